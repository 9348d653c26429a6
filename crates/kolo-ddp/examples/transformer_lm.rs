//! A small GPT-style language model over bytes, trained data-parallel: token and position
//! embeddings, pre-LayerNorm transformer blocks (causal multi-head attention, GELU MLP), the output
//! layer tied to the token embedding, AdamW, gradient clipping, and an optional bf16 compute mode
//! (f32 master weights).
//!
//! ```text
//! cargo build --release -p kolo-ddp --example transformer_lm
//! kolo run -n 2 -- target/release/examples/transformer_lm [--steps 300] [--lr 0.01] [--bf16]
//!     [--target 2.5] [--corpus FILE_OR_DIR]... [--layers 2] [--timeline FILE] [--names-order]
//! ```
//!
//! The corpus is every file under `/usr/share/common-licenses` (the licence texts every Debian
//! system ships, about 300 KB of English), or the files and directories given. Each rank trains on
//! its shard of the 64-byte windows of the corpus (`DistributedSampler`); rank 0 prints the loss
//! averaged over ranks every 50 steps, then greedy text from the trained model. Exits non-zero
//! unless the mean loss of the last 20 steps is below `--target` nats per byte (a model that learnt
//! nothing stays near ln 256 = 5.5; one that learnt byte frequencies only, near 3.0).
//! `--timeline FILE` records the job (Ddp's backward, gradient sync, buckets) as a Chrome trace;
//! `--names-order` lays the gradient buckets out as kolo did before it followed the arrival order
//! (full-size buckets by parameter name, never re-laid), to compare the two.

use std::path::PathBuf;

use candle_core::{DType, Device, Module, Tensor, D};
use candle_nn::{Embedding, VarBuilder};
use kolo_data::{batches, DistributedSampler};
use kolo_ddp::ddp::{Ddp, DdpOptions};
use kolo_ddp::distributed::{check_loss, DistributedOptimizer};
use kolo_ddp::optim::{self, OptimizerConfig};
use kolo_nn::layers::Linear;

const VOCAB: usize = 256;
const CTX: usize = 64;
const DIM: usize = 64;
const HEADS: usize = 4;
const BATCH: usize = 16;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// LayerNorm over the last dimension, made of differentiable operations: candle_nn's `LayerNorm`
/// (on contiguous inputs) and `softmax_last_dim` are fused kernels without a backward pass, so
/// nothing before them would learn (Ddp names parameters that get no gradient).
struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
}

impl LayerNorm {
    fn new(vb: VarBuilder) -> candle_core::Result<LayerNorm> {
        Ok(LayerNorm {
            weight: vb.get_with_hints(DIM, "weight", candle_nn::Init::Const(1.0))?,
            bias: vb.get_with_hints(DIM, "bias", candle_nn::Init::Const(0.0))?,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        candle_nn::ops::layer_norm_slow(x, &self.weight, &self.bias, 1e-5)
    }
}

/// candle-nn's `linear` (its parameters, names and initialization) computing with kolo's linear op
/// (`kolo_nn::ops::linear`: one op on kolo's GEMM, its products on the bf16 unit under
/// `set_matmul_precision(Bf16)`).
fn linear(in_dim: usize, out_dim: usize, vb: VarBuilder) -> candle_core::Result<Linear> {
    let l = candle_nn::linear(in_dim, out_dim, vb)?;
    Ok(Linear::new(l.weight().clone(), l.bias().cloned()))
}

struct Block {
    ln1: LayerNorm,
    qkv: Linear,
    proj: Linear,
    ln2: LayerNorm,
    up: Linear,
    down: Linear,
}

impl Block {
    fn new(vb: VarBuilder) -> candle_core::Result<Block> {
        Ok(Block {
            ln1: LayerNorm::new(vb.pp("ln1"))?,
            qkv: linear(DIM, 3 * DIM, vb.pp("qkv"))?,
            proj: linear(DIM, DIM, vb.pp("proj"))?,
            ln2: LayerNorm::new(vb.pp("ln2"))?,
            up: linear(DIM, 4 * DIM, vb.pp("up"))?,
            down: linear(4 * DIM, DIM, vb.pp("down"))?,
        })
    }

    /// Causal multi-head self-attention over `x` (batch, time, DIM); `mask` is 0 on and below the
    /// diagonal, -inf above.
    fn attention(&self, x: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        let hd = DIM / HEADS;
        let qkv = self.qkv.forward(x)?.reshape((b, t, 3, HEADS, hd))?;
        let part = |i: usize| {
            qkv.narrow(2, i, 1)?
                .squeeze(2)?
                .transpose(1, 2)?
                .contiguous()
        };
        let (q, k, v) = (part(0)?, part(1)?, part(2)?); // (b, heads, t, hd)
        let scores = (q.matmul(&k.t()?)? * (1.0 / (hd as f64).sqrt()))?;
        let weights = candle_nn::ops::softmax(&scores.broadcast_add(mask)?, D::Minus1)?;
        let y = weights.matmul(&v)?.transpose(1, 2)?.reshape((b, t, DIM))?;
        self.proj.forward(&y)
    }

    fn forward(&self, x: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
        let x = (x + self.attention(&self.ln1.forward(x)?, mask)?)?;
        let h = self.up.forward(&self.ln2.forward(&x)?)?.gelu()?;
        x + self.down.forward(&h)?
    }
}

struct Gpt {
    wte: Embedding,
    /// The output layer: the token embedding's weights again (tied).
    head: Tensor,
    wpe: Tensor,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
}

impl Gpt {
    fn new(vb: VarBuilder, layers: usize) -> candle_core::Result<Gpt> {
        let init = candle_nn::Init::Randn {
            mean: 0.0,
            stdev: 0.02,
        };
        let wte = vb.get_with_hints((VOCAB, DIM), "wte", init)?;
        // Asked for twice under one name: one parameter, used by the input and the output layer,
        // whose gradient is the sum of both uses.
        let head = vb.get_with_hints((VOCAB, DIM), "wte", init)?;
        Ok(Gpt {
            wte: Embedding::new(wte, DIM),
            head,
            wpe: vb.get_with_hints((CTX, DIM), "wpe", init)?,
            blocks: (0..layers)
                .map(|i| Block::new(vb.pp(format!("h{i}"))))
                .collect::<candle_core::Result<_>>()?,
            ln_f: LayerNorm::new(vb.pp("ln_f"))?,
        })
    }

    /// Logits (batch, time, VOCAB), in f32, for the byte ids `ids` (batch, time).
    fn forward(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        let (_, t) = ids.dims2()?;
        let mut x = self
            .wte
            .forward(ids)?
            .broadcast_add(&self.wpe.narrow(0, 0, t)?)?;
        let mask = causal_mask(t, x.device())?.to_dtype(x.dtype())?;
        for b in &self.blocks {
            x = b.forward(&x, &mask)?;
        }
        let x = self.ln_f.forward(&x)?;
        kolo_nn::ops::linear(&x, &self.head, None)?.to_dtype(DType::F32)
    }
}

fn causal_mask(t: usize, dev: &Device) -> candle_core::Result<Tensor> {
    let m: Vec<f32> = (0..t * t)
        .map(|i| {
            if i % t > i / t {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    Tensor::from_vec(m, (t, t), dev)
}

struct Args {
    layers: usize,
    timeline: Option<PathBuf>,
    names_order: bool,
    steps: usize,
    lr: f64,
    bf16: bool,
    target: f64,
    corpus: Vec<PathBuf>,
}

fn args() -> Res<Args> {
    let mut a = Args {
        layers: 2,
        timeline: None,
        names_order: false,
        steps: 300,
        lr: 1e-2,
        bf16: false,
        target: 2.5,
        corpus: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--steps" => a.steps = value()?.parse()?,
            "--target" => a.target = value()?.parse()?,
            "--lr" => a.lr = value()?.parse()?,
            "--corpus" => a.corpus.push(value()?.into()),
            "--bf16" => a.bf16 = true,
            "--layers" => a.layers = value()?.parse()?,
            "--timeline" => a.timeline = Some(value()?.into()),
            "--names-order" => a.names_order = true,
            other => return Err(format!("unknown option {other}").into()),
        }
    }
    if a.corpus.is_empty() {
        a.corpus.push("/usr/share/common-licenses".into());
    }
    Ok(a)
}

/// The bytes of `paths` (directories: their files, sorted by name, not recursing), concatenated.
fn corpus(paths: &[PathBuf]) -> Res<Vec<u8>> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut names: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(|e| format!("{}: {e}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.is_file())
                .collect();
            names.sort();
            files.extend(names);
        } else {
            files.push(p.clone());
        }
    }
    let mut text = Vec::new();
    for f in &files {
        text.extend(std::fs::read(f).map_err(|e| format!("{}: {e}", f.display()))?);
    }
    if text.len() < 2 * CTX {
        return Err(format!(
            "the corpus ({} bytes in {files:?}) is too short",
            text.len()
        )
        .into());
    }
    Ok(text)
}

/// Inputs and next-byte targets (batch, CTX) for the windows starting at `starts`.
fn batch(text: &[u8], starts: &[usize], dev: &Device) -> candle_core::Result<(Tensor, Tensor)> {
    let take = |off: usize| -> Vec<u32> {
        starts
            .iter()
            .flat_map(|&s| text[s + off..s + off + CTX].iter().map(|&b| u32::from(b)))
            .collect()
    };
    let x = Tensor::from_vec(take(0), (starts.len(), CTX), dev)?;
    let y = Tensor::from_vec(take(1), (starts.len(), CTX), dev)?;
    Ok((x, y))
}

/// `len` bytes the model continues `prompt` with, each the most likely next byte.
fn generate(model: &Gpt, prompt: &[u8], len: usize, dev: &Device) -> candle_core::Result<String> {
    let mut ids: Vec<u32> = prompt.iter().map(|&b| u32::from(b)).collect();
    for _ in 0..len {
        let from = ids.len().saturating_sub(CTX);
        let x = Tensor::new(&ids[from..], dev)?.unsqueeze(0)?;
        let logits = model.forward(&x)?.squeeze(0)?;
        let next = logits.get(logits.dim(0)? - 1)?.argmax(D::Minus1)?;
        ids.push(next.to_scalar::<u32>()?);
    }
    Ok(String::from_utf8_lossy(&ids.iter().map(|&b| b as u8).collect::<Vec<_>>()).into_owned())
}

fn main() -> Res<()> {
    let a = args()?;
    let text = corpus(&a.corpus)?;
    let dev = Device::Cpu;
    let comm = kolo::init()?;
    let varmap = candle_nn::VarMap::new();
    Gpt::new(VarBuilder::from_varmap(&varmap, DType::F32, &dev), a.layers)?;
    let mut opts = DdpOptions::default();
    if a.names_order {
        // Buckets as kolo laid them before arrival order: full-size, by name, never re-laid.
        (opts.first_bucket_bytes, opts.rebuild_buckets) = (opts.bucket_bytes, false);
    }
    let ddp = Ddp::new(&comm, &varmap, opts)?;
    let timeline = match &a.timeline {
        Some(path) => kolo_ddp::timeline::Timeline::create(&comm, path)?,
        None => kolo_ddp::timeline::Timeline::disabled(),
    };
    ddp.set_timeline(timeline.clone());
    let model = match a.bf16 {
        true => Gpt::new(ddp.var_builder_in(DType::BF16, &dev), a.layers)?, // bf16 compute
        false => Gpt::new(ddp.var_builder(DType::F32, &dev), a.layers)?,
    };
    let adamw = optim::build(ddp.params(), OptimizerConfig::adamw(a.lr, 0.01))?;
    let mut opt = DistributedOptimizer::new(ddp, adamw, 1)?;
    opt.set_max_grad_norm(Some(1.0))?;
    let windows = (text.len() - CTX - 1) / (CTX / 2); // starts every CTX/2 bytes
    let mut sampler = DistributedSampler::builder(windows, comm.size(), comm.rank()).build()?;
    let (mut step, mut epoch, mut recent) = (0u64, 0u64, Vec::new());
    while (step as usize) < a.steps {
        sampler.set_epoch(epoch);
        for idx in batches(&sampler.indices(), BATCH, true)? {
            let starts: Vec<usize> = idx.iter().map(|&w| w * (CTX / 2)).collect();
            let (x, y) = batch(&text, &starts, &dev)?;
            let logits = model.forward(&x)?;
            let loss = candle_nn::loss::cross_entropy(&logits.flatten_to(1)?, &y.flatten_all()?)?;
            let mean = check_loss(&comm, step, f64::from(loss.to_scalar::<f32>()?))?;
            opt.backward_step(&loss)?;
            recent.push(mean);
            step += 1;
            if comm.rank() == 0 && (step % 50 == 0 || step == 1) {
                let norm = opt.last_grad_norm().unwrap_or(f64::NAN);
                println!("step {step}: loss {mean:.3} (gradient norm {norm:.2})");
            }
            if step as usize == a.steps {
                break;
            }
        }
        epoch += 1;
    }
    timeline.finish()?;
    let last = &recent[recent.len().saturating_sub(20)..];
    let final_loss = last.iter().sum::<f64>() / last.len().max(1) as f64;
    if comm.rank() == 0 {
        println!(
            "final loss {final_loss:.3} nats/byte over the last {} steps",
            last.len()
        );
        let text = generate(&model, b"This License ", 60, &dev)?;
        println!("sample: {:?}", text);
    }
    if final_loss.is_nan() || final_loss >= a.target {
        let (rank, target) = (comm.rank(), a.target);
        return Err(
            format!("rank {rank}: final loss {final_loss:.3} is not below {target}").into(),
        );
    }
    Ok(())
}
