//! CPU binding of workers: each local worker gets its own block of the CPUs the launcher may use,
//! as `mpirun` binds ranks to cores by default.
//!
//! Why it matters: ranks that wait for each other by spinning (the shared-memory transport does, for
//! a few microseconds before it sleeps) must not share a core. Left to itself the scheduler can start
//! two such ranks on one core and keep them there, since at any moment only one of them is runnable;
//! a bound rank also keeps its caches and its compute threads (which size themselves by the CPUs
//! they may use) to itself.

use std::fmt;
use std::str::FromStr;

use rustix::thread::CpuSet as RawCpuSet;

/// How workers are bound to CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuBind {
    /// Each of the `nproc` workers gets `cpus / nproc` of the launcher's CPUs (a contiguous block, in
    /// CPU order), when there are at least two workers and no more workers than CPUs; otherwise no
    /// binding.
    #[default]
    Cores,
    /// No binding: workers may run on every CPU the launcher may use.
    None,
}

impl FromStr for CpuBind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "cores" | "core" => Ok(CpuBind::Cores),
            "none" => Ok(CpuBind::None),
            other => Err(format!("expected `cores` or `none`, got `{other}`")),
        }
    }
}

impl fmt::Display for CpuBind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CpuBind::Cores => "cores",
            CpuBind::None => "none",
        })
    }
}

/// The CPUs this process may run on, in increasing order (empty where that cannot be read).
pub fn allowed_cpus() -> Vec<usize> {
    // `None` is this thread.
    let Ok(set) = rustix::thread::sched_getaffinity(None) else {
        return Vec::new();
    };
    (0..RawCpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect()
}

/// The CPUs of each of `nproc` workers under `bind`, given the launcher's `cpus`; `None` when the
/// workers are not bound.
pub fn plan(bind: CpuBind, nproc: usize, cpus: &[usize]) -> Option<Vec<Vec<usize>>> {
    if bind == CpuBind::None || nproc < 2 || nproc > cpus.len() {
        return None;
    }
    let per = cpus.len() / nproc;
    Some(
        (0..nproc)
            .map(|r| cpus[r * per..(r + 1) * per].to_vec())
            .collect(),
    )
}

/// Variables that size a worker's compute thread pools (rayon's, which candle's matrix products
/// use, and OpenMP's), set by the launcher where the environment does not set them already.
pub const THREAD_VARS: [&str; 2] = ["RAYON_NUM_THREADS", "OMP_NUM_THREADS"];

/// Compute threads for each worker: the number of its CPUs when bound (`worker_cpus`), else, with
/// several workers, an equal share of the launcher's `cpus` CPUs (at least one, as torchrun sets
/// `OMP_NUM_THREADS=1`); `None` for a lone worker (its libraries' own default). Without it,
/// libraries that count the machine's cores rather than the CPUs a worker may use (candle counts
/// physical cores) start a thread per core in every worker, and the workers' threads fight over
/// the cores (a transformer step 5x slower with 2 workers on 2 cores).
pub fn threads_per_worker(
    nproc: usize,
    cpus: usize,
    worker_cpus: Option<&[usize]>,
) -> Option<usize> {
    match worker_cpus {
        Some(mine) => Some(mine.len().max(1)),
        None if nproc >= 2 => Some((cpus / nproc).max(1)),
        None => None,
    }
}

/// A CPU set ready to apply in a forked child (no allocation there).
#[derive(Clone, Copy)]
pub(crate) struct CpuSet(RawCpuSet);

impl CpuSet {
    pub(crate) fn new(cpus: &[usize]) -> CpuSet {
        let mut set = RawCpuSet::new();
        for &c in cpus.iter().filter(|&&c| c < RawCpuSet::MAX_CPU) {
            set.set(c);
        }
        CpuSet(set)
    }

    /// Binds the calling process (async-signal-safe: one system call).
    pub(crate) fn apply(&self) -> std::io::Result<()> {
        // `None` is the calling thread (the only one, in a forked child before exec).
        rustix::thread::sched_setaffinity(None, &self.0)?;
        Ok(())
    }
}

/// `0-3,8` style list of `cpus` (sorted).
pub fn cpu_list(cpus: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_follow_the_binding_or_share_the_cpus() {
        assert_eq!(threads_per_worker(2, 8, Some(&[4, 5, 6, 7])), Some(4));
        assert_eq!(threads_per_worker(2, 2, Some(&[1])), Some(1));
        assert_eq!(threads_per_worker(3, 8, None), Some(2));
        assert_eq!(threads_per_worker(16, 8, None), Some(1));
        assert_eq!(threads_per_worker(1, 8, None), None);
    }

    #[test]
    fn blocks_split_the_cpus_evenly() {
        let cpus: Vec<usize> = (0..8).collect();
        let p = plan(CpuBind::Cores, 2, &cpus).expect("bound");
        assert_eq!(p, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
        let p = plan(CpuBind::Cores, 3, &cpus).expect("bound");
        assert_eq!(p, vec![vec![0, 1], vec![2, 3], vec![4, 5]]);
        let odd = [1, 3, 5];
        assert_eq!(
            plan(CpuBind::Cores, 3, &odd),
            Some(vec![vec![1], vec![3], vec![5]])
        );
    }

    #[test]
    fn no_binding_when_it_cannot_help() {
        let cpus: Vec<usize> = (0..2).collect();
        assert_eq!(plan(CpuBind::Cores, 1, &cpus), None);
        assert_eq!(plan(CpuBind::Cores, 3, &cpus), None);
        assert_eq!(plan(CpuBind::None, 2, &cpus), None);
    }

    #[test]
    fn lists_and_parsing() {
        assert_eq!(cpu_list(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(cpu_list(&[]), "");
        assert_eq!("none".parse::<CpuBind>(), Ok(CpuBind::None));
        assert_eq!("cores".parse::<CpuBind>(), Ok(CpuBind::Cores));
        assert!("socket".parse::<CpuBind>().is_err());
    }

    #[test]
    fn this_process_has_cpus() {
        assert!(!allowed_cpus().is_empty());
    }
}
