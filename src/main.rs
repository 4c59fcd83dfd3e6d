//! The `onepass` command-line tool.

mod cli;

fn main() {
    std::process::exit(cli::main());
}
