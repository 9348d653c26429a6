//! Python buffers (numpy arrays, `bytearray`, `memoryview`, `array.array`, a torch tensor's numpy
//! view) as kolo's element slices: their element type read from the buffer's format, checked to
//! be C-contiguous, aligned and (where kolo writes) writable, and held so that their memory stays
//! put while a collective runs.

use kolo::DType;
use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

/// A held buffer: the exporter cannot free or move the memory until this is dropped (dropping
/// takes the GIL, so drop it where the GIL is held or can be taken).
#[derive(Debug)]
pub(crate) struct Held {
    // Kept for its `Drop` (releases the export); the memory is reached through `region`.
    _buf: PyUntypedBuffer,
    pub(crate) region: Region,
}

/// The memory of a held buffer: `count` elements of `dtype` at `ptr`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Region {
    ptr: *mut u8,
    pub(crate) count: usize,
    pub(crate) dtype: DType,
}

// SAFETY: a `Region` is only dereferenced while the buffer it came from is held (the `Held` is
// moved into the same job, or the calling thread waits for the job), and kolo's jobs run one at
// a time, so the memory is valid wherever the region is sent.
unsafe impl Send for Region {}

impl Region {
    /// An empty region (a non-root rank's absent buffer).
    pub(crate) fn empty(dtype: DType) -> Region {
        Region {
            ptr: std::ptr::NonNull::<u64>::dangling().as_ptr().cast(),
            count: 0,
            dtype,
        }
    }

    fn bytes(&self) -> usize {
        self.count * self.dtype.size()
    }

    /// Whether the two regions share memory.
    pub(crate) fn overlaps(&self, other: &Region) -> bool {
        let (a, b) = (self.ptr as usize, other.ptr as usize);
        self.bytes() > 0 && other.bytes() > 0 && a < b + other.bytes() && b < a + self.bytes()
    }

    /// The elements.
    ///
    /// # Safety
    /// The buffer must be held, `T` must be `self.dtype`'s type (checked: a mismatch is a
    /// panic-free error upstream, here an assertion in debug builds), and no `&mut` to it may be
    /// alive.
    pub(crate) unsafe fn slice<'a, T: kolo::Element>(self) -> &'a [T] {
        debug_assert_eq!(T::DTYPE, self.dtype);
        // SAFETY: per this function's contract; alignment and length were checked by `hold`.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<T>(), self.count) }
    }

    /// The elements, to write.
    ///
    /// # Safety
    /// As [`Region::slice`], and no other reference to the memory may be alive.
    pub(crate) unsafe fn slice_mut<'a, T: kolo::Element>(self) -> &'a mut [T] {
        debug_assert_eq!(T::DTYPE, self.dtype);
        // SAFETY: per this function's contract; the buffer was exported writable.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.cast::<T>(), self.count) }
    }
}

/// kolo's element type named `name` (`float32`/`f32`, `float64`, `float16`, `bfloat16`, `int32`,
/// `int64`, `uint8`).
pub(crate) fn parse_dtype(name: &str) -> PyResult<DType> {
    Ok(match name.trim().to_ascii_lowercase().as_str() {
        "f32" | "float32" | "float" => DType::F32,
        "f64" | "float64" | "double" => DType::F64,
        "f16" | "float16" | "half" => DType::F16,
        "bf16" | "bfloat16" => DType::BF16,
        "i32" | "int32" => DType::I32,
        "i64" | "int64" | "long" => DType::I64,
        "u8" | "uint8" => DType::U8,
        other => {
            return Err(PyTypeError::new_err(format!(
                "unsupported element type {other:?}: kolo reduces float32, float64, float16, \
                 bfloat16, int32, int64 and uint8"
            )))
        }
    })
}

/// The element type of a buffer format (`struct` module syntax, one item), or `None`.
fn format_dtype(format: &str, item_size: usize) -> Option<DType> {
    let code = format.trim_start_matches(['@', '=', '<', '>', '!']);
    // Byte order other than native is not kolo's to convert.
    if format.starts_with(['>', '!']) && cfg!(target_endian = "little") {
        return None;
    }
    Some(match (code, item_size) {
        ("f", 4) => DType::F32,
        ("d", 8) => DType::F64,
        ("e", 2) => DType::F16,
        ("i" | "l", 4) => DType::I32,
        ("q" | "l" | "n", 8) => DType::I64,
        ("B" | "c", 1) => DType::U8,
        _ => return None,
    })
}

/// Whether a buffer of `format` may be read as `wanted` (an explicit element type): the same
/// type, or 16-bit items read as float16/bfloat16 (how a torch bfloat16 tensor reaches numpy:
/// `t.view(torch.int16).numpy()`).
fn reinterpretable(format: &str, item_size: usize, wanted: DType) -> bool {
    let code = format.trim_start_matches(['@', '=', '<']);
    match wanted {
        DType::F16 | DType::BF16 => matches!((code, item_size), ("e" | "h" | "H", 2)),
        other => format_dtype(format, item_size) == Some(other),
    }
}

/// Holds `obj`'s buffer as argument `arg` of an operation: C-contiguous, of a kolo element type
/// (the format's, or `dtype` where given and compatible), aligned, and writable when `write`.
pub(crate) fn hold(
    obj: &Bound<'_, PyAny>,
    dtype: Option<DType>,
    arg: &str,
    write: bool,
) -> PyResult<Held> {
    let buf = PyUntypedBuffer::get(obj).map_err(|e| {
        PyTypeError::new_err(format!(
            "{arg}: expected an object with the buffer protocol (a numpy array, bytearray, \
             memoryview, array.array; torch tensors through kolo.torch), got {}: {e}",
            type_name(obj)
        ))
    })?;
    let format = buf.format().to_string_lossy().into_owned();
    let item = buf.item_size();
    let dtype = match dtype {
        Some(d) if reinterpretable(&format, item, d) => d,
        Some(d) => {
            return Err(PyTypeError::new_err(format!(
                "{arg}: a buffer of format {format:?} ({item}-byte items) cannot be read as {}",
                d.name()
            )))
        }
        None => format_dtype(&format, item).ok_or_else(|| {
            PyTypeError::new_err(format!(
                "{arg}: unsupported element type (buffer format {format:?}, {item}-byte items): \
                 kolo reduces float32, float64, float16, bfloat16, int32, int64 and uint8"
            ))
        })?,
    };
    if !buf.is_c_contiguous() {
        return Err(PyValueError::new_err(format!(
            "{arg}: the buffer is not C-contiguous (a strided view or a transposed array): pass \
             a contiguous copy (numpy.ascontiguousarray, tensor.contiguous())"
        )));
    }
    if write && buf.readonly() {
        return Err(PyValueError::new_err(format!(
            "{arg}: the buffer is read-only, and kolo writes the result into it"
        )));
    }
    let count = buf.len_bytes() / dtype.size();
    if count == 0 {
        // An empty buffer's pointer may be anything; nothing is read or written through it.
        return Ok(Held {
            _buf: buf,
            region: Region::empty(dtype),
        });
    }
    let ptr = buf.buf_ptr().cast::<u8>();
    if (ptr as usize) % dtype.size() != 0 {
        return Err(PyValueError::new_err(format!(
            "{arg}: the buffer's memory is not aligned to its {}-byte elements",
            dtype.size()
        )));
    }
    Ok(Held {
        _buf: buf,
        region: Region { ptr, count, dtype },
    })
}

/// Holds an optional buffer: `None` (a non-root rank's) is an empty region of `dtype`.
pub(crate) fn hold_opt(
    obj: Option<&Bound<'_, PyAny>>,
    dtype: DType,
    arg: &str,
    write: bool,
) -> PyResult<(Option<Held>, Region)> {
    match obj {
        None => Ok((None, Region::empty(dtype))),
        Some(o) => {
            let h = hold(o, Some(dtype), arg, write)?;
            let r = h.region;
            Ok((Some(h), r))
        }
    }
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}
