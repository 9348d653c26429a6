//! The models' checks of their constructor arguments and inputs.

use candle_core::{Result, Tensor};

/// Error for an input whose spatial size is too small for a model.
pub(crate) fn too_small(model: &str, input_shape: [usize; 3], stage: &str) -> candle_core::Error {
    let [c, h, w] = input_shape;
    candle_core::Error::Msg(format!(
        "{model}: input {c}x{h}x{w} is too small (spatial size drops to zero at {stage})"
    ))
}

/// Checks that constructor arguments are non-degenerate.
pub(crate) fn check_dims(model: &str, input_shape: [usize; 3], classes: usize) -> Result<()> {
    let [c, h, w] = input_shape;
    if c == 0 || h == 0 || w == 0 {
        candle_core::bail!("{model}: input shape {c}x{h}x{w} has a zero dimension");
    }
    if classes == 0 {
        candle_core::bail!("{model}: number of classes must be positive");
    }
    Ok(())
}

/// Checks that `x` is a `[B, C, H, W]` batch matching the model's input shape.
pub(crate) fn check_input(model: &str, x: &Tensor, input_shape: [usize; 3]) -> Result<()> {
    let dims = x.dims();
    if dims.len() != 4 || dims[1..] != input_shape {
        let [c, h, w] = input_shape;
        candle_core::bail!(
            "{model}: expected input of shape [B, {c}, {h}, {w}], got {:?}",
            x.shape()
        );
    }
    Ok(())
}
