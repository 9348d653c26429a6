//! A small two-convolution CNN.

use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;

use kolo_nn::layers::{self, Conv2d, Linear};
use kolo_nn::ops::{max_pool2x2, relu};

use crate::check;
use crate::model::Model;

const NAME: &str = "simple-cnn";

/// SimpleCNN:
/// `Conv2d(C, 32, 3, padding=1), ReLU, MaxPool2d(2), Conv2d(32, 64, 3, padding=1), ReLU,
/// MaxPool2d(2), Flatten, Linear(64·h·w, 128), ReLU, Linear(128, classes)`.
///
/// Parameters: `conv1.*`, `conv2.*`, `fc1.*`, `fc2.*`. Needs inputs of at least 4×4.
#[derive(Debug, Clone)]
pub struct SimpleCnn {
    input_shape: [usize; 3],
    conv1: Conv2d,
    conv2: Conv2d,
    fc1: Linear,
    fc2: Linear,
}

impl SimpleCnn {
    /// Creates the model for per-sample inputs `input_shape` (`[C, H, W]`) and `classes`
    /// classes; errors if the input is too small.
    pub fn new(vb: VarBuilder, input_shape: [usize; 3], classes: usize) -> Result<Self> {
        check::check_dims(NAME, input_shape, classes)?;
        let [c, h, w] = input_shape;
        // 3×3 convolutions with padding 1 keep the size; each pooling halves it (floor).
        let (oh, ow) = (h / 4, w / 4);
        if oh == 0 || ow == 0 {
            return Err(check::too_small(NAME, input_shape, "pool2"));
        }
        Ok(Self {
            input_shape,
            conv1: layers::conv2d(c, 32, 3, 1, 1, vb.pp("conv1"))?,
            conv2: layers::conv2d(32, 64, 3, 1, 1, vb.pp("conv2"))?,
            fc1: layers::linear(64 * oh * ow, 128, vb.pp("fc1"))?,
            fc2: layers::linear(128, classes, vb.pp("fc2"))?,
        })
    }
}

impl Model for SimpleCnn {
    fn forward(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        check::check_input(NAME, x, self.input_shape)?;
        let x = max_pool2x2(&self.conv1.forward_relu(x)?)?;
        let x = max_pool2x2(&self.conv2.forward_relu(&x)?)?;
        let x = x.flatten_from(1)?;
        let x = relu(&self.fc1.forward(&x)?)?;
        self.fc2.forward(&x)
    }
}
