//! `scripts/goal_rows.py`, issue 19's goal table in one command, driven on the CPU backend with
//! short prompts (its GPU rows are the same commands with other numbers): it runs `onepass
//! bench` a row, reads the JSON and prints one Markdown line a row with its goal and whether it
//! holds, and refuses a filter that selects no row; `--save` writes a run's figures and
//! `--before` shows them beside the next run's, and refuses a file `--save` did not write;
//! `--against` runs two binaries alternately and prints their ratio.

use std::process::Command;

fn script(args: &[&str]) -> std::process::Output {
    Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/goal_rows.py"))
        .args(["--bin", env!("CARGO_BIN_EXE_onepass")])
        .args(args)
        .output()
        .expect("python3 runs (the README's set-up installs it)")
}

/// The SmolLM2 rows on the CPU backend with short prompts and runs.
const QUICK: [&str; 12] = [
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
];

/// A fresh directory of this test process under the system's temporary directory.
fn scratch(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("onepass-goal-rows-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn the_smollm2_rows_print_their_figures_and_goals() {
    let out = script(&QUICK);
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
    let tok_s = leading_number(short[3]);
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

#[test]
fn a_saved_run_is_shown_beside_the_next_as_before() {
    let dir = scratch("saved");
    let saved = dir.join("before.json");
    let saved = saved.to_str().unwrap();
    let first = script(&[&QUICK[..], &["--save", saved]].concat());
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(saved).unwrap()).unwrap();
    let was = file["rows"]["smollm2"]["decode_tok_s"].as_f64().unwrap();
    assert!(
        was > 0.0 && file["device"].as_str().unwrap().starts_with("cpu"),
        "{file}"
    );
    assert_eq!(file["rows"]["smollm2-long"]["prompt"], 16, "{file}");

    let second = script(&[&QUICK[..], &["--before", saved]].concat());
    let stdout = String::from_utf8_lossy(&second.stdout);
    assert!(second.status.success(), "{stdout}");
    assert!(
        stdout.contains(&format!("before: {saved}, measured on cpu")),
        "{stdout}"
    );
    assert!(
        stdout.contains("| before tok/s (now / before) |"),
        "{stdout}"
    );
    let cells: Vec<&str> = stdout
        .lines()
        .find(|l| l.starts_with("| smollm2 |"))
        .unwrap()
        .split('|')
        .map(str::trim)
        .collect();
    let now = leading_number(cells[3]);
    let (before, ratio) = cells[4].split_once(" (").unwrap();
    assert_eq!(before, format!("{was:.1}"), "{cells:?}");
    let ratio: f64 = ratio.trim_end_matches("x)").parse().unwrap();
    assert!(
        (ratio - now / was).abs() < 2e-3 * (1.0 + ratio),
        "{cells:?}"
    );
}

#[test]
fn a_before_file_that_is_not_a_saved_run_is_refused_by_name() {
    let dir = scratch("bad");
    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{\"rows\": {\"8b\": {\"tok\": 1}}}").unwrap();
    let out = script(&["--before", bad.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("bad.json: not a file `--save` wrote"),
        "{stderr}"
    );
    let missing = dir.join("missing.json");
    let out = script(&["--before", missing.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("missing.json: cannot read it"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn against_runs_two_binaries_alternately_and_prints_their_ratio() {
    let bin = env!("CARGO_BIN_EXE_onepass");
    let quick = &QUICK[..QUICK.len() - 2]; // one repeat a run: every run is one bench
    let out = script(&[quick, &["--repeat", "1", "--against", bin, "--rounds", "2"]].concat());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("against: {bin}; new: {bin}")),
        "{stdout}"
    );
    // Each binary's two runs of each row, in turn: against, new, against, new.
    let runs: Vec<&str> = stderr.lines().filter(|l| l.contains(", round ")).collect();
    assert_eq!(runs.len(), 8, "{stderr}");
    assert!(
        runs[0].ends_with("round 1 ...") && runs[3].ends_with("round 2 ..."),
        "{runs:?}"
    );
    // "", key, label, against tok/s, new tok/s, new / against, us a step, ""
    let cells: Vec<&str> = stdout
        .lines()
        .find(|l| l.starts_with("| smollm2 |"))
        .unwrap_or_else(|| panic!("no smollm2 row in\n{stdout}"))
        .split('|')
        .map(str::trim)
        .collect();
    let mean = |cell: &str| {
        let runs: Vec<f64> = cell.split(" / ").map(leading_number).collect();
        assert_eq!(runs.len(), 2, "{cell}");
        runs.iter().sum::<f64>() / 2.0
    };
    let ratio: f64 = cells[5].trim_end_matches('x').parse().unwrap();
    let want = mean(cells[4]) / mean(cells[3]);
    assert!((ratio - want).abs() < 2e-3 * (1.0 + want), "{cells:?}");
    assert!(cells[6].contains(" -> "), "{cells:?}");

    let refused = script(&["--against", bin, "--save", "x.json"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr)
        .contains("--save and --before go with the goal table"));
}

/// The number a table cell starts with (`1,415.9 [1,414.7-1,417.0]` -> 1415.9).
fn leading_number(cell: &str) -> f64 {
    cell.split(' ')
        .next()
        .unwrap()
        .replace(',', "")
        .parse()
        .unwrap()
}
