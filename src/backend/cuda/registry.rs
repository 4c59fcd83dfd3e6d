//! The CUDA kernel registry: CUDA C sources embedded in the binary (one file per op family under
//! `kernels/`), compiled by NVRTC to a cubin for the device's architecture at first use, cached on
//! disk, loaded as modules, and looked up by kernel name.
//!
//! A kernel's name is the name of its `extern "C" __global__` function, which is the same name the
//! CPU backend registers, so one [`KernelId`] names the same op on every backend.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use cudarc::driver::{sys, CudaContext, CudaFunction, CudaModule, DevicePtr};

use super::cache::{cache_key, CubinCache};
use super::nvrtc::{compile_cubin, compile_options, nvrtc_version};
use crate::error::{Error, Result};
use crate::graph::KernelId;

/// Helpers every family source may use (included before each family's source).
pub const PRELUDE: &str = include_str!("kernels/prelude.cuh");

/// One op family's CUDA C source.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// The family (and file) name: `norm`, `matmul`, ...
    pub family: &'static str,
    /// The CUDA C source, without the prelude.
    pub source: &'static str,
}

/// Every embedded family source.
pub const SOURCES: &[KernelSource] = &[
    family("argmax", include_str!("kernels/argmax.cu")),
    // The tensor-core prompt form (`attention_mma.cuh`) in front of the attention family, and the
    // slotted decode attention of a batched step (`attention_slots.cu`) after the family's own
    // source, whose fold and merge it calls.
    family(
        "attention",
        concat!(
            "#line 1 \"attention_mma.cuh\"\n",
            include_str!("kernels/attention_mma.cuh"),
            "#line 1 \"attention.cu\"\n",
            include_str!("kernels/attention.cu"),
            "#line 1 \"attention_decode.cu\"\n",
            include_str!("kernels/attention_decode.cu"),
            "#line 1 \"attention_slots.cu\"\n",
            include_str!("kernels/attention_slots.cu"),
        ),
    ),
    family("copy", include_str!("kernels/copy.cu")),
    family("draw", include_str!("kernels/draw.cu")),
    // The activations (`activation.cuh`) in front of the two families that compute them; the
    // `#line` marks keep compiler messages and size-check lines pointing at each file.
    family(
        "elementwise",
        concat!(
            "#line 1 \"activation.cuh\"\n",
            include_str!("kernels/activation.cuh"),
            "#line 1 \"elementwise.cu\"\n",
            include_str!("kernels/elementwise.cu"),
        ),
    ),
    family("embedding", include_str!("kernels/embedding.cu")),
    // The vector forms of the products (`matmul_blocks.cuh`, then `matmul_dots.cuh`) in front of
    // each family that uses them; the fused kernels' activation row (`fused_row.cuh`) in front of
    // theirs.
    family(
        "fused_block",
        concat!(
            "#line 1 \"activation.cuh\"\n",
            include_str!("kernels/activation.cuh"),
            "#line 1 \"matmul_blocks.cuh\"\n",
            include_str!("kernels/matmul_blocks.cuh"),
            "#line 1 \"matmul_dots.cuh\"\n",
            include_str!("kernels/matmul_dots.cuh"),
            "#line 1 \"fused_row.cuh\"\n",
            include_str!("kernels/fused_row.cuh"),
            "#line 1 \"fused_block.cu\"\n",
            include_str!("kernels/fused_block.cu"),
        ),
    ),
    family(
        "kv_cache",
        concat!(
            include_str!("kernels/kv_cache.cu"),
            "#line 1 \"kv_slots.cu\"\n",
            include_str!("kernels/kv_slots.cu"),
        ),
    ),
    family(
        "matmul",
        concat!(
            "#line 1 \"activation.cuh\"\n",
            include_str!("kernels/activation.cuh"),
            "#line 1 \"matmul_blocks.cuh\"\n",
            include_str!("kernels/matmul_blocks.cuh"),
            "#line 1 \"matmul_dots.cuh\"\n",
            include_str!("kernels/matmul_dots.cuh"),
            "#line 1 \"matmul_mma.cuh\"\n",
            include_str!("kernels/matmul_mma.cuh"),
            "#line 1 \"matmul_mma_pipe.cuh\"\n",
            include_str!("kernels/matmul_mma_pipe.cuh"),
            "#line 1 \"matmul_mma_h.cuh\"\n",
            include_str!("kernels/matmul_mma_h.cuh"),
            "#line 1 \"matmul_wgmma.cuh\"\n",
            include_str!("kernels/matmul_wgmma.cuh"),
            "#line 1 \"matmul_head.cuh\"\n",
            include_str!("kernels/matmul_head.cuh"),
            "#line 1 \"matmul.cu\"\n",
            include_str!("kernels/matmul.cu"),
            "#line 1 \"matmul_rows.cu\"\n",
            include_str!("kernels/matmul_rows.cu"),
        ),
    ),
    // One row of RMS normalization (`norm_row.cuh`) in front of the norms.
    family(
        "norm",
        concat!(
            "#line 1 \"norm_row.cuh\"\n",
            include_str!("kernels/norm_row.cuh"),
            "#line 1 \"norm.cu\"\n",
            include_str!("kernels/norm.cu"),
        ),
    ),
    family("rope", include_str!("kernels/rope.cu")),
    family("softmax", include_str!("kernels/softmax.cu")),
    family("test", include_str!("kernels/test.cu")),
];

const fn family(family: &'static str, source: &'static str) -> KernelSource {
    KernelSource { family, source }
}

impl KernelSource {
    /// The full text NVRTC compiles: the prelude, then the family's source.
    pub fn full_text(&self) -> String {
        format!(
            "#line 1 \"prelude.cuh\"\n{PRELUDE}\n#line 1 \"{}.cu\"\n{}",
            self.family, self.source
        )
    }

    /// The names of the kernels this source defines (`extern "C" __global__ void NAME(`).
    pub fn kernel_names(&self) -> Vec<&'static str> {
        kernel_names_in(self.source)
    }
}

/// The names of the kernels a source defines, in order. Two forms are recognized:
/// `extern "C" __global__ void NAME(` (a `NAME` in capitals is a macro parameter and skipped),
/// and a line that starts with a macro call `SOMETHING_KERNEL(NAME, ...)`, the convention for
/// instantiating one templated kernel per dtype. The compile test checks that every name found
/// here is a symbol of the compiled cubin.
pub fn kernel_names_in(source: &'static str) -> Vec<&'static str> {
    const MARK: &str = "extern \"C\" __global__ void ";
    let ident_end = |t: &str| {
        t.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(t.len())
    };
    let mut names = Vec::new();
    for line in source.lines() {
        let trimmed = line.trim_start();
        if let Some(at) = trimmed.find(MARK) {
            let tail = &trimmed[at + MARK.len()..];
            // A kernel's launch bounds between `void` and its name.
            let tail = match tail.strip_prefix("__launch_bounds__(") {
                Some(bounds) => bounds
                    .find(')')
                    .map_or("", |e| bounds[e + 1..].trim_start()),
                None => tail,
            };
            let name = &tail[..ident_end(tail)];
            if !name.is_empty() && name.chars().any(|c| c.is_ascii_lowercase()) {
                names.push(name);
            }
            continue;
        }
        let macro_len = ident_end(trimmed);
        let macro_name = &trimmed[..macro_len];
        if macro_len > 0 && macro_name.ends_with("_KERNEL") && trimmed[macro_len..].starts_with('(')
        {
            let tail = trimmed[macro_len + 1..].trim_start();
            let name = &tail[..ident_end(tail)];
            if !name.is_empty() && tail[name.len()..].trim_start().starts_with(',') {
                names.push(name);
            }
        }
    }
    names
}

/// Every CUDA kernel name, sorted.
pub fn all_kernel_names() -> Vec<&'static str> {
    let mut v: Vec<_> = SOURCES.iter().flat_map(|s| s.kernel_names()).collect();
    v.sort_unstable();
    v
}

/// The compute capability as an NVRTC architecture: `(8, 6)` -> `sm_86`; `(9, 0)` -> `sm_90a`, the
/// Hopper target whose warpgroup products (`wgmma`, `matmul_wgmma.cuh`) exist only there (its
/// cubins run on compute capability 9.0 alone, which is what it is chosen for).
pub fn arch_for(compute_capability: (i32, i32)) -> String {
    let suffix = if compute_capability == (9, 0) {
        "a"
    } else {
        ""
    };
    format!(
        "sm_{}{}{suffix}",
        compute_capability.0, compute_capability.1
    )
}

/// The CUDA header directory: `ONEPASS_CUDA_INCLUDE` when set, else the toolkit's
/// `/usr/local/cuda/include` (or `$CUDA_HOME/include`, `$CUDA_PATH/include`) when it exists.
/// Read once at start and passed down.
pub fn include_dir_from_env() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("ONEPASS_CUDA_INCLUDE").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    let candidates = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(std::env::var_os)
        .map(|root| PathBuf::from(root).join("include"))
        .chain(std::iter::once(PathBuf::from("/usr/local/cuda/include")));
    candidates
        .into_iter()
        .find(|d| d.join("cuda_fp16.h").exists())
}

/// Compiles family sources to cubins for one architecture, through the disk cache.
#[derive(Debug, Clone)]
pub struct KernelCompiler {
    arch: String,
    options: Vec<String>,
    cache: Option<CubinCache>,
}

impl KernelCompiler {
    /// A compiler for `arch` (`sm_90`), with CUDA headers from `include_dir` and cubins cached in
    /// `cache_dir` (no disk cache when `None`).
    pub fn new(arch: &str, include_dir: Option<&Path>, cache_dir: Option<PathBuf>) -> Self {
        KernelCompiler {
            arch: arch.to_string(),
            options: compile_options(arch, include_dir),
            cache: cache_dir.map(CubinCache::new),
        }
    }

    /// The same compiler with block stamps compiled in (`-DOP_STAMPS`, `kernels/prelude.cuh`):
    /// every kernel's blocks record when they ran ([`super::stamps`]). The cubins get their own
    /// cache keys, since the options differ.
    pub fn with_block_stamps(mut self) -> Self {
        self.options.push("-DOP_STAMPS".to_string());
        self
    }

    /// The target architecture.
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// The NVRTC options.
    pub fn options(&self) -> &[String] {
        &self.options
    }

    /// The disk cache, when there is one.
    pub fn cache(&self) -> Option<&CubinCache> {
        self.cache.as_ref()
    }

    /// The cubin of one family: from the cache when a verified entry exists, else compiled (and
    /// stored; a failure to store is logged, not fatal).
    pub fn cubin(&self, src: &KernelSource) -> Result<Vec<u8>> {
        let version = nvrtc_version().ok_or_else(|| {
            Error::Unavailable(
                "libnvrtc not found: install the CUDA NVRTC library (see the README)".into(),
            )
        })?;
        let text = src.full_text();
        let key = cache_key(&text, &self.options, version);
        if let Some(cache) = &self.cache {
            if let Some(cubin) = cache.load(src.family, &key) {
                return Ok(cubin);
            }
        }
        let cubin = self.compile_text(src.family, &text)?;
        if let Some(cache) = &self.cache {
            if let Err(e) = cache.store(src.family, &key, &cubin) {
                tracing::warn!("cannot cache the {} cubin: {e}", src.family);
            }
        }
        Ok(cubin)
    }

    /// Compiles one family without the cache (the doctor's and the tests' check); a failure is
    /// an [`Error::Compile`] with NVRTC's log.
    pub fn compile(&self, src: &KernelSource) -> Result<Vec<u8>> {
        self.compile_text(src.family, &src.full_text())
    }

    fn compile_text(&self, family: &str, text: &str) -> Result<Vec<u8>> {
        compile_cubin(&format!("{family}.cu"), text, &self.options)
    }
}

/// A loaded kernel: the function handle and the module that keeps it valid.
#[derive(Clone)]
pub struct Kernel {
    function: Arc<CudaFunction>,
    max_dynamic_shared: Arc<Mutex<u32>>,
    static_shared: u32,
}

impl Kernel {
    /// The raw function handle, valid while this `Kernel` lives.
    pub fn cu_function(&self) -> sys::CUfunction {
        self.function.cu_function()
    }

    /// The kernel's statically declared shared memory in bytes: a block's dynamic shared memory
    /// may be at most the device's limit less this.
    pub fn static_shared(&self) -> u32 {
        self.static_shared
    }

    /// Raises the kernel's dynamic shared-memory limit to `bytes` when it is above the default
    /// (48 KiB less the kernel's static shared memory) and above what was set before.
    pub fn ensure_dynamic_shared(&self, bytes: u32) -> Result<()> {
        if bytes.saturating_add(self.static_shared) <= 48 * 1024 {
            return Ok(());
        }
        let mut cur = self
            .max_dynamic_shared
            .lock()
            .map_err(|_| Error::Backend("kernel lock poisoned".into()))?;
        if bytes > *cur {
            self.function
                .set_attribute(
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    bytes as i32,
                )
                .map_err(|e| {
                    Error::driver(
                        format!("raising the shared-memory limit to {bytes} bytes"),
                        e,
                    )
                })?;
            *cur = bytes;
        }
        Ok(())
    }
}

/// The registry of one device: loads each family's module at first use of one of its kernels.
pub struct KernelRegistry {
    ctx: Arc<CudaContext>,
    compiler: KernelCompiler,
    family_of: HashMap<&'static str, usize>,
    modules: Mutex<HashMap<usize, Arc<CudaModule>>>,
    kernels: RwLock<HashMap<&'static str, (KernelId, Kernel)>>,
    error_record: Option<u64>,
}

impl KernelRegistry {
    /// A registry for `ctx` compiling with `compiler`.
    pub fn new(ctx: Arc<CudaContext>, compiler: KernelCompiler) -> Self {
        let mut family_of = HashMap::new();
        for (i, src) in SOURCES.iter().enumerate() {
            for name in src.kernel_names() {
                family_of.insert(name, i);
            }
        }
        KernelRegistry {
            ctx,
            compiler,
            family_of,
            modules: Mutex::new(HashMap::new()),
            kernels: RwLock::new(HashMap::new()),
            error_record: None,
        }
    }

    /// Points every module loaded from now on at the device's error record (the address of
    /// [`super::fault::RECORD_BYTES`] bytes of device memory): kernels record the bad arguments
    /// they detect there. Without it they return without writing and report nothing.
    ///
    /// Private to the crate: kernels write to `address`, so it must be the device's own record.
    pub(crate) fn with_error_record(mut self, address: u64) -> Self {
        self.error_record = Some(address);
        self
    }

    /// The compiler.
    pub fn compiler(&self) -> &KernelCompiler {
        &self.compiler
    }

    /// Whether the registry has this kernel: a declared built-in kernel whose name a source
    /// defines.
    pub fn contains(&self, id: KernelId) -> bool {
        crate::kernels::builtin(id.name()) == Some(id) && self.family_of.contains_key(id.name())
    }

    /// The kernel `id`, compiling and loading its family's module on first use. Only a declared
    /// built-in kernel is found: an untyped kernel, a user kernel or another declaration of a
    /// built-in name is an unknown kernel, never a launch with a parameter list the function
    /// does not take.
    pub fn get(&self, id: KernelId) -> Result<Kernel> {
        if let Some((held, k)) = self.kernels.read().map_err(|_| lock_err())?.get(id.name()) {
            if *held == id {
                return Ok(k.clone());
            }
        }
        let unknown = || Error::UnknownKernel {
            name: id.name().to_string(),
            backend: "cuda",
        };
        if crate::kernels::builtin(id.name()) != Some(id) {
            return Err(unknown());
        }
        let family = *self.family_of.get(id.name()).ok_or_else(unknown)?;
        let module = self.module(family)?;
        let function = module.load_function(id.name()).map_err(|e| {
            Error::driver(
                format!("loading kernel {id} from {}.cu", SOURCES[family].family),
                e,
            )
        })?;
        let static_shared = function.shared_size_bytes().map_err(|e| {
            Error::driver(
                format!("reading the static shared memory of `{}`", id.name()),
                e,
            )
        })?;
        let static_shared = u32::try_from(static_shared).unwrap_or(0);
        let kernel = Kernel {
            function: Arc::new(function),
            max_dynamic_shared: Arc::new(Mutex::new((48 * 1024u32).saturating_sub(static_shared))),
            static_shared,
        };
        self.kernels
            .write()
            .map_err(|_| lock_err())?
            .insert(id.name(), (id, kernel.clone()));
        Ok(kernel)
    }

    fn module(&self, family: usize) -> Result<Arc<CudaModule>> {
        let mut modules = self.modules.lock().map_err(|_| lock_err())?;
        if let Some(m) = modules.get(&family) {
            return Ok(m.clone());
        }
        let src = &SOURCES[family];
        let cubin = self.compiler.cubin(src)?;
        let module = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
            .map_err(|e| Error::driver(format!("loading the {}.cu cubin", src.family), e))?;
        if let Some(record) = self.error_record {
            self.point_at_error_record(&module, src.family, record)?;
        }
        modules.insert(family, module.clone());
        Ok(module)
    }

    /// Writes the error record's address into the `op_error_word` global of `family`'s module
    /// (a synchronous copy, done once per module when it is loaded).
    fn point_at_error_record(
        &self,
        module: &Arc<CudaModule>,
        family: &str,
        record: u64,
    ) -> Result<()> {
        let stream = self.ctx.default_stream();
        let global = module
            .get_global(super::fault::ERROR_WORD_SYMBOL, &stream)
            .map_err(|e| Error::driver(format!("{family}.cu: finding `op_error_word`"), e))?;
        let bytes = record.to_le_bytes();
        if global.len() != bytes.len() {
            return Err(Error::Backend(format!(
                "{family}.cu: `op_error_word` has {} bytes, expected a pointer",
                global.len()
            )));
        }
        let (address, _sync) = global.device_ptr(&stream);
        self.ctx
            .bind_to_thread()
            .map_err(|e| Error::driver("binding the CUDA context", e))?;
        // SAFETY: `address` is the module's 8-byte global, alive while `module` is; the copy is
        // synchronous, so `bytes` outlives it.
        unsafe { cudarc::driver::result::memcpy_htod_sync(address, &bytes) }
            .map_err(|e| Error::driver(format!("{family}.cu: setting `op_error_word`"), e))
    }

    /// Compiles and loads every family now (instead of at first use).
    pub fn load_all(&self) -> Result<()> {
        (0..SOURCES.len()).try_for_each(|i| self.module(i).map(|_| ()))
    }
}

fn lock_err() -> Error {
    Error::Backend("kernel registry lock poisoned".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_are_found_in_source() {
        let src = "extern \"C\" __global__ void a_f32(float* x) {}\n\
                   __device__ float helper() { return 1.0f; }\n\
                   #define NORM_KERNEL(NAME, T) extern \"C\" __global__ void NAME(const T* x) {}\n\
                   NORM_KERNEL(c_bf16, __nv_bfloat16)\n\
                   extern \"C\" __global__ void b_f16_q4_1(const void* w) {}\n\
                   extern \"C\" __global__ void __launch_bounds__(1024) d_f32(float* x) {}";
        assert_eq!(
            kernel_names_in(src),
            vec!["a_f32", "c_bf16", "b_f16_q4_1", "d_f32"]
        );
    }

    #[test]
    fn every_kernel_name_is_unique() {
        let names = all_kernel_names();
        let mut dedup = names.clone();
        dedup.dedup();
        assert_eq!(names, dedup, "a kernel name appears in two sources");
        assert!(!names.is_empty());
    }

    /// The statements between a kernel's opening brace and `OP_GRID_ENTRY();` (None: no entry
    /// before the next kernel or the end).
    fn before_entry(body: &str) -> Option<Vec<String>> {
        let open = body.find('{')?;
        let end = body[open..].find("OP_GRID_ENTRY")? + open;
        Some(
            body[open + 1..end]
                .split(';')
                .map(|s| s.replace('\\', "").trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
        )
    }

    /// Kernels that begin with `OP_GRID_ENTRY_LATE()` and read before their grid wait, each
    /// through a function that documents what it reads early and calls `OP_GRID_WAIT()` on every
    /// path (`kernels/prelude.cuh`): only the one-row decode attention.
    const EARLY_READERS: &[&str] = &["attention_decode<T>("];

    /// Programmatic graph edges (`graph.rs`) are only sound if every kernel waits for the kernels
    /// before it before touching their memory: each kernel's first statement is
    /// `OP_GRID_ENTRY()`, after at most weight-row prefetches, or `OP_GRID_ENTRY_LATE()` in a
    /// kernel of [`EARLY_READERS`].
    #[test]
    fn every_kernel_begins_with_the_grid_entry() {
        let mut kernels = 0;
        for src in SOURCES {
            let starts: Vec<usize> = src
                .source
                .match_indices("extern \"C\" __global__")
                .map(|(i, _)| i)
                .collect();
            for (n, &at) in starts.iter().enumerate() {
                let end = starts.get(n + 1).copied().unwrap_or(src.source.len());
                let body = &src.source[at..end];
                let head: String = body.chars().take(80).collect();
                let before = before_entry(body)
                    .unwrap_or_else(|| panic!("{}: no OP_GRID_ENTRY in `{head}`", src.family));
                let entry = &body[body.find("OP_GRID_ENTRY").unwrap_or(0)..];
                if entry.starts_with("OP_GRID_ENTRY_LATE();") {
                    assert!(
                        EARLY_READERS.iter().any(|f| body.contains(f)),
                        "{}: OP_GRID_ENTRY_LATE outside the early readers in `{head}`",
                        src.family
                    );
                    assert!(src.source.contains("OP_GRID_WAIT();"), "{}", src.family);
                } else {
                    assert!(
                        entry.starts_with("OP_GRID_ENTRY();"),
                        "{}: `{head}`",
                        src.family
                    );
                }
                for stmt in before {
                    // Prefetches, and arithmetic on the kernel's arguments alone.
                    assert!(
                        stmt.starts_with("mm_prefetch_first<")
                            || stmt.starts_with("fb_prefetch_")
                            || stmt.starts_with("const double rope_freq = fb_rope_freq(")
                            || stmt.starts_with("const double own_freq = rope_own_freq("),
                        "{}: `{stmt}` before OP_GRID_ENTRY in `{head}`",
                        src.family
                    );
                }
                kernels += 1;
            }
        }
        assert!(kernels >= 40, "{kernels} kernels found");
    }

    #[test]
    fn before_entry_finds_what_runs_first() {
        let ok =
            "extern \"C\" __global__ void a(float* x) {\n    OP_GRID_ENTRY();\n    x[0] = 1; }";
        assert_eq!(before_entry(ok), Some(vec![]));
        let late = "extern \"C\" __global__ void a(float* x) { x[0] = 1; OP_GRID_ENTRY(); }";
        assert_eq!(before_entry(late), Some(vec!["x[0] = 1".to_string()]));
        assert_eq!(before_entry("extern \"C\" __global__ void a() { }"), None);
    }

    #[test]
    fn arch_string() {
        assert_eq!(arch_for((9, 0)), "sm_90a");
        assert_eq!(arch_for((8, 6)), "sm_86");
    }
}
