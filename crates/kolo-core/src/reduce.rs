//! Reduction operators and the kernels that apply them to byte buffers of a given [`DType`].

use std::fmt;

use half::{bf16, f16};

use crate::dtype::{DType, Element};

/// How a reduction combines elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReduceOp {
    /// Element-wise sum (integers wrap on overflow).
    Sum = 1,
    /// Element-wise product (integers wrap on overflow).
    Prod = 2,
    /// Element-wise minimum; a NaN on any rank gives NaN.
    Min = 3,
    /// Element-wise maximum; a NaN on any rank gives NaN.
    Max = 4,
    /// Sum divided by the number of ranks. For integer types the exact average, truncated toward
    /// zero like integer division: summed in `i64` (an `i64` as two halves), so it does not wrap
    /// where the sum overflows the type.
    Avg = 5,
}

impl ReduceOp {
    /// Every operator, in wire-code order.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    /// Lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }

    /// Decodes a wire code.
    #[inline]
    pub fn from_code(code: u8) -> Option<ReduceOp> {
        // `ALL` lists the variants in the order of their codes, from 1: an index, not a search
        // (this decodes every message's header); checked, so a list out of order only refuses.
        let v = *ReduceOp::ALL.get(usize::from(code.wrapping_sub(1)))?;
        (v as u8 == code).then_some(v)
    }

    /// Parses a name as printed by [`ReduceOp::name`].
    pub fn from_name(name: &str) -> Option<ReduceOp> {
        ReduceOp::ALL.into_iter().find(|o| o.name() == name)
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Arithmetic each element type provides to the kernels.
trait Arith: Element {
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn min_(self, o: Self) -> Self;
    fn max_(self, o: Self) -> Self;
    /// Divides by a rank count (for `Avg`).
    fn div_count(self, n: usize) -> Self;
}

macro_rules! float_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline] fn add(self, o: Self) -> Self { self + o }
            #[inline] fn mul(self, o: Self) -> Self { self * o }
            #[inline] fn min_(self, o: Self) -> Self { if self.is_nan() || o.is_nan() { <$t>::NAN } else if o < self { o } else { self } }
            #[inline] fn max_(self, o: Self) -> Self { if self.is_nan() || o.is_nan() { <$t>::NAN } else if o > self { o } else { self } }
            #[inline] fn div_count(self, n: usize) -> Self { self / n as $t }
        }
    )*};
}
float_arith!(f32, f64);

macro_rules! half_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline] fn add(self, o: Self) -> Self { <$t>::from_f32(self.to_f32() + o.to_f32()) }
            #[inline] fn mul(self, o: Self) -> Self { <$t>::from_f32(self.to_f32() * o.to_f32()) }
            #[inline] fn min_(self, o: Self) -> Self { <$t>::from_f32(self.to_f32().min_(o.to_f32())) }
            #[inline] fn max_(self, o: Self) -> Self { <$t>::from_f32(self.to_f32().max_(o.to_f32())) }
            #[inline] fn div_count(self, n: usize) -> Self { <$t>::from_f32(self.to_f32() / n as f32) }
        }
    )*};
}
half_arith!(f16, bf16);

macro_rules! int_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline] fn add(self, o: Self) -> Self { self.wrapping_add(o) }
            #[inline] fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
            #[inline] fn min_(self, o: Self) -> Self { Ord::min(self, o) }
            #[inline] fn max_(self, o: Self) -> Self { Ord::max(self, o) }
            #[inline] fn div_count(self, n: usize) -> Self { (self as i128 / n as i128) as $t }
        }
    )*};
}
int_arith!(i32, i64, u8);

/// Applies `f` to `dst[i] = f(dst[i], src[i])`, whatever the alignment of the two byte slices.
#[inline]
fn zip_apply<T: Arith>(dst: &mut [u8], src: &[u8], f: impl Fn(T, T) -> T) {
    match (
        bytemuck::try_cast_slice_mut::<u8, T>(dst),
        bytemuck::try_cast_slice::<u8, T>(src),
    ) {
        (Ok(d), Ok(s)) => {
            for (d, s) in d.iter_mut().zip(s) {
                *d = f(*d, *s);
            }
        }
        _ => {
            let w = std::mem::size_of::<T>();
            for (d, s) in dst.chunks_exact_mut(w).zip(src.chunks_exact(w)) {
                let a: T = bytemuck::pod_read_unaligned(d);
                let b: T = bytemuck::pod_read_unaligned(s);
                d.copy_from_slice(bytemuck::bytes_of(&f(a, b)));
            }
        }
    }
}

fn reduce_typed<T: Arith>(op: ReduceOp, dst: &mut [u8], src: &[u8]) {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => zip_apply::<T>(dst, src, T::add),
        ReduceOp::Prod => zip_apply::<T>(dst, src, T::mul),
        ReduceOp::Min => zip_apply::<T>(dst, src, T::min_),
        ReduceOp::Max => zip_apply::<T>(dst, src, T::max_),
    }
}

/// How many 16-bit floats [`reduce_half`] converts at a time (two f32 buffers of this on the stack).
const HALF_CHUNK: usize = 1024;

/// [`reduce_typed`] for f16/bf16: the same values, computed through f32 in chunks converted with the
/// `half` crate's slice conversions (vectorized where the CPU allows) instead of element by element.
fn reduce_half<T: Arith>(op: ReduceOp, dst: &mut [u8], src: &[u8])
where
    [T]: half::slice::HalfFloatSliceExt,
{
    use half::slice::HalfFloatSliceExt;
    if let (Ok(d), Ok(s)) = (
        bytemuck::try_cast_slice_mut::<u8, T>(dst),
        bytemuck::try_cast_slice::<u8, T>(src),
    ) {
        let (mut a, mut b) = ([0f32; HALF_CHUNK], [0f32; HALF_CHUNK]);
        for (d, s) in d.chunks_mut(HALF_CHUNK).zip(s.chunks(HALF_CHUNK)) {
            let (a, b) = (&mut a[..d.len()], &mut b[..d.len()]);
            d.convert_to_f32_slice(a);
            s.convert_to_f32_slice(b);
            // One loop per operator (a function item each, not a pointer), so each is inlined.
            match op {
                ReduceOp::Sum | ReduceOp::Avg => zip_f32(a, b, <f32 as Arith>::add),
                ReduceOp::Prod => zip_f32(a, b, <f32 as Arith>::mul),
                ReduceOp::Min => zip_f32(a, b, <f32 as Arith>::min_),
                ReduceOp::Max => zip_f32(a, b, <f32 as Arith>::max_),
            }
            d.convert_from_f32_slice(a);
        }
        return;
    }
    reduce_typed::<T>(op, dst, src)
}

#[inline]
fn zip_f32(a: &mut [f32], b: &[f32], f: impl Fn(f32, f32) -> f32) {
    a.iter_mut().zip(b).for_each(|(x, y)| *x = f(*x, *y));
}

fn scale_typed<T: Arith>(buf: &mut [u8], n: usize) {
    let w = std::mem::size_of::<T>();
    for c in buf.chunks_exact_mut(w) {
        let v: T = bytemuck::pod_read_unaligned(c);
        c.copy_from_slice(bytemuck::bytes_of(&v.div_count(n)));
    }
}

/// A reduction of one element type with one operator, applied to raw bytes.
///
/// `Avg` reduces as a sum; the caller divides once at the end with [`Reducer::finish`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reducer {
    /// Element type of the buffers.
    pub dtype: DType,
    /// Operator.
    pub op: ReduceOp,
}

impl Reducer {
    /// A reducer for `dtype` and `op`.
    pub const fn new(dtype: DType, op: ReduceOp) -> Self {
        Reducer { dtype, op }
    }

    /// `dst[i] = op(dst[i], src[i])` element-wise. Both slices hold the same whole number of elements
    /// (the collectives check this before calling).
    pub fn apply(&self, dst: &mut [u8], src: &[u8]) {
        debug_assert_eq!(dst.len(), src.len());
        match self.dtype {
            DType::F32 => reduce_typed::<f32>(self.op, dst, src),
            DType::F64 => reduce_typed::<f64>(self.op, dst, src),
            DType::F16 => reduce_half::<f16>(self.op, dst, src),
            DType::BF16 => reduce_half::<bf16>(self.op, dst, src),
            DType::I32 => reduce_typed::<i32>(self.op, dst, src),
            DType::I64 => reduce_typed::<i64>(self.op, dst, src),
            DType::U8 => reduce_typed::<u8>(self.op, dst, src),
        }
    }

    /// Final step after all contributions of `world` ranks are combined: divides by `world` for `Avg`,
    /// does nothing for the other operators.
    pub fn finish(&self, buf: &mut [u8], world: usize) {
        if self.op != ReduceOp::Avg || world <= 1 {
            return;
        }
        match self.dtype {
            DType::F32 => scale_typed::<f32>(buf, world),
            DType::F64 => scale_typed::<f64>(buf, world),
            DType::F16 => scale_typed::<f16>(buf, world),
            DType::BF16 => scale_typed::<bf16>(buf, world),
            DType::I32 => scale_typed::<i32>(buf, world),
            DType::I64 => scale_typed::<i64>(buf, world),
            DType::U8 => scale_typed::<u8>(buf, world),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{as_bytes, as_bytes_mut};

    #[test]
    fn f32_ops() {
        let r = |op| {
            let mut a = [1.0f32, 5.0, -2.0];
            let b = [3.0f32, 2.0, 4.0];
            Reducer::new(DType::F32, op).apply(as_bytes_mut(&mut a), as_bytes(&b));
            a
        };
        assert_eq!(r(ReduceOp::Sum), [4.0, 7.0, 2.0]);
        assert_eq!(r(ReduceOp::Prod), [3.0, 10.0, -8.0]);
        assert_eq!(r(ReduceOp::Min), [1.0, 2.0, -2.0]);
        assert_eq!(r(ReduceOp::Max), [3.0, 5.0, 4.0]);
    }

    #[test]
    fn nan_propagates_through_min_and_max() {
        for op in [ReduceOp::Min, ReduceOp::Max] {
            let mut a = [1.0f64];
            Reducer::new(DType::F64, op).apply(as_bytes_mut(&mut a), as_bytes(&[f64::NAN]));
            assert!(a[0].is_nan(), "{op}");
        }
    }

    #[test]
    fn avg_divides_once() {
        let red = Reducer::new(DType::I32, ReduceOp::Avg);
        let mut a = [7i32, -7];
        red.apply(as_bytes_mut(&mut a), as_bytes(&[2i32, 0]));
        red.finish(as_bytes_mut(&mut a), 2);
        assert_eq!(a, [4, -3]);
    }

    #[test]
    fn unaligned_source() {
        let mut a = [1.0f64, 2.0];
        let mut src = [0u8; 17];
        src[1..].copy_from_slice(as_bytes(&[10.0f64, 20.0]));
        Reducer::new(DType::F64, ReduceOp::Sum).apply(as_bytes_mut(&mut a), &src[1..]);
        assert_eq!(a, [11.0, 22.0]);
    }

    #[test]
    fn integers_wrap() {
        let mut a = [250u8];
        Reducer::new(DType::U8, ReduceOp::Sum).apply(&mut a, &[10u8]);
        assert_eq!(a, [4]);
    }

    #[test]
    fn half_chunks_give_the_values_of_element_by_element() {
        // Every 16-bit pattern against a shifted copy (NaNs, infinities, subnormals included), more
        // than one chunk long and not a multiple of it, for both types and every operator.
        let x: Vec<u16> = (0..=u16::MAX).collect();
        let y: Vec<u16> = x
            .iter()
            .map(|v| v.wrapping_mul(40503).rotate_left(3))
            .collect();
        for dtype in [DType::F16, DType::BF16] {
            for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
                let (mut fast, mut slow) = (x.clone(), x.clone());
                Reducer::new(dtype, op).apply(
                    bytemuck::cast_slice_mut(&mut fast),
                    bytemuck::cast_slice(&y),
                );
                match dtype {
                    DType::F16 => reduce_typed::<f16>(
                        op,
                        bytemuck::cast_slice_mut(&mut slow),
                        bytemuck::cast_slice(&y),
                    ),
                    _ => reduce_typed::<bf16>(
                        op,
                        bytemuck::cast_slice_mut(&mut slow),
                        bytemuck::cast_slice(&y),
                    ),
                }
                let differ = fast
                    .iter()
                    .zip(&slow)
                    .filter(|(a, b)| a != b && !(is_nan(dtype, **a) && is_nan(dtype, **b)))
                    .count();
                assert_eq!(differ, 0, "{dtype} {op}");
            }
        }
    }

    fn is_nan(dtype: DType, bits: u16) -> bool {
        match dtype {
            DType::F16 => f16::from_bits(bits).is_nan(),
            _ => bf16::from_bits(bits).is_nan(),
        }
    }
}
