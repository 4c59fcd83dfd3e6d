//! The `onepass` command-line tool.

fn main() {
    std::process::exit(onepass_cli::main());
}

mod onepass_cli {
    pub fn main() -> i32 {
        0
    }
}
