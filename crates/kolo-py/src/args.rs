//! What the communicator's methods share: the element-type dispatch and the buffers of
//! two-buffer operations.

use pyo3::prelude::*;

use crate::buffer::{hold, Held};
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
