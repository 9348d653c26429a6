//! How the AMX unit of this core spends its time on the blocks a tile kernel can hold: the
//! nanoseconds per `tdpbf16ps` of a 2 × 2 block of `C` (four accumulators; two tiles of `A` and
//! two of `B` loaded a step), a 1 × 2 block (two accumulators; one of `A`, two of `B`) and a
//! 1 × 1 block, each with its loads from L1 and without them. The blocks run in turns, in bursts
//! of about a millisecond, so that each sees the same states of the core (on a server the other
//! hardware thread may be running tiles too, and the unit's speed changes with it); the
//! quartiles of the bursts are printed. `ops::bf16_gemm`'s kernels hold the 1 × 2 block, from
//! these figures (the design chapter has them).
//!
//! ```text
//! cargo run --release -p kolo-nn --example amx_blocks [-- --rounds N]
//! ```

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod blocks {
    use std::arch::asm;
    use std::time::Instant;

    /// Palette 1, eight tiles of 16 rows of 64 bytes.
    #[repr(C, align(64))]
    struct TileConfig {
        palette: u8,
        start_row: u8,
        reserved: [u8; 14],
        colsb: [u16; 16],
        rows: [u8; 16],
    }

    /// 64 KiB of bf16 ones, on a cache line: the operands' tiles (inside L1).
    #[repr(C, align(64))]
    struct Operands([u16; 32 * 1024]);

    /// The blocks: name, products per step, whether a step loads its operands.
    pub const BLOCKS: [(&str, f64, bool); 6] = [
        ("2x2, no loads", 4.0, false),
        ("1x2, no loads", 2.0, false),
        ("2x2, loads", 4.0, true),
        ("1x2, loads", 2.0, true),
        ("1x1, loads", 1.0, true),
        ("1x1, no loads", 1.0, false),
    ];

    /// Runs block `which` for `steps` steps; tiles configured and released here.
    fn run(which: usize, steps: usize, ops: &Operands) {
        let mut cfg = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [64; 16],
            rows: [16; 16],
        };
        cfg.colsb[8..].fill(0);
        cfg.rows[8..].fill(0);
        let p = ops.0.as_ptr();
        // SAFETY: AMX is available (the caller checked); every load reads 16 rows of 64 bytes,
        // 64 bytes apart, within 13 KiB of `p`, inside the 64 KiB of `ops`.
        unsafe {
            asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly));
            asm!(
                "tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3",
                "tileloadd tmm4, [{p} + {s}]", "tileloadd tmm5, [{p} + {s}]",
                "tileloadd tmm6, [{p} + {s}]", "tileloadd tmm7, [{p} + {s}]",
                p = in(reg) p, s = in(reg) 64usize, options(nostack, readonly)
            );
            for step in 0..steps {
                // Four steps' operands in turn, 1 KiB a tile.
                let a = p.add((step % 4) * 512);
                let b = p.add(2048 + (step % 4) * 1024);
                match which {
                    0 => asm!(
                        "tdpbf16ps tmm0, tmm4, tmm6",
                        "tdpbf16ps tmm1, tmm4, tmm7",
                        "tdpbf16ps tmm2, tmm5, tmm6",
                        "tdpbf16ps tmm3, tmm5, tmm7",
                        options(nostack, nomem)
                    ),
                    1 => asm!(
                        "tdpbf16ps tmm0, tmm4, tmm6",
                        "tdpbf16ps tmm1, tmm4, tmm7",
                        options(nostack, nomem)
                    ),
                    2 => asm!(
                        "tileloadd tmm4, [{a} + {s}]", "tileloadd tmm6, [{b} + {s}]",
                        "tdpbf16ps tmm0, tmm4, tmm6",
                        "tileloadd tmm7, [{b} + {s} + 512]",
                        "tdpbf16ps tmm1, tmm4, tmm7",
                        "tileloadd tmm5, [{a} + {s} + 4096]",
                        "tdpbf16ps tmm2, tmm5, tmm6", "tdpbf16ps tmm3, tmm5, tmm7",
                        a = in(reg) a, b = in(reg) b, s = in(reg) 64usize,
                        options(nostack, readonly)
                    ),
                    3 => asm!(
                        "tileloadd tmm4, [{a} + {s}]", "tileloadd tmm6, [{b} + {s}]",
                        "tdpbf16ps tmm0, tmm4, tmm6",
                        "tileloadd tmm7, [{b} + {s} + 512]",
                        "tdpbf16ps tmm1, tmm4, tmm7",
                        a = in(reg) a, b = in(reg) b, s = in(reg) 64usize,
                        options(nostack, readonly)
                    ),
                    4 => asm!(
                        "tileloadd tmm4, [{a} + {s}]", "tileloadd tmm6, [{b} + {s}]",
                        "tdpbf16ps tmm0, tmm4, tmm6",
                        a = in(reg) a, b = in(reg) b, s = in(reg) 64usize,
                        options(nostack, readonly)
                    ),
                    _ => asm!("tdpbf16ps tmm0, tmm4, tmm6", options(nostack, nomem)),
                }
            }
            asm!("tilerelease", options(nostack, nomem));
        }
    }

    /// Nanoseconds per product of each block over `rounds` turns: quartiles.
    pub fn measure(rounds: usize) -> Vec<[f64; 3]> {
        let ops = Box::new(Operands([0x3f80; 32 * 1024]));
        let steps = 20_000;
        let mut ns: Vec<Vec<f64>> = vec![Vec::with_capacity(rounds); BLOCKS.len()];
        for _ in 0..rounds {
            for (i, &(_, products, _)) in BLOCKS.iter().enumerate() {
                let t = Instant::now();
                run(i, steps, &ops);
                ns[i].push(t.elapsed().as_secs_f64() * 1e9 / (steps as f64 * products));
            }
        }
        ns.into_iter()
            .map(|mut v| {
                v.sort_by(f64::total_cmp);
                let q = |f: f64| v[((v.len() - 1) as f64 * f) as usize];
                [q(0.25), q(0.5), q(0.75)]
            })
            .collect()
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rounds = match args.iter().position(|a| a == "--rounds") {
        Some(i) => match args.get(i + 1).and_then(|v| v.parse::<usize>().ok()) {
            Some(n) if n > 0 => n,
            _ => {
                eprintln!("amx_blocks: --rounds takes a positive count");
                std::process::exit(2);
            }
        },
        None => 400,
    };
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        // kolo's own check: CPUID, the AVX-512 the kernels around the tiles use, and Linux's
        // permission for this process's tile data.
        if !kolo_nn::ops::Bf16Path::Amx.available() {
            println!(
                "amx_blocks: this CPU (or its kernel) offers no AMX tiles; nothing to measure"
            );
            return;
        }
        println!("ns per tdpbf16ps (quartiles of {rounds} bursts)     p25    p50    p75");
        for (&(name, _, _), q) in blocks::BLOCKS.iter().zip(blocks::measure(rounds)) {
            println!("{name:<40} {:>6.1} {:>6.1} {:>6.1}", q[0], q[1], q[2]);
        }
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        let _ = rounds;
        println!("amx_blocks: AMX runs on x86-64 Linux only; nothing to measure");
    }
}
