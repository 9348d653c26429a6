//! Reproducible initialization of a model's parameters.

use candle_core::{Result, Tensor};
use candle_nn::VarMap;
use kolo_nn::vars::sorted_vars;

/// Deterministic PyTorch-style initialization from `seed`: weights (2-d and more) and their biases
/// uniform in ±1/√fan_in, as `nn.Linear`/`nn.Conv2d` do; BatchNorm scales, shifts and buffers are left
/// as built. Candle's CPU random generator cannot be seeded, so runs are reproducible only with this.
pub fn seeded_init(varmap: &VarMap, seed: u64) -> Result<()> {
    let vars = sorted_vars(varmap);
    let fan_in = |name: &str| -> Option<usize> {
        let w = vars.iter().find(|(n, _)| n == name)?;
        let d = w.1.dims();
        (d.len() >= 2).then(|| d[1..].iter().product())
    };
    let mut rng = kolo_data::rng::SplitMix64::new(seed);
    for (name, var) in &vars {
        let fan = if name.ends_with(".weight") {
            fan_in(name)
        } else if let Some(prefix) = name.strip_suffix(".bias") {
            fan_in(&format!("{prefix}.weight"))
        } else {
            None
        };
        let Some(fan) = fan else { continue };
        let bound = 1.0 / (fan as f64).sqrt();
        let vals: Vec<f32> = (0..var.elem_count())
            .map(|_| ((rng.next_f64() * 2.0 - 1.0) * bound) as f32)
            .collect();
        var.set(&Tensor::from_vec(vals, var.shape(), var.device())?.to_dtype(var.dtype())?)?;
    }
    Ok(())
}
