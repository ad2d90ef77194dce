//! `simulate`: placeholder until the simulation command lands.

use std::process::ExitCode;

/// Arguments of `fissionlog simulate`.
#[derive(clap::Args, Debug)]
pub struct SimulateArgs {}

/// Runs the simulation.
pub fn run(_args: &SimulateArgs) -> ExitCode {
    eprintln!("simulate: not built");
    ExitCode::from(1)
}
