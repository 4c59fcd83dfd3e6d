//! `scripts/goal_rows.py`, issue 19's goal table in one command, driven on the CPU backend with
//! short prompts (its GPU rows are the same commands with other numbers): it runs `onepass
//! bench` a row, reads the JSON and prints one Markdown line a row with its goal and whether it
//! holds, and refuses a filter that selects no row.

use std::process::Command;

fn script(args: &[&str]) -> std::process::Output {
    Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/goal_rows.py"))
        .args(["--bin", env!("CARGO_BIN_EXE_onepass")])
        .args(args)
        .output()
        .expect("python3 runs (the README's set-up installs it)")
}

#[test]
fn the_smollm2_rows_print_their_figures_and_goals() {
    let out = script(&[
        "--backend",
        "cpu",
        "--only",
        "smollm2",
        "--prompt",
        "8",
        "--long",
        "16",
        "--decode",
        "2",
        "--repeat",
        "1",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("device: cpu"), "{stdout}");
    let row = |key: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(&format!("| {key} |")))
            .unwrap_or_else(|| panic!("no {key} row in\n{stdout}"))
            .split('|')
            .map(str::trim)
            .collect::<Vec<_>>()
    };
    // "", key, label, tok/s [range], us, GB, TB/s, goal, holds?, "" (split at each |)
    let short = row("smollm2");
    assert_eq!(short[5], "0.10", "{short:?}"); // the Q4_1 file's 96 MB a step
    assert_eq!(short[7], "2,000", "{short:?}");
    assert!(short[8].starts_with("no ("), "{short:?}");
    let tok_s: f64 = short[3]
        .split(' ')
        .next()
        .unwrap()
        .replace(',', "")
        .parse()
        .unwrap();
    assert!(tok_s > 0.0, "{short:?}");
    let long = row("smollm2-long");
    assert!(long[2].ends_with("(16)"), "{long:?}");
    assert_eq!(long[7], "90% of smollm2", "{long:?}");
}

#[test]
fn a_filter_that_selects_no_row_is_refused_with_the_keys() {
    let out = script(&["--only", "no-such-row"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("no row's key contains 'no-such-row'") && stderr.contains("8b-q4k"),
        "{stderr}"
    );
}
