//! The learning rate every rank must step with alike, checked on the last all-reduce of each
//! averaged pass (the used-parameter flags, a byte each, `ReduceOp::Max`), with no collective of
//! its own: each rank appends the rate's 8 bytes and their complements. The maxima of the two give
//! every byte's maximum and minimum over the ranks, equal only where every rank passed the same
//! bits. A rank without a rate to check (a rank in join mode shadowing the others' steps, a loop
//! that never set one) appends zeros, which change neither maximum.

use kolo::Communicator;

use crate::error::{Result, TrainError};

/// The bytes appended to the flags.
pub(super) const BYTES: usize = 16;

/// Appends `lr`'s bytes and their complements to `flags` (zeros without a rate).
pub(super) fn append(flags: &mut Vec<u8>, lr: Option<f64>) {
    match lr {
        Some(lr) => {
            let bits = lr.to_bits().to_le_bytes();
            flags.extend_from_slice(&bits);
            flags.extend(bits.iter().map(|b| !b));
        }
        None => flags.extend_from_slice(&[0; BYTES]),
    }
}

/// Whether the reduced tail (the last [`BYTES`] of the flags) says the ranks that passed a rate
/// passed the same one.
pub(super) fn agreed(tail: &[u8]) -> bool {
    let (max, max_of_complements) = tail.split_at(BYTES / 2);
    let none = tail.iter().all(|&b| b == 0);
    none || max.iter().zip(max_of_complements).all(|(&hi, &c)| hi == !c)
}

/// Where the ranks disagree (every rank calls it, as every rank sees the same reduced flags):
/// gathers each rank's rate for the error.
pub(super) fn disagreement(comm: &Communicator, lr: Option<f64>) -> Result<TrainError> {
    let mut all = vec![0f64; comm.size()];
    comm.all_gather(&[lr.unwrap_or(f64::NAN)], &mut all)?;
    Ok(TrainError::LearningRatesDiffer {
        rank: comm.rank(),
        rates: all
            .into_iter()
            .map(|x| (!x.is_nan()).then_some(x))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reduction the flags' all-reduce makes: the maximum, byte by byte.
    fn reduced(rates: &[Option<f64>]) -> Vec<u8> {
        let mut out = vec![0u8; BYTES];
        for &r in rates {
            let mut mine = Vec::new();
            append(&mut mine, r);
            out.iter_mut()
                .zip(&mine)
                .for_each(|(o, &m)| *o = (*o).max(m));
        }
        out
    }

    #[test]
    fn equal_rates_agree_and_any_difference_does_not() {
        assert!(agreed(&reduced(&[Some(0.1), Some(0.1), Some(0.1)])));
        assert!(agreed(&reduced(&[None, None])));
        assert!(agreed(&reduced(&[Some(0.05), None, Some(0.05)])));
        assert!(agreed(&reduced(&[Some(0.0), Some(0.0)])));
        assert!(!agreed(&reduced(&[Some(0.1), Some(0.2)])));
        assert!(!agreed(&reduced(&[
            Some(0.1),
            Some(0.1),
            Some(0.1 + 1e-17 + f64::EPSILON)
        ])));
        assert!(!agreed(&reduced(&[Some(0.1), None, Some(0.4)])));
        assert!(!agreed(&reduced(&[Some(1.0), Some(-1.0)])));
    }
}
