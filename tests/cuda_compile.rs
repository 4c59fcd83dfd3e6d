//! Every embedded CUDA kernel family compiles with NVRTC to an `sm_90` cubin. Needs libnvrtc and
//! the CUDA headers (`ONEPASS_CUDA_INCLUDE`, see `scripts/cuda-env.sh`), not a GPU; skips with a
//! visible message where libnvrtc cannot be found.

use onepass::backend::cuda::{
    all_kernel_names, cache_key, include_dir_from_env, nvrtc, CubinCache, KernelCompiler,
    KernelSource, DEFAULT_ARCH, SOURCES,
};

fn compiler(cache: Option<std::path::PathBuf>) -> Option<KernelCompiler> {
    if !nvrtc::nvrtc_present() {
        eprintln!("skipping: libnvrtc not found (source scripts/cuda-env.sh)");
        return None;
    }
    let include = include_dir_from_env();
    assert!(
        include.is_some(),
        "libnvrtc is present but no CUDA headers: set ONEPASS_CUDA_INCLUDE"
    );
    Some(KernelCompiler::new(DEFAULT_ARCH, include.as_deref(), cache))
}

#[test]
fn every_family_compiles_to_a_cubin() {
    let Some(c) = compiler(None) else { return };
    let mut failures = Vec::new();
    for src in SOURCES {
        match c.compile(src) {
            Ok(cubin) => {
                // An ELF image: the magic bytes of a cubin.
                assert_eq!(
                    &cubin[..4],
                    b"\x7fELF",
                    "{}.cu did not give a cubin",
                    src.family
                );
                // Every kernel name the registry found in the source is a symbol of the cubin.
                for name in src.kernel_names() {
                    let sym = format!("\0{name}\0");
                    assert!(
                        cubin.windows(sym.len()).any(|w| w == sym.as_bytes()),
                        "{}.cu: kernel {name} is not in the cubin",
                        src.family
                    );
                }
            }
            Err(f) => failures.push(f.to_string()),
        }
    }
    assert!(
        failures.is_empty(),
        "{} families failed:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    assert!(!all_kernel_names().is_empty());
}

#[test]
fn compile_error_shows_log_and_options() {
    let Some(c) = compiler(None) else { return };
    let bad = KernelSource {
        family: "broken",
        source: "extern \"C\" __global__ void k() { undefined_name(); }",
    };
    let err = c.compile(&bad).expect_err("the source is invalid");
    let text = err.to_string();
    assert!(
        text.contains("undefined_name"),
        "the log is missing: {text}"
    );
    assert!(
        text.contains("--gpu-architecture=sm_90"),
        "the options are missing: {text}"
    );
    assert!(
        text.contains("broken.cu"),
        "the program name is missing: {text}"
    );
}

#[test]
fn cubins_are_cached_on_disk_and_reused() {
    let dir =
        std::env::temp_dir().join(format!("onepass-cuda-compile-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let Some(c) = compiler(Some(dir.clone())) else {
        return;
    };
    let src = &SOURCES[0];
    let first = c.cubin(src).expect("compiles");
    let version = nvrtc::nvrtc_version().expect("nvrtc present");
    let key = cache_key(&src.full_text(), c.options(), version);
    let cache = CubinCache::new(&dir);
    assert_eq!(
        cache.load(src.family, &key).as_deref(),
        Some(&first[..]),
        "the cubin was not stored"
    );
    // A second request is served from the cache: replace the entry with a marker payload and see
    // it come back (no recompilation).
    cache.store(src.family, &key, b"\x7fELF marker").unwrap();
    assert_eq!(c.cubin(src).unwrap(), b"\x7fELF marker");
    let _ = std::fs::remove_dir_all(&dir);
}
