//! The CUDA backend's infrastructure on a real device: discovery, memory, the scratch pool, the
//! kernel registry, and the three ways of running a pass (direct, recorded, synchronized per
//! launch). Every test but discovery needs a GPU: ignored by default, it fails where there is none.

mod cuda_open;
mod seeded;

use cuda_open::cuda_device;
use onepass::backend::{cuda, EncoderOptions};
use onepass::graph::{Arg, Dispatch, Grid, KernelId, KernelSig, OpKind};
use onepass::kernels::misc::CUDA_SELFTEST;
use onepass::{DType, Device, Executor, Mode, Plan};
use seeded::random_f32;

#[test]
fn discovery_never_panics() {
    // With or without a driver these return, never panic.
    let present = cuda::driver_present();
    let version = cuda::driver_version();
    assert_eq!(present, version.is_some());
    match cuda::device_count() {
        Ok(n) => assert!(present, "{n} devices without a driver"),
        Err(e) => assert!(e.to_string().contains("CUDA"), "{e}"),
    }
    if !present {
        let err = Device::cuda(0).expect_err("no driver");
        assert!(err.to_string().contains("no CUDA driver found"), "{err}");
        assert!(matches!(err, onepass::Error::Unavailable(_)), "{err:?}");
        assert_eq!(
            Device::auto(1).unwrap().kind(),
            onepass::backend::BackendKind::Cpu
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn upload_download_roundtrip_and_views() {
    let dev = cuda_device();
    let data = random_f32(1000, 1.0, 1);
    let buf = dev.upload(&data, &[10, 100]).unwrap();
    assert_eq!(dev.download::<f32>(&buf).unwrap(), data);
    // A view of rows 3..5 reads the right bytes; writing it changes only those.
    let rows = buf.rows(3, 2).unwrap();
    assert_eq!(dev.download::<f32>(&rows).unwrap(), data[300..500]);
    let new: Vec<f32> = random_f32(200, 1.0, 2);
    dev.write(&rows, &new).unwrap();
    let all = dev.download::<f32>(&buf).unwrap();
    assert_eq!(all[..300], data[..300]);
    assert_eq!(all[300..500], new[..]);
    assert_eq!(all[500..], data[500..]);
    // Fresh allocations are zeroed.
    let z = dev.alloc(DType::F32, &[257]).unwrap();
    assert!(dev.download::<f32>(&z).unwrap().iter().all(|&v| v == 0.0));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn scratch_pool_reuses_blocks() {
    let dev = cuda_device();
    let Device::Cuda(cuda) = &dev else {
        unreachable!()
    };
    let before = cuda.pool().stats();
    for _ in 0..10 {
        let a = dev.alloc_scratch(DType::F32, &[1000]).unwrap();
        let b = dev.alloc_scratch(DType::F16, &[3, 333]).unwrap();
        drop((a, b));
    }
    let after = cuda.pool().stats();
    // At most one driver allocation per size class; everything else from the free lists.
    assert!(after.misses - before.misses <= 2, "{before:?} -> {after:?}");
    assert!(after.hits - before.hits >= 18, "{before:?} -> {after:?}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn unknown_kernel_is_an_error() {
    static NO_SUCH: KernelSig = KernelSig::untyped("no_such_kernel", OpKind::Copy);
    static FAKE_COPY: KernelSig = KernelSig::untyped("copy_f32_f32", OpKind::Copy);
    let dev = cuda_device();
    let x = dev.alloc(DType::F32, &[4]).unwrap();
    for (sig, name) in [(&NO_SUCH, "no_such_kernel"), (&FAKE_COPY, "copy_f32_f32")] {
        let d = Dispatch::new(KernelId::of(sig), vec![Arg::write(&x)], Grid::new(1, 32)).unwrap();
        let mut s = Executor::new(dev.clone()).begin(Mode::Direct);
        let err = s.push(d).expect_err("unknown kernel");
        assert!(err.to_string().contains(name), "{err}");
    }
}

/// A dispatch of a built-in kernel over CUDA buffers whose arguments do not fit its declaration
/// (too few, or a wrong dtype) is refused before any launch, naming kernel and argument.
#[test]
#[ignore = "needs a CUDA GPU"]
fn misfit_arguments_are_refused_on_cuda_buffers() {
    let dev = cuda_device();
    let x = dev.alloc(DType::F32, &[4]).unwrap();
    let ints = dev.alloc(DType::I32, &[4]).unwrap();
    let axpy = KernelId::of(&CUDA_SELFTEST[0]);
    let short = Dispatch::new(
        axpy,
        vec![Arg::read(&x), Arg::read_write(&x)],
        Grid::new(1, 32),
    );
    let msg = short.expect_err("too few").to_string();
    assert!(
        msg.contains("selftest_axpy_f32") && msg.contains("2 arguments"),
        "{msg}"
    );
    let typed = vec![
        Arg::read(&ints),
        Arg::read_write(&x),
        Arg::u32(4),
        Arg::f32(1.0),
    ];
    let msg = Dispatch::new(axpy, typed, Grid::new(1, 32))
        .expect_err("i32 x")
        .to_string();
    assert!(
        msg.contains("argument 0 `x`") && msg.contains("i32"),
        "{msg}"
    );
}

/// A chain of `selftest_axpy_f32` launches, each depending on the last: every mode must give the
/// same bits as the host computing the same float operations in order.
#[test]
#[ignore = "needs a CUDA GPU"]
fn direct_recorded_and_synchronized_modes_agree() {
    let dev = cuda_device();
    let n = 4099usize;
    let x = random_f32(n, 1.0, 3);
    let y0 = random_f32(n, 1.0, 4);
    let scales = [0.5f32, -1.25, 2.0, 0.75, -0.3];
    let mut want = y0.clone();
    for a in scales {
        for (w, xv) in want.iter_mut().zip(&x) {
            *w += a * xv;
        }
    }
    let exec = Executor::new(dev.clone());
    for (mode, sync_each, plan) in [
        (Mode::Direct, false, Plan::SEQUENTIAL),
        (Mode::Recorded, false, Plan::SEQUENTIAL),
        (Mode::Recorded, false, Plan::OPTIMIZED),
        (Mode::Direct, true, Plan::SEQUENTIAL),
    ] {
        let xb = dev.upload(&x, &[n]).unwrap();
        let yb = dev.upload(&y0, &[n]).unwrap();
        let options = EncoderOptions {
            sync_each_dispatch: sync_each,
        };
        let mut s = exec.begin_with(mode, options);
        for a in scales {
            let d = Dispatch::new(
                KernelId::of(&CUDA_SELFTEST[0]),
                vec![
                    Arg::read(&xb),
                    Arg::read_write(&yb),
                    Arg::u32(n as u32),
                    Arg::f32(a),
                ],
                Grid::cover(n, 256),
            )
            .unwrap();
            s.push(d).unwrap();
        }
        let report = s.finish(&plan).unwrap();
        assert_eq!(report.dispatches, scales.len());
        let got = dev.download::<f32>(&yb).unwrap();
        assert_eq!(got, want, "{mode:?} sync_each={sync_each} {plan:?}");
    }
}
