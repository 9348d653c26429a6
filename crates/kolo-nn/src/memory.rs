//! Keeping the memory a training step frees for the next step.
//!
//! A step allocates and frees the same tensors every time: activations, gradients, the kernels'
//! layouts — most of them between 128 KiB and a few tens of MiB. glibc's `malloc` hands
//! allocations over its mmap threshold (128 KiB, raised as such blocks are freed, up to 32 MiB)
//! to fresh `mmap`s, and gives the heap's free top back to the system past its trim threshold;
//! either way the next step's allocation of the same size can be new memory, which the kernel
//! faults in and zeroes page by page before kolo's kernels overwrite it. [`keep_freed_memory`]
//! tells `malloc` to serve blocks under 1 GiB from its heap and to keep that heap's free memory,
//! so a step reuses the pages of the last: resident memory stays at its peak between steps
//! instead of falling and rising again (the peak is unchanged; a step holds all of it at once
//! anyway). PyTorch's CPU tuning guides get the same by loading jemalloc or tcmalloc.
//!
//! `kolo train`'s launcher gives its workers these settings (and huge pages) through
//! `GLIBC_TUNABLES`; a `kolo train` worker started by another launcher, and a loop of your own,
//! call this once at start. It changes the whole process's allocator, which is why kolo's
//! libraries do not do it behind your back.

/// Blocks at least this large are still mapped on their own (and returned when freed).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 1 << 30;

/// Asks the process's C allocator to keep freed memory for reuse (see the module notes). Returns
/// whether it did: `true` with glibc on Linux; `false` elsewhere (musl, macOS, Windows, or a
/// program whose allocator is not glibc's `malloc`), where it changes nothing. Calling it again
/// is harmless.
pub fn keep_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallopt` only sets malloc's parameters; both values are within the ranges
        // glibc documents (it refuses others and returns 0, which is reported).
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, libc::c_int::MAX) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With the freed memory kept, a block freed and asked for again comes back from the heap
    /// without a page fault; without it (glibc's defaults, mmap threshold raised to at most
    /// 32 MiB), a 40 MiB block (over its largest threshold) is mapped anew each time and every
    /// page faults again. (40 MiB also fits a thread's arena, whose heaps are 64 MiB: tests run
    /// on threads.)
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn a_freed_block_is_reused_without_faults() {
        fn minor_faults() -> i64 {
            // SAFETY: `getrusage` writes the struct it is given.
            let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
            assert_eq!(
                unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) },
                0
            );
            usage.ru_minflt
        }
        assert!(keep_freed_memory());
        assert!(keep_freed_memory(), "a second call is harmless");
        const LEN: usize = 40 << 20;
        // One byte per page, through a pointer: neither a zero-fill nor an uninitialized read.
        let touch = |v: &mut Vec<u8>| {
            let p = v.as_mut_ptr();
            for i in (0..LEN).step_by(4096) {
                // SAFETY: i < LEN, the vector's capacity.
                unsafe { p.add(i).write(i as u8) };
            }
        };
        let mut first = Vec::<u8>::with_capacity(LEN);
        touch(&mut first);
        // Observed, so that an optimized build keeps the block and its writes.
        drop(std::hint::black_box(first));
        let before = minor_faults();
        let mut again = Vec::<u8>::with_capacity(LEN);
        touch(&mut again);
        let faults = minor_faults() - before;
        assert!(
            faults <= 4,
            "{faults} page faults writing a reused 40 MiB block (a fresh one: 10,240 small \
             pages, or 20 huge ones)"
        );
        std::hint::black_box(&again);
    }
}
