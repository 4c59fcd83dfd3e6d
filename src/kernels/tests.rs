//! The declarations hold together: names are unique, every CPU kernel and every CUDA function is
//! declared, every declared kernel has a function on the backend that runs it, and a dispatch
//! that does not fit its declaration is refused with an error naming kernel and argument.

use std::collections::BTreeSet;

use super::{all, builtin, misc, KernelId, ParamKind};
use crate::backend::cpu::CpuRegistry;
use crate::backend::cuda::all_kernel_names;
use crate::backend::{DType, Device};
use crate::graph::{Arg, Dispatch, Grid, OpKind};

fn declared() -> BTreeSet<&'static str> {
    all().into_iter().map(|k| k.name()).collect()
}

#[test]
fn given_every_declaration_when_listed_should_have_distinct_names_and_parameter_names() {
    let list = all();
    assert_eq!(declared().len(), list.len(), "a name is declared twice");
    for k in list.iter().copied().chain(&misc::CUDA_SELFTEST) {
        let params = k
            .params()
            .expect("built-in kernels declare their parameters");
        let names: BTreeSet<_> = params.iter().map(|p| p.name).collect();
        assert_eq!(
            names.len(),
            params.len(),
            "{}: a parameter name twice",
            k.name()
        );
        for p in params {
            if let ParamKind::Buffer(_, dtypes) = p.kind {
                assert!(
                    !dtypes.list().is_empty(),
                    "{}.{} has no dtype",
                    k.name(),
                    p.name
                );
            }
        }
        assert_eq!(builtin(k.name()), Some(KernelId::of(k)));
    }
}

/// The CPU registers exactly the declared kernels but the CUDA-only one-launch decode
/// attention.
#[test]
fn given_the_cpu_registry_when_compared_with_the_declarations_should_match_them() {
    let mut registry = CpuRegistry::default();
    crate::backend::cpu::kernels::register_all(&mut registry);
    let cpu: BTreeSet<_> = registry.names().into_iter().collect();
    let cuda_only: BTreeSet<_> = super::attention::DECODE.iter().map(|k| k.name()).collect();
    let want: BTreeSet<_> = declared().difference(&cuda_only).copied().collect();
    assert_eq!(cpu, want);
    for k in all() {
        let id = KernelId::of(k);
        assert_eq!(
            registry.get(id).is_ok(),
            !cuda_only.contains(k.name()),
            "{id}"
        );
    }
}

/// The CUDA sources define exactly the declared kernels (the self-test kernels included).
#[test]
fn given_the_cuda_sources_when_compared_with_the_declarations_should_match_them() {
    let cuda: BTreeSet<_> = all_kernel_names().into_iter().collect();
    let mut want = declared();
    want.extend(misc::CUDA_SELFTEST.iter().map(|k| k.name()));
    assert_eq!(cuda, want);
}

/// A dispatch with a wrong argument count or dtype is refused with an error naming the kernel
/// and the argument, before any backend sees it.
#[test]
fn given_arguments_that_do_not_fit_when_built_should_name_kernel_and_argument() {
    let dev = Device::cpu(1).expect("cpu");
    let x = dev.alloc(DType::F32, &[4, 8]).expect("alloc");
    let w = dev.alloc(DType::F32, &[8]).expect("alloc");
    let out = dev.alloc(DType::F32, &[4, 8]).expect("alloc");
    let ints = dev.alloc(DType::I32, &[8]).expect("alloc");
    let norm = KernelId::of(&super::norm::RMS_NORM[0]);
    let short = vec![
        Arg::read(&x),
        Arg::read(&w),
        Arg::write(&out),
        Arg::f32(1e-5),
    ];
    let err = Dispatch::new(norm, short, Grid::new(4, 32)).expect_err("short");
    let msg = err.to_string();
    assert!(
        msg.contains("rms_norm_f32") && msg.contains("4 arguments"),
        "{msg}"
    );
    assert!(msg.contains("x, weight, out, eps, dim"), "{msg}");
    let typed = vec![
        Arg::read(&x),
        Arg::read(&ints),
        Arg::write(&out),
        Arg::f32(1e-5),
        Arg::u32(8),
    ];
    let msg = Dispatch::new(norm, typed, Grid::new(4, 32))
        .expect_err("i32 weight")
        .to_string();
    assert!(
        msg.contains("rms_norm_f32") && msg.contains("argument 1 `weight`"),
        "{msg}"
    );
    assert!(msg.contains("i32"), "{msg}");
    let access = vec![
        Arg::read(&x),
        Arg::write(&w),
        Arg::write(&out),
        Arg::f32(1e-5),
        Arg::u32(8),
    ];
    let msg = Dispatch::new(norm, access, Grid::new(4, 32))
        .expect_err("written weight")
        .to_string();
    assert!(
        msg.contains("argument 1 `weight`") && msg.contains("Write"),
        "{msg}"
    );
    let scalar = vec![
        Arg::read(&x),
        Arg::read(&w),
        Arg::write(&out),
        Arg::u32(1),
        Arg::u32(8),
    ];
    let msg = Dispatch::new(norm, scalar, Grid::new(4, 32))
        .expect_err("u32 eps")
        .to_string();
    assert!(
        msg.contains("argument 3 `eps`") && msg.contains("F32"),
        "{msg}"
    );
    let fits = vec![
        Arg::read(&x),
        Arg::read(&w),
        Arg::write(&out),
        Arg::f32(1e-5),
        Arg::u32(8),
    ];
    let d = Dispatch::new(norm, fits, Grid::new(4, 32)).expect("fits");
    assert_eq!(d.op(), OpKind::RmsNorm);
}

/// An untyped kernel records, but no backend runs it, even under a built-in kernel's name.
#[test]
fn given_an_untyped_kernel_under_a_builtin_name_when_looked_up_should_be_unknown() {
    static FAKE: super::KernelSig = super::KernelSig::untyped("rms_norm_f32", OpKind::RmsNorm);
    let fake = KernelId::of(&FAKE);
    assert_ne!(fake, KernelId::of(&super::norm::RMS_NORM[0]));
    let mut registry = CpuRegistry::default();
    crate::backend::cpu::kernels::register_all(&mut registry);
    let err = registry.get(fake).expect_err("untyped");
    assert!(err.to_string().contains("rms_norm_f32"), "{err}");
    assert_eq!(
        builtin("rms_norm_f32"),
        Some(KernelId::of(&super::norm::RMS_NORM[0]))
    );
}
