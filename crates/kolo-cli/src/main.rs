//! `kolo`: the command line of the kolo distributed training library.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;

/// The `kolo` command line.
#[derive(Debug, Parser)]
#[command(
    name = "kolo",
    version,
    about = "kolo: distributed deep-learning training in Rust",
    long_about = "kolo: distributed deep-learning training in Rust.\n\n\
                  `kolo run` starts and supervises the worker processes of a training job \
                  on this machine, like torchrun: each worker gets RANK, WORLD_SIZE, \
                  LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and friends \
                  (see `kolo run --help`).",
    after_help = "Example: kolo run -n 4 -- ./train --epochs 3",
    propagate_version = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start N local worker processes and supervise them (like torchrun)
    #[command(
        long_about = cmd::run::LONG_ABOUT,
        override_usage = "kolo run [OPTIONS] -n <N> -- <PROGRAM> [ARGS]..."
    )]
    Run(Box<cmd::run::RunArgs>),
    /// Train a model data-parallel on N workers (LeNet on Fashion-MNIST with 2 workers by default)
    #[command(long_about = cmd::train::LONG_ABOUT)]
    Train(Box<cmd::train::TrainArgs>),
    /// Time a collective on N workers like nccl-tests (allreduce, allgather, reduce_scatter, ...)
    #[command(long_about = cmd::bench::LONG_ABOUT)]
    Bench(Box<cmd::bench::BenchArgs>),
    /// Predict step time and scaling efficiency of data-parallel training at N ranks
    #[command(long_about = cmd::simulate::LONG_ABOUT)]
    Simulate(Box<cmd::simulate::SimulateArgs>),
    /// Read the ranks' flight records and say which rank stopped where (and who is slow)
    #[command(long_about = cmd::diagnose::LONG_ABOUT)]
    Diagnose(Box<cmd::diagnose::DiagnoseArgs>),
    /// Draw a CSV of series against one x as a PNG (the benchmark scripts' pictures)
    #[command(long_about = cmd::plot::LONG_ABOUT)]
    Plot(Box<cmd::plot::PlotArgs>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => cmd::run::execute(*args),
        Command::Train(args) => cmd::train::execute(*args),
        Command::Bench(args) => cmd::bench::execute(*args),
        Command::Simulate(args) => cmd::simulate::execute(*args),
        Command::Diagnose(args) => cmd::diagnose::execute(*args),
        Command::Plot(args) => cmd::plot::execute(*args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_takes_program_and_args_after_dashes() {
        let cli = Cli::try_parse_from(["kolo", "run", "-n", "2", "--", "prog", "-x", "--y"]);
        assert!(cli.is_ok());
        let cli = Cli::try_parse_from(["kolo", "run", "--nproc-per-node", "2", "prog"]);
        assert!(cli.is_ok());
        assert!(Cli::try_parse_from(["kolo", "run", "-n", "2"]).is_err());
        assert!(Cli::try_parse_from(["kolo", "run", "-n", "0", "prog"]).is_err());
    }

    /// `--train-limit 0` and `--test-limit 0` are refused: no training, or an "accuracy" over no
    /// test sample (it printed 0.00 %), is not a result.
    #[test]
    fn train_limits_are_at_least_one() {
        for flag in ["--train-limit", "--test-limit"] {
            assert!(Cli::try_parse_from(["kolo", "train", flag, "1"]).is_ok());
            let err = Cli::try_parse_from(["kolo", "train", flag, "0"])
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains(flag) && err.contains("at least 1"), "{err}");
        }
    }
}
