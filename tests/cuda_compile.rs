//! Every embedded CUDA kernel family compiles with NVRTC to an `sm_90` cubin. Needs libnvrtc and
//! the CUDA headers (`ONEPASS_CUDA_INCLUDE`, see `scripts/cuda-env.sh`), not a GPU. Ignored where
//! the build found no libnvrtc (`cfg(onepass_nvrtc)`, set by `build.rs`); where it found one, a
//! libnvrtc that cannot be loaded is a failure.

use onepass::backend::cuda::{
    all_kernel_names, cache_key, include_dir_from_env, nvrtc, CubinCache, KernelCompiler,
    KernelSource, DEFAULT_ARCH, SOURCES,
};

/// The compiler for `DEFAULT_ARCH`, caching cubins in `cache`; panics, saying why, where
/// libnvrtc cannot be loaded or the CUDA headers are not set.
fn compiler(cache: Option<std::path::PathBuf>) -> KernelCompiler {
    assert!(
        nvrtc::nvrtc_present(),
        "this test needs NVRTC, and libnvrtc cannot be loaded: source scripts/cuda-env.sh \
         (where the build found it, run the tests with the library path it was built with)"
    );
    let include = include_dir_from_env();
    assert!(
        include.is_some(),
        "libnvrtc is present but no CUDA headers: set ONEPASS_CUDA_INCLUDE"
    );
    KernelCompiler::new(DEFAULT_ARCH, include.as_deref(), cache)
}

#[test]
#[cfg_attr(not(onepass_nvrtc), ignore = "needs NVRTC: source scripts/cuda-env.sh")]
fn every_family_compiles_to_a_cubin() {
    let c = compiler(None);
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
#[cfg_attr(not(onepass_nvrtc), ignore = "needs NVRTC: source scripts/cuda-env.sh")]
fn compile_error_shows_log_and_options() {
    let c = compiler(None);
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
#[cfg_attr(not(onepass_nvrtc), ignore = "needs NVRTC: source scripts/cuda-env.sh")]
fn cubins_are_cached_on_disk_and_reused() {
    let dir =
        std::env::temp_dir().join(format!("onepass-cuda-compile-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let c = compiler(Some(dir.clone()));
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
