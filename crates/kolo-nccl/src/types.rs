//! kolo's element types and operators as NCCL's (`ncclDataType_t`, `ncclRedOp_t`).

use std::ffi::c_int;

use kolo_core::{DType, ReduceOp};

/// `ncclUint8`.
pub(crate) const UINT8: c_int = 1;
/// `ncclUint64`.
pub(crate) const UINT64: c_int = 5;
/// `ncclMax`.
pub(crate) const MAX: c_int = 2;
/// `ncclSum`.
pub(crate) const SUM: c_int = 0;

/// NCCL's `ncclDataType_t` for `dtype` (`ncclBfloat16` needs NCCL 2.10 or later).
pub(crate) const fn data_type(dtype: DType) -> c_int {
    match dtype {
        DType::U8 => UINT8,
        DType::I32 => 2,
        DType::I64 => 4,
        DType::F16 => 6,
        DType::F32 => 7,
        DType::F64 => 8,
        DType::BF16 => 9,
    }
}

/// NCCL's `ncclRedOp_t` for `op` on host-staged buffers. `Avg` reduces as a sum here and is
/// finished on the host with kolo's own division ([`kolo_core::Reducer::finish`]), so its results
/// equal kolo's algorithms' bit for bit on every type (NCCL's `ncclAvg` scales each contribution
/// before summing floats, and has no integer form of kolo's truncating average).
pub(crate) const fn host_op(op: ReduceOp) -> c_int {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => SUM,
        ReduceOp::Prod => 1,
        ReduceOp::Max => MAX,
        ReduceOp::Min => 3,
    }
}

/// NCCL's `ncclRedOp_t` for `op` on device buffers: `ncclAvg` for the average (NCCL 2.10 or
/// later), computed on the GPU.
pub(crate) const fn device_op(op: ReduceOp) -> c_int {
    match op {
        ReduceOp::Avg => 4,
        other => host_op(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_and_operator_has_a_distinct_nccl_code() {
        // The values of nccl.h (2.10+): a wrong one would reduce garbage on a GPU, so pin them.
        let types: Vec<c_int> = DType::ALL.iter().map(|&d| data_type(d)).collect();
        assert_eq!(types, [7, 8, 6, 9, 2, 4, 1]);
        let ops: Vec<c_int> = ReduceOp::ALL.iter().map(|&o| device_op(o)).collect();
        assert_eq!(ops, [0, 1, 3, 2, 4]);
        assert_eq!(host_op(ReduceOp::Avg), SUM);
    }
}
