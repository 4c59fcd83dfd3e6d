//! Tests of the memory lock: a host copy never overlaps a running kernel, and a kernel that uses
//! the host API gets an error instead of waiting forever.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::backend::cpu::{CpuDevice, KernelArgs};
use crate::backend::{DType, Device};
use crate::error::Result;
use crate::graph::{Arg, Dispatch, Grid, KernelId, KernelSig, OpKind};
use crate::kernels::{DTypes, Param};

const F32: DTypes = DTypes::one(DType::F32);

static STARTED: AtomicBool = AtomicBool::new(false);

/// Writes `out[i] = i + 1` slowly, after saying it started.
fn slow_fill(args: &KernelArgs<'_>) -> Result<()> {
    let out = args.output::<f32>(0)?;
    STARTED.store(true, Ordering::SeqCst);
    for (i, o) in out.iter_mut().enumerate() {
        *o = i as f32 + 1.0;
        if i % 8 == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    Ok(())
}

static SLOW_FILL: KernelSig = KernelSig::new(
    "test_run_slow_fill",
    OpKind::Custom { reorderable: true },
    &[Param::write("out", F32)],
);

/// The device a kernel below reaches through a static, as a careless custom kernel might.
static REACHED: OnceLock<Device> = OnceLock::new();
static REACHED_BUFFER: OnceLock<crate::backend::Buffer> = OnceLock::new();

/// Tries to download a buffer from inside a kernel; records the error's text in `out[0]`'s sign.
fn reach_device(args: &KernelArgs<'_>) -> Result<()> {
    let (dev, buf) = (
        REACHED.get().expect("device"),
        REACHED_BUFFER.get().expect("buffer"),
    );
    let refused = dev.download::<f32>(buf).is_err();
    args.output::<f32>(0)?[0] = if refused { -1.0 } else { 1.0 };
    Ok(())
}

static REACH_DEVICE: KernelSig = KernelSig::new(
    "test_run_reach_device",
    OpKind::Custom { reorderable: true },
    &[Param::write("out", F32)],
);

fn cpu_device() -> (Device, Arc<CpuDevice>) {
    let dev = Device::cpu(2).expect("cpu");
    let Device::Cpu(cpu) = &dev else {
        unreachable!("Device::cpu makes a CPU device")
    };
    let cpu = cpu.clone();
    (dev, cpu)
}

/// A download issued while a submitted kernel is still writing its output waits for it: it reads
/// the finished output, never a half-written one.
#[test]
fn given_a_kernel_in_flight_when_the_host_downloads_its_output_should_see_it_finished() {
    let (dev, cpu) = cpu_device();
    cpu.register_custom(KernelId::of(&SLOW_FILL), slow_fill)
        .expect("register");
    let n = 256;
    let out = dev.alloc(DType::F32, &[n]).expect("alloc");
    let fill = Dispatch::new(
        KernelId::of(&SLOW_FILL),
        vec![Arg::write(&out)],
        Grid::new(1, 1),
    )
    .expect("dispatch");
    let mut enc = cpu.encoder();
    enc.encode(fill.as_view()).expect("encode");
    let submission = enc.submit().expect("submit");
    while !STARTED.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    let seen = dev.download::<f32>(&out).expect("download");
    let want: Vec<f32> = (0..n).map(|i| i as f32 + 1.0).collect();
    assert_eq!(seen, want, "the download overlapped the kernel");
    submission.wait().expect("wait");
}

/// A kernel that reads device memory through the host API is refused (an error it can
/// report), instead of waiting for the lock its own submission holds.
#[test]
fn given_a_kernel_that_uses_the_host_api_when_run_should_be_refused_not_deadlocked() {
    let (dev, cpu) = cpu_device();
    cpu.register_custom(KernelId::of(&REACH_DEVICE), reach_device)
        .expect("register");
    let other = dev.upload(&[3.0f32; 4], &[4]).expect("upload");
    let _ = REACHED.set(dev.clone());
    let _ = REACHED_BUFFER.set(other);
    let out = dev.alloc(DType::F32, &[4]).expect("alloc");
    let d = Dispatch::new(
        KernelId::of(&REACH_DEVICE),
        vec![Arg::write(&out)],
        Grid::new(1, 1),
    )
    .expect("dispatch");
    let mut enc = cpu.encoder();
    enc.encode(d.as_view()).expect("encode");
    enc.submit().expect("submit").wait().expect("wait");
    assert_eq!(dev.download::<f32>(&out).expect("download")[0], -1.0);
}
