//! The CUDA device of a test that needs a GPU. Such tests are `#[ignore = "needs a CUDA GPU"]`, so
//! a machine without one reports them as ignored; run with `--ignored` or `--include-ignored`
//! where there is none, they fail here, saying why, rather than passing without checking
//! anything.

use onepass::backend::cuda::{self, CudaOptions};
use onepass::Device;

/// Panics with the reason unless a CUDA driver and at least one CUDA device are present.
pub(crate) fn require_gpu() {
    const WHY: &str = "this test needs a CUDA GPU (it is ignored by default for that reason)";
    if !cuda::driver_present() {
        panic!("{WHY}: no CUDA driver found (libcuda is not on the library path)");
    }
    match cuda::device_count() {
        Ok(0) => panic!("{WHY}: the CUDA driver reports no device"),
        Ok(_) => {}
        Err(e) => panic!("{WHY}: counting CUDA devices failed: {e}"),
    }
}

/// The first CUDA device, its kernels compiled without the on-disk cache unless
/// `ONEPASS_TEST_KERNEL_CACHE` names a directory of cubins to use and fill (one that
/// `onepass doctor --fill-cache` filled, with `ONEPASS_CACHE_DIR` its parent, saves a GPU
/// machine the minutes of compiling the matmul family in every test binary); panics (see
/// [`require_gpu`]) where there is none.
#[allow(dead_code)] // Some test files open their device another way, after `require_gpu`.
pub(crate) fn cuda_device() -> Device {
    require_gpu();
    let opts = CudaOptions {
        cache_dir: std::env::var_os("ONEPASS_TEST_KERNEL_CACHE")
            .filter(|v| !v.is_empty())
            .map(std::path::PathBuf::from),
        ..CudaOptions::from_env()
    };
    Device::cuda_with(0, &opts).expect("a CUDA device is present, opening it must work")
}
