//! The narrowing rules (`graph::passes::narrow`) for prompt products: an f32 `rms_norm`, SwiGLU
//! or tensor-core attention whose every reader is a tensor-core product (`matmul_mma_<w>`,
//! `matmul3_mma_<w>`, `matmul_add_mma_<w>`) of exactly its output becomes
//! `rms_norm_f32_to_f16` / `swiglu_f32_to_f16` / `attention_mma_<t>_to_f16`, writing f16 into the
//! first half of the output's bytes, and the products their `_h` forms reading it. The
//! tensor-core products round x to f16 (round to nearest even) before they multiply, and the
//! producer's f32 values are the same in both forms, so the products see the same f16 operands:
//! the same bits, half the activation bytes read.

use crate::backend::{Buffer, DType, F16Products};
use crate::graph::passes::NarrowRule;
use crate::graph::{Access, Arg, ArgRef, DispatchRef, DispatchSpec, KernelId, Range};
use crate::kernels::{attention as ka, elementwise as ew, matmul as mm, norm as kn};
use crate::ops::matmul::{wgmma_shape, with_hopper_memory, MMA_TILE};

/// `d`'s output `out` and its f16 view of the same first bytes.
fn f16_view(d: DispatchRef<'_>) -> Option<(Buffer, Buffer)> {
    let out = d.buffer("out")?;
    let narrow = out.view(0, DType::F16, out.dims()).ok()?;
    Some((out.clone(), narrow))
}

fn norm_output(d: DispatchRef<'_>) -> Option<(Buffer, Buffer)> {
    if d.kernel() != KernelId::of(&kn::RMS_NORM[0]) {
        return None;
    }
    f16_view(d)
}

/// The f16 norm takes the f32 norm's arguments (x, weight, out, eps, dim), out narrowed.
fn narrow_norm<'a>(d: DispatchRef<'a>, narrow: &'a Buffer) -> Option<DispatchSpec<'a>> {
    let args = replaced(d, |_, access| access == Access::Write, narrow);
    DispatchSpec::new(KernelId::of(&kn::RMS_NORM_TO_F16), &args, d.grid()).ok()
}

/// The shortest k the f16 forms take. Measured on an H100 (`onepass bench -p 512`, one call
/// each): narrowed, the Llama 3.1 8B's products (k 4096 and 14336) gained 19% of the prompt's
/// speed and the 1B's (k 2048 and 8192) 9%; SmolLM2's (k 576 and 1536) measured 3% slower in two
/// calls, within the 7% by which two runs of the same code differed in a third: no gain shown,
/// so they stay f32.
const MIN_K: u32 = 2048;

/// A tensor-core product of exactly `wide` (one of the three kernels' families), reading
/// `narrow` instead, where `products` takes its weight format.
fn narrow_product<'a>(
    d: DispatchRef<'a>,
    wide: &'a Buffer,
    narrow: &'a Buffer,
    products: F16Products,
) -> Option<DispatchSpec<'a>> {
    let x = d.buffer("x")?;
    if Range::of(x) != Range::of(wide) || x.dims() != wide.dims() {
        return None;
    }
    let kernel = d.kernel();
    let (family, index) = if let Some(f) = kernel.index_in(&mm::MATMUL_MMA) {
        (&mm::MATMUL_MMA_H, f)
    } else if let Some(f) = kernel.index_in(&mm::MATMUL_ADD_MMA) {
        (&mm::MATMUL_ADD_MMA_H, f)
    } else {
        (&mm::MATMUL3_MMA_H, kernel.index_in(&mm::MATMUL3_MMA)?)
    };
    // Only where the f16 form is the fast one: `MmhFormat::fast` in `matmul_mma_h.cuh` (Q4_0,
    // Q4_1 and Q5_0 in 64-value steps), and on sm_90a every format of `MmwFormat`
    // (`matmul_wgmma.cuh`). Elsewhere it would take its two-buffer form, slower than the f32
    // pipelined one.
    let k = match d.scalar("k")? {
        crate::graph::Scalar::U32(k) => k,
        _ => return None,
    };
    let format = crate::kernels::WEIGHT_FORMATS[index];
    if !products.takes(format) || k % 64 != 0 || k < MIN_K {
        return None;
    }
    // The formats past Q4_0, Q4_1 and Q5_0 are fast only in the Hopper form's shapes (whole
    // output tiles, aligned rows).
    let outputs: Vec<usize> = ["n", "n0", "n1", "n2"]
        .iter()
        .filter_map(|name| match d.scalar(name) {
            Some(crate::graph::Scalar::U32(n)) => Some(n as usize),
            _ => None,
        })
        .collect();
    let hopper = wgmma_shape(format, k as usize, &outputs, MMA_TILE);
    if !F16Products::SmallBlocks.takes(format) && !hopper {
        return None;
    }
    // Where the backend runs the Hopper form and it takes the shapes, the launch asks for its
    // shared memory (the f32 forms did not).
    let grid = if products == F16Products::AllBlocks && hopper {
        with_hopper_memory(d.grid())
    } else {
        d.grid()
    };
    // x is the first argument.
    let args = replaced(d, |i, _| i == 0, narrow);
    DispatchSpec::new(KernelId::of(&family[index]), &args, grid).ok()
}

fn small_blocks<'a>(d: DispatchRef<'a>, w: &'a Buffer, n: &'a Buffer) -> Option<DispatchSpec<'a>> {
    narrow_product(d, w, n, F16Products::SmallBlocks)
}

fn all_blocks<'a>(d: DispatchRef<'a>, w: &'a Buffer, n: &'a Buffer) -> Option<DispatchSpec<'a>> {
    narrow_product(d, w, n, F16Products::AllBlocks)
}

/// The narrowings for a backend that runs `products` on f16 activations (none for
/// [`F16Products::None`]): an f32 norm, SwiGLU or tensor-core attention read only by such
/// products writes f16, and they read f16.
pub fn rules_for(products: F16Products) -> Vec<NarrowRule> {
    let reader = match products {
        F16Products::None => return Vec::new(),
        F16Products::SmallBlocks => small_blocks,
        F16Products::AllBlocks => all_blocks,
    };
    vec![
        NarrowRule {
            name: "rms_norm->f16 products",
            output: norm_output,
            producer: narrow_norm,
            reader,
        },
        NarrowRule {
            name: "swiglu->f16 products",
            output: swiglu_output,
            producer: narrow_swiglu,
            reader,
        },
        NarrowRule {
            name: "attention->f16 products",
            output: attention_output,
            producer: narrow_attention,
            reader,
        },
    ]
}

/// Every argument of `d` as it was, the buffer that `pick` (given its index and access) chooses
/// replaced by `narrow` with the same access.
fn replaced<'a>(
    d: DispatchRef<'a>,
    pick: impl Fn(usize, Access) -> bool,
    narrow: &'a Buffer,
) -> Vec<ArgRef<'a>> {
    d.args()
        .iter()
        .enumerate()
        .map(|(i, a)| match a {
            Arg::Buffer(_, access) if pick(i, *access) => ArgRef::Buffer(narrow, *access),
            Arg::Buffer(b, access) => ArgRef::Buffer(b, *access),
            Arg::Scalar(s) => ArgRef::Scalar(*s),
        })
        .collect()
}

/// The output of an out-of-place f32 SwiGLU whose gate and up are as long as it (no broadcast
/// row), and its f16 view.
fn swiglu_output(d: DispatchRef<'_>) -> Option<(Buffer, Buffer)> {
    if d.kernel() != KernelId::of(&ew::SWIGLU[0]) {
        return None;
    }
    let n = d.buffer("out")?.elems();
    if d.buffer("gate")?.elems() != n || d.buffer("up")?.elems() != n {
        return None;
    }
    f16_view(d)
}

fn narrow_swiglu<'a>(d: DispatchRef<'a>, narrow: &'a Buffer) -> Option<DispatchSpec<'a>> {
    DispatchSpec::new(
        KernelId::of(&ew::SWIGLU_TO_F16),
        &[
            ArgRef::read(d.buffer("gate")?),
            ArgRef::read(d.buffer("up")?),
            ArgRef::write(narrow),
        ],
        d.grid(),
    )
    .ok()
}

/// The output of a tensor-core prompt attention, and its f16 view.
fn attention_output(d: DispatchRef<'_>) -> Option<(Buffer, Buffer)> {
    d.kernel().index_in(&ka::ATTENTION_MMA)?;
    f16_view(d)
}

fn narrow_attention<'a>(d: DispatchRef<'a>, narrow: &'a Buffer) -> Option<DispatchSpec<'a>> {
    let index = d.kernel().index_in(&ka::ATTENTION_MMA)?;
    // `out` is the one buffer the attention writes.
    let args = replaced(d, |_, access| access == Access::Write, narrow);
    DispatchSpec::new(
        KernelId::of(&ka::ATTENTION_MMA_TO_F16[index]),
        &args,
        d.grid(),
    )
    .ok()
}

#[cfg(test)]
mod tests {
    use crate::backend::{cpu, Capabilities, DType, Device, F16Products};
    use crate::testutil::random_f32;
    use crate::{Buffer, Executor, Mode, Plan};

    const ROWS: usize = 64;
    /// The shortest k narrowed (`MIN_K`).
    const K: usize = 2048;
    /// Four products of the norm's output: the first three fuse into a `matmul3_mma`, the fourth
    /// stays a `matmul_mma`; widths that end in a partial tile of 128.
    const WIDTHS: [usize; 4] = [200, 64, 72, 96];

    struct Case {
        dev: Device,
        x: Buffer,
        norm: Buffer,
        xn: Buffer,
        ws: Vec<Buffer>,
        outs: Vec<Buffer>,
    }

    fn case() -> Case {
        let dev = Device::cpu(2).unwrap();
        let x = dev
            .upload(&random_f32(ROWS * K, 2.0, 3), &[ROWS, K])
            .unwrap();
        let norm = dev.upload(&random_f32(K, 1.0, 4), &[K]).unwrap();
        let xn = dev.alloc(DType::F32, &[ROWS, K]).unwrap();
        let ws = WIDTHS
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let bytes =
                    crate::quant::quantize(DType::Q4_0, &random_f32(n * K, 1.0, 10 + i as u64))
                        .unwrap();
                dev.upload_bytes(&bytes, DType::Q4_0, &[n, K]).unwrap()
            })
            .collect();
        let outs = WIDTHS
            .iter()
            .map(|&n| dev.alloc(DType::F32, &[ROWS, n]).unwrap())
            .collect();
        Case {
            dev,
            x,
            norm,
            xn,
            ws,
            outs,
        }
    }

    /// The norm and the four products recorded, optimized with `caps` (and `extra`, a read of
    /// the norm's output by an add, when set) and run; the four outputs.
    fn run(c: &Case, caps: &Capabilities, extra: Option<&Buffer>) -> Vec<Vec<f32>> {
        let exec = Executor::new(c.dev.clone());
        let mut s = exec.begin(Mode::Recorded);
        s.rms_norm(&c.x, &c.norm, &c.xn, 1e-5).unwrap();
        for (w, out) in c.ws.iter().zip(&c.outs) {
            s.matmul(&c.xn, w, out).unwrap();
        }
        if let Some(acc) = extra {
            s.add_inplace(acc, &c.xn).unwrap();
        }
        s.mark_scratch(&c.xn);
        let mut graph = s.into_graph().unwrap();
        Executor::optimize(&mut graph, &Plan::OPTIMIZED, caps);
        exec.run(&graph, false).unwrap();
        c.outs.iter().map(|o| c.dev.download(o).unwrap()).collect()
    }

    fn bits(v: &[Vec<f32>]) -> Vec<Vec<u32>> {
        v.iter()
            .map(|o| o.iter().map(|x| x.to_bits()).collect())
            .collect()
    }

    /// With the narrowing declared, the norm writes f16 and the products read it: their results
    /// are the products of the f32 norm's values rounded to f16 (computed here by rounding the
    /// unnarrowed norm's output on the host), bit for bit, and differ from the f32 products (so
    /// the narrowing happened). Without it, or where something else reads the norm's output, the
    /// products read f32.
    #[test]
    fn a_norm_read_only_by_tensor_core_products_is_narrowed_to_f16() {
        let c = case();
        let narrowing = cpu::CAPABILITIES.with_f16_products(F16Products::SmallBlocks);
        let plain = run(&c, &cpu::CAPABILITIES, None);
        let narrowed = run(&c, &narrowing, None);
        // The reference: the f32 norm (as the plain run left it), rounded to f16, multiplied.
        let exec = Executor::new(c.dev.clone());
        let mut s = exec.begin(Mode::Direct);
        s.rms_norm(&c.x, &c.norm, &c.xn, 1e-5).unwrap();
        s.finish(&Plan::SEQUENTIAL).unwrap();
        let rounded: Vec<f32> = c
            .dev
            .download::<f32>(&c.xn)
            .unwrap()
            .iter()
            .map(|&v| half::f16::from_f32(v).to_f32())
            .collect();
        let xr = c.dev.upload(&rounded, &[ROWS, K]).unwrap();
        let mut s = exec.begin(Mode::Direct);
        for (w, out) in c.ws.iter().zip(&c.outs) {
            s.matmul(&xr, w, out).unwrap();
        }
        s.finish(&Plan::SEQUENTIAL).unwrap();
        let want: Vec<Vec<f32>> = c.outs.iter().map(|o| c.dev.download(o).unwrap()).collect();
        assert_eq!(
            bits(&narrowed),
            bits(&want),
            "narrowed against f16-rounded products"
        );
        assert_ne!(
            bits(&narrowed),
            bits(&plain),
            "the narrowing did not happen"
        );
        // An add reading the norm's output keeps it f32 (the products too).
        let acc = c
            .dev
            .upload(&random_f32(ROWS * K, 1.0, 9), &[ROWS, K])
            .unwrap();
        let kept = run(&c, &narrowing, Some(&acc));
        assert_eq!(
            bits(&kept),
            bits(&plain),
            "a norm read by an add must stay f32"
        );
    }

    /// A producer (`produce` records it, writing f32 `[ROWS, K]` into its argument), then the
    /// product with 200 (or 256) rows of `format` weights and the residual add (fused into
    /// `matmul_add_mma`), optimized with `caps` and run: the accumulator after it, and the
    /// producers narrowed. With `round`, the reference: the producer runs alone, and the product
    /// reads its values rounded to f16 on the host.
    fn then_product(
        dev: &Device,
        caps: &Capabilities,
        format: DType,
        round: bool,
        produce: &dyn Fn(&mut crate::Session, &Buffer),
    ) -> (Vec<f32>, usize) {
        // A partial tile of 128 outputs; whole tiles for the formats that narrow only in the
        // Hopper form's shapes.
        let n = if F16Products::SmallBlocks.takes(format) {
            200
        } else {
            256
        };
        let bytes = crate::quant::quantize(format, &random_f32(n * K, 1.0, 23)).unwrap();
        let w = dev.upload_bytes(&bytes, format, &[n, K]).unwrap();
        let acc = dev
            .upload(&random_f32(ROWS * n, 1.0, 24), &[ROWS, n])
            .unwrap();
        let proj = dev.alloc(DType::F32, &[ROWS, n]).unwrap();
        let produced = dev.alloc(DType::F32, &[ROWS, K]).unwrap();
        let exec = Executor::new(dev.clone());
        let x = if round {
            let mut d = exec.begin(Mode::Direct);
            produce(&mut d, &produced);
            d.finish(&Plan::SEQUENTIAL).unwrap();
            let rounded: Vec<f32> = dev
                .download::<f32>(&produced)
                .unwrap()
                .iter()
                .map(|&v| half::f16::from_f32(v).to_f32())
                .collect();
            dev.upload(&rounded, &[ROWS, K]).unwrap()
        } else {
            produced.clone()
        };
        let mut s = exec.begin(Mode::Recorded);
        if !round {
            produce(&mut s, &produced);
            s.mark_scratch(&produced);
        }
        s.matmul(&x, &w, &proj).unwrap();
        s.add_inplace(&acc, &proj).unwrap();
        s.mark_scratch(&proj);
        let mut graph = s.into_graph().unwrap();
        let report = Executor::optimize(&mut graph, &Plan::OPTIMIZED, caps);
        exec.run(&graph, false).unwrap();
        (dev.download(&acc).unwrap(), report.narrowed)
    }

    /// Narrowed once where declared; the narrowed accumulator equals, bit for bit, the product
    /// of the producer's f32 values rounded to f16, and differs from the unnarrowed one.
    fn check_narrowed(what: &str, produce: &dyn Fn(&mut crate::Session, &Buffer)) {
        check_narrowed_for(what, DType::Q4_1, F16Products::SmallBlocks, produce);
    }

    fn check_narrowed_for(
        what: &str,
        format: DType,
        products: F16Products,
        produce: &dyn Fn(&mut crate::Session, &Buffer),
    ) {
        let dev = Device::cpu(2).unwrap();
        let narrowing = cpu::CAPABILITIES.with_f16_products(products);
        let plain = &cpu::CAPABILITIES;
        let (wide, none) = then_product(&dev, plain, format, false, produce);
        let (narrowed, once) = then_product(&dev, &narrowing, format, false, produce);
        let (want, _) = then_product(&dev, plain, format, true, produce);
        assert_eq!(
            (none, once),
            (0, 1),
            "{what}: narrowed once, only when declared"
        );
        let b = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            b(&narrowed),
            b(&want),
            "{what}: narrowed against f16-rounded"
        );
        assert_ne!(
            b(&narrowed),
            b(&wide),
            "{what}: the narrowing did not happen"
        );
    }

    /// Q8_0, Q4_K and Q6_K products are narrowed only where every block format's f16 form is
    /// declared fast (`F16Products::AllBlocks`: CUDA's sm_90a), not where only Q4_0, Q4_1 and
    /// Q5_0's is.
    #[test]
    fn the_other_block_formats_narrow_only_where_declared() {
        let dev = Device::cpu(2).unwrap();
        let gate = dev
            .upload(&random_f32(ROWS * K, 2.0, 41), &[ROWS, K])
            .unwrap();
        let up = dev
            .upload(&random_f32(ROWS * K, 2.0, 42), &[ROWS, K])
            .unwrap();
        let produce = |s: &mut crate::Session, out: &Buffer| s.swiglu(&gate, &up, out).unwrap();
        for format in [DType::Q8_0, DType::Q4K, DType::Q6K] {
            let small = cpu::CAPABILITIES.with_f16_products(F16Products::SmallBlocks);
            let (_, narrowed) = then_product(&dev, &small, format, false, &produce);
            assert_eq!(narrowed, 0, "{format:?}: narrowed without the Hopper form");
            check_narrowed_for(
                &format!("{format:?}"),
                format,
                F16Products::AllBlocks,
                &produce,
            );
        }
    }

    /// A narrowed product in the Hopper form's shapes asks for that form's shared memory where
    /// the backend runs it (`F16Products::AllBlocks`), and only there; the f32 forms never do.
    #[test]
    fn narrowed_products_ask_for_the_hopper_memory_only_where_it_runs() {
        use crate::kernels::matmul as mm;
        // The f32 forms' (the f16 form's `MMH_SMEM`, the larger) and the Hopper form's.
        let mma = (3 * (128 * 72 * 2 + 128 * 44) + 2 * 128 * 72 * 2) as u32;
        let hopper = (4 * 256 * 128 + 1024) as u32;
        let dev = Device::cpu(2).unwrap();
        let cases = [
            (F16Products::AllBlocks, DType::Q4K, hopper),
            (F16Products::AllBlocks, DType::Q4_0, hopper),
            (F16Products::SmallBlocks, DType::Q4_0, mma),
            (F16Products::None, DType::Q4_0, mma),
        ];
        for (products, format, want) in cases {
            let x = dev
                .upload(&random_f32(ROWS * K, 2.0, 51), &[ROWS, K])
                .unwrap();
            let norm = dev.upload(&random_f32(K, 1.0, 52), &[K]).unwrap();
            let xn = dev.alloc(DType::F32, &[ROWS, K]).unwrap();
            let bytes = crate::quant::quantize(format, &random_f32(256 * K, 1.0, 53)).unwrap();
            let w = dev.upload_bytes(&bytes, format, &[256, K]).unwrap();
            let out = dev.alloc(DType::F32, &[ROWS, 256]).unwrap();
            let mut s = Executor::new(dev.clone()).begin(Mode::Recorded);
            s.rms_norm(&x, &norm, &xn, 1e-5).unwrap();
            s.matmul(&xn, &w, &out).unwrap();
            s.mark_scratch(&xn);
            let mut graph = s.into_graph().unwrap();
            let caps = cpu::CAPABILITIES.with_f16_products(products);
            Executor::optimize(&mut graph, &Plan::OPTIMIZED, &caps);
            let product = graph
                .dispatches()
                .find(|d| {
                    d.kernel().index_in(&mm::MATMUL_MMA_H).is_some()
                        || d.kernel().index_in(&mm::MATMUL_MMA).is_some()
                })
                .expect("the product");
            let narrowed = product.kernel().index_in(&mm::MATMUL_MMA_H).is_some();
            assert_eq!(
                (narrowed, product.grid().shared_bytes),
                (products != F16Products::None, want),
                "{products:?} {format}"
            );
        }
    }

    /// A SwiGLU read only by a down product (with its residual add) narrows.
    #[test]
    fn a_swiglu_read_only_by_a_down_product_is_narrowed_to_f16() {
        let dev = Device::cpu(2).unwrap();
        let gate = dev
            .upload(&random_f32(ROWS * K, 2.0, 21), &[ROWS, K])
            .unwrap();
        let up = dev
            .upload(&random_f32(ROWS * K, 2.0, 22), &[ROWS, K])
            .unwrap();
        check_narrowed("swiglu", &|s, out| s.swiglu(&gate, &up, out).unwrap());
    }

    /// A tensor-core prompt attention (64 rows, 32 heads of 64 over 4 KV heads) read only by an
    /// o product (with its residual add) narrows.
    #[test]
    fn an_attention_read_only_by_an_o_product_is_narrowed_to_f16() {
        use crate::ops::attention::AttentionParams;
        let dev = Device::cpu(2).unwrap();
        let (heads, kv_heads, hd, ctx) = (K / 64, 4, 64, 80);
        let q = dev
            .upload(&random_f32(ROWS * K, 1.0, 31), &[ROWS, K])
            .unwrap();
        let cache = |seed| {
            dev.upload(
                &random_f32(kv_heads * ctx * hd, 1.0, seed),
                &[kv_heads, ctx, hd],
            )
            .unwrap()
        };
        let (k, v) = (cache(32), cache(33));
        let step = dev.upload(&[5i32], &[1]).unwrap();
        let params = AttentionParams::new(heads, kv_heads, hd);
        check_narrowed("attention", &|s, out| {
            s.attention(&q, &k, &v, &step, out, params).unwrap()
        });
    }
}
