//! A Python object's buffer (PEP 3118), exported and held until dropped: what
//! [`crate::buffer`] reads element slices from. Unlike pyo3's `PyUntypedBuffer` it takes
//! zero-dimensional buffers (a numpy scalar array, `numpy.array(0)`, has no shape), which mpi4py
//! programs pass.

use std::ffi::CStr;
use std::os::raw::c_char;

use pyo3::ffi;
use pyo3::prelude::*;

/// An exported buffer; the exporter keeps its memory alive and in place until this is dropped
/// (dropping takes the GIL where it can; during the interpreter's finalization the export is
/// left as it is).
pub(crate) struct Export(Box<ffi::Py_buffer>);

// SAFETY: the export is only read (its fields) and released with the GIL held; the memory it
// describes is reached through `crate::buffer::Region` under that module's rules.
unsafe impl Send for Export {}

impl std::fmt::Debug for Export {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Export")
            .field("len", &self.0.len)
            .field("format", &self.format())
            .finish()
    }
}

impl Export {
    /// Exports `obj`'s buffer (strides, format, read-only allowed; the caller checks the rest).
    pub(crate) fn get(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        Export::get_with(obj, ffi::PyBUF_FULL_RO)
    }

    /// Exports `obj`'s buffer as C-contiguous bytes (writable when `write`), or `None` where the
    /// exporter cannot (then [`Export::get`] and the caller's checks say why): no format, shape
    /// or strides to fill in, which is cheaper for some exporters (numpy).
    pub(crate) fn get_contiguous(obj: &Bound<'_, PyAny>, write: bool) -> Option<Self> {
        let flags = ffi::PyBUF_ND | if write { ffi::PyBUF_WRITABLE } else { 0 };
        // The exporter's error is dropped (taken from the interpreter): the full export that
        // follows reports what is wrong.
        Export::get_with(obj, flags).ok()
    }

    fn get_with(obj: &Bound<'_, PyAny>, flags: std::os::raw::c_int) -> PyResult<Self> {
        let mut view = Box::<ffi::Py_buffer>::new_uninit();
        // SAFETY: `obj` is a live object (the GIL is held through `obj`'s `Python` token) and
        // `view` points to memory for one `Py_buffer`, which the call fills when it succeeds.
        let rc = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), view.as_mut_ptr(), flags) };
        if rc != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        // SAFETY: filled by the successful call above.
        Ok(Export(unsafe { view.assume_init() }))
    }

    /// The address of the first byte.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.0.buf.cast()
    }

    pub(crate) fn len_bytes(&self) -> usize {
        usize::try_from(self.0.len).unwrap_or(0)
    }

    pub(crate) fn item_size(&self) -> usize {
        usize::try_from(self.0.itemsize).unwrap_or(0)
    }

    pub(crate) fn readonly(&self) -> bool {
        self.0.readonly != 0
    }

    /// The `struct`-module format of one item (`B` when the exporter gives none).
    pub(crate) fn format(&self) -> &str {
        if self.0.format.is_null() {
            return "B";
        }
        // SAFETY: a non-null format is a NUL-terminated string owned by the export.
        unsafe { CStr::from_ptr(self.0.format) }
            .to_str()
            .unwrap_or("?")
    }

    pub(crate) fn is_c_contiguous(&self) -> bool {
        // SAFETY: the view was filled by `PyObject_GetBuffer` and is not released yet.
        unsafe { ffi::PyBuffer_IsContiguous(&*self.0, b'C' as c_char) != 0 }
    }
}

impl Drop for Export {
    fn drop(&mut self) {
        let view: *mut ffi::Py_buffer = &mut *self.0;
        let _ = Python::try_attach(|_| {
            // SAFETY: the view was filled by `PyObject_GetBuffer` and is released once, here,
            // with the GIL held.
            unsafe { ffi::PyBuffer_Release(view) }
        });
    }
}
