//! How a dispatch becomes a kernel launch: the one layout of parameters that stream launches
//! ([`CudaEncoder`](super::CudaEncoder)) and graph nodes ([`CudaGraph`](super::CudaGraph)) share,
//! the safety contract both rely on, and the only two raw driver calls that hand those parameters
//! over: `cuLaunchKernel` ([`LaunchParams::launch`]) and `cuGraphAddKernelNode`
//! ([`LaunchParams::add_node`]).
//!
//! A dispatch's arguments become kernel parameters in order: a buffer becomes the device address
//! of its first byte (allocation base + view offset), a scalar its 32-bit value. After them come
//! the element counts of the buffer arguments, in order, as `uint64_t` (a CUDA kernel sees only
//! pointers; the counts let it check bounds and tell a broadcast operand from a full one, as the
//! CPU kernel does with slice lengths). So the declaration `(x, out, eps: f32, dim: u32)` is the
//! CUDA function `(const T* x, T* out, float eps, uint32_t dim, uint64_t n_x, uint64_t n_out)`.
//!
//! The contract: the registry hands out only declared built-in kernels
//! ([`crate::kernels::builtin`]), whose names are functions of the sources taking the declared
//! parameters in this layout; a dispatch's arguments were checked against that declaration when
//! it was built (count, buffer or scalar, scalar type, dtype); every buffer address is checked to
//! lie on this device. So each parameter slot holds a value of the type the function takes at that
//! position. The driver copies the parameter values during the launch or node call, so the slots
//! only have to live for that call; buffer addresses stay valid because a dispatch holds its
//! allocations (and a session or graph holds the dispatches until the work has run).

use std::ffi::c_void;

use cudarc::driver::{result, sys};

use super::{CudaDevice, Kernel};
use crate::backend::Buffer;
use crate::error::{Error, Result};
use crate::graph::{Arg, DispatchRef, Scalar};

/// The device address of a buffer view on `device`, or an error naming the kernel and argument.
pub(crate) fn device_address(
    device: &CudaDevice,
    kernel: &'static str,
    index: usize,
    buf: &Buffer,
) -> Result<u64> {
    match super::cuda_memory(buf) {
        Some(mem) if mem.ordinal() == device.ordinal() => {
            Ok(mem.device_ptr() + buf.offset() as u64)
        }
        _ => Err(Error::Kernel {
            kernel,
            msg: format!(
                "argument {index} lives on {}, not cuda:{}",
                buf.allocation().location(),
                device.ordinal()
            ),
        }),
    }
}

/// The parameters of one launch: 8-byte slots and the pointers to them the driver reads.
/// Reused from launch to launch (no allocation once it has grown).
#[derive(Default)]
pub(crate) struct LaunchParams {
    slots: Vec<u64>,
    pointers: Vec<*mut c_void>,
}

// SAFETY: `pointers` only ever points into `slots` of the same value and is rebuilt by `prepare`
// before each use; nothing in it outlives the launch it was prepared for.
unsafe impl Send for LaunchParams {}

impl LaunchParams {
    /// Launches one dispatch into the device's stream (asynchronously). The device's context must
    /// be bound to this thread.
    pub(crate) fn launch(&mut self, device: &CudaDevice, dispatch: DispatchRef<'_>) -> Result<()> {
        let name = dispatch.kernel().name();
        let (kernel, shared) = self.prepare(device, dispatch)?;
        let grid = dispatch.grid();
        // SAFETY: the function handle is valid while `kernel` lives (it holds its module); the
        // parameters were laid out by `prepare` under this module's contract (each slot holds a
        // value of the type the function takes there); the driver copies the parameter values
        // during this call. Buffer addresses are inside allocations kept alive by the dispatch (and
        // by the session until it has waited).
        unsafe {
            result::launch_kernel(
                kernel.cu_function(),
                (grid.blocks[0], grid.blocks[1], grid.blocks[2]),
                (grid.threads[0], grid.threads[1], grid.threads[2]),
                shared,
                device.cu_stream(),
                &mut self.pointers,
            )
        }
        .map_err(|e| device.driver_error(&format!("cuLaunchKernel of `{name}` {grid:?}"), e))
    }

    /// Adds one dispatch as a kernel node of `graph`, depending on `deps`; returns the node and the
    /// kernel, which the caller keeps for as long as the graph can be launched (it owns the
    /// function handle the node refers to).
    ///
    /// # Safety
    ///
    /// `graph` must be a live graph created in the device's context, which must be bound to this
    /// thread, and every node of `deps` must belong to that graph.
    pub(crate) unsafe fn add_node(
        &mut self,
        device: &CudaDevice,
        graph: sys::CUgraph,
        deps: &[sys::CUgraphNode],
        dispatch: DispatchRef<'_>,
    ) -> Result<(sys::CUgraphNode, Kernel)> {
        let name = dispatch.kernel().name();
        let (kernel, shared) = self.prepare(device, dispatch)?;
        let grid = dispatch.grid();
        // SAFETY: the all-zero bit pattern is valid for this plain C struct (null pointers, zero
        // sizes).
        let mut np: sys::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
        np.func = kernel.cu_function();
        np.gridDimX = grid.blocks[0];
        np.gridDimY = grid.blocks[1];
        np.gridDimZ = grid.blocks[2];
        np.blockDimX = grid.threads[0];
        np.blockDimY = grid.threads[1];
        np.blockDimZ = grid.threads[2];
        np.sharedMemBytes = shared;
        np.kernelParams = self.pointers.as_mut_ptr();
        let mut node: sys::CUgraphNode = std::ptr::null_mut();
        // SAFETY: `graph` is live and `deps` are its nodes (the caller's contract); `np` points to
        // a valid function handle (held by `kernel`, which the caller keeps) and to parameters
        // laid out by `prepare` under this module's contract; the driver copies the parameter
        // values during this call.
        let added = unsafe {
            sys::cuGraphAddKernelNode_v2(&mut node, graph, deps.as_ptr(), deps.len(), &np)
        };
        device.driver(&format!("cuGraphAddKernelNode of `{name}`"), added.result())?;
        Ok((node, kernel))
    }

    /// Looks the dispatch's kernel up, checks its launch geometry and shared memory, and lays out
    /// its parameters; returns the kernel and the dynamic shared memory to launch it with. The
    /// pointers stay valid until the next `prepare`.
    ///
    /// A dispatch asking for more shared memory than a block of this device may have gets what
    /// the device allows, less the kernel's static shared memory: every kernel that takes a
    /// shared-memory form checks the size it was given (`%dynamic_smem_size`) and takes a smaller
    /// form otherwise (the pipelined prompt products' 106 KiB, for example, on a GPU with 99 KiB a
    /// block).
    fn prepare(&mut self, device: &CudaDevice, dispatch: DispatchRef<'_>) -> Result<(Kernel, u32)> {
        let name = dispatch.kernel().name();
        let kernel = device.registry().get(dispatch.kernel())?;
        let grid = dispatch.grid();
        if grid.blocks.contains(&0) || grid.threads.contains(&0) {
            return Err(Error::Kernel {
                kernel: name,
                msg: format!("empty launch geometry {grid:?}"),
            });
        }
        let info = device.info();
        let asked = grid.shared_bytes.max(occupancy_pad(
            grid.max_blocks_per_sm,
            info.shared_per_sm,
            info.reserved_shared_per_block,
        ));
        // The device's limit covers the kernel's static shared memory too.
        let limit = u32::try_from(info.max_shared_per_block)
            .unwrap_or(u32::MAX)
            .saturating_sub(kernel.static_shared());
        let shared = asked.min(limit);
        kernel.ensure_dynamic_shared(shared)?;
        self.slots.clear();
        for (i, arg) in dispatch.args().iter().enumerate() {
            self.slots.push(match arg {
                Arg::Buffer(buf, _) => device_address(device, name, i, buf)?,
                Arg::Scalar(Scalar::U32(v)) => *v as u64,
                Arg::Scalar(Scalar::I32(v)) => *v as u32 as u64,
                Arg::Scalar(Scalar::F32(v)) => v.to_bits() as u64,
            });
        }
        for arg in dispatch.args() {
            if let Arg::Buffer(buf, _) = arg {
                self.slots.push(buf.elems() as u64);
            }
        }
        // A 32-bit scalar is read from the low 4 bytes of its 8-byte slot (little-endian host).
        self.pointers.clear();
        let base = self.slots.as_mut_ptr();
        for i in 0..self.slots.len() {
            // SAFETY: `i` is in bounds of `slots`, which is not resized until the next `prepare`.
            self.pointers.push(unsafe { base.add(i) } as *mut c_void);
        }
        Ok((kernel, shared))
    }
}

/// The dynamic shared memory a block must take so that at most `cap` blocks fit on a
/// multiprocessor of `per_sm` bytes setting aside `reserved` bytes a block (0 for no cap): one
/// byte more than a share of `cap + 1` blocks, rounded up to 16.
pub(crate) fn occupancy_pad(cap: u32, per_sm: i32, reserved: i32) -> u32 {
    if cap == 0 || per_sm <= 0 {
        return 0;
    }
    let share = per_sm as i64 / (cap as i64 + 1) - reserved.max(0) as i64 + 1;
    u32::try_from(share.max(0)).map_or(0, |b| b.div_ceil(16) * 16)
}

#[cfg(test)]
mod tests {
    use super::occupancy_pad;

    /// An H100's 228 KiB an SM and 1 KiB a block: two blocks of the pad fit, three do not.
    #[test]
    fn the_pad_lets_exactly_the_cap_fit() {
        let (per_sm, reserved) = (233_472, 1024);
        for cap in 1..=4u32 {
            let pad = occupancy_pad(cap, per_sm, reserved) as i64;
            let fits = |n: i64| n * (pad + reserved as i64) <= per_sm as i64;
            assert!(
                fits(cap as i64) && !fits(cap as i64 + 1),
                "cap {cap}: pad {pad}"
            );
        }
        assert_eq!(occupancy_pad(0, per_sm, reserved), 0);
        assert_eq!(occupancy_pad(2, 0, reserved), 0);
    }
}
