//! NVRTC, wrapped: find the library without panicking, report its version, and compile CUDA C
//! to a cubin for a real architecture (`sm_90`), keeping the compiler log on failure.
//!
//! cudarc loads `libnvrtc` lazily and panics when it is missing, so every entry point here first
//! checks [`nvrtc_present`].

use std::ffi::{c_char, c_int, CString};
use std::path::Path;

use cudarc::nvrtc::result::NvrtcError;
use cudarc::nvrtc::sys;

use crate::error::{Error, Result};

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
///
/// A failing NVRTC call is an [`Error::Compile`] with NVRTC's log and status; a missing libnvrtc
/// is [`Error::Unavailable`]; a NUL byte in the source, the name or an option is
/// [`Error::InvalidArgument`].
pub fn compile_cubin(program: &str, source: &str, options: &[String]) -> Result<Vec<u8>> {
    let fail = |r: sys::nvrtcResult, log: String| Error::Compile {
        program: program.to_string(),
        options: options.to_vec(),
        log,
        source: NvrtcError(r),
    };
    if !nvrtc_present() {
        return Err(Error::Unavailable(format!(
            "libnvrtc not found on the library path, so {program} cannot be compiled"
        )));
    }
    let nul = |what: &str| {
        Error::InvalidArgument(format!("compiling {program}: {what} contains a NUL byte"))
    };
    let src = CString::new(source).map_err(|_| nul("the source"))?;
    let name = CString::new(program).map_err(|_| nul("the program name"))?;
    let c_opts: Vec<CString> = options
        .iter()
        .map(|o| CString::new(o.as_str()))
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| nul("an option"))?;
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
        return Err(fail(r, String::new()));
    }
    // Declared after `src` and `name`, so it is dropped before them.
    let prog = Program(raw);
    // SAFETY: `prog` is a live program; the option pointers are valid for the call.
    let r = unsafe { sys::nvrtcCompileProgram(prog.0, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
    let log = program_log(&prog);
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(fail(r, log));
    }
    let no_cubin = |log: String| format!("{log}\nno cubin: is the architecture a real sm_XX?");
    let mut size = 0usize;
    // SAFETY: `prog` compiled successfully; `size` is valid for writes.
    let r = unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(fail(r, no_cubin(log)));
    }
    if size == 0 {
        return Err(Error::InvalidArgument(format!(
            "NVRTC gave no cubin for {program} (options: {}): is the architecture a real sm_XX?",
            options.join(" ")
        )));
    }
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` has the size NVRTC reported.
    let r = unsafe { sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr() as *mut c_char) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(fail(r, log));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A source NVRTC rejects gives [`Error::Compile`]: its message carries NVRTC's log line and
    /// the options, and its source is NVRTC's status.
    #[test]
    #[cfg_attr(not(onepass_nvrtc), ignore = "needs NVRTC: source scripts/cuda-env.sh")]
    fn a_bad_kernel_is_a_compile_error_with_the_log_and_a_typed_status() {
        assert!(
            nvrtc_present(),
            "the build found libnvrtc; the tests cannot load it"
        );
        let options = compile_options("sm_90", None);
        let err = compile_cubin(
            "broken.cu",
            "extern \"C\" __global__ void k() { no_such_function(); }",
            &options,
        )
        .expect_err("the source does not compile");
        let Error::Compile { program, log, .. } = &err else {
            panic!("not a compile error: {err:?}");
        };
        assert_eq!(program, "broken.cu");
        let line = log
            .lines()
            .find(|l| l.contains("no_such_function"))
            .unwrap_or_else(|| panic!("the log names no undefined function: {log}"));
        let text = err.to_string();
        assert!(
            text.contains(line),
            "the message lacks the log line `{line}`: {text}"
        );
        assert!(text.contains("--gpu-architecture=sm_90"), "{text}");
        let status = std::error::Error::source(&err)
            .and_then(|s| s.downcast_ref::<NvrtcError>())
            .expect("NVRTC's status as the source");
        assert_eq!(
            *status,
            NvrtcError(sys::nvrtcResult::NVRTC_ERROR_COMPILATION)
        );
        assert!(err.with_causes().contains("NVRTC_ERROR_COMPILATION"));
    }

    #[test]
    fn nul_bytes_are_invalid_arguments() {
        if !nvrtc_present() {
            return;
        }
        let err = compile_cubin("nul.cu", "int x;\0", &[]).expect_err("a NUL byte");
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    }
}
