//! What the DDP examples share: the candle model of their own (an MLP), a slice of Fashion-MNIST,
//! a batch as tensors, and a check that every rank holds the same parameters.

use candle_core::{Device, Module, Tensor};
use candle_nn::{linear, seq, Activation, VarBuilder};
use kolo_data::{Dataset, DatasetKind, Split};

/// A 784 → 128 → 10 MLP: a model of your own, any candle code.
pub fn mlp(vb: VarBuilder) -> candle_core::Result<impl Module> {
    Ok(seq()
        .add(linear(784, 128, vb.pp("fc1"))?)
        .add(Activation::Relu)
        .add(linear(128, 10, vb.pp("fc2"))?))
}

/// The first `limit` training images of Fashion-MNIST (Debian's `dataset-fashion-mnist`, or
/// `scripts/fetch-data.sh`).
#[allow(dead_code)]
pub fn fashion(limit: usize) -> Result<Dataset, Box<dyn std::error::Error>> {
    let data = kolo_data::load(DatasetKind::FashionMnist, Split::Train, None)?;
    Ok(data.subset(&(0..limit.min(data.len())).collect::<Vec<_>>())?)
}

// ANCHOR: xy
/// Images and labels of the samples `batch` as tensors (`xs`, `ys`: reused buffers).
#[allow(dead_code)]
pub fn xy(
    data: &Dataset,
    batch: &[usize],
    xs: &mut Vec<f32>,
    ys: &mut Vec<u32>,
    dev: &Device,
) -> Result<(Tensor, Tensor), Box<dyn std::error::Error>> {
    data.gather(batch, xs, ys)?;
    let x = Tensor::from_slice(xs, (batch.len(), 784), dev)?;
    Ok((x, Tensor::from_slice(ys, batch.len(), dev)?))
}
// ANCHOR_END: xy

/// Whether every rank holds bit for bit the same `vars` (kolo-ddp's check, `true` for none).
#[allow(dead_code)]
pub fn same_on_every_rank(
    comm: &kolo::Communicator,
    vars: &[(String, candle_core::Var)],
) -> Result<bool, Box<dyn std::error::Error>> {
    Ok(kolo_ddp::vars_comm::same_on_every_rank(comm, vars)?.unwrap_or(true))
}
