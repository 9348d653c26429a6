//! What the communicator's methods share: the element-type dispatch, the names of reductions and
//! types, and the buffers of two-buffer operations.

use std::borrow::Cow;

use kolo::{DType, Element, ReduceOp};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::buffer::{hold, parse_dtype, Held, Region};

/// Runs `$body` with `$t` the Rust type of element type `$dtype`.
macro_rules! typed {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            kolo::DType::F32 => {
                type $t = f32;
                $body
            }
            kolo::DType::F64 => {
                type $t = f64;
                $body
            }
            kolo::DType::F16 => {
                type $t = half::f16;
                $body
            }
            kolo::DType::BF16 => {
                type $t = half::bf16;
                $body
            }
            kolo::DType::I32 => {
                type $t = i32;
                $body
            }
            kolo::DType::I64 => {
                type $t = i64;
                $body
            }
            kolo::DType::U8 => {
                type $t = u8;
                $body
            }
        }
    };
}

/// The reduction named `name` (`sum`, `prod`, `min`, `max`, `avg`; any case).
pub(crate) fn parse_op(name: &str) -> PyResult<ReduceOp> {
    Ok(match name.trim().to_ascii_lowercase().as_str() {
        "sum" => ReduceOp::Sum,
        "prod" | "product" => ReduceOp::Prod,
        "min" => ReduceOp::Min,
        "max" => ReduceOp::Max,
        "avg" | "mean" | "average" => ReduceOp::Avg,
        other => {
            return Err(PyValueError::new_err(format!(
                "unsupported reduction {other:?}: kolo reduces with sum, prod, min, max and avg"
            )))
        }
    })
}

pub(crate) fn parse_opt_dtype(dtype: Option<&str>) -> PyResult<Option<DType>> {
    dtype.map(parse_dtype).transpose()
}

/// The elements to send, copied first where they share memory with `recv` (an in-place
/// all-gather: the input is the output's own slot).
///
/// # Safety
/// Both regions' buffers must be held and no reference to either be alive.
pub(crate) unsafe fn source<'a, T: Element>(send: Region, recv: Region) -> Cow<'a, [T]> {
    if send.overlaps(&recv) {
        // SAFETY: per this function's contract; the borrow ends with the copy.
        Cow::Owned(unsafe { send.slice::<T>() }.to_vec())
    } else {
        // SAFETY: per this function's contract; `recv` does not share this memory.
        Cow::Borrowed(unsafe { send.slice::<T>() })
    }
}

pub(crate) use typed;

/// Holds a send and a receive buffer of one element type (`dtype`, or the send buffer's).
pub(crate) fn pair(
    send: &Bound<'_, PyAny>,
    recv: &Bound<'_, PyAny>,
    dtype: Option<&str>,
) -> PyResult<(Vec<Held>, Region, Region)> {
    let hs = hold(send, parse_opt_dtype(dtype)?, "send", false)?;
    let s = hs.region;
    let hr = hold(recv, Some(s.dtype), "recv", true)?;
    let r = hr.region;
    Ok((vec![hs, hr], s, r))
}
