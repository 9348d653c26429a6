//! Memory per rank of ResNet-18 training with AdamW, unsharded vs. optimizer state sharded
//! ([`ShardedOptimizer`], ZeRO stage 1), for world sizes 1, 2 and 4.
//!
//! Every rank is a process of its own (this program started again with `--child`, ranks meeting
//! over a TCP store on 127.0.0.1, TCP transport), so that each reports its own peak resident set
//! (`VmHWM` of `/proc/self/status`) besides the bytes of optimizer state it holds. Each rank
//! takes `--steps` training steps (Ddp + `DistributedOptimizer`) on a batch of `--batch` random
//! 3×32×32 images.
//!
//! ```text
//! cargo run --release -p kolo-ddp --example zero_memory -- [--batch 8] [--steps 2] [--worlds 1,2,4]
//! ```

use std::io::{BufRead, BufReader};
use std::process::{Command, ExitCode, Stdio};

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use kolo::{InitMethod, InitOptions, TransportChoice};
use kolo_ddp::ddp::{Ddp, DdpOptions};
use kolo_ddp::distributed::DistributedOptimizer;
use kolo_ddp::optim::{self, AdamWConfig, DynOptimizer, OptimizerConfig, ShardedOptimizer};
use kolo_models::{self as models, ModelKind};

const SHAPE: [usize; 3] = [3, 32, 32];
const CLASSES: usize = 10;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// What one rank reports.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Report {
    sharded: bool,
    world: usize,
    rank: usize,
    params: usize,
    param_bytes: usize,
    state_bytes: usize,
    vm_hwm_kib: u64,
    vm_rss_kib: u64,
}

/// `field` of `/proc/self/status` (`VmHWM`: peak resident set, `VmRSS`: resident set), in KiB.
fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn child(
    rank: usize,
    world: usize,
    port: u16,
    sharded: bool,
    batch: usize,
    steps: usize,
) -> Res<Report> {
    let mut opts = InitOptions::new(
        InitMethod::Tcp {
            host: "127.0.0.1".into(),
            port,
        },
        rank,
        world,
    );
    opts.transport = TransportChoice::Tcp;
    let comm = kolo::init_with(opts)?;
    let device = Device::Cpu;
    let varmap = VarMap::new();
    models::build(
        ModelKind::Resnet18,
        VarBuilder::from_varmap(&varmap, DType::F32, &device),
        SHAPE,
        CLASSES,
    )?;
    let ddp = Ddp::new(&comm, &varmap, DdpOptions::default())?;
    let vars = ddp.params().to_vec();
    let params: usize = vars.iter().map(|(_, v)| v.elem_count()).sum();
    let config = OptimizerConfig::AdamW(AdamWConfig::default());
    let opt: Box<dyn DynOptimizer> = if sharded {
        Box::new(ShardedOptimizer::new(&comm, vars, config)?)
    } else {
        optim::build(vars, config)?
    };
    let mut dopt = DistributedOptimizer::new(ddp, opt, 1)?;
    for step in 0..steps {
        let model = models::build(
            ModelKind::Resnet18,
            dopt.ddp().var_builder(DType::F32, &device),
            SHAPE,
            CLASSES,
        )?;
        let x = Tensor::randn(0f32, 1f32, (batch, SHAPE[0], SHAPE[1], SHAPE[2]), &device)?;
        let y: Vec<u32> = (0..batch)
            .map(|i| ((i + step + rank) % CLASSES) as u32)
            .collect();
        let y = Tensor::from_vec(y, batch, &device)?;
        let loss = candle_nn::loss::cross_entropy(&model.forward(&x, true)?, &y)?;
        dopt.backward_step(&loss)?;
    }
    let state_bytes = dopt
        .inner()
        .state()
        .iter()
        .map(|(_, t)| t.elem_count() * t.dtype().size_in_bytes())
        .sum();
    comm.barrier()?;
    Ok(Report {
        sharded,
        world,
        rank,
        params,
        param_bytes: params * 4,
        state_bytes,
        vm_hwm_kib: status_kib("VmHWM:"),
        vm_rss_kib: status_kib("VmRSS:"),
    })
}

fn parent(batch: usize, steps: usize, worlds: &[usize]) -> Res<Vec<Report>> {
    let exe = std::env::current_exe()?;
    let mut all = Vec::new();
    for &world in worlds {
        for sharded in [false, true] {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            let children = (0..world)
                .map(|rank| {
                    let mode = if sharded { "sharded" } else { "unsharded" };
                    let args = [
                        "--child".to_string(),
                        rank.to_string(),
                        world.to_string(),
                        port.to_string(),
                        mode.to_string(),
                        batch.to_string(),
                        steps.to_string(),
                    ];
                    Command::new(&exe)
                        .args(&args)
                        .stdout(Stdio::piped())
                        .spawn()
                })
                .collect::<Result<Vec<_>, _>>()?;
            for mut c in children {
                let out = c.stdout.take().ok_or("no child stdout")?;
                let mut line = String::new();
                BufReader::new(out).read_line(&mut line)?;
                let status = c.wait()?;
                if !status.success() {
                    return Err(format!("a rank failed ({status})").into());
                }
                all.push(serde_json::from_str::<Report>(line.trim())?);
            }
        }
    }
    Ok(all)
}

fn run() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        let num =
            |i: usize| -> Res<usize> { Ok(args.get(i).ok_or("missing child argument")?.parse()?) };
        let port = u16::try_from(num(3)?)?;
        let sharded = args.get(4).map(String::as_str) == Some("sharded");
        let r = child(num(1)?, num(2)?, port, sharded, num(5)?, num(6)?)?;
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    let (mut batch, mut steps, mut worlds) = (8usize, 2usize, vec![1usize, 2, 4]);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--batch" => batch = v.parse()?,
            "--steps" => steps = v.parse()?,
            "--worlds" => {
                worlds = v
                    .split(',')
                    .map(|w| w.trim().parse())
                    .collect::<Result<Vec<usize>, _>>()?
            }
            _ => return Err(format!("unknown flag {flag}").into()),
        }
    }
    let reports = parent(batch, steps, &worlds)?;
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    println!(
        "ResNet-18 ({} parameters, {:.1} MiB), AdamW, batch {batch}, {steps} steps, one process per rank",
        reports.first().map_or(0, |r| r.params),
        reports.first().map_or(0.0, |r| mib(r.param_bytes))
    );
    println!("world  optimizer   state MiB/rank   peak RSS MiB/rank   RSS after steps MiB/rank   (max over ranks)");
    for &world in &worlds {
        for sharded in [false, true] {
            let mine: Vec<&Report> = reports
                .iter()
                .filter(|r| r.world == world && r.sharded == sharded)
                .collect();
            let state = mine.iter().map(|r| r.state_bytes).max().unwrap_or(0);
            let hwm = mine.iter().map(|r| r.vm_hwm_kib).max().unwrap_or(0);
            let rss = mine.iter().map(|r| r.vm_rss_kib).max().unwrap_or(0);
            println!(
                "{world:>5}  {:<10}  {:>14.1}   {:>17.1}   {:>24.1}",
                if sharded { "sharded" } else { "unsharded" },
                mib(state),
                hwm as f64 / 1024.0,
                rss as f64 / 1024.0
            );
        }
    }
    println!("{}", serde_json::to_string(&reports)?);
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zero_memory: {e}");
            ExitCode::FAILURE
        }
    }
}
