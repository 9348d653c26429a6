//! Python buffers (numpy arrays, `bytearray`, `memoryview`, `mmap`, `array.array`, a torch
//! tensor's numpy view) as kolo's element slices: their element type read from the buffer's format,
//! checked to be C-contiguous, aligned and (where kolo writes) writable, and held so that their
//! memory stays put while a collective runs — as [`Target`] (written in place, or received into),
//! [`Source`] (read) and [`Reduced`] (a reduction's), kolo's [`CollectiveBuffer`]s, which kolo owns
//! while an asynchronous collective runs and hands back when it completes. A `(buffer,
//! byte_offset, count)` tuple stands for part of a buffer (kolo.MPI's `[buf, count, datatype]`):
//! only that part is read or written, in place.

use std::cell::OnceCell;
use std::marker::PhantomData;

use kolo::{CollectiveBuffer, DType, Element};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::export::Export;
use crate::names::{dtype_list, dtype_name};

/// A held buffer: the exporter cannot free or move the memory until this is dropped (dropping
/// takes the GIL where it can; during the interpreter's finalization the export is left as it
/// is). `None` stands for an absent buffer (a non-root rank's), an empty region.
#[derive(Debug)]
pub(crate) struct Held {
    // Kept for its `Drop` (releases the export); the memory is reached through `region`.
    _buf: Option<Export>,
    pub(crate) region: Region,
    /// Whether kolo may write into it (held for writing, or absent).
    writable: bool,
}

/// The memory of a held buffer: `count` elements of `dtype` at `ptr`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Region {
    ptr: *mut u8,
    pub(crate) count: usize,
    pub(crate) dtype: DType,
}

// SAFETY: a `Region` is only dereferenced through the `Target` or `Source` that holds its buffer
// (or, for `overlaps`, not at all), so the memory is valid wherever it is sent.
unsafe impl Send for Region {}

impl Region {
    /// An empty region (a non-root rank's absent buffer).
    fn empty(dtype: DType) -> Region {
        Region {
            ptr: std::ptr::NonNull::<u64>::dangling().as_ptr().cast(),
            count: 0,
            dtype,
        }
    }

    fn bytes(&self) -> usize {
        self.count * self.dtype.size()
    }

    /// Whether this region is exactly the `count` elements of `whole` from element `at` on.
    pub(crate) fn is_part_of(&self, whole: &Region, at: usize) -> bool {
        let size = self.dtype.size();
        self.dtype == whole.dtype
            && at + self.count <= whole.count
            && self.ptr as usize == whole.ptr as usize + at * size
    }

    /// Whether the two regions share memory.
    fn overlaps(&self, other: &Region) -> bool {
        let (a, b) = (self.ptr as usize, other.ptr as usize);
        self.bytes() > 0 && other.bytes() > 0 && a < b + other.bytes() && b < a + self.bytes()
    }

    /// The elements.
    ///
    /// # Safety
    /// The buffer must be held for `'a`, `T` must be `self.dtype`'s type, and no `&mut` to the
    /// memory may be alive.
    unsafe fn slice<'a, T: Element>(self) -> &'a [T] {
        debug_assert_eq!(T::DTYPE, self.dtype);
        // SAFETY: per this function's contract; alignment and length were checked by `hold`.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<T>(), self.count) }
    }

    /// The elements, to write.
    ///
    /// # Safety
    /// As [`Region::slice`], the buffer held for writing, and no other reference to the memory
    /// alive.
    unsafe fn slice_mut<'a, T: Element>(self) -> &'a mut [T] {
        debug_assert_eq!(T::DTYPE, self.dtype);
        // SAFETY: per this function's contract; the buffer was exported writable.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.cast::<T>(), self.count) }
    }
}

/// Checks that `T` is the element type of `h` (the `typed!` dispatch makes it so).
fn of_type<T: Element>(h: &Held) -> PyResult<()> {
    if T::DTYPE == h.region.dtype {
        Ok(())
    } else {
        Err(PyRuntimeError::new_err(format!(
            "internal: a buffer of {} taken as {}",
            dtype_name(h.region.dtype),
            dtype_name(T::DTYPE)
        )))
    }
}

/// A held buffer of `T` kolo writes: an in-place collective's, or a receive buffer. It holds the
/// Python object's export, so the memory stays alive and in place for as long as kolo owns it.
#[derive(Debug)]
pub(crate) struct Target<T> {
    held: Held,
    _t: PhantomData<fn() -> T>,
}

impl<T: Element> Target<T> {
    pub(crate) fn new(held: Held) -> PyResult<Self> {
        of_type::<T>(&held)?;
        if !held.writable {
            return Err(PyRuntimeError::new_err(
                "internal: a buffer held for reading taken as one kolo writes",
            ));
        }
        Ok(Target {
            held,
            _t: PhantomData,
        })
    }
}

impl<T: Element> CollectiveBuffer for Target<T> {
    type Elem = T;

    fn elements(&self) -> &[T] {
        // SAFETY: `held` keeps the export (and so the memory) alive while `self` is borrowed; the
        // type was checked in `new`; this `Target` is the only Rust handle on the memory (a
        // `Source` that shares it reads a copy, see there).
        unsafe { self.held.region.slice::<T>() }
    }

    fn elements_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `elements`, and the buffer was held for writing (checked in `new`).
        unsafe { self.held.region.slice_mut::<T>() }
    }
}

/// A held buffer of `T` kolo reads: a send buffer. Where it shares memory with the operation's
/// receive buffer (an all-gather whose input is this rank's slot of the output), kolo reads a
/// copy, taken when the operation starts reading it (after every operation issued before it), so
/// that the receive buffer's `&mut` never aliases it.
#[derive(Debug)]
pub(crate) struct Source<T> {
    held: Held,
    /// Whether to read a copy (the memory is also the receive buffer's).
    copied: bool,
    copy: OnceCell<Vec<T>>,
}

impl<T: Element> Source<T> {
    /// The send buffer of an operation whose receive buffer is `recv`.
    pub(crate) fn new(held: Held, recv: &Region) -> PyResult<Self> {
        of_type::<T>(&held)?;
        let copied = held.region.overlaps(recv);
        Ok(Source {
            held,
            copied,
            copy: OnceCell::new(),
        })
    }

    /// The send buffer of an operation without a receive buffer.
    pub(crate) fn alone(held: Held) -> PyResult<Self> {
        let nothing = Region::empty(held.region.dtype);
        Source::new(held, &nothing)
    }

    /// The held buffer, given back.
    pub(crate) fn into_held(self) -> Held {
        self.held
    }

    fn memory(&self) -> &[T] {
        // SAFETY: `held` keeps the memory alive while `self` is borrowed; the type was checked in
        // `new`; kolo writes into no buffer that shares it without this `Source` reading a copy.
        unsafe { self.held.region.slice::<T>() }
    }
}

impl<T: Element> CollectiveBuffer for Source<T> {
    type Elem = T;

    fn elements(&self) -> &[T] {
        if self.copied {
            self.copy.get_or_init(|| self.memory().to_vec())
        } else {
            self.memory()
        }
    }

    /// A copy: kolo writes into no send buffer, and a read-only export must not be written.
    fn elements_mut(&mut self) -> &mut [T] {
        if self.copy.get().is_none() {
            let v = self.memory().to_vec();
            let _ = self.copy.set(v);
        }
        self.copy
            .get_mut()
            .map(Vec::as_mut_slice)
            .unwrap_or_default()
    }
}

/// The buffer of a reduction, reduced in place: the caller's (a send buffer, if given, copied
/// into it first), or, without one, a copy of the send buffer in memory of kolo's (a non-root
/// rank's reduce, which leaves its send buffer as it was).
#[derive(Debug)]
pub(crate) enum Reduced<T> {
    Held(Target<T>),
    Owned(Vec<T>),
}

impl<T: Element> Reduced<T> {
    /// From the held `buf` and `send` (see [`reduced`]).
    pub(crate) fn new(buf: Option<Held>, send: Option<Held>) -> PyResult<Self> {
        match (buf, send) {
            (Some(b), None) => Ok(Reduced::Held(Target::new(b)?)),
            (Some(b), Some(s)) => {
                let mut target = Target::<T>::new(b)?;
                // A copy of `send` is read where it shares memory with `buf`.
                let source = Source::<T>::new(s, &target.held.region)?;
                let (from, to) = (source.elements(), target.elements_mut());
                if from.len() != to.len() {
                    return Err(PyValueError::new_err(format!(
                        "send: {} elements, and the receive buffer holds {}: a reduction's \
                         buffers have one count",
                        from.len(),
                        to.len()
                    )));
                }
                to.copy_from_slice(from);
                Ok(Reduced::Held(target))
            }
            (None, Some(s)) => Ok(Reduced::Owned(Source::<T>::alone(s)?.elements().to_vec())),
            (None, None) => Err(PyValueError::new_err(
                "a reduction needs a buffer: buf, send or both",
            )),
        }
    }
}

impl<T: Element> CollectiveBuffer for Reduced<T> {
    type Elem = T;

    fn elements(&self) -> &[T] {
        match self {
            Reduced::Held(t) => t.elements(),
            Reduced::Owned(v) => v,
        }
    }

    fn elements_mut(&mut self) -> &mut [T] {
        match self {
            Reduced::Held(t) => t.elements_mut(),
            Reduced::Owned(v) => v,
        }
    }
}

/// Holds a reduction's buffers: `buf` (written) and `send` (read, of `buf`'s element type), of
/// which at least one is given; and their element type.
pub(crate) fn reduced(
    buf: Option<&Bound<'_, PyAny>>,
    send: Option<&Bound<'_, PyAny>>,
    dtype: Option<DType>,
) -> PyResult<(Option<Held>, Option<Held>, DType)> {
    let h = buf.map(|b| hold(b, dtype, "buf", true)).transpose()?;
    let dt = h.as_ref().map(|h| h.region.dtype).or(dtype);
    let hs = send.map(|s| hold(s, dt, "send", false)).transpose()?;
    match h.as_ref().or(hs.as_ref()).map(|h| h.region.dtype) {
        Some(dt) => Ok((h, hs, dt)),
        None => Err(PyValueError::new_err(
            "a reduction needs a buffer: buf, send or both",
        )),
    }
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

/// Part of a buffer: `count` elements (all from `offset` on, when `None`) from byte `offset`.
#[derive(Debug, Clone, Copy)]
struct Span {
    offset: usize,
    count: Option<usize>,
}

/// `obj` as (the object with the buffer, the span of it given): a `(buffer, byte_offset, count)`
/// tuple names part of a buffer (how kolo.MPI passes mpi4py's `[buf, count, datatype]`), any
/// other object is the whole of itself.
fn split_span<'py>(
    obj: &Bound<'py, PyAny>,
    arg: &str,
) -> PyResult<(Bound<'py, PyAny>, Option<Span>)> {
    let Ok(t) = obj.cast::<PyTuple>() else {
        return Ok((obj.clone(), None));
    };
    if t.len() != 3 {
        return Err(PyTypeError::new_err(format!(
            "{arg}: a part of a buffer is (buffer, byte offset, count), got a tuple of {} items",
            t.len()
        )));
    }
    let offset = t.get_item(1)?.extract::<usize>().map_err(|e| {
        PyValueError::new_err(format!("{arg}: the byte offset must be an int >= 0: {e}"))
    })?;
    let count = t.get_item(2)?.extract::<Option<usize>>().map_err(|e| {
        PyValueError::new_err(format!("{arg}: the count must be an int >= 0 or None: {e}"))
    })?;
    Ok((t.get_item(0)?, Some(Span { offset, count })))
}

/// Holds `obj`'s buffer as argument `arg` of an operation: C-contiguous, of a kolo element type
/// (the format's, or `dtype` where given and compatible), aligned, and writable when `write`.
/// A `(buffer, byte_offset, count)` tuple holds `count` elements from `byte_offset` on (`None`:
/// the rest of the buffer); its memory is read as `dtype` whatever the buffer's format (the
/// caller says what the bytes are, as an MPI datatype does), the format's type without `dtype`.
pub(crate) fn hold(
    obj: &Bound<'_, PyAny>,
    dtype: Option<DType>,
    arg: &str,
    write: bool,
) -> PyResult<Held> {
    let (obj, span) = split_span(obj, arg)?;
    hold_span(&obj, span, dtype, arg, write)
}

/// [`hold`] of `count` bytes (`None`: all) from the start of `obj`'s buffer, read as bytes: the
/// `(obj, 0, count)` form without the tuple.
pub(crate) fn hold_bytes(
    obj: &Bound<'_, PyAny>,
    count: Option<usize>,
    arg: &str,
    write: bool,
) -> PyResult<Held> {
    let span = Some(Span { offset: 0, count });
    hold_span(obj, span, Some(DType::U8), arg, write)
}

/// [`hold`] of `obj`'s buffer, or of its part `span`.
fn hold_span(
    obj: &Bound<'_, PyAny>,
    span: Option<Span>,
    dtype: Option<DType>,
    arg: &str,
    write: bool,
) -> PyResult<Held> {
    // A part of a buffer read as a given type (kolo.MPI's form) needs no format: the cheaper
    // export of contiguous bytes first.
    let quick = match (dtype, span) {
        (Some(_), Some(_)) => Export::get_contiguous(obj, write),
        _ => None,
    };
    let buf = quick.map_or_else(|| Export::get(obj), Ok).map_err(|e| {
        PyTypeError::new_err(format!(
            "{arg}: expected an object with the buffer protocol (a numpy array, bytearray, \
             memoryview, array.array; torch tensors through kolo.torch), got {}: {e}",
            type_name(obj)
        ))
    })?;
    let dtype = match (dtype, span) {
        (Some(d), Some(_)) => d,
        (d, _) => buffer_dtype(&buf, d, arg)?,
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
    let (offset, count) = match span {
        None => (0, buf.len_bytes() / dtype.size()),
        Some(s) => span_elements(s, buf.len_bytes(), dtype, arg)?,
    };
    if count == 0 {
        // An empty buffer's pointer may be anything; nothing is read or written through it.
        return Ok(Held {
            _buf: Some(buf),
            region: Region::empty(dtype),
            writable: write,
        });
    }
    // In bounds: `span_elements` checked `offset + count * size <= len`.
    let ptr = buf.ptr().wrapping_add(offset);
    if !(ptr as usize).is_multiple_of(dtype.size()) {
        return Err(PyValueError::new_err(format!(
            "{arg}: the buffer's memory (at byte offset {offset}) is not aligned to its {}-byte \
             elements",
            dtype.size()
        )));
    }
    Ok(Held {
        _buf: Some(buf),
        region: Region { ptr, count, dtype },
        writable: write,
    })
}

/// The element type of `buf`: its format's, or `dtype` where given and compatible.
fn buffer_dtype(buf: &Export, dtype: Option<DType>, arg: &str) -> PyResult<DType> {
    let format = buf.format();
    let item = buf.item_size();
    match dtype {
        Some(d) if reinterpretable(format, item, d) => Ok(d),
        Some(d) => Err(PyTypeError::new_err(format!(
            "{arg}: a buffer of format {format:?} ({item}-byte items) cannot be read as {}",
            dtype_name(d)
        ))),
        None => format_dtype(format, item).ok_or_else(|| {
            PyTypeError::new_err(format!(
                "{arg}: unsupported element type (buffer format {format:?}, {item}-byte items): \
                 kolo reduces {}",
                dtype_list()
            ))
        }),
    }
}

/// The (byte offset, element count) of span `s` of a buffer of `len` bytes, checked to lie
/// inside it.
fn span_elements(s: Span, len: usize, dtype: DType, arg: &str) -> PyResult<(usize, usize)> {
    let size = dtype.size();
    let rest = len.checked_sub(s.offset).ok_or_else(|| {
        PyValueError::new_err(format!(
            "{arg}: byte offset {} is past the end of the buffer ({len} bytes)",
            s.offset
        ))
    })?;
    let count = match s.count {
        Some(c) => c,
        None if rest % size == 0 => rest / size,
        None => {
            return Err(PyValueError::new_err(format!(
                "{arg}: the {rest} bytes from byte offset {} are not a whole number of {}-byte \
                 elements",
                s.offset, size
            )))
        }
    };
    match count.checked_mul(size) {
        Some(bytes) if bytes <= rest => Ok((s.offset, count)),
        _ => Err(PyValueError::new_err(format!(
            "{arg}: {count} elements of {size} bytes from byte offset {} do not fit in the \
             buffer ({len} bytes)",
            s.offset
        ))),
    }
}

/// Holds an optional buffer: `None` (a non-root rank's) is an empty region of `dtype`.
pub(crate) fn hold_opt(
    obj: Option<&Bound<'_, PyAny>>,
    dtype: DType,
    arg: &str,
    write: bool,
) -> PyResult<Held> {
    match obj {
        None => Ok(Held {
            _buf: None,
            region: Region::empty(dtype),
            writable: true,
        }),
        Some(o) => hold(o, Some(dtype), arg, write),
    }
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}
