//! Every embedded CUDA kernel family compiles with NVRTC to an `sm_90` cubin; cubins are cached on
//! disk, and warming compiles the families the cache lacks on several threads. Needs libnvrtc and
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

/// Small families for the warm-up tests (each a second or so to compile, with the prelude).
const SMALL: &[KernelSource] = &[
    KernelSource {
        family: "warm_a",
        source: "extern \"C\" __global__ void warm_a(float* x) { x[threadIdx.x] += 1.0f; }",
    },
    KernelSource {
        family: "warm_b",
        source: "extern \"C\" __global__ void warm_b(float* x) { x[threadIdx.x] *= 2.0f; }",
    },
    KernelSource {
        family: "warm_c",
        source: "extern \"C\" __global__ void warm_c(float* x) { x[threadIdx.x] -= 3.0f; }",
    },
];

/// A fresh cache directory for one test.
fn temp_cache(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("onepass-warm-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
#[cfg_attr(not(onepass_nvrtc), ignore = "needs NVRTC: source scripts/cuda-env.sh")]
fn warming_compiles_what_the_cache_lacks_on_several_threads_once() {
    let dir = temp_cache("once");
    let c = compiler(Some(dir.clone()));
    // One family cached beforehand: warming compiles the other two.
    c.cubin(&SMALL[1]).expect("compiles");
    assert_eq!(c.missing(SMALL).unwrap().len(), 2);
    let calls = std::sync::Mutex::new(Vec::new());
    let report = c
        .warm(SMALL, 2, &|done, total, family| {
            calls
                .lock()
                .unwrap()
                .push((done, total, family.to_string()))
        })
        .expect("warms");
    assert_eq!(
        (report.families, report.compiled, report.threads),
        (3, 2, 2)
    );
    let mut calls = calls.into_inner().unwrap();
    assert_eq!(
        calls[0],
        (0, 2, String::new()),
        "the first call announces the total"
    );
    calls.remove(0);
    // Each family once, in whichever order the threads finished; the counts 1 and 2.
    let mut families: Vec<&str> = calls.iter().map(|c| c.2.as_str()).collect();
    families.sort();
    assert_eq!(families, ["warm_a", "warm_c"], "{calls:?}");
    let mut counts: Vec<usize> = calls.iter().map(|c| c.0).collect();
    counts.sort();
    assert_eq!(counts, [1, 2], "{calls:?}");
    assert!(c.missing(SMALL).unwrap().is_empty());
    // The cubins are the ones a plain request gets from the cache: valid images.
    for src in SMALL {
        assert_eq!(&c.cubin(src).unwrap()[..4], b"\x7fELF");
    }
    // Nothing left: no call, nothing compiled.
    let again = c
        .warm(SMALL, 4, &|_, _, _| panic!("nothing to report"))
        .unwrap();
    assert_eq!((again.compiled, again.threads), (0, 0));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[cfg_attr(not(onepass_nvrtc), ignore = "needs NVRTC: source scripts/cuda-env.sh")]
fn warming_returns_a_family_that_does_not_compile_and_keeps_the_others() {
    let dir = temp_cache("broken");
    let c = compiler(Some(dir.clone()));
    let sources = [
        SMALL[0],
        KernelSource {
            family: "warm_broken",
            source: "extern \"C\" __global__ void warm_broken() { not_declared(); }",
        },
    ];
    let err = c
        .warm(&sources, 1, &|_, _, _| {})
        .expect_err("a family does not compile");
    let text = err.to_string();
    assert!(
        text.contains("warm_broken.cu") && text.contains("not_declared"),
        "{text}"
    );
    // The family that compiles is cached all the same.
    let left: Vec<&str> = c
        .missing(&sources)
        .unwrap()
        .iter()
        .map(|s| s.family)
        .collect();
    assert_eq!(left, ["warm_broken"]);
    // The doctor's check: every family's result, in order, on threads.
    let all = c.compile_all(&[sources[1], SMALL[2], sources[0]], 2);
    assert!(all[0].is_err() && all[1].is_ok() && all[2].is_ok());
    assert_eq!(&all[2].as_ref().unwrap()[..4], b"\x7fELF");
    // Without a cache nothing is compiled ahead (it could not be kept).
    let uncached = compiler(None).warm(&sources, 2, &|_, _, _| {}).unwrap();
    assert_eq!(uncached.compiled, 0);
    let _ = std::fs::remove_dir_all(&dir);
}
