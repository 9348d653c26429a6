//! kolo's element types and reduce operators as MPI datatypes and operators. f16 and bf16 travel as
//! 16-bit words; their reductions are user-defined MPI operators that run kolo's own kernels.

use std::os::raw::{c_int, c_void};
use std::sync::OnceLock;

use kolo_core::{DType, ReduceOp};
use mpi::ffi;

extern "C" {
    fn kolo_mpi_in_place() -> *mut c_void;
}

/// `MPI_IN_PLACE` of the MPI library kolo was built against.
pub(crate) fn in_place() -> *mut c_void {
    // SAFETY: returns a constant.
    unsafe { kolo_mpi_in_place() }
}

/// The MPI datatype of one element.
pub(crate) fn datatype(d: DType) -> ffi::MPI_Datatype {
    // SAFETY: reading the predefined datatype handles rsmpi exports.
    unsafe {
        match d {
            DType::F32 => ffi::RSMPI_FLOAT,
            DType::F64 => ffi::RSMPI_DOUBLE,
            DType::I32 => ffi::RSMPI_INT32_T,
            DType::I64 => ffi::RSMPI_INT64_T,
            DType::U8 => ffi::RSMPI_UINT8_T,
            DType::F16 | DType::BF16 => ffi::RSMPI_UINT16_T,
        }
    }
}

/// An MPI operator handle (predefined or created once at start-up; never freed).
#[derive(Clone, Copy)]
struct Op(ffi::MPI_Op);
// SAFETY: operator handles are immutable values usable from any thread under MPI_THREAD_MULTIPLE.
unsafe impl Send for Op {}
// SAFETY: as above.
unsafe impl Sync for Op {}

/// The user-defined operators for f16 and bf16: `[dtype][operator]`, operators in `OPS` order.
static HALF_OPS: OnceLock<[[Op; 4]; 2]> = OnceLock::new();

const OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max];

macro_rules! half_ops {
    ($($name:ident: $t:ty, $op:expr;)*) => {$(
        /// `inout[i] = in[i] op inout[i]` for `*len` 16-bit elements (an MPI_User_function).
        unsafe extern "C" fn $name(
            inv: *mut c_void,
            inout: *mut c_void,
            len: *mut c_int,
            _datatype: *mut ffi::MPI_Datatype,
        ) {
            // SAFETY: MPI passes two buffers of `*len` elements of the 2-byte datatype the operator
            // was called with; MPI's buffers of 16-bit elements are 2-byte aligned.
            let n = unsafe { *len }.max(0) as usize;
            let src = unsafe { std::slice::from_raw_parts(inv as *const $t, n) };
            let dst = unsafe { std::slice::from_raw_parts_mut(inout as *mut $t, n) };
            combine_half::<$t>(src, dst, $op);
        }
    )*};
}

/// How many elements [`combine_half`] converts at a time (two f32 buffers of this on the stack).
const CHUNK: usize = 1024;

/// `dst[i] = op(src[i], dst[i])` through f32 (see [`ReduceOp`]; `Avg` is a sum here).
fn combine_half<T: HalfElem>(src: &[T], dst: &mut [T], op: ReduceOp) {
    let (mut a, mut b) = ([0f32; CHUNK], [0f32; CHUNK]);
    for (s, d) in src.chunks(CHUNK).zip(dst.chunks_mut(CHUNK)) {
        let (a, b) = (&mut a[..s.len()], &mut b[..s.len()]);
        T::widen(s, a);
        T::widen(d, b);
        match op {
            ReduceOp::Sum | ReduceOp::Avg => b.iter_mut().zip(a.iter()).for_each(|(y, x)| *y += x),
            ReduceOp::Prod => b.iter_mut().zip(a.iter()).for_each(|(y, x)| *y *= x),
            ReduceOp::Min => b.iter_mut().zip(a.iter()).for_each(|(y, x)| {
                *y = if x.is_nan() || y.is_nan() {
                    f32::NAN
                } else {
                    y.min(*x)
                }
            }),
            ReduceOp::Max => b.iter_mut().zip(a.iter()).for_each(|(y, x)| {
                *y = if x.is_nan() || y.is_nan() {
                    f32::NAN
                } else {
                    y.max(*x)
                }
            }),
        }
        T::narrow(b, d);
    }
}

/// f16 and bf16, with the `half` crate's bulk conversions.
pub(crate) trait HalfElem: Copy {
    fn widen(src: &[Self], dst: &mut [f32]);
    fn narrow(src: &[f32], dst: &mut [Self]);
}

macro_rules! half_elem {
    ($($t:ty),*) => {$(
        impl HalfElem for $t {
            fn widen(src: &[Self], dst: &mut [f32]) {
                use half::slice::HalfFloatSliceExt;
                src.convert_to_f32_slice(dst);
            }
            fn narrow(src: &[f32], dst: &mut [Self]) {
                use half::slice::HalfFloatSliceExt;
                dst.convert_from_f32_slice(src);
            }
        }
    )*};
}
half_elem!(half::f16, half::bf16);

half_ops! {
    f16_sum: half::f16, ReduceOp::Sum;
    f16_prod: half::f16, ReduceOp::Prod;
    f16_min: half::f16, ReduceOp::Min;
    f16_max: half::f16, ReduceOp::Max;
    bf16_sum: half::bf16, ReduceOp::Sum;
    bf16_prod: half::bf16, ReduceOp::Prod;
    bf16_min: half::bf16, ReduceOp::Min;
    bf16_max: half::bf16, ReduceOp::Max;
}

type UserFn = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_int, *mut ffi::MPI_Datatype);

/// Creates the f16/bf16 operators (once, right after MPI_Init).
pub(crate) fn create_ops() -> Result<(), String> {
    let fns: [[UserFn; 4]; 2] = [
        [f16_sum, f16_prod, f16_min, f16_max],
        [bf16_sum, bf16_prod, bf16_min, bf16_max],
    ];
    // SAFETY: reading a predefined operator, a placeholder until each slot is filled.
    let mut ops = [[Op(unsafe { ffi::RSMPI_SUM }); 4]; 2];
    for (d, row) in fns.iter().enumerate() {
        for (o, f) in row.iter().enumerate() {
            // SAFETY: a null handle is only an out-parameter placeholder.
            let mut op: ffi::MPI_Op = unsafe { ffi::RSMPI_SUM };
            // SAFETY: `f` has the MPI_User_function signature; every kolo operator commutes.
            let rc = unsafe { ffi::MPI_Op_create(Some(*f), 1, &mut op) };
            if rc != 0 {
                return Err(format!(
                    "MPI_Op_create for the half-precision operators failed ({rc})"
                ));
            }
            ops[d][o] = Op(op);
        }
    }
    let _ = HALF_OPS.set(ops);
    Ok(())
}

/// The MPI operator for `op` on `d` (`Avg` reduces as a sum; the engine divides afterwards).
pub(crate) fn operator(d: DType, op: ReduceOp) -> ffi::MPI_Op {
    let op = if op == ReduceOp::Avg {
        ReduceOp::Sum
    } else {
        op
    };
    let half = match d {
        DType::F16 => Some(0),
        DType::BF16 => Some(1),
        _ => None,
    };
    if let (Some(h), Some(ops)) = (half, HALF_OPS.get()) {
        let i = OPS.iter().position(|o| *o == op).unwrap_or(0);
        return ops[h][i].0;
    }
    // SAFETY: reading the predefined operator handles rsmpi exports.
    unsafe {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => ffi::RSMPI_SUM,
            ReduceOp::Prod => ffi::RSMPI_PROD,
            ReduceOp::Min => ffi::RSMPI_MIN,
            ReduceOp::Max => ffi::RSMPI_MAX,
        }
    }
}
