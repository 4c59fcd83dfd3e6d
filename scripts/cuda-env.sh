# Source this file: installs NVRTC 13.0 and the CUDA runtime headers into .cache/cuda13 (once) and
# points the library path and ONEPASS_CUDA_INCLUDE at them. No GPU or CUDA toolkit is needed.
CU=.cache/cuda13
if [ ! -f "$CU/nvidia/cu13/lib/libnvrtc.so.13" ]; then
  python3 -m pip install --quiet --no-cache-dir --no-deps --only-binary=:all: --no-compile \
    --target "$CU" nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96
fi
export LD_LIBRARY_PATH="$PWD/$CU/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export ONEPASS_CUDA_INCLUDE="$PWD/$CU/nvidia/cu13/include"
