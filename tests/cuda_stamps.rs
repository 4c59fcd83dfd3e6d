//! Block stamps on a real device (`onepass bench --timeline`): a device opened with
//! `CudaOptions::block_stamps` records one stamp per block of every kernel it runs, and the
//! stamps group into the launches that ran, in order. Needs a GPU: ignored by default, it fails
//! where there is none.

mod cuda_open;

use onepass::backend::cuda::CudaOptions;
use onepass::block_timeline::launches;
use onepass::{Device, Executor, Mode, Plan};

#[test]
#[ignore = "needs a CUDA GPU"]
fn stamped_kernels_record_each_block_of_each_launch_in_order() {
    cuda_open::require_gpu();
    let opts = CudaOptions {
        cache_dir: std::env::var_os("ONEPASS_TEST_KERNEL_CACHE")
            .filter(|v| !v.is_empty())
            .map(std::path::PathBuf::from),
        block_stamps: true,
        ..CudaOptions::from_env()
    };
    let dev = Device::cuda_with(0, &opts).expect("a stamped CUDA device");
    let Device::Cuda(cuda) = &dev else {
        panic!("Device::cuda_with gave another backend")
    };
    let n = 1 << 20;
    let a: Vec<f32> = (0..n).map(|i| (i % 97) as f32 * 0.5 + 0.25).collect();
    let x = dev.upload(&a, &[n]).unwrap();
    let y = dev.upload(&a, &[n]).unwrap();
    let s1 = dev.alloc(onepass::DType::F32, &[n]).unwrap();
    let s2 = dev.alloc(onepass::DType::F32, &[n]).unwrap();
    cuda.take_block_stamps().expect("an empty ring reads");
    let mut s = Executor::new(dev.clone()).begin(Mode::Direct);
    s.add(&x, &y, &s1).unwrap();
    s.mul(&s1, &y, &s2).unwrap();
    s.add(&s2, &x, &s1).unwrap();
    s.finish(&Plan::SEQUENTIAL).unwrap();
    let stamps = cuda.take_block_stamps().expect("the stamps read back");
    let ls = launches(&stamps);
    let names: Vec<&str> = ls.iter().map(|l| l.kernel.as_str()).collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(
        names[0].starts_with("add") && names[1].starts_with("mul"),
        "{names:?}"
    );
    assert!(names[2].starts_with("add"), "{names:?}");
    let total: u32 = ls.iter().map(|l| l.blocks).sum();
    assert_eq!(stamps.len(), total as usize, "every block left one stamp");
    for w in ls.windows(2) {
        assert!(w[0].end_ns <= w[1].start_ns, "stream order: {w:?}");
    }
    for s in &stamps {
        assert!(s.arrive_ns <= s.start_ns && s.start_ns <= s.end_ns, "{s:?}");
        assert!(s.block < s.grid, "{s:?}");
    }
    // The result is what the unstamped kernels compute.
    let got: Vec<f32> = dev.download(&s1).unwrap();
    for (i, (&g, &v)) in got.iter().zip(&a).enumerate() {
        assert_eq!(g, (v + v) * v + v, "element {i}");
    }
    // Read, the ring is empty.
    assert!(cuda.take_block_stamps().unwrap().is_empty());
}
