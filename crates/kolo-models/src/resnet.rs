//! ResNet-18, the d2l variant for small images.

use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;

use kolo_nn::batch_norm::BatchNorm;
use kolo_nn::layers::{self, Conv2d, Linear};

use crate::check;
use crate::model::Model;

const NAME: &str = "resnet18";

/// `(channels, stride of the first block)` of the four stages; two blocks each.
const STAGES: [(usize, usize); 4] = [(64, 1), (128, 2), (256, 2), (512, 2)];
const BLOCKS_PER_STAGE: usize = 2;

fn batch_norm(channels: usize, vb: VarBuilder) -> Result<BatchNorm> {
    // eps 1e-5 and momentum 0.1, as PyTorch's BatchNorm2d.
    BatchNorm::new(channels, vb)
}

/// d2l's `Residual`: `conv3×3(stride)-BN-ReLU-conv3×3-BN`, plus a 1×1 convolution (with
/// stride, no BN) on the shortcut where channels or resolution change; add, ReLU.
#[derive(Debug, Clone)]
struct Residual {
    conv1: Conv2d,
    bn1: BatchNorm,
    conv2: Conv2d,
    bn2: BatchNorm,
    shortcut: Option<Conv2d>,
}

impl Residual {
    fn new(c_in: usize, c_out: usize, stride: usize, vb: VarBuilder) -> Result<Self> {
        let shortcut = if c_in != c_out || stride != 1 {
            Some(layers::conv2d(
                c_in,
                c_out,
                1,
                stride,
                0,
                vb.pp("shortcut"),
            )?)
        } else {
            None
        };
        Ok(Self {
            conv1: layers::conv2d(c_in, c_out, 3, stride, 1, vb.pp("conv1"))?,
            bn1: batch_norm(c_out, vb.pp("bn1"))?,
            conv2: layers::conv2d(c_out, c_out, 3, 1, 1, vb.pp("conv2"))?,
            bn2: batch_norm(c_out, vb.pp("bn2"))?,
            shortcut,
        })
    }

    fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let y = self
            .bn1
            .forward_fused(&self.conv1.forward(x)?, None, true, train)?;
        let shortcut = match &self.shortcut {
            Some(conv) => conv.forward(x)?,
            None => x.clone(),
        };
        // relu(bn2(conv2(y)) + shortcut) in one op.
        self.bn2
            .forward_fused(&self.conv2.forward(&y)?, Some(&shortcut), true, train)
    }

    fn visit_batch_norms(&mut self, f: &mut dyn FnMut(&mut BatchNorm)) {
        f(&mut self.bn1);
        f(&mut self.bn2);
    }
}

/// ResNet-18 for small images as used by d2l for multi-GPU training:
/// `Conv2d(C, 64, 3, padding=1), BN, ReLU` (no max-pool), four stages of two [residual
/// blocks](https://d2l.ai/chapter_convolutional-modern/resnet.html) with 64, 128, 256 and 512
/// channels (stride 2 at the start of stages 2–4), global average pooling and
/// `Linear(512, classes)`.
///
/// Parameters: `conv1.*`, `bn1.*`, `layer{1..4}.{0,1}.{conv1,bn1,conv2,bn2}.*`,
/// `layer{2..4}.0.shortcut.*`, `fc.*`; BatchNorm running statistics are
/// `….running_mean` / `….running_var`. `train` selects batch statistics (and updates the
/// running statistics) vs. running statistics.
#[derive(Debug, Clone)]
pub struct Resnet18 {
    input_shape: [usize; 3],
    conv1: Conv2d,
    bn1: BatchNorm,
    blocks: Vec<Residual>,
    fc: Linear,
}

impl Resnet18 {
    /// Creates the model for per-sample inputs `input_shape` (`[C, H, W]`) and `classes`
    /// classes. Any spatial size ≥ 1 works (stride-2 3×3 convolutions with padding 1 never
    /// shrink a side below 1), although very small inputs make little sense.
    pub fn new(vb: VarBuilder, input_shape: [usize; 3], classes: usize) -> Result<Self> {
        check::check_dims(NAME, input_shape, classes)?;
        let [c, _, _] = input_shape;
        let conv1 = layers::conv2d(c, 64, 3, 1, 1, vb.pp("conv1"))?;
        let bn1 = batch_norm(64, vb.pp("bn1"))?;
        let mut blocks = Vec::with_capacity(STAGES.len() * BLOCKS_PER_STAGE);
        let mut c_in = 64;
        for (stage, &(channels, stride)) in STAGES.iter().enumerate() {
            let vb_stage = vb.pp(format!("layer{}", stage + 1));
            for block in 0..BLOCKS_PER_STAGE {
                let stride = if block == 0 { stride } else { 1 };
                blocks.push(Residual::new(c_in, channels, stride, vb_stage.pp(block))?);
                c_in = channels;
            }
        }
        Ok(Self {
            input_shape,
            conv1,
            bn1,
            blocks,
            fc: layers::linear(c_in, classes, vb.pp("fc"))?,
        })
    }
}

impl Model for Resnet18 {
    fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        check::check_input(NAME, x, self.input_shape)?;
        let mut x = self
            .bn1
            .forward_fused(&self.conv1.forward(x)?, None, true, train)?;
        for block in &self.blocks {
            x = block.forward(&x, train)?;
        }
        // Global average pooling: [B, 512, h, w] -> [B, 512].
        let x = x.mean(3)?.mean(2)?;
        self.fc.forward(&x)
    }

    fn visit_batch_norms(&mut self, f: &mut dyn FnMut(&mut BatchNorm)) {
        f(&mut self.bn1);
        for block in &mut self.blocks {
            block.visit_batch_norms(f);
        }
    }
}
