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
    let cpu = Device::cpu(2).unwrap();
    let want = run_on(&cpu, inputs, outputs, op);
    let got = run_on(dev, inputs, outputs, op);
    let dtypes: Vec<DType> = inputs
        .iter()
        .map(|h| h.dtype)
        .chain(outputs.iter().map(|o| o.0))
        .collect();
    for (t, ((w, g), dt)) in want.iter().zip(&got).zip(&dtypes).enumerate() {
        if skip.contains(&t) {
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
