//! The CUDA backend's error paths on a real device: out of memory, a kernel that faults, and
//! what the device does after a fault. Each must come back as an error (never a panic, an abort
//! or a hang) that says what happened.
//!
//! A kernel fault breaks the CUDA context for the rest of the process, and every test of this
//! binary shares the device's primary context; so each faulting test runs its fault in a child
//! process (this same test binary, running only that test, told by an environment variable to be
//! the child), and the parent checks what the child printed, how it exited, and that it exited in
//! time. No test exists only to be the child, so `--include-ignored` runs nothing on its own that
//! faults the parent's context. Every test needs a GPU: ignored by default, it fails where there is
//! none.

mod cuda_open;

use onepass::kernels::misc::CUDA_SELFTEST;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use onepass::backend::cuda::{size_class, CudaDevice, CudaGraph};
use onepass::graph::{Arg, Dispatch, Grid, KernelId};
use onepass::{DType, Device, Executor, Mode, Plan};

/// The environment variable that makes a faulting test the child, and says which path to fault
/// through.
const CHILD_MODE: &str = "ONEPASS_FAULT_CHILD_MODE";
/// What the child prints when every check passed.
const CHILD_OK: &str = "fault-child: all checks passed";
/// How long a child may take before the parent calls it a hang.
const CHILD_LIMIT: Duration = Duration::from_secs(180);
/// The upper address bits `selftest_fault_f32` stores through: a non-canonical address.
const BAD_HIGH: u32 = 0xdead_0000;

/// Tests that fill most of the device's memory take turns.
static BIG_MEMORY: Mutex<()> = Mutex::new(());

fn cuda_device() -> (Device, Arc<CudaDevice>) {
    let dev = cuda_open::cuda_device();
    let Device::Cuda(cuda) = &dev else {
        panic!("Device::cuda_with gave another backend")
    };
    let cuda = cuda.clone();
    (dev, cuda)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn allocations_larger_than_the_device_are_errors_naming_the_size() {
    let (dev, _) = cuda_device();
    let _turn = BIG_MEMORY.lock().unwrap_or_else(|e| e.into_inner());
    let tib = 1usize << 40;
    for scratch in [false, true] {
        let err = if scratch {
            dev.alloc_scratch(DType::U8, &[tib])
        } else {
            dev.alloc(DType::U8, &[tib])
        }
        .expect_err("1 TiB does not fit on any device we run on");
        let msg = err.to_string();
        assert!(
            msg.contains("out of device memory") && msg.contains("1099511627776 bytes"),
            "scratch={scratch}: {msg}"
        );
    }
    // The device is still usable after an allocation failed.
    let x: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5 + 0.25).collect();
    let buf = dev
        .upload(&x, &[1000])
        .expect("a small upload after the failure");
    assert_eq!(dev.download::<f32>(&buf).expect("download"), x);
}

/// The largest size class at most `limit` bytes.
fn largest_class_below(limit: usize) -> usize {
    let mut best = 256;
    let mut p = 512usize;
    while p <= limit {
        best = p;
        if p / 2 * 3 <= limit {
            best = p / 2 * 3;
        }
        p *= 2;
    }
    assert_eq!(size_class(best), best);
    best
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn out_of_memory_frees_the_scratch_pool_and_retries() {
    let (dev, cuda) = cuda_device();
    let _turn = BIG_MEMORY.lock().unwrap_or_else(|e| e.into_inner());
    // A class between half and 0.7 of the device: two blocks of it never fit together.
    let total = cuda.info().total_memory;
    let big = largest_class_below(total / 10 * 7);
    assert!(big * 2 > total, "class {big} of a {total}-byte device");
    let pool = cuda.pool().clone();
    pool.trim();

    // Cached scratch blocks make room for a plain allocation.
    drop(
        dev.alloc_scratch(DType::U8, &[big])
            .expect("first scratch block"),
    );
    assert_eq!(pool.stats().cached_bytes, big as u64);
    let plain = dev
        .alloc(DType::U8, &[big])
        .expect("a plain allocation succeeds once the pool's cached block is freed");
    assert_eq!(pool.stats().cached_bytes, 0);
    drop(plain);

    // And for a scratch block of the next class (it fits alone, not beside the cached block).
    let next = size_class(big + 1);
    if next > total / 20 * 19 {
        eprintln!("skipping the scratch retry: class {next} is too close to {total} bytes");
        pool.trim();
        return;
    }
    drop(dev.alloc_scratch(DType::U8, &[big]).expect("scratch block"));
    let before = pool.stats();
    let block = dev
        .alloc_scratch(DType::U8, &[next])
        .expect("a scratch block of another class, after freeing the cached one");
    let after = pool.stats();
    assert_eq!(after.misses, before.misses + 1);
    assert_eq!(after.cached_bytes, 0);
    drop(block);
    pool.trim();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn model_whose_kv_cache_cannot_fit_is_an_error() {
    use onepass::model::gguf::GgufFile;
    use onepass::model::synth::{write_synthetic, SynthShape, SynthSpec};
    use onepass::model::transformer::Transformer;
    let (dev, _) = cuda_device();
    let dir = std::env::temp_dir().join(format!("onepass-cuda-faults-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("smollm2.gguf");
    let spec = SynthSpec {
        shape: SynthShape::SmolLm2,
        quant: DType::Q8_0.into(),
        seed: 7,
        rope_freqs: false,
        layers: None,
    };
    write_synthetic(&spec, None, &path, &mut |_, _| {}).expect("synthetic model");
    let file = Arc::new(GgufFile::open(&path).expect("open the synthetic model"));
    let _turn = BIG_MEMORY.lock().unwrap_or_else(|e| e.into_inner());
    // 3 KV heads of 64 values in the device's cache type (CUDA: f16, 384 bytes per position), so
    // a layer's K cache of 2^30 positions is 384 GiB.
    let value_bytes = dev.capabilities().kv_cache.block_bytes() as u64;
    let bytes = (1u64 << 30) * 3 * 64 * value_bytes;
    let err = match Transformer::load(file, &dev, 1 << 30, 1) {
        Ok(_) => panic!("a KV cache of {bytes} bytes a layer loaded"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("out of device memory") && err.contains(&format!("{bytes} bytes")),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The faulting dispatch: one store through a non-canonical address.
fn faulting_dispatch(y: &onepass::Buffer) -> Dispatch {
    Dispatch::new(
        KernelId::of(&CUDA_SELFTEST[1]),
        vec![Arg::write(y), Arg::u32(BAD_HIGH)],
        Grid::cover(1, 32),
    )
    .expect("dispatch")
}

/// The body of a faulting test named `test` that faults through `mode`: in the child process
/// (where [`CHILD_MODE`] is `mode`) the fault and its checks, in the parent the child's run and
/// the check that its output names `CUDA_ERROR_ILLEGAL_ADDRESS`.
fn fault_test(test: &str, mode: &str) {
    if std::env::var(CHILD_MODE).is_ok_and(|m| m == mode) {
        fault_child(mode);
        return;
    }
    let text = run_child(test, mode);
    assert!(text.contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{text}");
}

/// Runs the test `test` of this binary alone in a child process that faults through `mode`;
/// returns its output after checking that it exited in time, successfully, and printed
/// [`CHILD_OK`].
fn run_child(test: &str, mode: &str) -> String {
    cuda_open::require_gpu();
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut child = Command::new(exe)
        .args([test, "--exact", "--include-ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(CHILD_MODE, mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the child test");
    let start = Instant::now();
    loop {
        match child.try_wait().expect("wait for the child") {
            Some(_) => break,
            None if start.elapsed() > CHILD_LIMIT => {
                let _ = child.kill();
                panic!("the {mode} fault child hung for {CHILD_LIMIT:?}");
            }
            None => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    let out = child.wait_with_output().expect("child output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{mode} child failed:\n{text}");
    assert!(text.contains(CHILD_OK), "{mode} child:\n{text}");
    eprintln!("{mode} child, {:?}:\n{text}", start.elapsed());
    text
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn kernel_fault_in_a_direct_session_is_an_error_and_poisons_the_device() {
    fault_test(
        "kernel_fault_in_a_direct_session_is_an_error_and_poisons_the_device",
        "direct",
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn kernel_fault_in_a_cuda_graph_is_an_error_and_poisons_the_device() {
    fault_test(
        "kernel_fault_in_a_cuda_graph_is_an_error_and_poisons_the_device",
        "graph",
    );
}

/// The child's part: faults through `mode` on purpose, then checks that the error says the
/// context is gone and that every later call fails at once. Runs only in the child process that
/// [`run_child`] starts.
fn fault_child(mode: &str) {
    let (dev, cuda) = cuda_device();
    let y = dev.upload(&[1.5f32; 64], &[64]).expect("upload");
    let scratch = dev.alloc_scratch(DType::F32, &[64]).expect("scratch");
    let err = match mode {
        "direct" => {
            let mut s = Executor::new(dev.clone()).begin(Mode::Direct);
            s.push(faulting_dispatch(&y)).expect("the launch is queued");
            s.finish(&Plan::SEQUENTIAL)
                .expect_err("a faulting kernel makes finish fail")
        }
        "graph" => {
            let graph = CudaGraph::build(&cuda, &[faulting_dispatch(&y)], &[vec![]])
                .expect("a graph of one node");
            graph.launch().expect("the launch is queued");
            let err = cuda
                .synchronize()
                .expect_err("a faulting graph makes the wait fail");
            let again = graph.launch().expect_err("a second launch fails");
            println!("second graph launch: {again}");
            err
        }
        other => panic!("unknown mode {other}"),
    };
    let msg = err.to_string();
    println!("fault: {msg}");
    assert!(msg.contains("unusable") && msg.contains("restart"), "{msg}");
    assert!(
        cuda.fault().is_some(),
        "the device did not record the fault"
    );

    // Every later call fails at once, naming the earlier fault.
    let later: Vec<(&str, String)> = vec![
        (
            "download",
            dev.download::<f32>(&y).expect_err("download").to_string(),
        ),
        (
            "write",
            dev.write(&y, &[0.0f32; 64]).expect_err("write").to_string(),
        ),
        (
            "alloc",
            dev.alloc(DType::F32, &[16]).expect_err("alloc").to_string(),
        ),
        (
            "scratch",
            dev.alloc_scratch(DType::F32, &[16])
                .expect_err("scratch")
                .to_string(),
        ),
        (
            "session",
            {
                let mut s = Executor::new(dev.clone()).begin(Mode::Direct);
                let d = Dispatch::new(
                    KernelId::of(&CUDA_SELFTEST[0]),
                    vec![
                        Arg::read(&scratch),
                        Arg::read_write(&y),
                        Arg::u32(64),
                        Arg::f32(2.0),
                    ],
                    Grid::cover(64, 64),
                )
                .expect("dispatch");
                match s.push(d) {
                    Err(e) => e,
                    Ok(()) => s.finish(&Plan::SEQUENTIAL).expect_err("session"),
                }
            }
            .to_string(),
        ),
        (
            "synchronize",
            cuda.synchronize().expect_err("synchronize").to_string(),
        ),
    ];
    for (what, msg) in &later {
        println!("after the fault, {what}: {msg}");
        assert!(
            msg.contains("unusable") && msg.contains("ILLEGAL_ADDRESS"),
            "{what}: {msg}"
        );
    }
    // Dropping everything (buffers, pool, device, context) must not panic either.
    drop((y, scratch, dev, cuda));
    println!("{CHILD_OK}");
}
