//! The doctor's report: its JSON carries the documented keys, and every kernel compiles where
//! libnvrtc is present.

#[path = "../src/cli/doctor.rs"]
#[allow(dead_code)]
mod doctor;

#[test]
fn json_has_the_documented_keys() {
    let report = doctor::diagnose();
    let v: serde_json::Value = serde_json::to_value(&report).unwrap();
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
    if report.nvrtc.is_some() {
        assert_eq!(report.kernels_failed, 0, "failures: {:#?}", report.failures);
    } else {
        eprintln!("skipping the compile check: libnvrtc not found");
        assert_eq!(report.kernels_compiled, 0);
    }
    if report.cuda_driver.is_none() {
        assert!(report.devices.is_empty());
        assert_eq!(report.arch, "sm_90");
    }
}
