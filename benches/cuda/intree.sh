#!/usr/bin/env bash
# Builds benches/cuda/gemm_q4_0.cu with onepass's own prompt products beside the harness's forms
# (the forms "tree ..."), compiled by nvcc with NVRTC's flags (--fmad=false), so that a gap
# between the harness and `onepass bench` can be split into the kernel's code and its
# surroundings. nvcc and NVRTC may schedule the same source differently (docs/prefill.md, item
# 18): a difference of a few percent here is no prediction for the pass.
#   [K=kernel_dir] bash benches/cuda/intree.sh OUT_BINARY [extra nvcc flags]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
k=${K:-"$here/../../src/backend/cuda/kernels"}
out=${1:?usage: intree.sh OUT_BINARY [nvcc flags]}
shift
src=$(mktemp --suffix=.inc)
trap 'rm -f "$src"' EXIT
# The kernels' own integer typedefs would clash with the C library's: a namespace keeps them apart.
{
    echo '#include <cuda_bf16.h>'
    echo 'namespace intree {'
    # The matmul family as src/backend/cuda/registry.rs concatenates it.
    cat "$k/prelude.cuh" "$k/activation.cuh" "$k/matmul_blocks.cuh" "$k/matmul_dots.cuh" \
        "$k/matmul_mma.cuh" "$k/matmul_mma_pipe.cuh" "$k/matmul_mma_h.cuh" "$k/matmul_wgmma.cuh" \
        "$k/matmul_head.cuh" "$k/matmul.cu" "$k/matmul_rows.cu"
    echo '}'
} | sed -E '/^#pragma unroll/ s/OP_FMT_Q4_K/6/g' > "$src"
# (nvcc, unlike NVRTC, does not expand a macro inside `#pragma unroll (...)`: the one such
# argument gets the format's number, prelude.cuh's OP_FMT_Q4_K.)
nvcc -O3 -arch=sm_90 --fmad=false -DINTREE="\"$src\"" "$@" -o "$out" "$here/gemm_q4_0.cu"
