//! The doctor's report: its JSON carries the documented keys (with or without NVRTC), and every
//! kernel compiles where libnvrtc is present (ignored where the build found none, see `build.rs`).

use std::sync::OnceLock;

#[path = "../src/cli/doctor.rs"]
#[allow(dead_code)]
mod doctor;

/// The report, gathered once for both tests (it compiles every kernel family where it can).
fn report() -> &'static doctor::DoctorReport {
    static REPORT: OnceLock<doctor::DoctorReport> = OnceLock::new();
    REPORT.get_or_init(doctor::diagnose)
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
