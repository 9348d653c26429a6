//! Collectives on memory given by its address: the torch backend's path for one dense CPU tensor
//! (`tensor.data_ptr()`, `tensor.numel()`), which costs less than making a buffer object of the
//! tensor on every call (a numpy view costs more than a 4-byte all-reduce).

use kolo::DType;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::args::typed;
use crate::comm::PyCommunicator;
use crate::names::{dtype_name, parse_dtype, parse_op};

/// `count` elements of `T` at `address` as a slice, after checking what can be checked here
/// (not null, aligned, within `isize::MAX` bytes).
///
/// # Safety
/// The caller guarantees that `address` is the start of `count` writable elements of `T` that
/// stay alive, and that nothing else touches them, until the slice is dropped.
unsafe fn slice_at<'a, T>(address: usize, count: usize, dtype: DType) -> PyResult<&'a mut [T]> {
    if count == 0 {
        return Ok(&mut []);
    }
    let fits = count
        .checked_mul(std::mem::size_of::<T>())
        .is_some_and(|b| b <= isize::MAX as usize);
    if address == 0 || !address.is_multiple_of(std::mem::align_of::<T>()) || !fits {
        return Err(PyValueError::new_err(format!(
            "kolo: {count} elements of {} at address {address:#x} are not addressable memory",
            dtype_name(dtype)
        )));
    }
    // SAFETY: checked above (non-null, aligned, size); the caller vouches for the rest.
    Ok(unsafe { std::slice::from_raw_parts_mut(address as *mut T, count) })
}

impl PyCommunicator {
    /// All-reduces, blocking, `count` elements of `dtype` at `address`.
    ///
    /// Python reaches it as `_all_reduce_address`, a private method: the address must be the
    /// start of `count` elements of a live, contiguous CPU tensor that no other thread changes
    /// until the call returns (the torch backend passes its argument tensor's).
    pub(crate) fn all_reduce_address(
        &self,
        py: Python<'_>,
        address: usize,
        count: usize,
        dtype: &str,
        op: &str,
    ) -> PyResult<()> {
        let op = parse_op(op)?;
        let dt = parse_dtype(dtype)?;
        typed!(dt, T => {
            // SAFETY: the caller's promise (see above); the slice lives only for this call.
            let elements = unsafe { slice_at::<T>(address, count, dt)? };
            let at = elements.as_mut_ptr() as usize;
            self.blocking(py, move |c| {
                // SAFETY: the same memory, rebuilt on the thread that runs the call (a pointer
                // does not cross `detach`); still within the caller's call.
                let elements = unsafe { std::slice::from_raw_parts_mut(at as *mut T, count) };
                c.all_reduce(elements, op)
            })
        })
    }
}
