//! A safe front to the `gemm` crate's matrix product on strided slices: the GEMMs of the kernels
//! that read and write their own buffers instead of going through candle tensors (no operand or
//! result copies).

use candle_core::{DType, Result, WithDType};

/// A strided `rows × cols` matrix view: element `(i, j)` at `data[i·rs + j·cs]`.
#[derive(Debug, Clone, Copy)]
pub(super) struct MatRef<'a, T> {
    data: &'a [T],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<'a, T> MatRef<'a, T> {
    /// The row-major `rows × cols` matrix at the start of `data`.
    pub(super) fn row_major(data: &'a [T], rows: usize, cols: usize) -> Self {
        MatRef {
            data,
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }

    /// The transposed view (no copy).
    pub(super) fn t(self) -> Self {
        MatRef {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }

    /// Its shape, `(rows, cols)`.
    pub(super) fn dims(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// Its values and strides, `(data, row stride, column stride)`.
    pub(super) fn parts(&self) -> (&'a [T], usize, usize) {
        (self.data, self.rs, self.cs)
    }

    /// The same view of the same memory as elements of `U`.
    ///
    /// # Safety
    /// `T` and `U` must be the same type (a generic `T` whose `DTYPE` says so).
    pub(super) unsafe fn retyped<U>(self) -> MatRef<'a, U> {
        debug_assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<U>());
        MatRef {
            // SAFETY: the caller's: the same type, size and alignment.
            data: unsafe { std::slice::from_raw_parts(self.data.as_ptr().cast(), self.data.len()) },
            rows: self.rows,
            cols: self.cols,
            rs: self.rs,
            cs: self.cs,
        }
    }

    /// Whether every element lies inside `data`.
    pub(super) fn fits(&self) -> bool {
        self.rows == 0
            || self.cols == 0
            || (self.rows - 1) * self.rs + (self.cols - 1) * self.cs < self.data.len()
    }
}

/// `dst = lhs @ rhs`, or `dst += lhs @ rhs` when `accumulate`; `dst` is the
/// `lhs.rows × rhs.cols` matrix at the start of the slice with element `(i, j)` at
/// `i·dst_rs + j·dst_cs`. Runs on candle's
/// thread count (one inside [`super::threads::for_each_block`]'s tasks) (f32, f64) or on the bf16 GEMM (bf16: products summed in f32, rounded to bf16
/// once, with what `dst` held when accumulating). Errors (naming `op`) on mismatched shapes,
/// views that leave their slices, or another dtype.
pub(super) fn matmul_into<T: WithDType>(
    op: &str,
    dst: &mut [T],
    (dst_rs, dst_cs): (usize, usize),
    lhs: MatRef<T>,
    rhs: MatRef<T>,
    accumulate: bool,
) -> Result<()> {
    if !matches!(T::DTYPE, DType::F32 | DType::F64 | DType::BF16) {
        candle_core::bail!("{op}: no GEMM for {:?}", T::DTYPE);
    }
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    let fits = dst_fits(m, n, (dst_rs, dst_cs), dst.len());
    if rhs.rows != k || !lhs.fits() || !rhs.fits() || !fits {
        candle_core::bail!(
            "{op}: GEMM of [{m}, {k}] @ [{}, {n}] into {} values does not fit",
            rhs.rows,
            dst.len()
        );
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                for j in 0..n {
                    dst[i * dst_rs + j * dst_cs] = T::zero();
                }
            }
        }
        return Ok(());
    }
    if T::DTYPE == DType::BF16 {
        return bf16_into(op, dst, (dst_rs, dst_cs), lhs, rhs, accumulate);
    }
    if T::DTYPE == DType::F32 && m.min(n).min(k) >= MIN_BF16_SIDE {
        if let Some(unit) = super::matmul_precision::bf16_unit() {
            // SAFETY: T::DTYPE is F32, so T is f32.
            let dst: &mut [f32] =
                unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast(), dst.len()) };
            // SAFETY: as above, for both operands.
            let (lhs, rhs) = unsafe { (lhs.retyped::<f32>(), rhs.retyped::<f32>()) };
            return f32_on_bf16(op, unit, dst, (dst_rs, dst_cs), lhs, rhs, accumulate);
        }
    }
    let threads = super::threads::for_work(m * n * k, MIN_MACS_PER_THREAD);
    let parallelism = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the three views were checked to lie inside their slices and the destination's
    // elements to be distinct (`fits`, `dst_fits`), `dst` is borrowed mutably so it aliases
    // neither operand, and `T` is f32 or f64, which `gemm` supports.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            dst_cs as isize,
            dst_rs as isize,
            accumulate,
            lhs.data.as_ptr(),
            lhs.cs as isize,
            lhs.rs as isize,
            rhs.data.as_ptr(),
            rhs.cs as isize,
            rhs.rs as isize,
            T::one(),
            T::one(),
            false,
            false,
            false,
            parallelism,
        );
    }
    Ok(())
}

/// Multiply-adds a GEMM gives each thread at the least (about 80 µs of one core's work): a
/// smaller product runs on the caller's thread, as splitting it costs more than it saves.
const MIN_MACS_PER_THREAD: usize = 4 << 20;

/// Products with a side (`m`, `n` or `k`) shorter than this stay f32 under
/// [`MatmulPrecision::Bf16`]: packing the operands (`m·k + k·n` values) then costs about as much as
/// the `m·n·k` multiply-adds the bf16 unit saves — LeNet's convolutions (6 and 16 channels) took
/// twice as long on it.
///
/// [`MatmulPrecision::Bf16`]: super::matmul_precision::MatmulPrecision::Bf16
const MIN_BF16_SIDE: usize = 32;

/// [`matmul_into`] of f32 operands on a bf16 unit ([`super::matmul_precision()`]): each operand
/// rounded to bf16 as it is packed, products summed in f32; straight into `dst` where it is
/// row-major.
fn f32_on_bf16(
    op: &str,
    unit: super::bf16_gemm::Bf16Path,
    dst: &mut [f32],
    (dst_rs, dst_cs): (usize, usize),
    lhs: MatRef<f32>,
    rhs: MatRef<f32>,
    accumulate: bool,
) -> Result<()> {
    let (m, n) = (lhs.rows, rhs.cols);
    let named = |e: candle_core::Error| candle_core::Error::msg(format!("{op}: {e}"));
    if dst_cs == 1 && dst_rs == n {
        return super::bf16_gemm::matmul_views(unit, lhs, rhs, &mut dst[..m * n], accumulate)
            .map_err(named);
    }
    let acc = product_on(op, unit, lhs, rhs)?;
    for_each_at(&acc, n, (dst_rs, dst_cs), |at, v| {
        dst[at] = if accumulate { dst[at] + v } else { v };
    });
    Ok(())
}

/// [`matmul_into`] for bf16 (`T` is bf16): the product in f32, then each element of `dst`
/// rounded once.
fn bf16_into<T: WithDType>(
    op: &str,
    dst: &mut [T],
    (dst_rs, dst_cs): (usize, usize),
    lhs: MatRef<T>,
    rhs: MatRef<T>,
    accumulate: bool,
) -> Result<()> {
    let n = rhs.cols;
    let acc = bf16_product(op, lhs, rhs)?;
    for_each_at(&acc, n, (dst_rs, dst_cs), |at, v| {
        let d = &mut dst[at];
        let prior = if accumulate { d.to_f64() as f32 } else { 0.0 };
        *d = T::from_f64(f64::from(v + prior));
    });
    Ok(())
}

/// `dst += lhs @ rhs` for bf16 operands (`T` is bf16) into an f32 destination with element
/// `(i, j)` at `i·dst_rs + j·dst_cs`: a sum over several products rounded to bf16 once, at the
/// end, by the caller (the kernel gradient over a batch's chunks).
pub(super) fn matmul_into_f32<T: WithDType>(
    op: &str,
    dst: &mut [f32],
    (dst_rs, dst_cs): (usize, usize),
    lhs: MatRef<T>,
    rhs: MatRef<T>,
) -> Result<()> {
    let (m, n) = (lhs.rows, rhs.cols);
    if T::DTYPE != DType::BF16 || !dst_fits(m, n, (dst_rs, dst_cs), dst.len()) {
        candle_core::bail!(
            "{op}: an f32 sum of {:?} products into {} values",
            T::DTYPE,
            dst.len()
        );
    }
    let acc = bf16_product(op, lhs, rhs)?;
    for_each_at(&acc, n, (dst_rs, dst_cs), |at, v| dst[at] += v);
    Ok(())
}

/// Calls `f(i·rs + j·cs, acc[i·n + j])` for every element of the row-major `acc` (`n` columns).
fn for_each_at(acc: &[f32], n: usize, (rs, cs): (usize, usize), mut f: impl FnMut(usize, f32)) {
    for (i, row) in acc.chunks_exact(n.max(1)).enumerate() {
        for (j, &v) in row.iter().enumerate() {
            f(i * rs + j * cs, v);
        }
    }
}

/// Whether an `m × n` destination with strides `(rs, cs)` lies inside `len` values, each
/// element its own.
fn dst_fits(m: usize, n: usize, (rs, cs): (usize, usize), len: usize) -> bool {
    (m == 0 || n == 0 || (m - 1) * rs + (n - 1) * cs < len) && distinct(m, n, rs, cs)
}

/// `lhs @ rhs` (bf16, `T` is bf16) in f32, row-major, on the bf16 GEMM's path.
fn bf16_product<T: WithDType>(op: &str, lhs: MatRef<T>, rhs: MatRef<T>) -> Result<Vec<f32>> {
    if T::DTYPE != DType::BF16 {
        candle_core::bail!("{op}: not bf16 but {:?}", T::DTYPE);
    }
    // SAFETY: T::DTYPE is BF16 (checked above), so T is half::bf16.
    let (lhs, rhs) = unsafe { (lhs.retyped::<half::bf16>(), rhs.retyped::<half::bf16>()) };
    product_on(op, super::bf16_gemm::bf16_path()?, lhs, rhs)
}

/// `lhs @ rhs` in f32, row-major, on the bf16 unit `path`: bf16 operands, or f32 ones rounded to
/// bf16 as they are packed.
fn product_on<S: super::bf16_gemm::Source>(
    op: &str,
    path: super::bf16_gemm::Bf16Path,
    lhs: MatRef<S>,
    rhs: MatRef<S>,
) -> Result<Vec<f32>> {
    let mut acc = vec![0f32; lhs.rows * rhs.cols];
    super::bf16_gemm::matmul_views(path, lhs, rhs, &mut acc, false)
        .map_err(|e| candle_core::Error::msg(format!("{op}: {e}")))?;
    Ok(acc)
}

/// Whether the `m × n` elements at `i·rs + j·cs` are distinct: a stride that moves along a
/// dimension of more than one element is not zero, and one of the strides spans the whole extent
/// of the other.
fn distinct(m: usize, n: usize, rs: usize, cs: usize) -> bool {
    match (m <= 1, n <= 1) {
        (true, true) => true,
        (true, false) => cs > 0,
        (false, true) => rs > 0,
        (false, false) => rs > 0 && cs > 0 && (rs >= n * cs || cs >= m * rs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliased_destinations_are_refused() {
        // (rows, cols, row stride, column stride) of a destination and whether it is distinct.
        for (m, n, rs, cs, want) in [
            (2, 3, 3, 1, true),
            (2, 3, 1, 2, true),
            (1, 1, 0, 0, true),
            (1, 3, 0, 1, true),
            (3, 1, 1, 0, true),
            (2, 3, 0, 1, false),
            (2, 3, 3, 0, false),
            (1, 3, 5, 0, false),
            (3, 1, 0, 5, false),
            (2, 3, 2, 1, false),
        ] {
            assert_eq!(distinct(m, n, rs, cs), want, "{m}x{n} strides ({rs}, {cs})");
        }
        let (a, b) = ([1.0f32; 4], [1.0f32; 4]);
        let mut dst = [0.0f32; 8];
        let lhs = MatRef::row_major(&a[..], 2, 2);
        let rhs = MatRef::row_major(&b[..], 2, 2);
        assert!(matmul_into("t", &mut dst, (2, 1), lhs, rhs, false).is_ok());
        assert!(matmul_into("t", &mut dst, (2, 0), lhs, rhs, false).is_err());
        assert!(matmul_into("t", &mut dst, (0, 1), lhs, rhs, false).is_err());
    }
}
