use crate::backend::{DType, Device};
use crate::testutil::random_f32;
use crate::{Executor, Mode, Plan};

/// Three prompt products of one x (`rows` rows, k = 256) with weights of `dtypes` and 200, 64
/// and 72 outputs (tiles of 128 outputs: the first and last end in a partial tile), run in `mode`
/// with `plan`; returns the three outputs and the report's fusion and dispatch counts.
fn run(dtypes: [DType; 3], rows: usize, mode: Mode, plan: &Plan) -> (Vec<Vec<f32>>, usize, usize) {
    let dev = Device::cpu(2).unwrap();
    let k = 256usize;
    let widths = [200usize, 64, 72];
    let x = dev
        .upload::<f32>(&random_f32(rows * k, 1.0, 7), &[rows, k])
        .unwrap();
    let mut ws = Vec::new();
    let mut outs = Vec::new();
    for (i, (&dtype, &n)) in dtypes.iter().zip(&widths).enumerate() {
        let bytes = crate::quant::quantize(dtype, &random_f32(n * k, 1.0, 10 + i as u64)).unwrap();
        ws.push(dev.upload_bytes(&bytes, dtype, &[n, k]).unwrap());
        outs.push(dev.alloc(DType::F32, &[rows, n]).unwrap());
    }
    let mut s = Executor::new(dev.clone()).begin(mode);
    for (w, out) in ws.iter().zip(&outs) {
        s.matmul(&x, w, out).unwrap();
    }
    let report = s.finish(plan).unwrap();
    let values = outs
        .iter()
        .map(|o| dev.download::<f32>(o).unwrap())
        .collect();
    (values, report.fusions, report.dispatches)
}

fn bits(v: &[Vec<f32>]) -> Vec<Vec<u32>> {
    v.iter()
        .map(|o| o.iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// From 64 rows (the tensor-core form) the optimizer makes one `matmul3_mma` of the three
/// products, which gives the bits of the three run one by one; below it (the CUDA-core forms)
/// the products stay apart.
#[test]
fn three_prompt_products_of_one_x_become_one_dispatch_with_the_same_bits() {
    for dtype in [DType::Q4_0, DType::Q4K, DType::F16] {
        for rows in [64usize, 100, 3] {
            let what = format!("{dtype} rows {rows}");
            let (fused, fusions, dispatches) =
                run([dtype; 3], rows, Mode::Recorded, &Plan::OPTIMIZED);
            let want = if rows >= 64 { (1, 1) } else { (0, 3) };
            assert_eq!((fusions, dispatches), want, "{what}");
            let (direct, _, _) = run([dtype; 3], rows, Mode::Direct, &Plan::SEQUENTIAL);
            assert_eq!(
                bits(&fused),
                bits(&direct),
                "{what}: fused and unfused differ"
            );
        }
    }
}

/// Products with weights of two formats are left apart (one kernel reads one format).
#[test]
fn products_of_mixed_weight_formats_stay_apart() {
    let dtypes = [DType::Q4_0, DType::Q8_0, DType::Q4_0];
    let (_, fusions, dispatches) = run(dtypes, 64, Mode::Recorded, &Plan::OPTIMIZED);
    assert_eq!((fusions, dispatches), (0, 3));
}
