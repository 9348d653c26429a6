//! Compiling a kernel's loops for the CPU's best vector extension.
//!
//! kolo is built for the baseline x86-64 (SSE2) so that one binary runs everywhere; the `gemm`
//! crate picks AVX2 / AVX-512 kernels at run time, and [`vectorized_fn`] does the same for kolo's
//! own element-wise loops: it compiles the function's body three times — with AVX-512F, with
//! AVX2 + FMA, and as built — and calls the best one the CPU supports. The body and every
//! `#[inline(always)]` function it calls are inlined into each copy and vectorized for its
//! registers (a closure passed to a `#[target_feature]` function would not be: it stays a
//! separate, baseline function).

/// `vectorized_fn! { fn name<T: WithDType>(args…) -> R { body } }` defines `name` with the body
/// compiled for AVX-512F, AVX2 + FMA and the baseline, dispatched at run time (see the module
/// notes). Besides `T`, the function may have one type parameter bound by a trait with const
/// arguments and const parameters, in that order: `fn name<T: WithDType, W: Tr<M, A>, const M:
/// usize, const A: usize>(…)`.
macro_rules! vectorized_fn {
    (
        $(#[$meta:meta])*
        $vis:vis fn $name:ident<
            T: WithDType $(, $w:ident: $wb:ident<$($wc:ident),*>)? $(, const $c:ident: usize)*
        >($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block
    ) => {
        $(#[$meta])*
        $vis fn $name<T: WithDType $(, $w: $wb<$($wc),*>)? $(, const $c: usize)*>(
            $($arg: $ty),*
        ) $(-> $ret)? {
            #[inline(always)]
            fn body<T: WithDType $(, $w: $wb<$($wc),*>)? $(, const $c: usize)*>(
                $($arg: $ty),*
            ) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                unsafe fn avx512<T: WithDType $(, $w: $wb<$($wc),*>)? $(, const $c: usize)*>(
                    $($arg: $ty),*
                ) $(-> $ret)? {
                    body::<T $(, $w)? $(, $c)*>($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2<T: WithDType $(, $w: $wb<$($wc),*>)? $(, const $c: usize)*>(
                    $($arg: $ty),*
                ) $(-> $ret)? {
                    body::<T $(, $w)? $(, $c)*>($($arg),*)
                }
                if std::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU supports AVX-512F (checked just above).
                    return unsafe { avx512::<T $(, $w)? $(, $c)*>($($arg),*) };
                }
                if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                    // SAFETY: the CPU supports AVX2 and FMA (checked just above).
                    return unsafe { avx2::<T $(, $w)? $(, $c)*>($($arg),*) };
                }
            }
            body::<T $(, $w)? $(, $c)*>($($arg),*)
        }
    };
}

pub(super) use vectorized_fn;
