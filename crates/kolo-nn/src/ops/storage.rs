//! The kernels as candle custom ops: a kernel is a [`Kernel`] over its operands' CPU storage,
//! written once for both float types; [`CpuOp`] makes it a `CustomOp1` / `CustomOp2` /
//! `CustomOp3`, dispatching on the first operand's dtype (f32 or f64) once per call. The
//! helpers below give a kernel its operands as slices of its type, without copies.

use candle_core::backend::BackendStorage;
use candle_core::{
    CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor, WithDType,
};

/// An operand of a kernel: its storage and layout.
pub(crate) type Arg<'a> = (&'a CpuStorage, &'a Layout);

/// What a kernel's forward pass returns: the result and its shape.
pub(crate) type Output = Result<(CpuStorage, Shape)>;

/// What a kernel's backward pass returns: the gradients of its `N` operands (`None` for those
/// it does not compute).
pub(crate) type Grads<const N: usize> = Result<[Option<Tensor>; N]>;

/// A CPU kernel of `N` operands: the forward pass for both float types, and the backward pass
/// when it has one.
pub(crate) trait Kernel<const N: usize>: Send + Sync {
    /// candle's name of the op, which error messages begin with.
    fn name(&self) -> &'static str;

    /// Whether the kernel takes bf16 operands (computing its products on the bf16 GEMM); the
    /// others take f32 and f64 only.
    const TAKES_BF16: bool = false;

    /// The result and its shape, `T` the first operand's dtype (f32 or f64).
    fn forward<T: WithDType>(&self, args: [Arg<'_>; N]) -> Output;

    /// The gradients of the operands, given the op's operands, its result `res` and the
    /// gradient of the result. By default none: an op applied without gradient.
    fn backward(&self, _args: [&Tensor; N], _res: &Tensor, _grad: &Tensor) -> Grads<N> {
        Err(candle_core::Error::BackwardNotSupported { op: self.name() })
    }
}

/// A [`Kernel`] as a candle custom op (`CustomOp1`, `CustomOp2` or `CustomOp3` by its number
/// of operands).
pub(crate) struct CpuOp<K>(pub(crate) K);

impl<K> CpuOp<K> {
    fn dispatch<const N: usize>(&self, args: [Arg<'_>; N]) -> Output
    where
        K: Kernel<N>,
    {
        match args.first().map(|(s, _)| s.dtype()) {
            Some(DType::F32) => self.0.forward::<f32>(args),
            Some(DType::F64) => self.0.forward::<f64>(args),
            Some(DType::BF16) if K::TAKES_BF16 => self.0.forward::<half::bf16>(args),
            Some(other) => candle_core::bail!("{}: unsupported dtype {other:?}", self.0.name()),
            None => candle_core::bail!("{}: no operands", self.0.name()),
        }
    }
}

/// `impl CustomOpN for CpuOp<K: Kernel<N>>`: the storages and layouts go to the kernel as `N`
/// operands, the operands of the backward pass as `N` tensors, its `N` gradients back as the
/// trait's tuple.
macro_rules! custom_op {
    ($op:ident<$n:literal> -> $grads:ty, $(($s:ident, $l:ident, $arg:ident, $d:ident)),+) => {
        impl<K: Kernel<$n>> $op for CpuOp<K> {
            fn name(&self) -> &'static str {
                self.0.name()
            }

            fn cpu_fwd(&self, $($s: &CpuStorage, $l: &Layout),+) -> Output {
                self.dispatch([$(($s, $l)),+])
            }

            fn bwd(&self, $($arg: &Tensor,)+ res: &Tensor, grad: &Tensor) -> Result<$grads> {
                let [$($d),+] = self.0.backward([$($arg),+], res, grad)?;
                Ok(($($d),+))
            }
        }
    };
}

custom_op!(CustomOp1<1> -> Option<Tensor>, (s, l, a, d));
custom_op!(
    CustomOp2<2> -> (Option<Tensor>, Option<Tensor>),
    (s1, l1, a1, d1),
    (s2, l2, a2, d2)
);
custom_op!(
    CustomOp3<3> -> (Option<Tensor>, Option<Tensor>, Option<Tensor>),
    (s1, l1, a1, d1),
    (s2, l2, a2, d2),
    (s3, l3, a3, d3)
);

/// All the elements of `arg`'s storage as `T`, with its layout (for kernels that read strided
/// operands); an error naming `op` if the storage holds another type.
pub(crate) fn typed<'a, T: WithDType>((s, l): Arg<'a>, op: &str) -> Result<(&'a [T], &'a Layout)> {
    match T::cpu_storage_as_slice(s) {
        Ok(v) => Ok((v, l)),
        Err(_) => candle_core::bail!(
            "{op}: an operand of dtype {:?}, not {:?}",
            s.dtype(),
            T::DTYPE
        ),
    }
}

/// The elements of the contiguous operand `arg` as `T`; an error naming `op` if it is not
/// contiguous or holds another type.
pub(crate) fn slice<'a, T: WithDType>(arg: Arg<'a>, op: &str) -> Result<&'a [T]> {
    let (data, layout) = typed(arg, op)?;
    contiguous(data, layout, op)
}

/// The elements of a contiguous `layout` in `data`; an error naming `op` otherwise.
pub(crate) fn contiguous<'a, T>(data: &'a [T], layout: &Layout, op: &str) -> Result<&'a [T]> {
    match layout.contiguous_offsets() {
        Some((a, b)) if b <= data.len() => Ok(&data[a..b]),
        _ => candle_core::bail!("{op}: expected a contiguous tensor, got {:?}", layout),
    }
}

/// `(a, b)` if they have the same length; an error naming `op` otherwise.
pub(crate) fn same_len<'a, T, U>(a: &'a [T], b: &'a [U], op: &str) -> Result<(&'a [T], &'a [U])> {
    if a.len() != b.len() {
        candle_core::bail!("{op}: operands of {} and {} elements", a.len(), b.len());
    }
    Ok((a, b))
}
