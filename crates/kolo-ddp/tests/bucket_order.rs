//! Buckets follow the order gradients arrive in: with overlap, after the first step the buckets
//! are re-laid in rank 0's observed arrival order (the same layout on every rank), with a small
//! first bucket — so a model of numbered blocks (`layers.10` sorts before `layers.2`) sends its
//! last layers first. Training is unchanged by it (the DDP equivalence tests run with it on).

mod common;

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{linear, Linear, VarBuilder, VarMap};
use kolo::Config;
use kolo_ddp::ddp::{Ddp, DdpOptions};
use kolo_ddp::Result;

const BLOCKS: usize = 12;

fn blocks(vb: &VarBuilder) -> candle_core::Result<Vec<Linear>> {
    (0..BLOCKS)
        .map(|i| linear(8, 8, vb.pp(format!("layers.{i}"))))
        .collect()
}

/// The block number of each parameter, in the layout's order.
fn block_order(ddp: &Ddp) -> Vec<usize> {
    let names: Vec<&str> = ddp.params().iter().map(|(n, _)| n.as_str()).collect();
    ddp.layout()
        .order()
        .iter()
        .map(|&p| {
            names[p]
                .split('.')
                .nth(1)
                .and_then(|b| b.parse().ok())
                .unwrap_or(usize::MAX)
        })
        .collect()
}

fn layouts(rebuild: bool) -> Vec<(Vec<usize>, Vec<usize>, Vec<usize>)> {
    common::on_ranks(2, Config::default(), move |comm| -> Result<_> {
        let vm = VarMap::new();
        blocks(&VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu))?;
        let opts = DdpOptions {
            bucket_bytes: 1200,
            first_bucket_bytes: 300,
            rebuild_buckets: rebuild,
            ..DdpOptions::default()
        };
        let ddp = Ddp::new(&comm, &vm, opts)?;
        let model = blocks(&ddp.var_builder(DType::F32, &Device::Cpu))?;
        let before = block_order(&ddp);
        for step in 0..2 {
            let mut x = Tensor::new(&[[0.5f32 + step as f32; 8]], &Device::Cpu)?;
            for b in &model {
                x = b.forward(&x)?.tanh()?;
            }
            ddp.backward(&x.sqr()?.sum_all()?)?;
        }
        Ok((before, block_order(&ddp), ddp.layout().len.clone()))
    })
}

fn descending(order: &[usize]) -> bool {
    order.windows(2).all(|w| w[0] >= w[1])
}

#[test]
fn buckets_are_rebuilt_in_arrival_order_with_a_small_first_bucket() {
    let got = layouts(true);
    assert_eq!(got[0], got[1], "every rank has the same layout");
    let (before, after, lens) = &got[0];
    // Names sorted as strings: blocks 9..2, then 11, 10, 1, 0.
    assert!(!descending(before), "{before:?}");
    // Backward runs from the last block to the first.
    assert!(descending(after), "{after:?}");
    assert_eq!(after.len(), 2 * BLOCKS);
    // 4-byte elements: the first bucket at most 300 bytes (a weight, 256), the others 1,200.
    assert!(
        lens[0] * 4 <= 300 && lens[1..].iter().all(|&l| l * 4 <= 1200),
        "{lens:?}"
    );
    assert!(lens.len() > 3, "{lens:?}");
}

#[test]
fn without_rebuild_the_layout_stays() {
    for (before, after, _) in layouts(false) {
        assert_eq!(before, after);
    }
}
