//! The GGUF reader on the real default model (fetched into the cache on first use), checked
//! against the facts recorded for it in `tests/fixtures/smollm2/README.md`.

use onepass::model::fetch;
use onepass::model::gguf::GgufFile;
use onepass::DType;

fn model() -> GgufFile {
    let cache = fetch::default_cache_dir().unwrap();
    GgufFile::open(fetch::default_model(&cache, false).unwrap()).unwrap()
}

#[test]
fn smollm2_header_metadata_and_tensors() {
    let f = model();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.metadata().len(), 33);
    assert_eq!(f.tensors().len(), 272);
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(f.get_u32("llama.block_count").unwrap(), 30);
    assert_eq!(f.get_u32("llama.embedding_length").unwrap(), 576);
    assert_eq!(f.get_u32("llama.feed_forward_length").unwrap(), 1536);
    assert_eq!(f.get_u32("llama.attention.head_count").unwrap(), 9);
    assert_eq!(f.get_u32("llama.attention.head_count_kv").unwrap(), 3);
    assert_eq!(f.get_f32("llama.rope.freq_base").unwrap(), 100000.0);
    assert!((f.get_f32("llama.attention.layer_norm_rms_epsilon").unwrap() - 1e-5).abs() < 1e-9);
    assert_eq!(f.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(f.get_str("tokenizer.ggml.pre").unwrap(), "smollm");
    assert_eq!(
        f.get_str_array("tokenizer.ggml.tokens").unwrap().len(),
        49152
    );
    assert_eq!(
        f.get_str_array("tokenizer.ggml.merges").unwrap().len(),
        48900
    );
    assert_eq!(
        f.get_i32_array("tokenizer.ggml.token_type").unwrap().len(),
        49152
    );
    assert_eq!(f.get_u32("tokenizer.ggml.bos_token_id").unwrap(), 1);
    assert_eq!(f.get_u32("tokenizer.ggml.eos_token_id").unwrap(), 2);
    assert!(!f.get_bool("tokenizer.ggml.add_bos_token").unwrap());
    assert!(f
        .get_str("tokenizer.chat_template")
        .unwrap()
        .contains("<|im_start|>"));

    let count = |d: DType| {
        f.tensors()
            .iter()
            .filter(|t| t.dtype().unwrap() == d)
            .count()
    };
    assert_eq!(
        (count(DType::F32), count(DType::Q4_1), count(DType::Q8_0)),
        (61, 210, 1)
    );
    let embd = f.tensor("token_embd.weight").unwrap();
    assert_eq!(embd.ne, vec![576, 49152]);
    assert_eq!(embd.dims_row_major(), vec![49152, 576]);
    assert_eq!(embd.n_bytes, 49152 * 576 / 32 * 34);
    assert!(!f.has_tensor("output.weight"));
    let q = f.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(
        (q.dims_row_major(), q.dtype().unwrap()),
        (vec![576, 576], DType::Q4_1)
    );
    let k = f.tensor("blk.29.attn_k.weight").unwrap();
    assert_eq!(k.dims_row_major(), vec![192, 576]);
    let norm = f.tensor("output_norm.weight").unwrap();
    assert_eq!(
        (norm.dims_row_major(), norm.dtype().unwrap()),
        (vec![576], DType::F32)
    );

    // Zero-copy slices of the map, every one inside the file, aligned, in total the data section.
    let map = f.mmap();
    let mut total = 0;
    for t in f.tensors() {
        let bytes = f.tensor_bytes(t).unwrap();
        assert_eq!(bytes.len(), t.n_bytes);
        assert_eq!(bytes.as_ptr(), map[t.file_offset..].as_ptr());
        assert_eq!(t.file_offset % 32, 0);
        total += t.n_bytes;
    }
    assert!(f.data_offset() + total <= map.len());
    // The norm weights are finite and near one: the slice really is the tensor.
    let w: Vec<f32> = f
        .tensor_bytes(norm)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert!(w.iter().all(|v| v.is_finite()) && w.iter().any(|&v| v != 0.0));
}

#[test]
fn smollm2_round_trips_through_the_writer() {
    use onepass::model::gguf_write::GgufWriter;
    let f = model();
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata() {
        w.add(k, v.clone()).unwrap();
    }
    for t in f.tensors() {
        w.add_tensor(
            &t.name,
            &t.dims_row_major(),
            t.dtype().unwrap(),
            f.tensor_bytes(t).unwrap(),
        )
        .unwrap();
    }
    let bytes = w.to_bytes().unwrap();
    // Same layout rules as the file written by the Python gguf writer: the same size.
    assert_eq!(bytes.len(), f.mmap().len());
    let back = GgufFile::from_bytes(&bytes, "rewritten.gguf").unwrap();
    assert_eq!(back.metadata(), f.metadata());
    assert_eq!(back.tensors().len(), f.tensors().len());
    for (a, b) in f.tensors().iter().zip(back.tensors()) {
        assert_eq!(
            (&a.name, &a.ne, a.ggml_type, a.offset),
            (&b.name, &b.ne, b.ggml_type, b.offset)
        );
        assert_eq!(
            f.tensor_bytes(a).unwrap(),
            back.tensor_bytes(b).unwrap(),
            "tensor {}",
            a.name
        );
    }
}
