//! A multi-layer perceptron on flattened images.

use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;

use kolo_nn::layers::{self, Linear};
use kolo_nn::ops::relu;

use crate::check;
use crate::model::Model;

const NAME: &str = "mlp";

/// Default hidden layer sizes of [`Mlp`].
pub const DEFAULT_MLP_HIDDEN: [usize; 2] = [256, 128];

/// MLP: `Flatten, Linear(C·H·W, h1), ReLU, …, Linear(h_n, classes)`.
///
/// Parameters: `fc1.*` … `fc{n+1}.*` for `n` hidden layers (`fc{n+1}` is the output layer).
#[derive(Debug, Clone)]
pub struct Mlp {
    input_shape: [usize; 3],
    layers: Vec<Linear>,
}

impl Mlp {
    /// Creates the model for per-sample inputs `input_shape` (`[C, H, W]`), `classes` classes
    /// and the given hidden layer sizes (may be empty: a linear classifier; sizes must be
    /// positive).
    pub fn new(
        vb: VarBuilder,
        input_shape: [usize; 3],
        classes: usize,
        hidden: &[usize],
    ) -> Result<Self> {
        check::check_dims(NAME, input_shape, classes)?;
        if let Some(i) = hidden.iter().position(|&h| h == 0) {
            candle_core::bail!("{NAME}: hidden layer {} has size 0", i + 1);
        }
        let [c, h, w] = input_shape;
        let mut dims = Vec::with_capacity(hidden.len() + 2);
        dims.push(c * h * w);
        dims.extend_from_slice(hidden);
        dims.push(classes);
        let layers = dims
            .windows(2)
            .enumerate()
            .map(|(i, d)| layers::linear(d[0], d[1], vb.pp(format!("fc{}", i + 1))))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            input_shape,
            layers,
        })
    }
}

impl Model for Mlp {
    fn forward(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        check::check_input(NAME, x, self.input_shape)?;
        let mut x = x.flatten_from(1)?;
        let last = self.layers.len().saturating_sub(1);
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward(&x)?;
            if i < last {
                x = relu(&x)?;
            }
        }
        Ok(x)
    }
}
