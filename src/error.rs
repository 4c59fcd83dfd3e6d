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
    /// The CUDA driver, NVRTC or a CUDA call failed.
    #[error("cuda: {0}")]
    Cuda(String),
    /// A backend worker stopped unexpectedly.
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
