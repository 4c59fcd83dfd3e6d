//! Typed access to a dispatch's arguments from inside a CPU kernel.

use std::cell::Cell;

use crate::backend::Buffer;
use crate::error::{Error, Result};
use crate::graph::{Access, Arg, KernelId, Range, Scalar};

/// The arguments of one dispatch as a CPU kernel sees them.
///
/// `input` hands out shared slices of `Read` arguments; `output` hands out one mutable slice per
/// `Write` or `ReadWrite` argument (a second request for the same argument is an error). The
/// slices never alias a live mutable slice:
/// - no written argument overlaps another buffer argument of the same dispatch (checked by
///   [`Dispatch::new`](crate::graph::Dispatch::new), and again by the constructor);
/// - only the CPU backend builds `KernelArgs` (the constructor is private to the crate), and it
///   never runs two conflicting dispatches at once.
///
/// A kernel (a custom one included) only reads its arguments through these methods.
pub struct KernelArgs<'a> {
    kernel: KernelId,
    args: &'a [Arg],
    taken: Cell<u64>,
}

impl<'a> KernelArgs<'a> {
    /// Wraps a dispatch's arguments; an error naming the kernel and both arguments when a
    /// written argument overlaps another buffer argument (the rule of
    /// [`Dispatch::new`](crate::graph::Dispatch::new): an in-place update is one `ReadWrite`
    /// argument).
    ///
    /// Private to the crate: the slices it hands out are sound only while no other dispatch that
    /// conflicts with this one runs, which the backend's scheduling guarantees.
    pub(crate) fn new(kernel: KernelId, args: &'a [Arg]) -> Result<Self> {
        check_writes_alone(kernel, args)?;
        Ok(KernelArgs {
            kernel,
            args,
            taken: Cell::new(0),
        })
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
            .memory()
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
        let ptr = buf.allocation().memory().host_ptr_mut().ok_or_else(|| {
            self.err(format!(
                "argument {index} is not writable host memory ({})",
                buf.allocation().location()
            ))
        })?;
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

/// Checks that no written buffer argument overlaps any other buffer argument (byte ranges of one
/// allocation sharing a byte, as [`Range::overlaps`] says).
fn check_writes_alone(kernel: KernelId, args: &[Arg]) -> Result<()> {
    let buffers = || {
        args.iter().enumerate().filter_map(|(i, a)| match a {
            Arg::Buffer(b, access) => Some((i, Range::of(b), *access)),
            Arg::Scalar(_) => None,
        })
    };
    for (i, mine, access) in buffers() {
        if !access.writes() {
            continue;
        }
        if let Some((j, _, _)) = buffers().find(|(j, other, _)| *j != i && mine.overlaps(other)) {
            return Err(Error::InvalidArgument(format!(
                "kernel {}: written argument {i} overlaps argument {j}; \
                 use one read-write argument for in-place updates",
                kernel.name()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{DType, Device};
    use crate::kernels::elementwise::ADD;

    fn kernel() -> KernelId {
        KernelId::of(&ADD[0])
    }

    fn refused(args: &[Arg]) -> String {
        match KernelArgs::new(kernel(), args) {
            Ok(_) => panic!("aliased arguments were accepted: {args:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn refuses_one_buffer_written_twice() {
        let dev = Device::cpu(1).unwrap();
        let a = dev.alloc(DType::F32, &[8]).unwrap();
        let msg = refused(&[
            Arg::read(&dev.alloc(DType::F32, &[8]).unwrap()),
            Arg::write(&a),
            Arg::write(&a),
        ]);
        assert!(msg.contains(kernel().name()), "{msg}");
        assert!(
            msg.contains("written argument 1 overlaps argument 2"),
            "{msg}"
        );
    }

    #[test]
    fn refuses_a_write_overlapping_a_read() {
        let dev = Device::cpu(1).unwrap();
        let a = dev.alloc(DType::F32, &[8]).unwrap();
        // Two views of one allocation sharing bytes 16..32.
        let head = a.view(0, DType::F32, &[8]).unwrap();
        let tail = a.view(16, DType::F32, &[4]).unwrap();
        let msg = refused(&[Arg::read(&head), Arg::write(&tail)]);
        assert!(
            msg.contains("written argument 1 overlaps argument 0"),
            "{msg}"
        );
        let msg = refused(&[Arg::read_write(&tail), Arg::read(&head)]);
        assert!(
            msg.contains("written argument 0 overlaps argument 1"),
            "{msg}"
        );
    }

    #[test]
    fn accepts_disjoint_views_of_one_allocation() {
        let dev = Device::cpu(1).unwrap();
        let a = dev.upload(&[1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap();
        let lo = a.view(0, DType::F32, &[2]).unwrap();
        let hi = a.view(8, DType::F32, &[2]).unwrap();
        let args = [Arg::read(&lo), Arg::write(&hi), Arg::u32(2)];
        let k = KernelArgs::new(kernel(), &args).unwrap();
        let out = k.output::<f32>(1).unwrap();
        out.copy_from_slice(k.input::<f32>(0).unwrap());
        assert!(k.output::<f32>(1).is_err(), "an output is handed out once");
        assert_eq!(dev.download::<f32>(&a).unwrap(), [1.0, 2.0, 1.0, 2.0]);
    }

    #[test]
    fn reads_may_share_bytes() {
        let dev = Device::cpu(1).unwrap();
        let a = dev.alloc(DType::F32, &[4]).unwrap();
        let out = dev.alloc(DType::F32, &[4]).unwrap();
        let args = [Arg::read(&a), Arg::read(&a), Arg::write(&out)];
        assert!(KernelArgs::new(kernel(), &args).is_ok());
    }
}
