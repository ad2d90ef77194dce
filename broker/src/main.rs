//! `fissionlog-broker`: the server, the client commands and the demo.

mod cli;

fn main() {
    std::process::exit(cli::main());
}
