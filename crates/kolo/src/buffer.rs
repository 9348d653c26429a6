//! [`CollectiveBuffer`]: what an asynchronous collective takes and gives back. The collective owns
//! the buffer while it runs on the communicator's worker thread and returns it from
//! [`Work::wait`](crate::Work::wait): a `Vec<T>` or `Box<[T]>`, or memory kolo cannot own itself —
//! a Python buffer, a pinned or registered allocation, a slice of a larger arena — behind a type
//! that keeps it alive and in place until then (the caller's promise, made once in that type's
//! implementation instead of at every call).

use kolo_core::Element;

/// A buffer of `Elem` an asynchronous collective can own while it runs.
///
/// ```
/// # use kolo::{CollectiveBuffer, Config, ReduceOp};
/// /// Gradients that live in a bigger arena, reduced a part at a time.
/// struct Part { arena: Vec<f32>, range: std::ops::Range<usize> }
///
/// impl CollectiveBuffer for Part {
///     type Elem = f32;
///     fn elements(&self) -> &[f32] { &self.arena[self.range.clone()] }
///     fn elements_mut(&mut self) -> &mut [f32] { &mut self.arena[self.range.clone()] }
/// }
///
/// let out = kolo::run_local(2, Config::default(), |comm| {
///     let part = Part { arena: vec![1.0; 8], range: 2..6 };
///     comm.all_reduce_async(part, ReduceOp::Sum).wait().map(|p| p.arena)
/// });
/// assert_eq!(out[0].as_ref().unwrap().as_ref().unwrap(), &[1., 1., 2., 2., 2., 2., 1., 1.]);
/// ```
pub trait CollectiveBuffer: Send + 'static {
    /// The element type.
    type Elem: Element;
    /// The elements the collective reads.
    fn elements(&self) -> &[Self::Elem];
    /// The elements the collective writes (in-place collectives and receive buffers).
    fn elements_mut(&mut self) -> &mut [Self::Elem];
}

impl<T: Element> CollectiveBuffer for Vec<T> {
    type Elem = T;

    fn elements(&self) -> &[T] {
        self
    }

    fn elements_mut(&mut self) -> &mut [T] {
        self
    }
}

impl<T: Element> CollectiveBuffer for Box<[T]> {
    type Elem = T;

    fn elements(&self) -> &[T] {
        self
    }

    fn elements_mut(&mut self) -> &mut [T] {
        self
    }
}
