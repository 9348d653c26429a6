//! f16/bf16 reductions: MPI's own operators on the 16-bit words, or (`KOLO_MPI_HALF=convert`)
//! through f32 copies reduced with MPI's built-in f32 operators.

use kolo_core::settings::Env;
use kolo_core::{DType, Error, Result};

use super::MpiEngine;

/// How f16/bf16 reductions run (`KOLO_MPI_HALF`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HalfMode {
    /// User-defined MPI operators on the 16-bit words (half the bytes on the wire; the default).
    Op,
    /// Convert to f32, reduce with MPI's built-in f32 operators, convert back.
    Convert,
}

impl HalfMode {
    /// The mode `KOLO_MPI_HALF` in `env` names.
    pub(super) fn from_lookup(env: impl Env) -> Result<HalfMode> {
        match env.lookup("KOLO_MPI_HALF").as_deref().map(str::trim) {
            None | Some("") | Some("op") => Ok(HalfMode::Op),
            Some("convert") => Ok(HalfMode::Convert),
            Some(v) => Err(Error::Config {
                var: "KOLO_MPI_HALF".into(),
                value: v.into(),
                reason: "expected op or convert".into(),
            }),
        }
    }
}

impl MpiEngine {
    /// Whether an f16/bf16 reduction of `dtype` goes through f32.
    pub(super) fn converts(&self, dtype: DType) -> bool {
        self.half == HalfMode::Convert && matches!(dtype, DType::F16 | DType::BF16)
    }

    /// Runs `f` on f32 copies of an f16/bf16 buffer and converts the result back.
    pub(super) fn through_f32(
        dtype: DType,
        inputs: &[&[u8]],
        out: &mut [u8],
        f: impl FnOnce(&[Vec<f32>], &mut [f32]) -> Result<()>,
    ) -> Result<()> {
        use half::slice::HalfFloatSliceExt;
        use half::vec::HalfFloatVecExt;
        let widen = |b: &[u8]| -> Vec<f32> {
            let mut wide = vec![0f32; b.len() / 2];
            match dtype {
                DType::BF16 => bytes_to_half::<half::bf16>(b).convert_to_f32_slice(&mut wide),
                _ => bytes_to_half::<half::f16>(b).convert_to_f32_slice(&mut wide),
            }
            wide
        };
        let ins: Vec<Vec<f32>> = inputs.iter().map(|b| widen(b)).collect();
        let mut wide = vec![0f32; out.len() / 2];
        f(&ins, &mut wide)?;
        match dtype {
            DType::BF16 => out.copy_from_slice(bytemuck::cast_slice(
                &Vec::<half::bf16>::from_f32_slice(&wide),
            )),
            _ => out.copy_from_slice(bytemuck::cast_slice(&Vec::<half::f16>::from_f32_slice(
                &wide,
            ))),
        }
        Ok(())
    }
}

/// 16-bit values from bytes of any alignment.
pub(super) fn bytes_to_half<H: bytemuck::Pod>(b: &[u8]) -> Vec<H> {
    b.chunks_exact(2)
        .map(bytemuck::pod_read_unaligned)
        .collect()
}

pub(super) fn bytes_of(v: &[f32]) -> &[u8] {
    bytemuck::cast_slice(v)
}

pub(super) fn bytes_of_mut(v: &mut [f32]) -> &mut [u8] {
    bytemuck::cast_slice_mut(v)
}
