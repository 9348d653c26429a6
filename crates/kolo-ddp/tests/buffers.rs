//! `broadcast_buffers` (PyTorch's default): after a synchronizing backward pass every rank holds
//! rank 0's BatchNorm running statistics; with it off each keeps its own.

mod common;

use candle_core::{DType, Device, Module, ModuleT, Tensor};
use candle_nn::{linear, VarBuilder, VarMap};
use kolo::Config;
use kolo_ddp::ddp::{Ddp, DdpOptions};
use kolo_ddp::Result;
use kolo_nn::batch_norm::BatchNorm;

fn running_stats(broadcast: bool) -> Vec<Vec<f32>> {
    common::on_ranks(2, Config::default(), move |comm| -> Result<Vec<f32>> {
        let vm = VarMap::new();
        let build = |vb: VarBuilder| -> candle_core::Result<(BatchNorm, candle_nn::Linear)> {
            Ok((BatchNorm::new(3, vb.pp("bn"))?, linear(3, 1, vb.pp("fc"))?))
        };
        build(VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu))?;
        let opts = DdpOptions {
            broadcast_buffers: broadcast,
            ..DdpOptions::default()
        };
        let ddp = Ddp::new(&comm, &vm, opts)?;
        let (bn, fc) = build(ddp.var_builder(DType::F32, &Device::Cpu))?;
        // Each rank's batch has other statistics.
        let r = comm.rank() as f32;
        let x = Tensor::new(&[[1.0f32 + r, 2.0, -r], [3.0 * r, -1.0, 0.5]], &Device::Cpu)?;
        let y = fc.forward(&bn.forward_t(&x, true)?)?;
        ddp.backward(&y.sum_all()?)?;
        let mut stats = bn.running_mean().to_vec1::<f32>()?;
        stats.extend(bn.running_var().to_vec1::<f32>()?);
        Ok(stats)
    })
}

#[test]
fn buffers_follow_rank_0_after_each_step_unless_off() {
    let on = running_stats(true);
    assert_eq!(
        on[0], on[1],
        "broadcast_buffers: every rank holds rank 0's statistics"
    );
    let off = running_stats(false);
    assert_ne!(off[0], off[1], "off: each rank keeps its own");
    assert_eq!(on[0], off[0], "rank 0's own statistics");
}
