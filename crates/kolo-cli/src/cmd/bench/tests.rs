//! kolo bench's options and its known-data checks.

use super::*;

/// `kolo bench` as clap parses it.
#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

#[test]
fn gpu_buffers_are_the_f32_allreduce_only() {
    use clap::Parser;
    for args in [
        &["kolo", "allgather", "--device", "cuda"][..],
        &["kolo", "allreduce", "--device", "cuda", "--dtype", "f64"],
    ] {
        let cli = Cli::try_parse_from(args).expect("parses");
        match launch_job(&cli.bench) {
            Err(CliError::Usage(e)) => assert!(e.contains("f32 allreduce"), "{e}"),
            other => panic!("{args:?}: {other:?}"),
        }
    }
    // Without CUDA in the build, a worker says how to get it.
    if !cfg!(feature = "cuda") {
        let cli = Cli::try_parse_from(["kolo", "allreduce", "--device", "cuda"]).expect("parses");
        let results = kolo::run_local(1, kolo::Config::default(), |comm| {
            device::run(&comm, &cli.bench).map_err(|e| e.to_string())
        });
        let e = results[0]
            .as_ref()
            .expect("ran")
            .as_ref()
            .expect_err("no CUDA");
        assert!(e.contains("--features kolo-cli/cuda"), "{e}");
    }
}

#[test]
fn sizes_parse() {
    assert_eq!(parse_size("4"), Ok(4));
    assert_eq!(parse_size("1K"), Ok(1024));
    assert_eq!(parse_size("64k"), Ok(65536));
    assert_eq!(parse_size("16M"), Ok(16 << 20));
    assert_eq!(parse_size("1GiB"), Ok(1 << 30));
    assert!(parse_size("12Q").is_err());
    assert!(parse_size("K").is_err());
    assert!(parse_size("0").is_err());
    assert!(parse_size("").is_err());
}

#[test]
fn every_op_checks_out_on_local_threads() {
    for op in Op::value_variants() {
        for n in [2usize, 3] {
            let results = kolo::run_local(n, kolo::Config::default(), move |comm| {
                let mut case = Case::<f32>::new(*op, n, comm.rank(), 100);
                case.step(&comm)?;
                Ok::<u64, kolo::Error>(case.wrong())
            });
            for r in results {
                let wrong = r.expect("rank ran").expect("step succeeded");
                assert_eq!(wrong, 0, "{op:?} n={n}");
            }
        }
    }
}
