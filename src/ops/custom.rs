//! User kernels: dispatch your own kernel, declaring each argument's access.
//!
//! A [`CustomKernel`] names a kernel and gives its CPU implementation (and, for the CUDA
//! backend, its CUDA C source). Each call of [`Session::custom`] passes the arguments as
//! [`Arg::read`], [`Arg::write`] or [`Arg::read_write`]: those declarations are all the optimizer
//! knows about the kernel, so they must be complete (every byte the kernel reads or writes lies in
//! an argument declared with that access). A kernel declared `reorderable: false` keeps its place
//! relative to every other dispatch.
//!
//! ```
//! use onepass::backend::cpu::KernelArgs;
//! use onepass::graph::{Arg, Grid};
//! use onepass::ops::custom::CustomKernel;
//! use onepass::{Device, Executor, Mode, Plan};
//!
//! /// `out[i] = 2 * x[i]`.
//! fn double(args: &KernelArgs<'_>) -> onepass::Result<()> {
//!     let x = args.input::<f32>(0)?;
//!     let out = args.output::<f32>(1)?;
//!     for (o, v) in out.iter_mut().zip(x) {
//!         *o = 2.0 * v;
//!     }
//!     Ok(())
//! }
//!
//! const DOUBLE: CustomKernel =
//!     CustomKernel { name: "example_double_f32", cpu: double, cuda: None, reorderable: true };
//!
//! # fn main() -> onepass::Result<()> {
//! let device = Device::cpu(1)?;
//! let x = device.upload(&[1.0f32, -2.0, 3.5], &[3])?;
//! let out = device.alloc(onepass::DType::F32, &[3])?;
//! let mut session = Executor::new(device.clone()).begin(Mode::Recorded);
//! session.custom(&DOUBLE, vec![Arg::read(&x), Arg::write(&out)], Grid::cover(3, 128))?;
//! session.finish(&Plan::OPTIMIZED)?;
//! assert_eq!(device.download::<f32>(&out)?, vec![2.0, -4.0, 7.0]);
//! # Ok(())
//! # }
//! ```

use std::collections::HashSet;
use std::sync::OnceLock;

use crate::backend::cpu::{CpuKernelFn, CpuRegistry};
use crate::backend::Device;
use crate::error::{Error, Result};
use crate::graph::{Arg, ArgRef, Dispatch, DispatchSpec, Grid, KernelId, OpKind};
use crate::session::Session;

/// A user kernel: its name, its CPU implementation and whether the optimizer may move it.
#[derive(Clone, Copy)]
pub struct CustomKernel {
    /// The kernel's name in every backend's registry. It may not be a built-in kernel's name.
    pub name: &'static str,
    /// The CPU implementation.
    pub cpu: CpuKernelFn,
    /// CUDA C source defining a `extern "C" __global__` function called `name`, compiled by the
    /// CUDA backend on first use. `None`: the kernel runs on the CPU backend only.
    pub cuda: Option<&'static str>,
    /// Whether the reorder pass may move dispatches of this kernel (its declared ranges are all
    /// it touches). `false` pins it in program order.
    pub reorderable: bool,
}

impl std::fmt::Debug for CustomKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CustomKernel")
            .field("name", &self.name)
            .field("cuda", &self.cuda.is_some())
            .field("reorderable", &self.reorderable)
            .finish()
    }
}

/// Names of the built-in CPU kernels, computed once.
fn builtin_names() -> &'static HashSet<&'static str> {
    static NAMES: OnceLock<HashSet<&'static str>> = OnceLock::new();
    NAMES.get_or_init(|| {
        let mut registry = CpuRegistry::default();
        crate::backend::cpu::kernels::register_all(&mut registry);
        registry.names().into_iter().collect()
    })
}

/// Whether `name` is a built-in kernel's name.
pub fn is_builtin_kernel(name: &str) -> bool {
    builtin_names().contains(name)
}

/// Builds the dispatch of a custom kernel: checks the name and derives the ranges from the
/// declared accesses (a written argument may not overlap any other argument).
pub fn custom(kernel: &CustomKernel, args: Vec<Arg>, grid: Grid) -> Result<Dispatch> {
    check_name(kernel.name)?;
    Dispatch::new(
        KernelId(kernel.name),
        args,
        grid,
        OpKind::Custom {
            reorderable: kernel.reorderable,
        },
    )
    .map_err(|e| Error::InvalidArgument(format!("custom kernel `{}`: {e}", kernel.name)))
}

/// The dispatch of a custom kernel as a spec borrowing its buffers: what a
/// [`FusionRule`](crate::graph::passes::FusionRule) that fuses into a custom kernel builds. The
/// ranges are checked when the fusion pass records it.
pub fn custom_spec<'a>(
    kernel: &CustomKernel,
    args: &[ArgRef<'a>],
    grid: Grid,
) -> Result<DispatchSpec<'a>> {
    check_name(kernel.name)?;
    let op = OpKind::Custom {
        reorderable: kernel.reorderable,
    };
    DispatchSpec::new(KernelId(kernel.name), args, grid, op)
}

fn check_name(name: &'static str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::InvalidArgument(
            "custom kernel: the name is empty".into(),
        ));
    }
    if is_builtin_kernel(name) {
        return Err(Error::InvalidArgument(format!(
            "custom kernel `{name}`: the name is taken by a built-in kernel; choose another name"
        )));
    }
    Ok(())
}

/// Registers the kernel's CPU function with `device`, once. A second kernel of the same name
/// with another function is an error.
pub fn register(device: &Device, kernel: &CustomKernel) -> Result<()> {
    check_name(kernel.name)?;
    match device {
        Device::Cpu(cpu) => match cpu.kernel(KernelId(kernel.name)) {
            Ok(existing) if existing as usize == kernel.cpu as usize => Ok(()),
            Ok(_) => Err(Error::InvalidArgument(format!(
                "custom kernel `{}`: another kernel of that name is already registered on {}",
                kernel.name,
                device.name()
            ))),
            Err(_) => cpu.register_kernel(kernel.name, kernel.cpu),
        },
        Device::Cuda(_) => Err(Error::Unsupported(format!(
            "custom kernel `{}`: custom kernels have no CUDA implementation yet",
            kernel.name
        ))),
    }
}

impl Session {
    /// Dispatches a user kernel with `args` (each buffer's access declared through
    /// [`Arg::read`], [`Arg::write`] or [`Arg::read_write`]) over `grid`. The first call
    /// registers the kernel with the session's device.
    pub fn custom(&mut self, kernel: &CustomKernel, args: Vec<Arg>, grid: Grid) -> Result<()> {
        let dispatch = custom(kernel, args, grid)?;
        register(self.device(), kernel)?;
        self.push(dispatch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::KernelArgs;
    use crate::backend::DType;
    use crate::session::{Executor, Mode, Plan};
    use crate::testutil::{assert_close, random_f32};

    fn axpy(args: &KernelArgs<'_>) -> Result<()> {
        let a = args.f32(2)?;
        let x = args.input::<f32>(0)?;
        let y = args.output::<f32>(1)?;
        for (o, v) in y.iter_mut().zip(x) {
            *o += a * v;
        }
        Ok(())
    }

    fn other(_: &KernelArgs<'_>) -> Result<()> {
        Ok(())
    }

    const AXPY: CustomKernel = CustomKernel {
        name: "test_custom_axpy_f32",
        cpu: axpy,
        cuda: None,
        reorderable: false,
    };

    #[test]
    fn given_a_custom_kernel_when_run_in_both_modes_should_match_a_float64_reference() {
        let n = 257;
        let x = random_f32(n, 1.0, 11);
        let y0 = random_f32(n, 1.0, 12);
        let want: Vec<f32> = x
            .iter()
            .zip(&y0)
            .map(|(&a, &b)| (b as f64 + 0.75 * a as f64) as f32)
            .collect();
        for mode in [Mode::Direct, Mode::Recorded] {
            let dev = Device::cpu(2).expect("cpu");
            let xb = dev.upload(&x, &[n]).expect("upload");
            let yb = dev.upload(&y0, &[n]).expect("upload");
            let mut s = Executor::new(dev.clone()).begin(mode);
            s.custom(
                &AXPY,
                vec![Arg::read(&xb), Arg::read_write(&yb), Arg::f32(0.75)],
                Grid::cover(n, 64),
            )
            .expect("custom");
            let report = s.finish(&Plan::OPTIMIZED).expect("finish");
            assert_eq!(report.dispatches, 1);
            let got = dev.download::<f32>(&yb).expect("download");
            assert_close(&got, &want, 1e-6, 1e-6, "axpy");
        }
    }

    #[test]
    fn given_a_custom_kernel_when_built_should_carry_its_kind_and_ranges() {
        let dev = Device::cpu(1).expect("cpu");
        let x = dev.alloc(DType::F32, &[8]).expect("alloc");
        let y = dev.alloc(DType::F32, &[8]).expect("alloc");
        let d = custom(
            &AXPY,
            vec![Arg::read(&x), Arg::read_write(&y), Arg::f32(1.0)],
            Grid::new(1, 8),
        )
        .expect("dispatch");
        assert_eq!(d.op(), OpKind::Custom { reorderable: false });
        assert!(!d.op().is_reorderable());
        assert_eq!(d.reads().len(), 2);
        assert_eq!(d.writes().len(), 1);
    }

    #[test]
    fn given_a_builtin_name_when_declared_should_be_rejected_with_a_clear_error() {
        assert!(is_builtin_kernel("copy_f32_f32"));
        assert!(!is_builtin_kernel("test_custom_axpy_f32"));
        let k = CustomKernel {
            name: "copy_f32_f32",
            cpu: other,
            cuda: None,
            reorderable: true,
        };
        let dev = Device::cpu(1).expect("cpu");
        let x = dev.alloc(DType::F32, &[8]).expect("alloc");
        let err = custom(&k, vec![Arg::write(&x)], Grid::new(1, 1)).expect_err("must reject");
        assert!(err.to_string().contains("built-in"), "{err}");
        let mut s = Executor::new(dev.clone()).begin(Mode::Direct);
        assert!(s.custom(&k, vec![Arg::write(&x)], Grid::new(1, 1)).is_err());
    }

    #[test]
    fn given_two_kernels_with_one_name_when_registered_should_reject_the_second() {
        let dev = Device::cpu(1).expect("cpu");
        let first = CustomKernel {
            name: "test_custom_dup",
            cpu: axpy,
            cuda: None,
            reorderable: true,
        };
        let second = CustomKernel {
            cpu: other,
            ..first
        };
        register(&dev, &first).expect("first registration");
        register(&dev, &first).expect("same kernel again is fine");
        let err = register(&dev, &second).expect_err("must reject");
        assert!(err.to_string().contains("already registered"), "{err}");
    }

    #[test]
    fn given_a_write_overlapping_a_read_when_declared_should_be_rejected() {
        let dev = Device::cpu(1).expect("cpu");
        let x = dev.alloc(DType::F32, &[8]).expect("alloc");
        let err = custom(
            &AXPY,
            vec![Arg::read(&x), Arg::write(&x), Arg::f32(1.0)],
            Grid::new(1, 8),
        )
        .expect_err("must reject");
        assert!(err.to_string().contains("test_custom_axpy_f32"), "{err}");
    }
}
