//! The library's error type: one enum, each variant carrying the context a reader needs.

use crate::dtype::DType;

/// Every error the onepass library returns.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An op was given an argument of the wrong dtype.
    #[error("{op}: argument `{arg}` has dtype {got:?}, expected {expected}")]
    DType {
        /// The op that rejected the argument.
        op: &'static str,
        /// The argument's name.
        arg: &'static str,
        /// The dtype that was passed.
        got: DType,
        /// What the op accepts, in words.
        expected: String,
    },
    /// An op was given an argument of the wrong shape or size.
    #[error("{op}: argument `{arg}`: {msg}")]
    Shape {
        /// The op that rejected the argument.
        op: &'static str,
        /// The argument's name.
        arg: &'static str,
        /// What is wrong, in words.
        msg: String,
    },
    /// A buffer view does not fit inside its allocation, or is misaligned.
    #[error("buffer view: {0}")]
    View(String),
    /// Two buffers of different devices were used together.
    #[error("{op}: argument `{arg}` lives on {got}, but the session runs on {expected}")]
    WrongDevice {
        /// The op.
        op: &'static str,
        /// The argument's name.
        arg: &'static str,
        /// The buffer's device.
        got: String,
        /// The session's device.
        expected: String,
    },
    /// A kernel name is not in the backend's registry.
    #[error("kernel `{name}` is not available on the {backend} backend")]
    UnknownKernel {
        /// The kernel's name.
        name: String,
        /// The backend.
        backend: &'static str,
    },
    /// A kernel failed while it ran.
    #[error("kernel `{kernel}` failed: {msg}")]
    Kernel {
        /// The kernel's name.
        kernel: &'static str,
        /// What went wrong.
        msg: String,
    },
    /// The operation is not supported (by this backend, for this dtype, ...).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// An invalid argument that is not a tensor (a flag, a count, a token id).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A model file is malformed.
    #[error("model file {path}: {msg}")]
    Model {
        /// The file.
        path: String,
        /// What is wrong.
        msg: String,
    },
    /// A CUDA driver call failed. The message says what was being done (the call, the size, the
    /// device where it matters); [`std::error::Error::source`] is the driver's status, so the
    /// status is printed once, by whoever prints the chain.
    #[error("CUDA driver: {what}")]
    Driver {
        /// What failed, in words, naming the driver call (`cuMemAlloc of 64 bytes (scratch)`).
        what: String,
        /// The driver's status.
        #[source]
        source: cudarc::driver::DriverError,
    },
    /// NVRTC failed to compile a kernel family. The message names the program, the options and
    /// NVRTC's log; [`std::error::Error::source`] is NVRTC's status.
    #[error(
        "NVRTC could not compile {program} (options: {}); log:\n{}",
        options.join(" "),
        log.trim_end()
    )]
    Compile {
        /// The program (the family's source file, `rmsnorm.cu`).
        program: String,
        /// The options NVRTC was called with.
        options: Vec<String>,
        /// NVRTC's program log (empty when it failed before compiling).
        log: String,
        /// NVRTC's status.
        #[source]
        source: cudarc::nvrtc::result::NvrtcError,
    },
    /// A library or device the operation needs is not on this machine (the CUDA driver,
    /// libnvrtc).
    #[error("not available: {0}")]
    Unavailable(String),
    /// A device is unusable: an earlier kernel fault broke its context, and every later call on
    /// it fails.
    #[error(
        "{device} is unusable: an earlier fault broke its context ({first}); restart the process \
         to use the GPU again"
    )]
    Faulted {
        /// The device (`cuda:0 (NVIDIA H100 80GB HBM3, sm_90)`).
        device: String,
        /// The first fault, in words (the call and the driver's status).
        first: String,
    },
    /// A backend's machinery broke: a worker stopped unexpectedly, a lock was poisoned by a
    /// panic, a kernel reported through a channel that names no kernel.
    #[error("backend: {0}")]
    Backend(String),
    /// An I/O error, with the path it concerns. The message includes the cause, so the cause is
    /// not also offered as [`std::error::Error::source`] (a printer that walks the chain would
    /// print it twice).
    #[error("{path}: {cause}")]
    Io {
        /// The file or directory.
        path: String,
        /// The underlying error.
        cause: std::io::Error,
    },
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Builds a [`Error::Shape`].
    pub fn shape(op: &'static str, arg: &'static str, msg: impl Into<String>) -> Self {
        Error::Shape {
            op,
            arg,
            msg: msg.into(),
        }
    }

    /// Builds an [`Error::Io`] for a path.
    pub fn io(path: impl AsRef<std::path::Path>, cause: std::io::Error) -> Self {
        Error::Io {
            path: path.as_ref().display().to_string(),
            cause,
        }
    }

    /// Builds an [`Error::Driver`]: `what` failed with the driver status `source`.
    pub fn driver(what: impl Into<String>, source: cudarc::driver::DriverError) -> Self {
        Error::Driver {
            what: what.into(),
            source,
        }
    }

    /// The message followed by each cause below it, `: `-separated, as the command line prints
    /// an error: for a report or a log line that should carry the driver's or NVRTC's status.
    pub fn with_causes(&self) -> String {
        let mut text = self.to_string();
        let mut cause = std::error::Error::source(self);
        while let Some(c) = cause {
            text.push_str(": ");
            text.push_str(&c.to_string());
            cause = c.source();
        }
        text
    }

    /// The kind of the underlying I/O error, for an [`Error::Io`].
    pub fn io_kind(&self) -> Option<std::io::ErrorKind> {
        match self {
            Error::Io { cause, .. } => Some(cause.kind()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_causes_appends_each_source_once() {
        let e = Error::InvalidArgument("plain".into());
        assert_eq!(e.with_causes(), "invalid argument: plain");
        let e = Error::Compile {
            program: "k.cu".into(),
            options: vec!["--std=c++17".into()],
            log: "k.cu(1): error: bad\n".into(),
            source: cudarc::nvrtc::result::NvrtcError(
                cudarc::nvrtc::sys::nvrtcResult::NVRTC_ERROR_COMPILATION,
            ),
        };
        let text = e.with_causes();
        assert!(
            text.starts_with(
                "NVRTC could not compile k.cu (options: --std=c++17); log:\nk.cu(1): error: bad: "
            ),
            "{text}"
        );
        assert_eq!(text.matches("NVRTC_ERROR_COMPILATION").count(), 1, "{text}");
    }

    #[test]
    fn io_errors_name_their_cause_once() {
        let e = Error::io(
            "/no/such/file",
            std::io::Error::from(std::io::ErrorKind::NotFound),
        );
        let chain = anyhow::Error::from(e);
        let printed = format!("{chain:#}");
        assert!(printed.starts_with("/no/such/file: "), "{printed}");
        assert_eq!(printed.matches("not found").count(), 1, "{printed}");
        assert_eq!(chain.chain().count(), 1);
        assert_eq!(
            chain.downcast_ref::<Error>().and_then(Error::io_kind),
            Some(std::io::ErrorKind::NotFound)
        );
    }
}
