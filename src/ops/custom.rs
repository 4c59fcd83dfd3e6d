//! User kernels: dispatch your own kernel, declared like the built-in ones.
//!
//! A [`CustomKernel`] pairs a [`KernelSig`] (its name, `OpKind::Custom { reorderable }` and its
//! parameters, each buffer's access and dtypes) with its CPU implementation. Each call of
//! [`Session::custom`] must pass arguments that fit the declaration: those accesses are all the
//! optimizer knows about the kernel, so they must be complete (every byte the kernel reads or
//! writes lies in an argument declared with that access). A kernel declared
//! `reorderable: false` keeps its place relative to every other dispatch. Custom kernels run on
//! the CPU backend; the CUDA backend refuses them with a clear error.
//!
//! ```
//! use onepass::backend::cpu::KernelArgs;
//! use onepass::graph::{Arg, Grid, KernelSig, OpKind};
//! use onepass::kernels::{DTypes, Param};
//! use onepass::ops::custom::CustomKernel;
//! use onepass::{DType, Device, Executor, Mode, Plan};
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
//! static DOUBLE_SIG: KernelSig = KernelSig::new(
//!     "example_double_f32",
//!     OpKind::Custom { reorderable: true },
//!     &[Param::read("x", DTypes::one(DType::F32)), Param::write("out", DTypes::one(DType::F32))],
//! );
//! const DOUBLE: CustomKernel = CustomKernel { sig: &DOUBLE_SIG, cpu: double };
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

use crate::backend::cpu::CpuKernelFn;
use crate::backend::Device;
use crate::error::{Error, Result};
use crate::graph::{Arg, ArgRef, Dispatch, DispatchSpec, Grid, KernelId, KernelSig, OpKind};

/// A user kernel: its declaration and its CPU implementation.
#[derive(Clone, Copy)]
pub struct CustomKernel {
    /// The declaration: a name no built-in kernel has, `OpKind::Custom { reorderable }`
    /// (whether the reorder pass may move it), and the parameters every call's arguments must
    /// fit.
    pub sig: &'static KernelSig,
    /// The CPU implementation.
    pub cpu: CpuKernelFn,
}

impl CustomKernel {
    /// The kernel's id.
    pub fn id(&self) -> KernelId {
        KernelId::of(self.sig)
    }
}

impl std::fmt::Debug for CustomKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CustomKernel")
            .field("sig", self.sig)
            .finish()
    }
}

/// Whether `name` is a built-in kernel's name.
pub fn is_builtin_kernel(name: &str) -> bool {
    crate::kernels::all().iter().any(|k| k.name() == name)
        || crate::kernels::misc::CUDA_SELFTEST
            .iter()
            .any(|k| k.name() == name)
}

/// Builds the dispatch of a custom kernel: checks the declaration and the arguments against it,
/// and derives the ranges (a written argument may not overlap any other argument).
pub fn custom(kernel: &CustomKernel, args: Vec<Arg>, grid: Grid) -> Result<Dispatch> {
    check_sig(kernel.sig)?;
    Dispatch::new(kernel.id(), args, grid)
        .map_err(|e| Error::InvalidArgument(format!("custom kernel `{}`: {e}", kernel.sig.name())))
}

/// The dispatch of a custom kernel as a spec borrowing its buffers: what a
/// [`FusionRule`](crate::graph::passes::FusionRule) that fuses into a custom kernel builds. The
/// ranges are checked when the fusion pass records it.
pub fn custom_spec<'a>(
    kernel: &CustomKernel,
    args: &[ArgRef<'a>],
    grid: Grid,
) -> Result<DispatchSpec<'a>> {
    check_sig(kernel.sig)?;
    DispatchSpec::new(kernel.id(), args, grid)
}

fn check_sig(sig: &KernelSig) -> Result<()> {
    let name = sig.name();
    let refuse = |why: &str| {
        Err(Error::InvalidArgument(format!(
            "custom kernel `{name}`: {why}"
        )))
    };
    if name.is_empty() {
        return Err(Error::InvalidArgument(
            "custom kernel: the name is empty".into(),
        ));
    }
    if is_builtin_kernel(name) {
        return refuse("the name is taken by a built-in kernel; choose another name");
    }
    if !matches!(sig.op(), OpKind::Custom { .. }) {
        return refuse("its op kind must be OpKind::Custom { reorderable }");
    }
    if sig.params().is_none() {
        return refuse("it declares no parameters; declare them with KernelSig::new");
    }
    Ok(())
}

/// Registers the kernel's CPU function with `device`, once. A second kernel of the same name
/// with another declaration or function is an error.
pub fn register(device: &Device, kernel: &CustomKernel) -> Result<()> {
    check_sig(kernel.sig)?;
    let name = kernel.sig.name();
    if !device.capabilities().custom_cpu_kernels {
        return Err(Error::Unsupported(format!(
            "custom kernel `{name}`: custom kernels run on the CPU backend only"
        )));
    }
    device
        .backend()
        .register_custom(kernel.id(), kernel.cpu)
        .map_err(|_| {
            Error::InvalidArgument(format!(
                "custom kernel `{name}`: another kernel of that name is already registered on {}",
                device.name()
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::KernelArgs;
    use crate::backend::DType;
    use crate::kernels::{DTypes, Param};
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

    const F32: DTypes = DTypes::one(DType::F32);

    static AXPY_SIG: KernelSig = KernelSig::new(
        "test_custom_axpy_f32",
        OpKind::Custom { reorderable: false },
        &[
            Param::read("x", F32),
            Param::read_write("y", F32),
            Param::f32("a"),
        ],
    );

    const AXPY: CustomKernel = CustomKernel {
        sig: &AXPY_SIG,
        cpu: axpy,
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
        static COPY_SIG: KernelSig = KernelSig::new(
            "copy_f32_f32",
            OpKind::Custom { reorderable: true },
            &[Param::write("x", F32)],
        );
        let k = CustomKernel {
            sig: &COPY_SIG,
            cpu: other,
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
        static DUP_SIG: KernelSig = KernelSig::new(
            "test_custom_dup",
            OpKind::Custom { reorderable: true },
            &[
                Param::read("x", F32),
                Param::read_write("y", F32),
                Param::f32("a"),
            ],
        );
        let first = CustomKernel {
            sig: &DUP_SIG,
            cpu: axpy,
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

    #[test]
    fn given_arguments_that_do_not_fit_the_declaration_when_built_should_name_the_argument() {
        let dev = Device::cpu(1).expect("cpu");
        let x = dev.alloc(DType::F32, &[8]).expect("alloc");
        let y = dev.alloc(DType::F32, &[8]).expect("alloc");
        let ints = dev.alloc(DType::I32, &[8]).expect("alloc");
        let short = custom(
            &AXPY,
            vec![Arg::read(&x), Arg::read_write(&y)],
            Grid::new(1, 8),
        );
        let err = short.expect_err("too few arguments").to_string();
        assert!(
            err.contains("2 arguments") && err.contains("x, y, a"),
            "{err}"
        );
        let wrong = vec![Arg::read(&ints), Arg::read_write(&y), Arg::f32(1.0)];
        let err = custom(&AXPY, wrong, Grid::new(1, 8))
            .expect_err("i32 x")
            .to_string();
        assert!(
            err.contains("argument 0 `x`") && err.contains("i32"),
            "{err}"
        );
    }
}
