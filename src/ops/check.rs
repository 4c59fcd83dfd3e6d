//! Argument checks shared by every op: each failure names the op and the argument.

use crate::backend::{Buffer, DType};
use crate::error::{Error, Result};

/// Checks for one op's arguments.
#[derive(Debug, Clone, Copy)]
pub struct Check {
    op: &'static str,
}

impl Check {
    /// Checks for the op named `op`.
    pub const fn op(op: &'static str) -> Self {
        Check { op }
    }

    /// The buffer must have one of `allowed` dtypes.
    pub fn dtype(&self, arg: &'static str, buf: &Buffer, allowed: &[DType]) -> Result<()> {
        if allowed.contains(&buf.dtype()) {
            return Ok(());
        }
        let expected = allowed
            .iter()
            .map(|d| d.name())
            .collect::<Vec<_>>()
            .join(" or ");
        Err(Error::DType {
            op: self.op,
            arg,
            got: buf.dtype(),
            expected,
        })
    }

    /// The buffer must hold exactly `elems` elements.
    pub fn elems(&self, arg: &'static str, buf: &Buffer, elems: usize) -> Result<()> {
        if buf.elems() == elems {
            return Ok(());
        }
        Err(Error::shape(
            self.op,
            arg,
            format!("has {} elements, expected {elems}", buf.elems()),
        ))
    }

    /// The buffer's dimensions must equal `dims`.
    pub fn dims(&self, arg: &'static str, buf: &Buffer, dims: &[usize]) -> Result<()> {
        if buf.dims() == dims {
            return Ok(());
        }
        Err(Error::shape(
            self.op,
            arg,
            format!("has shape {:?}, expected {dims:?}", buf.dims()),
        ))
    }

    /// The buffer's last dimension must be `n`.
    pub fn last_dim(&self, arg: &'static str, buf: &Buffer, n: usize) -> Result<()> {
        if buf.shape().last() == n {
            return Ok(());
        }
        Err(Error::shape(
            self.op,
            arg,
            format!(
                "has last dimension {} (shape {:?}), expected {n}",
                buf.shape().last(),
                buf.dims()
            ),
        ))
    }

    /// A condition on the arguments, with the message to give when it fails.
    pub fn require(&self, arg: &'static str, ok: bool, msg: impl FnOnce() -> String) -> Result<()> {
        if ok {
            Ok(())
        } else {
            Err(Error::shape(self.op, arg, msg()))
        }
    }
}
