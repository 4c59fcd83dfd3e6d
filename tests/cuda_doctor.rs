//! The doctor's report: its JSON carries the documented keys (with or without NVRTC), every
//! kernel compiles where libnvrtc is present, and `--fill-cache` leaves every family in the kernel
//! cache (both ignored where the build found no NVRTC, see `build.rs`).

use std::sync::OnceLock;

#[path = "../src/cli/doctor.rs"]
#[allow(dead_code)]
mod doctor;

/// The report, gathered once for both tests (it compiles every kernel family where it can).
fn report() -> &'static doctor::DoctorReport {
    static REPORT: OnceLock<doctor::DoctorReport> = OnceLock::new();
    REPORT.get_or_init(|| doctor::diagnose(None, doctor::Fill::Nothing))
}

#[test]
fn json_has_the_documented_keys() {
    let report = report();
    let v: serde_json::Value = serde_json::to_value(report).unwrap();
    for key in [
        "cuda_driver",
        "nvrtc",
        "devices",
        "kernels_compiled",
        "kernels_failed",
    ] {
        assert!(v.get(key).is_some(), "missing key {key} in {v}");
    }
    assert!(v["devices"].is_array());
    assert_eq!(
        report.kernels_compiled + report.kernels_failed,
        report.kernels
    );
    assert!(report.kernels > 0);
    if report.nvrtc.is_none() {
        assert_eq!(report.kernels_compiled, 0);
        assert!(
            report.failures.iter().any(|f| f.error.contains("libnvrtc")),
            "{:#?}",
            report.failures
        );
    }
    if report.cuda_driver.is_none() {
        assert!(report.devices.is_empty());
        assert_eq!(report.arch, "sm_90a");
    }
}

#[test]
#[cfg_attr(not(onepass_nvrtc), ignore = "needs NVRTC: source scripts/cuda-env.sh")]
fn every_kernel_compiles_where_nvrtc_is_present() {
    let report = report();
    assert!(
        report.nvrtc.is_some(),
        "this test needs NVRTC, and libnvrtc cannot be loaded: source scripts/cuda-env.sh \
         (where the build found it, run the tests with the library path it was built with)"
    );
    assert_eq!(report.kernels_failed, 0, "failures: {:#?}", report.failures);
    assert_eq!(report.kernels_compiled, report.kernels);
}

#[test]
#[cfg_attr(not(onepass_nvrtc), ignore = "needs NVRTC: source scripts/cuda-env.sh")]
fn fill_cache_compiles_every_family_once_for_the_named_architecture() {
    let dir = std::env::temp_dir().join(format!("onepass-fill-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let fill = || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_onepass"))
            .args(["doctor", "--json", "--arch", "sm_89", "--fill-cache"])
            .env("ONEPASS_CACHE_DIR", &dir)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str::<serde_json::Value>(&text).unwrap()
    };
    let first = fill();
    assert_eq!(first["arch"], "sm_89");
    let families = first["families"].as_u64().unwrap();
    assert_eq!(first["filled_cache"]["compiled"].as_u64(), Some(families));
    let cubins = std::fs::read_dir(dir.join("kernels"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "cubin"))
        })
        .count();
    assert_eq!(cubins as u64, families);
    // Everything is cached now: nothing is compiled again.
    assert_eq!(fill()["filled_cache"]["compiled"].as_u64(), Some(0));
    let _ = std::fs::remove_dir_all(&dir);
}
