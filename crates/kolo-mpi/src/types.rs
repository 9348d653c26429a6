//! kolo's element types and reduce operators as MPI datatypes and operators. f16 and bf16 travel as
//! 16-bit words; their reductions are user-defined MPI operators that run kolo's own kernels.

use std::os::raw::{c_int, c_void};
use std::sync::OnceLock;

use kolo_core::{DType, ReduceOp, Reducer};
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
    ($($name:ident: $dtype:expr, $op:expr;)*) => {$(
        /// `inout[i] = in[i] op inout[i]` for `*len` 16-bit elements (an MPI_User_function), with
        /// kolo's own kernel.
        unsafe extern "C" fn $name(
            inv: *mut c_void,
            inout: *mut c_void,
            len: *mut c_int,
            _datatype: *mut ffi::MPI_Datatype,
        ) {
            // SAFETY: MPI passes two buffers of `*len` elements of the 2-byte datatype the operator
            // was called with.
            let n = unsafe { *len }.max(0) as usize * 2;
            let src = unsafe { std::slice::from_raw_parts(inv as *const u8, n) };
            let dst = unsafe { std::slice::from_raw_parts_mut(inout as *mut u8, n) };
            Reducer::new($dtype, $op).apply(dst, src);
        }
    )*};
}

half_ops! {
    f16_sum: DType::F16, ReduceOp::Sum;
    f16_prod: DType::F16, ReduceOp::Prod;
    f16_min: DType::F16, ReduceOp::Min;
    f16_max: DType::F16, ReduceOp::Max;
    bf16_sum: DType::BF16, ReduceOp::Sum;
    bf16_prod: DType::BF16, ReduceOp::Prod;
    bf16_min: DType::BF16, ReduceOp::Min;
    bf16_max: DType::BF16, ReduceOp::Max;
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
