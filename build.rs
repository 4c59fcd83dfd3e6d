//! Sets `cfg(onepass_nvrtc)` where a libnvrtc shared library can be found at build time (in the
//! directories of `LD_LIBRARY_PATH`, under `CUDA_PATH`, `CUDA_HOME` or `CUDA_ROOT`, or in the
//! usual CUDA and system library folders). The tests that compile CUDA kernels with NVRTC are
//! ignored without it, and run (failing loudly if it cannot be loaded after all) with it;
//! `source scripts/cuda-env.sh` installs one and puts it on `LD_LIBRARY_PATH`.

use std::env;
use std::path::{Path, PathBuf};

/// Environment variables whose directories are searched; a change of any reruns this script.
const DIR_VARS: [&str; 3] = ["CUDA_PATH", "CUDA_HOME", "CUDA_ROOT"];

/// The usual places of libnvrtc outside `LD_LIBRARY_PATH`.
const USUAL_DIRS: [&str; 7] = [
    "/usr/local/cuda/lib64",
    "/usr/local/cuda/targets/x86_64-linux/lib",
    "/opt/cuda/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
];

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=LD_LIBRARY_PATH");
    for var in DIR_VARS {
        println!("cargo::rerun-if-env-changed={var}");
    }
    println!("cargo::rustc-check-cfg=cfg(onepass_nvrtc)");
    if candidate_dirs().iter().any(|d| has_nvrtc(d)) {
        println!("cargo::rustc-cfg=onepass_nvrtc");
    }
}

/// Every directory that may hold libnvrtc, `LD_LIBRARY_PATH`'s first.
fn candidate_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = env::var_os("LD_LIBRARY_PATH")
        .map(|p| env::split_paths(&p).collect())
        .unwrap_or_default();
    for var in DIR_VARS {
        if let Some(root) = env::var_os(var) {
            let root = PathBuf::from(root);
            dirs.extend(["lib64", "lib", "targets/x86_64-linux/lib"].map(|d| root.join(d)));
        }
    }
    dirs.extend(USUAL_DIRS.map(PathBuf::from));
    dirs
}

/// Whether `dir` holds `libnvrtc.so` or a versioned `libnvrtc.so.N` (the names the loader tries).
fn has_nvrtc(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|e| {
        let name = e.file_name();
        let name = name.to_string_lossy();
        name == "libnvrtc.so"
            || name
                .strip_prefix("libnvrtc.so.")
                .is_some_and(|v| v.starts_with(|c: char| c.is_ascii_digit()))
    })
}
