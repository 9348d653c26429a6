//! Model tests: shapes, parameter names and counts (against PyTorch's), BatchNorm modes, and
//! that LeNet + SGD actually learn. The convolution and pooling kernels are tested in `kernels.rs`.

use std::path::Path;
use std::time::Instant;

use candle_core::{DType, Device, Result, Tensor, D};
use candle_nn::{VarBuilder, VarMap};
use kolo_ddp::optim::{Sgd, SgdConfig};
use kolo_models::{build, Lenet, Mlp, Model, ModelKind, Resnet18};
use kolo_nn::batch_norm::is_buffer_name;
use kolo_nn::vars::{named_buffers, named_parameters, parameter_count};

const MNIST: [usize; 3] = [1, 28, 28];
const CIFAR: [usize; 3] = [3, 32, 32];
const DIGITS: [usize; 3] = [1, 8, 8];

fn new_model(
    kind: ModelKind,
    input_shape: [usize; 3],
    classes: usize,
) -> Result<(VarMap, Box<dyn Model>)> {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let model = build(kind, vb, input_shape, classes)?;
    Ok((varmap, model))
}

fn batch(b: usize, [c, h, w]: [usize; 3]) -> Result<Tensor> {
    Tensor::randn(0f32, 1f32, (b, c, h, w), &Device::Cpu)
}

fn names(vars: &[(String, candle_core::Var)]) -> Vec<String> {
    vars.iter().map(|(n, _)| n.clone()).collect()
}

#[test]
fn model_kind_parse_and_display_round_trip() {
    for kind in ModelKind::ALL {
        assert_eq!(kind.to_string().parse::<ModelKind>(), Ok(kind));
    }
    assert_eq!("simple-cnn".parse::<ModelKind>(), Ok(ModelKind::SimpleCnn));
    assert_eq!("ResNet18".parse::<ModelKind>(), Ok(ModelKind::Resnet18));
    let err = "vgg".parse::<ModelKind>().expect_err("vgg is not a model");
    assert!(err.to_string().contains("vgg"), "{err}");
}

#[test]
fn output_shapes_for_every_model_and_dataset() -> Result<()> {
    for kind in ModelKind::ALL {
        for shape in [MNIST, CIFAR] {
            let (_vm, model) = new_model(kind, shape, 10)?;
            for train in [true, false] {
                let logits = model.forward(&batch(2, shape)?, train)?;
                assert_eq!(logits.dims(), [2, 10], "{kind} on {shape:?}");
                assert_eq!(logits.dtype(), DType::F32);
            }
        }
    }
    // Digits 1x8x8 work for everything but LeNet.
    for kind in [ModelKind::Mlp, ModelKind::SimpleCnn, ModelKind::Resnet18] {
        let (_vm, model) = new_model(kind, DIGITS, 10)?;
        let logits = model.forward(&batch(3, DIGITS)?, true)?;
        assert_eq!(logits.dims(), [3, 10], "{kind} on digits");
    }
    Ok(())
}

#[test]
fn lenet_rejects_inputs_that_are_too_small() {
    let err = match new_model(ModelKind::Lenet, DIGITS, 10) {
        Ok(_) => panic!("LeNet on 8x8 must fail"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("lenet") && err.contains("too small"), "{err}");
    // 12x12 is the smallest input LeNet accepts.
    assert!(new_model(ModelKind::Lenet, [1, 11, 12], 10).is_err());
    assert!(new_model(ModelKind::Lenet, [1, 12, 12], 10).is_ok());
    assert!(new_model(ModelKind::SimpleCnn, [1, 3, 3], 10).is_err());
}

#[test]
fn wrong_input_shape_is_a_clear_error() -> Result<()> {
    let (_vm, model) = new_model(ModelKind::Lenet, MNIST, 10)?;
    let err = match model.forward(&batch(2, CIFAR)?, false) {
        Ok(_) => panic!("a CIFAR batch must not pass through an MNIST LeNet"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("[B, 1, 28, 28]"), "{err}");
    Ok(())
}

#[test]
fn odd_sizes_pool_with_floor_semantics_and_backprop() -> Result<()> {
    // 30 -> 15 -> 7 exercises pooling over an odd size.
    let shape = [1, 30, 30];
    let (vm, model) = new_model(ModelKind::SimpleCnn, shape, 4)?;
    let fc1 = named_parameters(&vm)
        .into_iter()
        .find(|(n, _)| n == "fc1.weight")
        .map(|(_, v)| v.dims().to_vec());
    assert_eq!(fc1, Some(vec![128, 64 * 7 * 7]));
    let loss = model.forward(&batch(2, shape)?, true)?.sqr()?.sum_all()?;
    let grads = loss.backward()?;
    for (name, var) in named_parameters(&vm) {
        assert!(grads.get(&var).is_some(), "no gradient for {name}");
    }
    Ok(())
}

#[test]
fn lenet_and_simple_cnn_parameter_names_are_stable_and_sorted() -> Result<()> {
    let (vm, _) = new_model(ModelKind::Lenet, MNIST, 10)?;
    let expected: Vec<String> = ["conv1", "conv2", "fc1", "fc2", "fc3"]
        .iter()
        .flat_map(|l| [format!("{l}.bias"), format!("{l}.weight")])
        .collect();
    assert_eq!(names(&named_parameters(&vm)), expected);
    assert!(named_buffers(&vm).is_empty());
    // Building again gives the same names in the same order.
    let (vm2, _) = new_model(ModelKind::Lenet, MNIST, 10)?;
    assert_eq!(names(&named_parameters(&vm2)), expected);

    let (vm, _) = new_model(ModelKind::SimpleCnn, CIFAR, 10)?;
    let expected: Vec<String> = ["conv1", "conv2", "fc1", "fc2"]
        .iter()
        .flat_map(|l| [format!("{l}.bias"), format!("{l}.weight")])
        .collect();
    assert_eq!(names(&named_parameters(&vm)), expected);

    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    Mlp::new(vb, DIGITS, 10, &[32, 16, 8])?;
    let expected: Vec<String> = ["fc1", "fc2", "fc3", "fc4"]
        .iter()
        .flat_map(|l| [format!("{l}.bias"), format!("{l}.weight")])
        .collect();
    assert_eq!(names(&named_parameters(&varmap)), expected);
    Ok(())
}

#[test]
fn resnet_parameter_and_buffer_names() -> Result<()> {
    let (vm, _) = new_model(ModelKind::Resnet18, CIFAR, 10)?;
    let params = names(&named_parameters(&vm));
    let buffers = names(&named_buffers(&vm));
    let mut sorted = params.clone();
    sorted.sort();
    assert_eq!(params, sorted);
    for name in [
        "conv1.weight",
        "bn1.weight",
        "bn1.bias",
        "layer1.0.conv1.weight",
        "layer1.1.bn2.bias",
        "layer2.0.bn1.weight",
        "layer2.0.shortcut.weight",
        "layer4.0.shortcut.bias",
        "layer4.1.conv2.weight",
        "fc.weight",
        "fc.bias",
    ] {
        assert!(params.iter().any(|p| p == name), "missing {name}");
    }
    assert!(!params.iter().any(|p| p.starts_with("layer1.0.shortcut")));
    assert!(!params.iter().any(|p| p.contains("running")));
    assert!(buffers.iter().all(|b| is_buffer_name(b)));
    assert!(!is_buffer_name("layer1.0.bn1.weight"));
    // 1 stem BN + 2 per block x 8 blocks = 17 BatchNorms, 2 buffers each.
    assert_eq!(buffers.len(), 34);
    assert!(buffers.contains(&"layer2.0.bn1.running_mean".to_string()));
    assert!(buffers.contains(&"bn1.running_var".to_string()));
    // conv: 1 stem + 16 in blocks + 3 shortcuts = 20 (weight + bias); BN: 17 x 2; fc: 2.
    assert_eq!(params.len(), 20 * 2 + 17 * 2 + 2);
    Ok(())
}

fn conv(c_in: usize, c_out: usize, k: usize) -> usize {
    c_in * c_out * k * k + c_out
}

fn bn(c: usize) -> usize {
    2 * c
}

/// Parameter count of d2l's small-image ResNet-18 (PyTorch's `model.parameters()`, i.e.
/// without BatchNorm running statistics).
fn d2l_resnet18_params(c: usize, classes: usize) -> usize {
    let residual = |c_in: usize, c_out: usize, shortcut: bool| {
        conv(c_in, c_out, 3)
            + bn(c_out)
            + conv(c_out, c_out, 3)
            + bn(c_out)
            + if shortcut { conv(c_in, c_out, 1) } else { 0 }
    };
    let mut n = conv(c, 64, 3) + bn(64);
    n += 2 * residual(64, 64, false);
    for (c_in, c_out) in [(64, 128), (128, 256), (256, 512)] {
        n += residual(c_in, c_out, true) + residual(c_out, c_out, false);
    }
    n + 512 * classes + classes
}

#[test]
fn parameter_counts_match_pytorch() -> Result<()> {
    let count = |kind, shape| -> Result<usize> {
        let (vm, _) = new_model(kind, shape, 10)?;
        Ok(parameter_count(&vm))
    };
    // d2l LeNet on 1x28x28: the well-known 61,706.
    assert_eq!(count(ModelKind::Lenet, MNIST)?, 61_706);
    // 3x32x32: conv1 3*6*25+6, conv2 6*16*25+16, fc1 16*6*6*120+120, fc2, fc3.
    assert_eq!(
        count(ModelKind::Lenet, CIFAR)?,
        456 + 2_416 + (576 * 120 + 120) + 10_164 + 850
    );
    assert_eq!(
        count(ModelKind::SimpleCnn, MNIST)?,
        conv(1, 32, 3) + conv(32, 64, 3) + (64 * 7 * 7 * 128 + 128) + (128 * 10 + 10)
    );
    assert_eq!(
        count(ModelKind::Mlp, MNIST)?,
        (784 * 256 + 256) + (256 * 128 + 128) + (128 * 10 + 10)
    );
    let resnet_mnist = d2l_resnet18_params(1, 10);
    assert_eq!(count(ModelKind::Resnet18, MNIST)?, resnet_mnist);
    // Hand-checked: stem 768 + stage1 148,224 + stage2 525,952 + stage3 2,100,480
    // + stage4 8,395,264 + fc 5,130.
    assert_eq!(resnet_mnist, 11_175_818);
    assert_eq!(
        count(ModelKind::Resnet18, CIFAR)?,
        d2l_resnet18_params(3, 10)
    );
    Ok(())
}

#[test]
fn initialization_follows_pytorch_defaults() -> Result<()> {
    let (vm, _) = new_model(ModelKind::Lenet, MNIST, 10)?;
    for (name, var) in named_parameters(&vm) {
        let fan_in: usize = match name.split('.').next() {
            Some("conv1") => 25,
            Some("conv2") => 6 * 25,
            Some("fc1") => 400,
            Some("fc2") => 120,
            Some("fc3") => 84,
            other => panic!("unexpected layer {other:?}"),
        };
        let bound = 1.0 / (fan_in as f32).sqrt();
        let max = var.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
        assert!(max <= bound, "{name}: |w| max {max} > bound {bound}");
        if var.elem_count() >= 1000 {
            // U(-b, b) has standard deviation b/sqrt(3); candle's default would be sqrt(6)x larger.
            let std = var
                .flatten_all()?
                .sqr()?
                .mean(0)?
                .sqrt()?
                .to_scalar::<f32>()?;
            let expected = bound / 3f32.sqrt();
            assert!(
                (std / expected - 1.0).abs() < 0.1,
                "{name}: std {std} vs {expected}"
            );
        }
    }
    Ok(())
}

#[test]
fn batch_norm_train_and_eval_differ() -> Result<()> {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let model = Resnet18::new(vb, DIGITS, 10)?;
    let x = (batch(4, DIGITS)? * 3.0)?.affine(1.0, 2.0)?;
    let running_mean = |name: &str| -> Result<Vec<f32>> {
        named_buffers(&varmap)
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.to_vec1::<f32>())
            .unwrap_or_else(|| Err(candle_core::Error::Msg(format!("no buffer {name}"))))
    };
    let before = running_mean("bn1.running_mean")?;
    assert!(before.iter().all(|&v| v == 0.0));

    // Eval mode uses (and leaves alone) the running statistics.
    let eval1 = model.forward(&x, false)?;
    assert_eq!(running_mean("bn1.running_mean")?, before);

    // Train mode normalizes with batch statistics and updates the running statistics.
    let train = model.forward(&x, true)?;
    let after = running_mean("bn1.running_mean")?;
    assert_ne!(after, before);
    let diff = (&train - &eval1)?.abs()?.sum_all()?.to_scalar::<f32>()?;
    assert!(diff > 1e-3, "train and eval outputs coincide ({diff})");

    // With updated running statistics, eval output changes but stays deterministic.
    let eval2 = model.forward(&x, false)?;
    let eval3 = model.forward(&x, false)?;
    assert_eq!(eval2.to_vec2::<f32>()?, eval3.to_vec2::<f32>()?);
    let moved = (&eval2 - &eval1)?.abs()?.sum_all()?.to_scalar::<f32>()?;
    assert!(moved > 0.0);

    // The running statistics never get gradients.
    let loss = model.forward(&x, true)?.sqr()?.sum_all()?;
    let grads = loss.backward()?;
    for (name, var) in named_buffers(&varmap) {
        assert!(grads.get(&var).is_none(), "{name} has a gradient");
    }
    for (name, var) in named_parameters(&varmap) {
        assert!(grads.get(&var).is_some(), "{name} has no gradient");
    }
    Ok(())
}

#[test]
fn models_load_from_saved_variables() -> Result<()> {
    // Build, save through the VarMap, rebuild from the saved tensors: same outputs.
    let dir = tempfile::tempdir().map_err(candle_core::Error::wrap)?;
    let path = dir.path().join("resnet.safetensors");
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let model = Resnet18::new(vb, DIGITS, 10)?;
    let x = batch(4, DIGITS)?;
    model.forward(&x, true)?; // move the running statistics away from their init
    varmap.save(&path)?;
    let expected = model.forward(&x, false)?.to_vec2::<f32>()?;

    let mut loaded = VarMap::new();
    let vb = VarBuilder::from_varmap(&loaded, DType::F32, &Device::Cpu);
    let model2 = Resnet18::new(vb, DIGITS, 10)?;
    loaded.load(&path)?;
    assert_eq!(model2.forward(&x, false)?.to_vec2::<f32>()?, expected);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Learning sanity checks.

/// Class templates plus Gaussian noise (σ 1): a synthetic 10-class task LeNet must learn
/// quickly.
/// `n` noisy copies of `templates` (unit Gaussian noise from `seed`, so every run sees the same data).
fn synthetic(n: usize, templates: &Tensor, seed: u64) -> Result<(Tensor, Tensor)> {
    let labels: Vec<u32> = (0..n as u32).map(|i| (i * 7 + i / 3) % 10).collect();
    let labels = Tensor::new(labels.as_slice(), &Device::Cpu)?;
    let x = templates.index_select(&labels, 0)?;
    let mut rng = kolo_data::rng::SplitMix64::new(seed);
    let noise: Vec<f32> = (0..x.elem_count())
        .map(|_| rng.next_gaussian() as f32)
        .collect();
    let noise = Tensor::from_vec(noise, x.shape(), &Device::Cpu)?;
    Ok(((x + noise)?, labels))
}

fn accuracy(model: &dyn Model, x: &Tensor, y: &Tensor) -> Result<f32> {
    let pred = model.forward(x, false)?.argmax(D::Minus1)?;
    let correct = pred
        .eq(y)?
        .to_dtype(DType::F32)?
        .sum_all()?
        .to_scalar::<f32>()?;
    Ok(correct / y.dim(0)? as f32)
}

/// Trains `steps` SGD steps (momentum 0.9, as the reference runs) on batches of 64 cycled from
/// `(x, y)`; returns the per-step losses.
fn train_lenet(
    model: &Lenet,
    varmap: &VarMap,
    (x, y): (&Tensor, &Tensor),
    lr: f64,
    steps: usize,
) -> Result<Vec<f32>> {
    let config = SgdConfig {
        lr,
        momentum: 0.9,
        ..SgdConfig::default()
    };
    let mut opt = Sgd::new(named_parameters(varmap), config)?;
    let n = x.dim(0)?;
    let bs = 64;
    let mut losses = Vec::with_capacity(steps);
    for step in 0..steps {
        let start = (step * bs) % (n - bs + 1);
        let xb = x.narrow(0, start, bs)?;
        let yb = y.narrow(0, start, bs)?;
        let loss = candle_nn::loss::cross_entropy(&model.forward(&xb, true)?, &yb)?;
        opt.step(&loss.backward()?)?;
        losses.push(loss.to_scalar::<f32>()?);
    }
    Ok(losses)
}

fn mean(v: &[f32]) -> f32 {
    v.iter().sum::<f32>() / v.len() as f32
}

#[test]
fn lenet_sgd_learns_a_synthetic_task() -> Result<()> {
    // Class c is a bright 8x8 square at its own place of a 5x2 grid.
    let mut pixels = vec![0f32; 10 * 28 * 28];
    for c in 0..10 {
        let (r0, c0) = (1 + (c / 5) * 13, 1 + (c % 5) * 5);
        for r in r0..r0 + 8 {
            for col in c0..(c0 + 8).min(28) {
                pixels[c * 784 + r * 28 + col] = 1.0;
            }
        }
    }
    let templates = Tensor::from_vec(pixels, (10, 1, 28, 28), &Device::Cpu)?;
    let (x, y) = synthetic(2048, &templates, 1)?;
    let (x_test, y_test) = synthetic(512, &templates, 2)?;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let model = Lenet::new(vb, MNIST, 10)?;
    // Seeded data and weights: the run is the same every time. lr 0.03 learned the task from each of
    // eight initial seeds (final loss at most 7 % of the first); 0.05 sometimes spikes mid-run.
    kolo_models::seeded_init(&varmap, 1).map_err(candle_core::Error::wrap)?;
    let losses = train_lenet(&model, &varmap, (&x, &y), 0.03, 100)?;
    let (first, last) = (mean(&losses[..5]), mean(&losses[losses.len() - 5..]));
    assert!(
        last < 0.3 * first,
        "loss did not fall: {first} -> {last} ({losses:?})"
    );
    let acc = accuracy(&model, &x_test, &y_test)?;
    assert!(acc > 0.9, "test accuracy {acc}");
    Ok(())
}

/// Reads an idx file (optionally gzip-compressed, decompressed with the system `gzip`).
fn read_idx(path: &Path) -> Option<Vec<u8>> {
    let out = std::process::Command::new("gzip")
        .arg("-dc")
        .arg(path)
        .output()
        .ok()?;
    out.status.success().then_some(out.stdout)
}

/// The first `n` images (scaled to [0, 1]) and labels of a Fashion-MNIST split.
fn fashion_mnist(split: &str, n: usize) -> Result<Option<(Tensor, Tensor)>> {
    let dir = Path::new("/usr/share/datasets/fashion-mnist");
    let (Some(images), Some(labels)) = (
        read_idx(&dir.join(format!("{split}-images-idx3-ubyte.gz"))),
        read_idx(&dir.join(format!("{split}-labels-idx1-ubyte.gz"))),
    ) else {
        return Ok(None);
    };
    let pixels = 28 * 28;
    if images.len() < 16 + n * pixels || labels.len() < 8 + n {
        candle_core::bail!("fashion-mnist {split}: files too short");
    }
    let x: Vec<f32> = images[16..16 + n * pixels]
        .iter()
        .map(|&p| p as f32 / 255.0)
        .collect();
    let y: Vec<u32> = labels[8..8 + n].iter().map(|&l| l as u32).collect();
    let x = Tensor::from_vec(x, (n, 1, 28, 28), &Device::Cpu)?;
    let y = Tensor::from_vec(y, n, &Device::Cpu)?;
    Ok(Some((x, y)))
}

#[test]
fn lenet_sgd_learns_fashion_mnist() -> Result<()> {
    let (Some((x, y)), Some((x_test, y_test))) =
        (fashion_mnist("train", 6400)?, fashion_mnist("t10k", 1000)?)
    else {
        eprintln!("skipping: Fashion-MNIST not found (apt-get install dataset-fashion-mnist)");
        return Ok(());
    };
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let model = Lenet::new(vb, MNIST, 10)?;
    // Seeded weights (as `kolo train` seeds them): the run is the same every time, also with other
    // tests loading the cores. Unseeded, one run in many collapsed at this learning rate (loss
    // stuck at ln 10, accuracy 0.1); seeds 1-16 all learned (final loss 0.62-0.78, accuracy
    // 0.72-0.77).
    kolo_models::seeded_init(&varmap, 1).map_err(candle_core::Error::wrap)?;
    let t = Instant::now();
    // The reference configuration: SGD lr 0.05, momentum 0.9, batch 64.
    let losses = train_lenet(&model, &varmap, (&x, &y), 0.05, 250)?;
    let (first, last) = (mean(&losses[..10]), mean(&losses[losses.len() - 10..]));
    let acc = accuracy(&model, &x_test, &y_test)?;
    eprintln!(
        "fashion-mnist: 250 steps of 64 in {:.1?}; loss {first:.3} -> {last:.3}; test acc {acc:.3}",
        t.elapsed()
    );
    assert!(first > 2.0, "initial loss {first} should be about ln 10");
    assert!(last < 1.0, "loss did not fall clearly: {first} -> {last}");
    assert!(acc > 0.6, "test accuracy {acc}");
    Ok(())
}

/// LeNet forward + backward throughput (run with `--ignored --nocapture`, ideally `--release`).
#[test]
#[ignore = "a throughput benchmark, not a check: run with --ignored --nocapture, ideally --release"]
fn lenet_throughput() -> Result<()> {
    for bs in [64, 256] {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let model = Lenet::new(vb, MNIST, 10)?;
        let x = batch(bs, MNIST)?;
        let y = Tensor::new(vec![3u32; bs].as_slice(), &Device::Cpu)?;
        let mut opt = Sgd::new(
            named_parameters(&varmap),
            SgdConfig {
                lr: 0.01,
                momentum: 0.9,
                ..SgdConfig::default()
            },
        )?;
        let iters = if bs == 64 { 40 } else { 10 };
        let mut fwd = std::time::Duration::ZERO;
        let mut bwd = std::time::Duration::ZERO;
        let mut upd = std::time::Duration::ZERO;
        for i in 0..iters + 3 {
            let t0 = Instant::now();
            let loss = candle_nn::loss::cross_entropy(&model.forward(&x, true)?, &y)?;
            let t1 = Instant::now();
            let grads = loss.backward()?;
            let t2 = Instant::now();
            opt.step(&grads)?;
            let t3 = Instant::now();
            if i >= 3 {
                fwd += t1 - t0;
                bwd += t2 - t1;
                upd += t3 - t2;
            }
        }
        let total = fwd + bwd + upd;
        eprintln!(
            "lenet batch {bs}: {:.0} samples/s (fwd {:.1?}, bwd {:.1?}, sgd {:.1?} per step)",
            (bs * iters) as f64 / total.as_secs_f64(),
            fwd / iters as u32,
            bwd / iters as u32,
            upd / iters as u32,
        );
    }
    Ok(())
}
