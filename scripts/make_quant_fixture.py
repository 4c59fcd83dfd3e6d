#!/usr/bin/env python3
"""Makes the quantization fixtures in tests/fixtures/quant/ with the `gguf` package.

For each GGML block format, `<fmt>.bin` holds a few blocks of bytes and `<fmt>.f32` the values
that `gguf.quants.dequantize` gives for them (little-endian f32). Q4_0, Q4_1, Q5_0 and Q8_0 blocks
come from `gguf.quants.quantize` on seeded random data, which is stored as `<fmt>.src.f32` so the
Rust quantizer can be compared with it too (Q5_0's data also has an all-zero block); Q4_K and Q6_K
(no quantizer in the package) are random block bytes with finite f16 scales. The formats are made
in a fixed order from one seeded generator, Q5_0 last, so every earlier fixture keeps its bytes.
With the default model file present, `model_q4_1.*` and `model_q8_0.*` hold the first blocks of a
real Q4_1 tensor and of the Q8_0 token embedding.

Usage: pip install gguf numpy; python3 scripts/make_quant_fixture.py [MODEL.gguf]
The model path may also come from the ONEPASS_MODEL environment variable; without one, the model
part is skipped and the committed model fixtures are left as they are.
"""

import os
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader
from gguf import quants

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "quant"
BLOCK_BYTES = {T.Q4_0: 18, T.Q4_1: 20, T.Q5_0: 22, T.Q8_0: 34, T.Q4_K: 144, T.Q6_K: 210}
BLOCK_ELEMS = {T.Q4_0: 32, T.Q4_1: 32, T.Q5_0: 32, T.Q8_0: 32, T.Q4_K: 256, T.Q6_K: 256}
NAMES = {
    T.Q4_0: "q4_0",
    T.Q4_1: "q4_1",
    T.Q5_0: "q5_0",
    T.Q8_0: "q8_0",
    T.Q4_K: "q4_k",
    T.Q6_K: "q6_k",
}


def write(name: str, blocks: np.ndarray, qtype: T) -> None:
    raw = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(-1)
    values = quants.dequantize(raw.reshape(-1, BLOCK_BYTES[qtype]), qtype).astype("<f4").reshape(-1)
    assert np.all(np.isfinite(values)), name
    (OUT / f"{name}.bin").write_bytes(raw.tobytes())
    (OUT / f"{name}.f32").write_bytes(values.tobytes())
    print(f"{name}: {raw.size // BLOCK_BYTES[qtype]} blocks, {values.size} values")


def quantized_fixtures(rng: np.random.Generator, qtypes: tuple) -> None:
    for qtype in qtypes:
        n_blocks = 8
        src = rng.uniform(-2.0, 2.0, size=n_blocks * 32).astype(np.float32)
        src[:32] *= 0.001  # one block of tiny values exercises f16 subnormal scales
        if qtype == T.Q5_0:
            src[32:64] = 0.0  # a zero block: scale -0.0, every quant 16 (all fifth bits set)
        blocks = quants.quantize(src.reshape(n_blocks, 32), qtype)
        (OUT / f"{NAMES[qtype]}.src.f32").write_bytes(src.astype("<f4").tobytes())
        write(NAMES[qtype], blocks, qtype)


def random_k_fixtures(rng: np.random.Generator) -> None:
    for qtype, scale_offsets in ((T.Q4_K, (0, 2)), (T.Q6_K, (208,))):
        n_blocks = 3
        blocks = rng.integers(0, 256, size=(n_blocks, BLOCK_BYTES[qtype]), dtype=np.uint8)
        for off in scale_offsets:
            scales = rng.uniform(-0.05, 0.05, size=n_blocks).astype(np.float16)
            blocks[:, off:off + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
        write(NAMES[qtype], blocks, qtype)


def model_fixtures(path: str) -> None:
    reader = GGUFReader(path)
    wanted = {T.Q4_1: None, T.Q8_0: None}
    for t in reader.tensors:
        if t.tensor_type in wanted and wanted[t.tensor_type] is None:
            wanted[t.tensor_type] = t
    for qtype, tensor in wanted.items():
        if tensor is None:
            print(f"model has no {NAMES[qtype]} tensor; skipped")
            continue
        raw = np.asarray(tensor.data).view(np.uint8).reshape(-1)
        # Blocks from the start and from the middle of the tensor.
        bb = BLOCK_BYTES[qtype]
        mid = (raw.size // bb // 2) * bb
        blocks = np.concatenate([raw[: 4 * bb], raw[mid : mid + 4 * bb]]).reshape(-1, bb)
        print(f"model tensor {tensor.name} ({NAMES[qtype]})")
        write(f"model_{NAMES[qtype]}", blocks, qtype)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20240607)
    quantized_fixtures(rng, (T.Q4_0, T.Q4_1, T.Q8_0))
    random_k_fixtures(rng)
    quantized_fixtures(rng, (T.Q5_0,))
    model = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("ONEPASS_MODEL", "")
    if model and Path(model).is_file():
        model_fixtures(model)
    else:
        print("no model file given or found; model fixtures skipped")


if __name__ == "__main__":
    main()
