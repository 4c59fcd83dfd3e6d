//! `onepass doctor [--json]`: what this machine offers onepass. Whether the CPU backend starts;
//! for CUDA, driver and NVRTC versions, devices with their compute capability, and whether every
//! embedded kernel family compiles (NVRTC only, no GPU needed: without a device it compiles for
//! `sm_90a`; `--arch` names another). CUDA being absent is not a problem; a part of it that is
//! present and broken is. With `--fill-cache` the kernels are compiled into the kernel cache, so a
//! machine can be prepared for a GPU it does not have.

use std::io::Write;
use std::time::Instant;

use onepass::backend::cuda::{
    all_kernel_names, arch_for, default_cache_dir, devices, driver_present, driver_version,
    include_dir_from_env, nvrtc, DeviceInfo, KernelCompiler, DEFAULT_ARCH, SOURCES,
};

/// One kernel family that failed to compile.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FamilyFailure {
    /// The family (source file without `.cu`).
    pub family: String,
    /// NVRTC's status, options and log.
    pub error: String,
}

/// The kernel cache `--fill-cache` filled.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FilledCache {
    /// The cache directory.
    pub dir: String,
    /// Families compiled into it by this run.
    pub compiled: usize,
}

/// Everything the doctor found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DoctorReport {
    /// The CPU backend: `ready: <device>`, or why it does not start.
    pub cpu: String,
    /// Whether the CPU backend starts.
    pub cpu_ready: bool,
    /// The driver's CUDA version, or null without a driver.
    pub cuda_driver: Option<String>,
    /// NVRTC's version, or null when libnvrtc cannot be found.
    pub nvrtc: Option<String>,
    /// The devices the driver reports (empty without a driver).
    pub devices: Vec<DeviceInfo>,
    /// Why device discovery failed, when it did with a driver present.
    pub device_error: Option<String>,
    /// The CUDA header directory NVRTC uses, if any.
    pub include_dir: Option<String>,
    /// The architecture the kernels were compiled for.
    pub arch: String,
    /// Kernel families (source files).
    pub families: usize,
    /// Kernels (entry points) in all families.
    pub kernels: usize,
    /// Kernels whose family compiled.
    pub kernels_compiled: usize,
    /// Kernels whose family failed to compile (or could not be compiled: no NVRTC).
    pub kernels_failed: usize,
    /// The failing families, with NVRTC's log.
    pub failures: Vec<FamilyFailure>,
    /// Seconds spent compiling.
    pub compile_seconds: f64,
    /// With `--fill-cache`: the kernel cache filled, and how many families were compiled into it
    /// (the others were there already).
    pub filled_cache: Option<FilledCache>,
    /// What is present on this machine but broken, one line each (empty: nothing is).
    pub problems: Vec<String>,
}

/// What `--fill-cache` compiles into the kernel cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// Nothing: the kernels are compiled to check them, not kept.
    Nothing,
    /// Every kernel, as a run loads it.
    Kernels,
    /// Every kernel, and every kernel again with block stamps (what `bench --timeline` loads).
    KernelsAndStamped,
}

/// Gathers the report.
pub fn diagnose(arch: Option<&str>, fill: Fill) -> DoctorReport {
    let (cpu, cpu_ready) = match onepass::Device::cpu(0) {
        Ok(d) => (format!("ready: {}", d.name()), true),
        Err(e) => (format!("does not start: {e}"), false),
    };
    let cuda_driver = driver_version();
    let (devices, device_error) = if driver_present() {
        match devices() {
            Ok(d) => (d, None),
            Err(e) => (Vec::new(), Some(e.with_causes())),
        }
    } else {
        (Vec::new(), None)
    };
    let arch = match arch {
        Some(a) => a.to_string(),
        None => devices
            .first()
            .map(|d| arch_for(d.compute_capability))
            .unwrap_or_else(|| DEFAULT_ARCH.to_string()),
    };
    let include = include_dir_from_env();
    let nvrtc_version = nvrtc::nvrtc_version();
    let kernels = all_kernel_names().len();
    let start = Instant::now();
    let mut failures = Vec::new();
    let mut kernels_failed = 0;
    let mut filled_cache = None;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if nvrtc_version.is_some() && fill != Fill::Nothing {
        match default_cache_dir() {
            Some(dir) => {
                let compiler = KernelCompiler::new(&arch, include.as_deref(), Some(dir.clone()));
                let stamped = compiler.clone().with_block_stamps();
                let warmed = compiler
                    .warm(SOURCES, threads, &|_, _, _| {})
                    .and_then(|plain| {
                        if fill != Fill::KernelsAndStamped {
                            return Ok(plain.compiled);
                        }
                        let report = stamped.warm(SOURCES, threads, &|_, _, _| {})?;
                        Ok(plain.compiled + report.compiled)
                    });
                match warmed {
                    Ok(compiled) => {
                        filled_cache = Some(FilledCache {
                            dir: dir.display().to_string(),
                            compiled,
                        })
                    }
                    Err(e) => {
                        kernels_failed = kernels;
                        failures.push(FamilyFailure {
                            family: "*".into(),
                            error: e.with_causes(),
                        });
                    }
                }
            }
            None => {
                kernels_failed = kernels;
                failures.push(FamilyFailure {
                    family: "*".into(),
                    error: "no kernel cache directory (set ONEPASS_CACHE_DIR)".into(),
                });
            }
        }
    } else if nvrtc_version.is_some() {
        let compiler = KernelCompiler::new(&arch, include.as_deref(), None);
        for (src, result) in SOURCES.iter().zip(compiler.compile_all(SOURCES, threads)) {
            if let Err(f) = result {
                kernels_failed += src.kernel_names().len();
                failures.push(FamilyFailure {
                    family: src.family.to_string(),
                    error: f.with_causes(),
                });
            }
        }
    } else {
        kernels_failed = kernels;
        failures.push(FamilyFailure {
            family: "*".into(),
            error: "libnvrtc not found on the library path; no kernel can be compiled".into(),
        });
    }
    let mut problems = Vec::new();
    if !cpu_ready {
        problems.push(format!("the CPU backend {cpu}"));
    }
    if let Some(e) = &device_error {
        problems.push(format!(
            "the CUDA driver is present but lists no device: {e}"
        ));
    }
    if nvrtc_version.is_some() && kernels_failed > 0 {
        problems.push(format!(
            "{kernels_failed} of {kernels} CUDA kernels did not compile"
        ));
    }
    if nvrtc_version.is_none() && !devices.is_empty() {
        problems.push(
            "a CUDA device is present but libnvrtc is not on the library path, so no kernel \
             can be compiled for it"
                .to_string(),
        );
    }
    DoctorReport {
        cpu,
        cpu_ready,
        cuda_driver,
        nvrtc: nvrtc_version.map(|(a, b)| format!("{a}.{b}")),
        devices,
        device_error,
        include_dir: include.map(|p| p.display().to_string()),
        arch,
        families: SOURCES.len(),
        kernels,
        kernels_compiled: kernels - kernels_failed,
        kernels_failed,
        failures,
        compile_seconds: start.elapsed().as_secs_f64(),
        filled_cache,
        problems,
    }
}

/// One line on CUDA as a whole: what is absent, or that it is usable.
fn cuda_summary(r: &DoctorReport) -> String {
    match (&r.cuda_driver, r.devices.len(), &r.nvrtc) {
        (None, _, None) => "absent (no driver, no NVRTC): onepass runs on the CPU".into(),
        (None, _, Some(_)) => {
            "no driver: onepass runs on the CPU (NVRTC is present, the kernels are checked below)"
                .into()
        }
        (Some(_), 0, _) => "a driver but no device: onepass runs on the CPU".into(),
        (Some(_), n, Some(_)) if r.kernels_failed == 0 => {
            format!("ready ({n} device(s); `--backend auto` uses device 0)")
        }
        (Some(_), _, _) => "present but not usable (see the problems below)".into(),
    }
}

fn or_none(v: &Option<String>) -> &str {
    v.as_deref().unwrap_or("not found")
}

/// Prints the report (one JSON object with `json`); an error when something this machine has is
/// broken (a CUDA that is absent is not).
pub fn run(json: bool, arch: Option<&str>, fill: Fill) -> anyhow::Result<()> {
    let r = diagnose(arch, fill);
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&r)?)?;
    } else {
        writeln!(out, "CPU backend:  {}", r.cpu)?;
        writeln!(out, "CUDA:         {}", cuda_summary(&r))?;
        writeln!(out, "CUDA driver:  {}", or_none(&r.cuda_driver))?;
        writeln!(out, "NVRTC:        {}", or_none(&r.nvrtc))?;
        writeln!(out, "headers:      {}", or_none(&r.include_dir))?;
        if let Some(e) = &r.device_error {
            writeln!(out, "devices:      error: {e}")?;
        } else if r.devices.is_empty() {
            writeln!(out, "devices:      none")?;
        }
        for d in &r.devices {
            writeln!(
                out,
                "device {}:     {} (compute {}.{}, {} SMs, {:.1} GiB)",
                d.ordinal,
                d.name,
                d.compute_capability.0,
                d.compute_capability.1,
                d.multiprocessors,
                d.total_memory as f64 / (1u64 << 30) as f64
            )?;
        }
        if r.nvrtc.is_some() {
            writeln!(
                out,
                "kernels:      {} of {} compiled for {} ({} families, {:.2} s), {} failed",
                r.kernels_compiled,
                r.kernels,
                r.arch,
                r.families,
                r.compile_seconds,
                r.kernels_failed
            )?;
            if let Some(c) = &r.filled_cache {
                writeln!(
                    out,
                    "cache:        {} ({} families compiled into it)",
                    c.dir, c.compiled
                )?;
            }
            for f in &r.failures {
                writeln!(out, "\nfamily {}:\n{}", f.family, f.error)?;
            }
        } else {
            writeln!(
                out,
                "kernels:      not compiled (no libnvrtc on the library path)"
            )?;
        }
    }
    match r.problems.as_slice() {
        [] => Ok(()),
        [one] => anyhow::bail!("{one}"),
        many => anyhow::bail!("{} problems: {}", many.len(), many.join("; ")),
    }
}
