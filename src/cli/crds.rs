//! `hwaccel crds`: print every CustomResourceDefinition, or write one file per CRD.

use std::path::PathBuf;
use std::process::ExitCode;

use super::write_stdout;

#[derive(Debug, clap::Args)]
pub(super) struct CrdsArgs {
    /// Write `<plural>.<group>.yaml` files into this directory instead of printing.
    #[arg(long)]
    out_dir: Option<PathBuf>,
}

/// Runs `hwaccel crds`.
pub(super) fn run(args: CrdsArgs) -> anyhow::Result<ExitCode> {
    match args.out_dir {
        Some(dir) => {
            for path in crate::api::crds::write_dir(&dir)? {
                eprintln!("wrote {}", path.display());
            }
        }
        None => write_stdout(&crate::api::crds::all_yaml()?)?,
    }
    Ok(ExitCode::SUCCESS)
}
