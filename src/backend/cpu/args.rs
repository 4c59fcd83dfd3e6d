//! Typed access to a dispatch's arguments from inside a CPU kernel.

use std::cell::Cell;

use crate::backend::{Buffer, Memory};
use crate::error::{Error, Result};
use crate::graph::{Access, Arg, KernelId, Scalar};

/// The arguments of one dispatch as a CPU kernel sees them.
///
/// `input` hands out shared slices of `Read` arguments; `output` hands out one mutable slice per
/// `Write` or `ReadWrite` argument (a second request for the same argument is an error). A
/// dispatch's written arguments never overlap its other arguments (checked by
/// [`Dispatch::new`](crate::graph::Dispatch::new)), and the executor never runs two conflicting
/// dispatches at once, so these slices never alias a live mutable slice.
pub struct KernelArgs<'a> {
    kernel: KernelId,
    args: &'a [Arg],
    taken: Cell<u64>,
}

impl<'a> KernelArgs<'a> {
    /// Wraps a dispatch's arguments.
    pub fn new(kernel: KernelId, args: &'a [Arg]) -> Self {
        KernelArgs {
            kernel,
            args,
            taken: Cell::new(0),
        }
    }

    /// The kernel these arguments belong to.
    pub fn kernel(&self) -> KernelId {
        self.kernel
    }

    /// Number of arguments.
    pub fn len(&self) -> usize {
        self.args.len()
    }

    /// Whether there are no arguments.
    pub fn is_empty(&self) -> bool {
        self.args.is_empty()
    }

    fn err(&self, msg: String) -> Error {
        Error::Kernel {
            kernel: self.kernel.name(),
            msg,
        }
    }

    /// The buffer argument at `index`.
    pub fn buffer(&self, index: usize) -> Result<(&'a Buffer, Access)> {
        match self.args.get(index) {
            Some(Arg::Buffer(b, a)) => Ok((b, *a)),
            other => Err(self.err(format!("argument {index} is not a buffer: {other:?}"))),
        }
    }

    fn scalar(&self, index: usize) -> Result<Scalar> {
        match self.args.get(index) {
            Some(Arg::Scalar(s)) => Ok(*s),
            other => Err(self.err(format!("argument {index} is not a scalar: {other:?}"))),
        }
    }

    /// The `u32` scalar at `index`.
    pub fn u32(&self, index: usize) -> Result<u32> {
        match self.scalar(index)? {
            Scalar::U32(v) => Ok(v),
            s => Err(self.err(format!("argument {index} is {s:?}, expected u32"))),
        }
    }

    /// The `u32` scalar at `index`, as a `usize`.
    pub fn usize(&self, index: usize) -> Result<usize> {
        self.u32(index).map(|v| v as usize)
    }

    /// The `i32` scalar at `index`.
    pub fn i32(&self, index: usize) -> Result<i32> {
        match self.scalar(index)? {
            Scalar::I32(v) => Ok(v),
            s => Err(self.err(format!("argument {index} is {s:?}, expected i32"))),
        }
    }

    /// The `f32` scalar at `index`.
    pub fn f32(&self, index: usize) -> Result<f32> {
        match self.scalar(index)? {
            Scalar::F32(v) => Ok(v),
            s => Err(self.err(format!("argument {index} is {s:?}, expected f32"))),
        }
    }

    /// The bytes of the read-only buffer argument at `index`.
    pub fn input_bytes(&self, index: usize) -> Result<&'a [u8]> {
        let (buf, access) = self.buffer(index)?;
        if access != Access::Read {
            return Err(self.err(format!("argument {index} is {access:?}, not Read")));
        }
        let ptr = buf
            .allocation()
            .memory
            .host_ptr()
            .ok_or_else(|| self.err(format!("argument {index} is not in host memory")))?;
        // SAFETY: the view lies inside its allocation (checked when the view was made), the
        // allocation outlives `'a` (the argument holds an `Arc` to it), and no dispatch writes
        // these bytes while this one runs (see the type's documentation).
        Ok(unsafe { std::slice::from_raw_parts(ptr.add(buf.offset()), buf.len_bytes()) })
    }

    /// The read-only buffer argument at `index` as a slice of `T`.
    pub fn input<T: bytemuck::Pod>(&self, index: usize) -> Result<&'a [T]> {
        let bytes = self.input_bytes(index)?;
        bytemuck::try_cast_slice(bytes).map_err(|e| {
            self.err(format!(
                "argument {index} as {}: {e}",
                std::any::type_name::<T>()
            ))
        })
    }

    /// The bytes of the written argument at `index`; each argument may be taken once.
    pub fn output_bytes(&self, index: usize) -> Result<&'a mut [u8]> {
        let (buf, access) = self.buffer(index)?;
        if !access.writes() {
            return Err(self.err(format!("argument {index} is {access:?}, not written")));
        }
        let bit = 1u64 << (index % 64);
        if index >= 64 || self.taken.get() & bit != 0 {
            return Err(self.err(format!("argument {index} taken twice as output")));
        }
        self.taken.set(self.taken.get() | bit);
        let ptr = match &buf.allocation().memory {
            Memory::Host(h) => h.as_ptr(),
            other => {
                return Err(self.err(format!(
                    "argument {index} is not writable host memory ({})",
                    other.location()
                )))
            }
        };
        // SAFETY: as for `input_bytes`; in addition this is the only slice of this argument
        // handed out (the `taken` mask), and no other argument of the dispatch overlaps it.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr.add(buf.offset()), buf.len_bytes()) })
    }

    /// The written argument at `index` as a mutable slice of `T`; each argument may be taken once.
    pub fn output<T: bytemuck::Pod>(&self, index: usize) -> Result<&'a mut [T]> {
        let bytes = self.output_bytes(index)?;
        bytemuck::try_cast_slice_mut(bytes).map_err(|e| {
            self.err(format!(
                "argument {index} as {}: {e}",
                std::any::type_name::<T>()
            ))
        })
    }
}
