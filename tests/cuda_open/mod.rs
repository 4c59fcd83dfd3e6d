//! Opening the first CUDA device for a test, or a visible skip where the machine has none.

use onepass::backend::cuda::{self, CudaOptions};
use onepass::Device;

/// The first CUDA device (its kernels compiled without the on-disk cache), or `None` after a
/// "skipping" line where there is no CUDA driver or device.
pub(crate) fn cuda_device() -> Option<Device> {
    if !cuda::driver_present() || cuda::device_count().unwrap_or(0) == 0 {
        eprintln!("skipping: no CUDA device");
        return None;
    }
    let opts = CudaOptions {
        cache_dir: None,
        ..CudaOptions::from_env()
    };
    Some(Device::cuda_with(0, &opts).expect("a CUDA device is present, opening it must work"))
}
