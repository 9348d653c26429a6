//! LeNet-5 as defined by d2l (and the PyTorch reference).

use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;

use kolo_nn::layers::{self, Conv2d, Linear};
use kolo_nn::ops::{avg_pool2x2, conv_out, relu};

use crate::check;
use crate::model::Model;

const NAME: &str = "lenet";

/// LeNet as in d2l:
/// `Conv2d(C, 6, 5, padding=2), ReLU, AvgPool2d(2), Conv2d(6, 16, 5), ReLU, AvgPool2d(2),
/// Flatten, Linear(16·h·w, 120), ReLU, Linear(120, 84), ReLU, Linear(84, classes)`.
///
/// Parameters: `conv1.*`, `conv2.*`, `fc1.*`, `fc2.*`, `fc3.*` (61,706 for 1×28×28 inputs and
/// 10 classes). Needs inputs of at least 12×12 (8×8 digits are too small).
#[derive(Debug, Clone)]
pub struct Lenet {
    input_shape: [usize; 3],
    conv1: Conv2d,
    conv2: Conv2d,
    fc1: Linear,
    fc2: Linear,
    fc3: Linear,
}

impl Lenet {
    /// Creates the model for per-sample inputs `input_shape` (`[C, H, W]`) and `classes`
    /// classes; errors if the input is too small.
    pub fn new(vb: VarBuilder, input_shape: [usize; 3], classes: usize) -> Result<Self> {
        check::check_dims(NAME, input_shape, classes)?;
        let [c, h, w] = input_shape;
        let spatial = |s: usize| -> Option<usize> {
            let s = conv_out(s, 5, 1, 2)? / 2;
            let s = conv_out(s, 5, 1, 0)? / 2;
            (s > 0).then_some(s)
        };
        let (Some(oh), Some(ow)) = (spatial(h), spatial(w)) else {
            return Err(check::too_small(NAME, input_shape, "conv2/pool2"));
        };
        Ok(Self {
            input_shape,
            conv1: layers::conv2d(c, 6, 5, 1, 2, vb.pp("conv1"))?,
            conv2: layers::conv2d(6, 16, 5, 1, 0, vb.pp("conv2"))?,
            fc1: layers::linear(16 * oh * ow, 120, vb.pp("fc1"))?,
            fc2: layers::linear(120, 84, vb.pp("fc2"))?,
            fc3: layers::linear(84, classes, vb.pp("fc3"))?,
        })
    }
}

impl Model for Lenet {
    fn forward(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        check::check_input(NAME, x, self.input_shape)?;
        let x = avg_pool2x2(&self.conv1.forward_relu(x)?)?;
        let x = avg_pool2x2(&self.conv2.forward_relu(&x)?)?;
        let x = x.flatten_from(1)?;
        let x = relu(&self.fc1.forward(&x)?)?;
        let x = relu(&self.fc2.forward(&x)?)?;
        self.fc3.forward(&x)
    }
}
