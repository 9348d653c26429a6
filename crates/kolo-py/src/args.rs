//! What the communicator's methods share: the element-type dispatch and the buffers of
//! two-buffer operations.

use pyo3::prelude::*;

use crate::buffer::{hold, Held};
use crate::errors::ArgumentError;
use crate::names::parse_opt_dtype;

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

pub(crate) use typed;

/// Holds a send and a receive buffer of one element type (`dtype`, or the send buffer's).
pub(crate) fn pair(
    send: &Bound<'_, PyAny>,
    recv: &Bound<'_, PyAny>,
    dtype: Option<&str>,
) -> PyResult<(Held, Held)> {
    let hs = hold(send, parse_opt_dtype(dtype)?, "send", false)?;
    let hr = hold(recv, Some(hs.region.dtype), "recv", true)?;
    Ok((hs, hr))
}

/// A rank argument named `name`: a Python int from 0, else `ArgumentError` naming the argument
/// and its value (a negative rank was a bare `OverflowError`); the range of the group is the
/// communicator's to check.
fn rank_arg(ob: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    let v: i64 = ob.extract()?;
    usize::try_from(v)
        .map_err(|_| ArgumentError::new_err(format!("{name} {v}: not a rank (ranks count from 0)")))
}

/// The `root` of a collective ([`rank_arg`]).
pub(crate) fn root(ob: &Bound<'_, PyAny>) -> PyResult<usize> {
    rank_arg(ob, "root")
}

/// The `src` of a receive ([`rank_arg`]).
pub(crate) fn src(ob: &Bound<'_, PyAny>) -> PyResult<usize> {
    rank_arg(ob, "src")
}

/// The `dest` of a send ([`rank_arg`]).
pub(crate) fn dest(ob: &Bound<'_, PyAny>) -> PyResult<usize> {
    rank_arg(ob, "dest")
}
