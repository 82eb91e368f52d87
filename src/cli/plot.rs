//! `nimbus plot RUN_DIR`: draws a training run's losses from its
//! `metrics.jsonl` into its `loss.svg` (as the run does at its end), for a
//! run still going or one whose plot was lost.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

/// Options of `nimbus plot`.
#[derive(Args)]
pub(crate) struct PlotArgs {
    /// The run directory (the one holding metrics.jsonl).
    run_dir: PathBuf,
}

/// Runs `nimbus plot`.
pub(crate) fn run(args: PlotArgs) -> Result<()> {
    let reports = crate::train::results::read_reports(&args.run_dir)?;
    let path = crate::train::results::plot(&args.run_dir)?;
    println!("plotted {} reports: {}", reports.len(), path.display());
    Ok(())
}
