//! NVRTC, wrapped: find the library without panicking, report its version, and compile CUDA C
//! to a cubin for a real architecture (`sm_90`), keeping the compiler log on failure.
//!
//! cudarc loads `libnvrtc` lazily and panics when it is missing, so every entry point here first
//! checks [`nvrtc_present`].

use std::ffi::{c_char, c_int, CStr, CString};
use std::path::Path;

use cudarc::nvrtc::sys;

use crate::error::Error;

/// Whether `libnvrtc` can be loaded from the library search path.
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to open the library; no NVRTC function is called.
    unsafe { sys::is_culib_present() }
}

/// NVRTC's version as `(major, minor)`, or `None` when the library is missing.
pub fn nvrtc_version() -> Option<(i32, i32)> {
    if !nvrtc_present() {
        return None;
    }
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: the library is present (checked above); both pointers are valid for writes.
    let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    (r == sys::nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
}

/// Why a compilation failed: what NVRTC said and how it was called.
#[derive(Debug, Clone)]
pub struct CompileFailure {
    /// The program (source file) name.
    pub program: String,
    /// The NVRTC status in words.
    pub status: String,
    /// The options passed to NVRTC.
    pub options: Vec<String>,
    /// NVRTC's program log.
    pub log: String,
}

impl std::fmt::Display for CompileFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NVRTC failed to compile {} ({}); options: [{}]; log:\n{}",
            self.program,
            self.status,
            self.options.join(" "),
            self.log.trim_end()
        )
    }
}

impl From<CompileFailure> for Error {
    fn from(f: CompileFailure) -> Self {
        Error::Cuda(f.to_string())
    }
}

/// The options onepass compiles every kernel with, for `arch` (e.g. `sm_90`).
pub fn compile_options(arch: &str, include_dir: Option<&Path>) -> Vec<String> {
    let mut opts = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        // Kernels must match the host reference closely: no fused multiply-add contraction.
        "--fmad=false".to_string(),
        "-default-device".to_string(),
    ];
    if let Some(dir) = include_dir {
        opts.push(format!("--include-path={}", dir.display()));
    }
    opts
}

fn status_text(r: sys::nvrtcResult) -> String {
    // SAFETY: the library is loaded (callers checked) and the returned pointer is a static string.
    let p = unsafe { sys::nvrtcGetErrorString(r) };
    if p.is_null() {
        format!("{r:?}")
    } else {
        // SAFETY: NVRTC returns a NUL-terminated static string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// An NVRTC program that is destroyed when dropped.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by `nvrtcCreateProgram` and is destroyed once.
        unsafe {
            sys::nvrtcDestroyProgram(&mut self.0);
        }
    }
}

/// Compiles `source` (named `program` in messages) with `options` and returns the cubin.
/// The options must name a real architecture (`sm_XX`), or NVRTC has no cubin to give.
pub fn compile_cubin(
    program: &str,
    source: &str,
    options: &[String],
) -> std::result::Result<Vec<u8>, CompileFailure> {
    let fail = |status: String, log: String| CompileFailure {
        program: program.to_string(),
        status,
        options: options.to_vec(),
        log,
    };
    if !nvrtc_present() {
        return Err(fail(
            "libnvrtc not found on the library path".into(),
            String::new(),
        ));
    }
    let src = CString::new(source)
        .map_err(|_| fail("source contains a NUL byte".into(), String::new()))?;
    let name = CString::new(program)
        .map_err(|_| fail("name contains a NUL byte".into(), String::new()))?;
    let c_opts: Vec<CString> = options
        .iter()
        .map(|o| CString::new(o.as_str()))
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| fail("an option contains a NUL byte".into(), String::new()))?;
    let opt_ptrs: Vec<*const c_char> = c_opts.iter().map(|o| o.as_ptr()).collect();

    let mut raw = std::ptr::null_mut();
    // SAFETY: the library is present; `src` and `name` are NUL-terminated and outlive the program
    // (`prog` below is declared after them, so it is dropped first).
    let r = unsafe {
        sys::nvrtcCreateProgram(
            &mut raw,
            src.as_ptr(),
            name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(fail(status_text(r), String::new()));
    }
    // Declared after `src` and `name`, so it is dropped before them.
    let prog = Program(raw);
    // SAFETY: `prog` is a live program; the option pointers are valid for the call.
    let r = unsafe { sys::nvrtcCompileProgram(prog.0, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
    let log = program_log(&prog);
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(fail(status_text(r), log));
    }
    let mut size = 0usize;
    // SAFETY: `prog` compiled successfully; `size` is valid for writes.
    let r = unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
        return Err(fail(
            format!(
                "no cubin ({}): is the architecture a real sm_XX?",
                status_text(r)
            ),
            log,
        ));
    }
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` has the size NVRTC reported.
    let r = unsafe { sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr() as *mut c_char) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(fail(status_text(r), log));
    }
    Ok(cubin)
}

fn program_log(prog: &Program) -> String {
    let mut size = 0usize;
    // SAFETY: `prog` is a live program; `size` is valid for writes.
    if unsafe { sys::nvrtcGetProgramLogSize(prog.0, &mut size) } != sys::nvrtcResult::NVRTC_SUCCESS
        || size == 0
    {
        return String::new();
    }
    let mut buf = vec![0u8; size];
    // SAFETY: `buf` has the size NVRTC reported.
    if unsafe { sys::nvrtcGetProgramLog(prog.0, buf.as_mut_ptr() as *mut c_char) }
        != sys::nvrtcResult::NVRTC_SUCCESS
    {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
