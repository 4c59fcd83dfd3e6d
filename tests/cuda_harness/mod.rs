//! The harness of the CUDA op tests: host tensors, seeded random inputs (never zeros), running
//! one op in a direct session on a device, and comparing the CUDA results with the CPU's within a
//! stated tolerance.

pub(crate) use crate::seeded::{random_f32, rng};
use half::{bf16, f16};
use onepass::{Buffer, DType, Device, Executor, Mode, Plan, Result, Session};

/// A host tensor: raw bytes, dtype and dims.
#[derive(Clone)]
pub(crate) struct Host {
    pub(crate) bytes: Vec<u8>,
    pub(crate) dtype: DType,
    pub(crate) dims: Vec<usize>,
}

/// A float tensor of `dtype` from f32 values.
pub(crate) fn float_tensor(values: &[f32], dtype: DType, dims: &[usize]) -> Host {
    let bytes = match dtype {
        DType::F32 => bytemuck::cast_slice(values).to_vec(),
        DType::F16 => {
            let v: Vec<f16> = values.iter().map(|&x| f16::from_f32(x)).collect();
            bytemuck::cast_slice(&v).to_vec()
        }
        DType::BF16 => {
            let v: Vec<bf16> = values.iter().map(|&x| bf16::from_f32(x)).collect();
            bytemuck::cast_slice(&v).to_vec()
        }
        other => panic!("float_tensor: {other} is not a float dtype"),
    };
    Host {
        bytes,
        dtype,
        dims: dims.to_vec(),
    }
}

pub(crate) fn random_tensor(dtype: DType, dims: &[usize], scale: f32, seed: u64) -> Host {
    float_tensor(&random_f32(dims.iter().product(), scale, seed), dtype, dims)
}

pub(crate) fn i32_tensor(values: &[i32], dims: &[usize]) -> Host {
    Host {
        bytes: bytemuck::cast_slice(values).to_vec(),
        dtype: DType::I32,
        dims: dims.to_vec(),
    }
}

/// Decodes any float or integer tensor's bytes to f64 for comparison.
pub(crate) fn to_f64(bytes: &[u8], dtype: DType) -> Vec<f64> {
    let w = dtype.block_bytes();
    bytes
        .chunks_exact(w)
        .map(|c| match dtype {
            DType::F32 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
            DType::F16 => f16::from_le_bytes([c[0], c[1]]).to_f64(),
            DType::BF16 => bf16::from_le_bytes([c[0], c[1]]).to_f64(),
            DType::I32 => i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
            DType::U32 => u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
            other => panic!("to_f64: cannot compare {other}"),
        })
        .collect()
}

/// An op under test: a session, the input buffers, the output buffers.
pub(crate) type OpFn<'a> = dyn Fn(&mut Session, &[Buffer], &[Buffer]) -> Result<()> + 'a;

/// Uploads `inputs` (read, or read-write when their index is in `in_place`), allocates NaN-filled
/// `outputs`, runs `op` in a direct session, and returns every tensor's final bytes: inputs
/// first, then outputs.
pub(crate) fn run_on(
    dev: &Device,
    inputs: &[Host],
    outputs: &[(DType, Vec<usize>)],
    op: &OpFn<'_>,
) -> Vec<Vec<u8>> {
    let ins: Vec<Buffer> = inputs
        .iter()
        .map(|h| dev.upload_bytes(&h.bytes, h.dtype, &h.dims).unwrap())
        .collect();
    let outs: Vec<Buffer> = outputs
        .iter()
        .map(|(dt, dims)| {
            let b = dev.alloc(*dt, dims).unwrap();
            dev.write_bytes(&b, &vec![0xFFu8; b.len_bytes()]).unwrap();
            b
        })
        .collect();
    let mut s = Executor::new(dev.clone()).begin(Mode::Direct);
    op(&mut s, &ins, &outs).unwrap_or_else(|e| panic!("{} failed: {e}", dev.name()));
    s.finish(&Plan::SEQUENTIAL)
        .unwrap_or_else(|e| panic!("{} failed: {e}", dev.name()));
    ins.iter()
        .chain(&outs)
        .map(|b| dev.download_bytes(b).unwrap())
        .collect()
}

/// Runs `op` on the CPU and on CUDA and compares every tensor (inputs too: an in-place op
/// changes them, a read-only op must not) within `|got - want| <= atol + rtol * |want|`.
pub(crate) fn compare(
    what: &str,
    dev: &Device,
    inputs: &[Host],
    outputs: &[(DType, Vec<usize>)],
    atol: f64,
    rtol: f64,
    op: &OpFn<'_>,
) {
    compare_except(what, dev, inputs, outputs, atol, rtol, op, &[]);
}

/// [`compare`] without the tensors whose index (inputs first, then outputs) is in `skip`: a
/// backend's private scratch, whose contents the op does not define.
#[allow(clippy::too_many_arguments)] // compare's arguments and the skip list
pub(crate) fn compare_except(
    what: &str,
    dev: &Device,
    inputs: &[Host],
    outputs: &[(DType, Vec<usize>)],
    atol: f64,
    rtol: f64,
    op: &OpFn<'_>,
    skip: &[usize],
) {
    compare_inputs(what, dev, inputs, inputs, outputs, atol, rtol, op, skip);
}

/// [`compare`] where the CPU runs on `cpu_inputs` (the same shapes and dtypes as `inputs`): the
/// values CUDA's arithmetic stands for, such as an activation row rounded as the int8 products
/// round it ([`int8_rounded`]). An input given differently to the two is not compared.
#[allow(clippy::too_many_arguments)] // compare's arguments, the CPU's inputs and the skip list
pub(crate) fn compare_inputs(
    what: &str,
    dev: &Device,
    inputs: &[Host],
    cpu_inputs: &[Host],
    outputs: &[(DType, Vec<usize>)],
    atol: f64,
    rtol: f64,
    op: &OpFn<'_>,
    skip: &[usize],
) {
    let cpu = Device::cpu(2).unwrap();
    let want = run_on(&cpu, cpu_inputs, outputs, op);
    let got = run_on(dev, inputs, outputs, op);
    let dtypes: Vec<DType> = inputs
        .iter()
        .map(|h| h.dtype)
        .chain(outputs.iter().map(|o| o.0))
        .collect();
    let differs = |t: usize| t < inputs.len() && inputs[t].bytes != cpu_inputs[t].bytes;
    for (t, ((w, g), dt)) in want.iter().zip(&got).zip(&dtypes).enumerate() {
        if skip.contains(&t) || differs(t) {
            continue;
        }
        if dt.is_block() || *dt == DType::U8 {
            assert_eq!(w, g, "{what}: tensor {t} ({dt}) differs");
            continue;
        }
        let (w, g) = (to_f64(w, *dt), to_f64(g, *dt));
        let mut worst = (0.0f64, 0usize);
        for (i, (a, b)) in w.iter().zip(&g).enumerate() {
            let err = (a - b).abs();
            assert!(
                a == b || err <= atol + rtol * a.abs() && !b.is_nan() || (a.is_nan() && b.is_nan()),
                "{what}: tensor {t} ({dt}) element {i}: cuda {b}, cpu {a} (atol {atol}, rtol {rtol})"
            );
            if err > worst.0 {
                worst = (err, i);
            }
        }
        eprintln!(
            "{what}: tensor {t} ({dt}, {} values) max abs error {:.3e} at {}",
            w.len(),
            worst.0,
            worst.1
        );
    }
}

/// Tolerances for float outputs: f32 close to the CPU's rounding; f16/bf16 one or two ulps.
pub(crate) fn tol(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F32 => (1e-5, 1e-5),
        DType::F16 => (2e-3, 2e-3),
        _ => (1.6e-2, 1.6e-2),
    }
}

pub(crate) use onepass::kernels::{FLOATS, WEIGHT_FORMATS as WEIGHT_DTYPES};

pub(crate) fn weight_tensor(dtype: DType, n: usize, k: usize, seed: u64) -> Host {
    let values = random_f32(n * k, 1.0, seed);
    if dtype.is_float() {
        return float_tensor(&values, dtype, &[n, k]);
    }
    Host {
        bytes: onepass::quant::quantize(dtype, &values).unwrap(),
        dtype,
        dims: vec![n, k],
    }
}

/// The activation row the one-row CUDA products of the 32-value block formats and Q4_K multiply
/// (`backend/cuda/kernels/matmul_blocks.cuh`, int8 activations): per 32 values, `m` the largest
/// magnitude (a NaN counts as infinite), `q = rint(x * (127 / m))` in f32, the value `q * (m / 127)`.
/// The products then differ from the CPU's on these values only by f32 rounding.
pub(crate) fn int8_rounded(x: &[f32]) -> Vec<f32> {
    x.chunks(32)
        .flat_map(|b| {
            let m = b
                .iter()
                .map(|v| if v.is_nan() { f32::INFINITY } else { v.abs() })
                .fold(0f32, f32::max);
            let id = if m > 0.0 { 127.0 / m } else { 0.0 };
            let d = m / 127.0;
            b.iter().map(move |&v| (v * id).round_ties_even() * d)
        })
        .collect()
}

/// Whether CUDA's one-row product of an `[n, k]` weight of dtype `w` reads int8 activations
/// (`ops::matmul::vector_grid`: the 32-value block formats, Q4_K and Q6_K, at least 2^21 weights,
/// the row within the 48 KiB of shared memory the launch asks for).
pub(crate) fn takes_int8(w: DType, rows: usize, n: usize, k: usize) -> bool {
    rows == 1 && int8_format(w, k) && n * k >= 1 << 21 && k + k / 4 <= 48 * 1024
}

/// Whether CUDA's fused block kernels (`norm_qkv_rope`, `norm_gate_up`) read a one-row pass of
/// width `dim` as int8 (`ops::fused_block::fused_launch`: the shared-memory form, from 1024
/// values, with the f32 row, the weight stage and the int8 row within 48 KiB).
pub(crate) fn fused_takes_int8(w: DType, dim: usize) -> bool {
    int8_format(w, dim) && dim >= 1024 && dim * 4 + 17664 + dim + dim / 4 <= 48 * 1024
}

fn int8_format(w: DType, k: usize) -> bool {
    let formats = [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q8_0,
        DType::Q4K,
    ];
    // Q6_K in rows of an even count of super-blocks (`ops::matmul::int8_row_bytes`).
    let q6k = w == DType::Q6K && k.is_multiple_of(512);
    (formats.contains(&w) || q6k) && k.is_multiple_of(32)
}

/// An f32 activation tensor as the CPU should see it to stand for CUDA's product with the weight
/// `w`: [`int8_rounded`] where [`takes_int8`], else unchanged.
pub(crate) fn cpu_activations(x: &Host, w: &Host) -> Host {
    let k = *x.dims.last().unwrap();
    let rows = x.dims.iter().product::<usize>() / k.max(1);
    if x.dtype != DType::F32 || !takes_int8(w.dtype, rows, w.dims[0], k) {
        return x.clone();
    }
    let v: Vec<f32> = x
        .bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    float_tensor(&int8_rounded(&v), DType::F32, &x.dims)
}

/// [`compare`] for a product op whose inputs are `x`, the weight `w` and then `rest`: the CPU
/// multiplies [`cpu_activations`] (CUDA's int8-rounded row where its product reads one).
#[allow(clippy::too_many_arguments)] // compare's arguments, split into the product's inputs
pub(crate) fn compare_product(
    what: &str,
    dev: &Device,
    x: &Host,
    w: &Host,
    rest: &[Host],
    outputs: &[(DType, Vec<usize>)],
    atol: f64,
    rtol: f64,
    op: &OpFn<'_>,
) {
    let mut inputs = vec![x.clone(), w.clone()];
    inputs.extend_from_slice(rest);
    let mut cpu_inputs = inputs.clone();
    cpu_inputs[0] = cpu_activations(x, w);
    compare_inputs(
        what,
        dev,
        &inputs,
        &cpu_inputs,
        outputs,
        atol,
        rtol,
        op,
        &[],
    );
}
