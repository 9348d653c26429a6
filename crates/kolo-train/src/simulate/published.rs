//! Built-in profiles of the models of Horovod's published scaling benchmark (Sergeev & Del Balso,
//! 2018; Horovod's README: 128 servers of 4 Pascal GPUs on 25 Gbit/s RoCE, about 90 % scaling
//! efficiency for Inception V3 and ResNet-101 at 512 GPUs, 68 % for VGG-16).
//!
//! Gradient sizes are the published parameter counts (ResNet-101 ≈ 44.5 M, Inception V3 ≈ 23.8 M,
//! VGG-16 ≈ 138.4 M), laid out layer by layer in groups. Compute is not measured here but stated: a
//! batch of 64 images per GPU at a Pascal P100's TensorFlow benchmark throughput (Inception V3 ≈ 140,
//! ResNet-101 ≈ 125, VGG-16 ≈ 140 images/s), split one third forward and two thirds backward;
//! backward reaches each layer after the layers above it, in proportion to their share of the FLOPs
//! (VGG-16's per-layer FLOPs are exact at 224×224; the ResNet-101 and Inception V3 shares are
//! per stage, approximate). Reduction runs on the GPU (γ = 0.002 ns/byte).

use super::error::SimError;
use super::profile::{ParamProfile, Profile};

/// Images per GPU and step in the published benchmarks.
pub const BATCH: usize = 64;

/// A group of `layers` equal layers holding `params` parameters and `flops` of the model's FLOPs.
struct Group {
    name: &'static str,
    layers: usize,
    params: usize,
    flops: f64,
}

const fn g(name: &'static str, layers: usize, params: usize, flops: f64) -> Group {
    Group {
        name,
        layers,
        params,
        flops,
    }
}

const RESNET101: &[Group] = &[
    g("conv1", 1, 9_408, 0.03),
    g("layer1", 9, 215_808, 0.12),
    g("layer2", 12, 1_219_584, 0.20),
    g("layer3", 69, 26_090_496, 0.55),
    g("layer4", 9, 14_964_736, 0.10),
    g("fc", 1, 2_049_000, 0.0),
];

const INCEPTION_V3: &[Group] = &[
    g("stem", 5, 320_000, 0.28),
    g("mixed5", 21, 840_000, 0.22),
    g("mixed6", 42, 8_600_000, 0.32),
    g("mixed7", 24, 11_990_000, 0.18),
    g("fc", 1, 2_049_000, 0.0),
];

// Exact VGG-16 layers; FLOPs in GMACs at 224×224 (15.47 in all).
const VGG16: &[Group] = &[
    g("conv1_1", 1, 1_792, 0.087),
    g("conv1_2", 1, 36_928, 1.85),
    g("conv2_1", 1, 73_856, 0.925),
    g("conv2_2", 1, 147_584, 1.85),
    g("conv3_1", 1, 295_168, 0.925),
    g("conv3_2", 2, 1_180_160, 3.7),
    g("conv4_1", 1, 1_180_160, 0.925),
    g("conv4_2", 2, 4_719_616, 3.7),
    g("conv5", 3, 7_079_424, 1.387),
    g("fc6", 1, 102_764_544, 0.103),
    g("fc7", 1, 16_781_312, 0.017),
    g("fc8", 1, 4_097_000, 0.004),
];

/// The built-in model names.
pub const NAMES: &[&str] = &["resnet101", "inception-v3", "vgg16"];

/// The built-in profile `name` (`resnet101`, `inception-v3`, `vgg16`), `None` for another name.
pub fn profile(name: &str) -> Option<Profile> {
    let (groups, images_per_s) = match name.to_ascii_lowercase().replace('_', "-").as_str() {
        "resnet101" | "resnet-101" => (RESNET101, 125.0),
        "inception-v3" | "inceptionv3" | "inception3" => (INCEPTION_V3, 140.0),
        "vgg16" | "vgg-16" => (VGG16, 140.0),
        _ => return None,
    };
    Some(from_groups(name, groups, images_per_s))
}

/// A profile from groups of layers in forward order (`flops` relative shares).
fn from_groups(model: &str, groups: &[Group], images_per_s: f64) -> Profile {
    let step = BATCH as f64 / images_per_s;
    let backward = step * 2.0 / 3.0;
    let total: f64 = groups.iter().map(|g| g.flops).sum();
    // Layers in forward order, each with its parameters and FLOP share.
    let mut layers = Vec::new();
    for gr in groups {
        for k in 0..gr.layers {
            let base = gr.params / gr.layers;
            let extra = usize::from(k < gr.params % gr.layers);
            layers.push((
                format!("{}.{k:03}", gr.name),
                base + extra,
                gr.flops / total / gr.layers as f64,
            ));
        }
    }
    // Backward runs from the last layer: layer i's gradient is ready once the layers from the end
    // down to i are done.
    let mut done = 0.0;
    let mut ready = vec![0.0; layers.len()];
    for i in (0..layers.len()).rev() {
        done += layers[i].2;
        ready[i] = (backward * done).min(backward);
    }
    Profile {
        model: model.to_string(),
        batch: BATCH,
        threads: 1,
        forward_s: step / 3.0,
        backward_s: backward,
        optimizer_s: 0.0,
        other_s: 0.0,
        elem_bytes: 4,
        gamma_s_per_byte: 2e-12,
        step_sd_s: 0.0,
        // Names sort in forward order, as DDP orders parameters.
        params: layers
            .into_iter()
            .zip(ready)
            .enumerate()
            .map(|(i, ((name, numel, _), ready_s))| ParamProfile {
                name: format!("{i:04}.{name}"),
                numel,
                ready_s,
            })
            .collect(),
        method: format!(
            "published: parameter counts per layer group; compute stated as {images_per_s} \
             images/s per GPU at batch {BATCH}, 1/3 forward, 2/3 backward apportioned by FLOPs"
        ),
    }
}

/// [`profile`], or an error listing the names.
pub fn builtin(name: &str) -> Result<Profile, SimError> {
    profile(name).ok_or_else(|| SimError::Profile {
        field: "model".into(),
        reason: format!(
            "no built-in profile `{name}` (built in: {}; or profile lenet, simple-cnn, mlp, resnet18)",
            NAMES.join(", ")
        ),
    })
}
