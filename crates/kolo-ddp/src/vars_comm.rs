//! Communication of many variables at once, in one place: their values as one flat buffer
//! ([`Flat`]: flatten, one collective, scatter back), a broadcast of variables built on it
//! ([`broadcast_vars`]), and the check that all ranks hold the same variables
//! ([`check_same_vars`], with [`common_float_dtype`] for the type they share).
//!
//! [`Ddp`](crate::ddp::Ddp) broadcasts its parameters and buffers with these, the
//! [`ShardedOptimizer`](crate::optim::ShardedOptimizer) its updated shards,
//! [`checkpoint::broadcast_tensors`](crate::checkpoint::broadcast_tensors) a checkpoint's tensors,
//! and [`replicas::all_reduce_mean`](crate::replicas::all_reduce_mean) averages tensors.

use candle_core::{DType, Device, Shape, Tensor, Var, WithDType};
use kolo::{Communicator, Element};

use crate::error::{Result, TrainError};

/// The values of a list of tensors (or variables), flattened in order into one buffer of `T`
/// for a single collective, and cut back into tensors of their shapes afterwards.
#[derive(Debug, Clone)]
pub struct Flat<T> {
    values: Vec<T>,
    shapes: Vec<Shape>,
}

impl<T: Element + WithDType> Flat<T> {
    /// The values of `tensors`, in order, converted to `T`.
    pub fn of<'a>(tensors: impl IntoIterator<Item = &'a Tensor>) -> Result<Self> {
        let (mut values, mut shapes) = (Vec::new(), Vec::new());
        for t in tensors {
            values.extend(
                t.flatten_all()?
                    .to_dtype(<T as WithDType>::DTYPE)?
                    .to_vec1::<T>()?,
            );
            shapes.push(t.shape().clone());
        }
        Ok(Flat { values, shapes })
    }

    /// Zeros for tensors of `shapes`: the buffer of a rank that only receives.
    pub fn zeros(shapes: Vec<Shape>) -> Self {
        let len = shapes.iter().map(Shape::elem_count).sum();
        Flat {
            values: vec![T::zeroed(); len],
            shapes,
        }
    }

    /// The buffer, for the collective.
    pub fn values_mut(&mut self) -> &mut [T] {
        &mut self.values
    }

    /// The parts of the buffer, one per shape, in order.
    fn parts(&self) -> impl Iterator<Item = (&[T], &Shape)> {
        self.shapes.iter().scan(0, |at, shape| {
            let n = shape.elem_count();
            let part = self.values.get(*at..*at + n).unwrap_or_default();
            *at += n;
            Some((part, shape))
        })
    }

    /// The buffer cut back into tensors of type `T` on `device`, one per shape.
    pub fn tensors(&self, device: &Device) -> Result<Vec<Tensor>> {
        self.parts()
            .map(|(part, shape)| Ok(Tensor::from_slice(part, shape, device)?))
            .collect()
    }

    /// Writes the buffer back into `vars` (one per shape, in order), each in its own type and on
    /// its own device.
    pub fn set_vars<'a>(&self, vars: impl IntoIterator<Item = &'a Var>) -> Result<()> {
        for ((part, shape), var) in self.parts().zip(vars) {
            if var.shape() != shape {
                return Err(TrainError::Unsupported {
                    what: format!(
                        "writing values of shape {shape:?} into a variable of shape {:?}",
                        var.shape()
                    ),
                });
            }
            let t = Tensor::from_slice(part, shape, var.device())?;
            var.set(&t.to_dtype(var.dtype())?)?;
        }
        Ok(())
    }
}

/// Copies the values of `vars` on rank `root` into `vars` on every rank, as one flat broadcast
/// in `T` (the root sends, the others receive). Every rank passes variables of the same shapes.
pub fn broadcast_vars<T: Element + WithDType>(
    comm: &Communicator,
    vars: &[&Var],
    root: usize,
) -> Result<()> {
    if comm.size() <= 1 || vars.is_empty() {
        return Ok(());
    }
    let mut flat = if comm.rank() == root {
        Flat::<T>::of(vars.iter().map(|v| v.as_tensor()))?
    } else {
        Flat::zeros(vars.iter().map(|v| v.shape().clone()).collect())
    };
    comm.broadcast(flat.values_mut(), root)?;
    if comm.rank() != root {
        flat.set_vars(vars.iter().copied())?;
    }
    Ok(())
}

/// The type all of `vars` share, f32 or f64 (f32 for none); otherwise
/// [`TrainError::Unsupported`] naming them as `noun`s (e.g. "parameter").
pub fn common_float_dtype(vars: &[(String, Var)], noun: &str) -> Result<DType> {
    let dtype = vars.first().map_or(DType::F32, |(_, v)| v.dtype());
    if !matches!(dtype, DType::F32 | DType::F64) {
        return Err(TrainError::Unsupported {
            what: format!("{noun}s of type {dtype:?} (f32 and f64 are supported)"),
        });
    }
    if let Some((n, v)) = vars.iter().find(|(_, v)| v.dtype() != dtype) {
        return Err(TrainError::Unsupported {
            what: format!("{noun} {n} is {:?} while others are {dtype:?}", v.dtype()),
        });
    }
    Ok(dtype)
}

/// A variable's name, shape and type, as ranks compare them.
type Signature = Vec<(String, Vec<usize>, String)>;

fn signature(vars: &[(String, Var)]) -> Signature {
    vars.iter()
        .map(|(n, v)| (n.clone(), v.dims().to_vec(), format!("{:?}", v.dtype())))
        .collect()
}

/// Checks that every rank passes the same variables (names, shapes and types, in order): a
/// collective. The first difference between rank 0's and another rank's is
/// [`TrainError::ModelMismatch`] on every rank, naming the variables as `noun`s (e.g.
/// "parameter").
pub fn check_same_vars(comm: &Communicator, vars: &[(String, Var)], noun: &str) -> Result<()> {
    let everyone: Vec<Signature> = comm.all_gather_object(&signature(vars))?;
    for (rank, sig) in everyone.iter().enumerate().skip(1) {
        if let Some(e) = compare(rank, &everyone[0], sig, noun) {
            return Err(e);
        }
    }
    Ok(())
}

/// The first difference between rank 0's and `rank`'s variables.
fn compare(rank: usize, want: &Signature, got: &Signature, noun: &str) -> Option<TrainError> {
    let mismatch = |what: String, expected: String, actual: String| TrainError::ModelMismatch {
        rank,
        what,
        expected,
        actual,
    };
    for i in 0..want.len().max(got.len()) {
        match (want.get(i), got.get(i)) {
            (Some(a), Some(b)) if a.0 != b.0 => {
                return Some(mismatch(
                    format!("{noun} #{i} has another name"),
                    a.0.clone(),
                    b.0.clone(),
                ))
            }
            (Some(a), Some(b)) if a.1 != b.1 => {
                return Some(mismatch(
                    format!("{noun} {} has another shape", a.0),
                    format!("{:?}", a.1),
                    format!("{:?}", b.1),
                ))
            }
            (Some(a), Some(b)) if a.2 != b.2 => {
                return Some(mismatch(
                    format!("{noun} {} has another type", a.0),
                    a.2.clone(),
                    b.2.clone(),
                ))
            }
            (Some(a), None) => {
                return Some(mismatch(
                    format!("lacks {noun} {}", a.0),
                    a.0.clone(),
                    "nothing".into(),
                ))
            }
            (None, Some(b)) => {
                return Some(mismatch(
                    format!("has an extra {noun} {}", b.0),
                    "nothing".into(),
                    b.0.clone(),
                ))
            }
            _ => {}
        }
    }
    None
}

/// Whether every rank of `comm` holds bit for bit the same values of `vars` (`None` when there are
/// none): [`differing_ranks`] found none. A collective.
pub fn same_on_every_rank(comm: &Communicator, vars: &[(String, Var)]) -> Result<Option<bool>> {
    if vars.is_empty() {
        return Ok(None);
    }
    Ok(Some(differing_ranks(comm, vars)?.is_none()))
}

/// A fingerprint of `t`'s values, bit for bit: each value's bits mixed with its position, summed.
/// Two tensors whose values differ anywhere (a last bit included) get different fingerprints
/// but for a chance of 2⁻⁶⁴.
pub fn fingerprint(t: &Tensor) -> Result<u64> {
    let t = t.flatten_all()?;
    match t.dtype() {
        DType::F32 => fold_bits(&t, |x: f32| x.to_bits().into()),
        DType::F64 => fold_bits(&t, f64::to_bits),
        DType::BF16 => fold_bits(&t, |x: half::bf16| x.to_bits().into()),
        DType::F16 => fold_bits(&t, |x: half::f16| x.to_bits().into()),
        DType::U8 => fold_bits(&t, |x: u8| x.into()),
        DType::U32 => fold_bits(&t, |x: u32| x.into()),
        DType::I64 => fold_bits(&t, |x: i64| x as u64),
        _ => fold_bits(&t.to_dtype(DType::F64)?, f64::to_bits),
    }
}

/// The sum over `t`'s values (one dimension, of type `T`) of their `bits` mixed with their
/// position.
fn fold_bits<T: WithDType>(t: &Tensor, bits: impl Fn(T) -> u64) -> Result<u64> {
    let values = t.to_vec1::<T>()?;
    Ok(values.into_iter().enumerate().fold(0u64, |sum, (i, x)| {
        sum.wrapping_add(mix(bits(x) ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)))
    }))
}

/// splitmix64's finalizer: every input bit changes about half of the output's.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Where the ranks' values of `vars` differ from rank 0's: the ranks that differ (in rank
/// order) and the first variable (in `vars`' order) in which the first of them does; `None`
/// where every rank holds bit for bit the same values. One all-gather of a fingerprint per
/// variable ([`fingerprint`]). A collective: every rank passes the same list of variables (the
/// same count; [`check_same_vars`] checks names and shapes).
pub fn differing_ranks(
    comm: &Communicator,
    vars: &[(String, Var)],
) -> Result<Option<(Vec<usize>, String)>> {
    let mine = vars
        .iter()
        .map(|(_, v)| fingerprint(v.as_tensor()).map(|f| f as i64))
        .collect::<Result<Vec<i64>>>()?;
    let n = mine.len();
    if n == 0 {
        return Ok(None);
    }
    let mut all = vec![0i64; n * comm.size()];
    comm.all_gather(&mine, &mut all)?;
    let row = |r: usize| &all[r * n..(r + 1) * n];
    let ranks: Vec<usize> = (1..comm.size()).filter(|&r| row(r) != row(0)).collect();
    let Some(&first) = ranks.first() else {
        return Ok(None);
    };
    let i = (0..n).find(|&i| row(first)[i] != row(0)[i]).unwrap_or(0);
    Ok(Some((ranks, vars[i].0.clone())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fingerprint_changes_with_any_bit_and_any_order() -> Result<()> {
        let dev = Device::Cpu;
        let values = [1.5f32, -2.25, 3.0, 0.0];
        let f = |v: &[f32], dtype: DType| -> Result<u64> {
            fingerprint(&Tensor::new(v, &dev)?.to_dtype(dtype)?)
        };
        for dtype in [DType::F32, DType::BF16, DType::F16, DType::F64] {
            let base = f(&values, dtype)?;
            assert_eq!(base, f(&values, dtype)?, "{dtype:?}: the same values");
            let swapped = [values[1], values[0], values[2], values[3]];
            assert_ne!(base, f(&swapped, dtype)?, "{dtype:?}: two values swapped");
            let shaped = Tensor::new(&values, &dev)?
                .reshape((2, 2))?
                .to_dtype(dtype)?;
            assert_eq!(
                base,
                fingerprint(&shaped)?,
                "{dtype:?}: the shape is not hashed"
            );
        }
        let last_bit = [
            values[0],
            values[1],
            f32::from_bits(3f32.to_bits() ^ 1),
            0.0,
        ];
        assert_ne!(f(&values, DType::F32)?, f(&last_bit, DType::F32)?);
        assert_ne!(
            f(&values, DType::F32)?,
            f(&[1.5, -2.25, 3.0, -0.0], DType::F32)?
        );
        Ok(())
    }
}
