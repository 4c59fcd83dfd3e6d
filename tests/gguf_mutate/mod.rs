//! The mutation side of the GGUF fuzz test: a map of the base file's header fields and section
//! boundaries, and one seeded mutation of a copy (a bit flip, a truncation, an interesting value in a
//! field of a chosen kind, inserted or removed bytes).

use rand::RngExt;
use rand_chacha::ChaCha8Rng;

/// What a header field is, for targeted mutations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    Version,
    TensorCount,
    KvCount,
    StrLen,
    ValueType,
    ArrayType,
    ArrayCount,
    NDims,
    Dim,
    GgmlType,
    Offset,
    Alignment,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Field {
    pub(crate) pos: usize,
    pub(crate) width: usize,
    pub(crate) kind: Kind,
}

/// Fields of the base file and its section boundaries (offsets where a section ends).
pub(crate) struct Map {
    pub(crate) fields: Vec<Field>,
    pub(crate) boundaries: Vec<usize>,
    pub(crate) data_offset: usize,
}

pub(crate) struct Walker<'a> {
    b: &'a [u8],
    pub(crate) pos: usize,
    map: Map,
}

impl Walker<'_> {
    fn field(&mut self, width: usize, kind: Kind) -> u64 {
        self.map.fields.push(Field {
            pos: self.pos,
            width,
            kind,
        });
        let mut v = [0u8; 8];
        v[..width].copy_from_slice(&self.b[self.pos..self.pos + width]);
        self.pos += width;
        u64::from_le_bytes(v)
    }

    fn string(&mut self) -> String {
        let n = self.field(8, Kind::StrLen) as usize;
        let s = String::from_utf8(self.b[self.pos..self.pos + n].to_vec()).unwrap();
        self.pos += n;
        s
    }

    fn value(&mut self, ty: u64, key: &str) {
        match ty {
            0 | 1 | 7 => self.pos += 1,
            2 | 3 => self.pos += 2,
            4..=6 => {
                if key == "general.alignment" {
                    self.field(4, Kind::Alignment);
                } else {
                    self.pos += 4;
                }
            }
            10..=12 => self.pos += 8,
            8 => {
                self.string();
            }
            9 => {
                let et = self.field(4, Kind::ArrayType);
                let n = self.field(8, Kind::ArrayCount);
                for _ in 0..n {
                    self.value(et, key);
                }
            }
            _ => unreachable!("the base file is valid"),
        }
    }
}

pub(crate) fn map_of(b: &[u8]) -> Map {
    let mut w = Walker {
        b,
        pos: 4,
        map: Map {
            fields: vec![],
            boundaries: vec![4],
            data_offset: 0,
        },
    };
    w.field(4, Kind::Version);
    w.map.boundaries.push(w.pos);
    let n_tensors = w.field(8, Kind::TensorCount);
    w.map.boundaries.push(w.pos);
    let n_kv = w.field(8, Kind::KvCount);
    w.map.boundaries.push(w.pos);
    for _ in 0..n_kv {
        let key = w.string();
        w.map.boundaries.push(w.pos);
        let ty = w.field(4, Kind::ValueType);
        w.value(ty, &key);
        w.map.boundaries.push(w.pos);
    }
    for _ in 0..n_tensors {
        w.string();
        w.map.boundaries.push(w.pos);
        let n = w.field(4, Kind::NDims);
        for _ in 0..n {
            w.field(8, Kind::Dim);
        }
        w.field(4, Kind::GgmlType);
        w.field(8, Kind::Offset);
        w.map.boundaries.push(w.pos);
    }
    let data_offset = w.pos.div_ceil(32) * 32;
    w.map.data_offset = data_offset;
    w.map.boundaries.push(data_offset);
    // Inside the data section: every 16 bytes, and the last byte.
    let mut p = data_offset + 16;
    while p < b.len() {
        w.map.boundaries.push(p);
        p += 16;
    }
    w.map.boundaries.push(b.len() - 1);
    w.map
}

// ---------------------------------------------------------------------------------------------
// Mutations.

pub(crate) const INTERESTING_U64: [u64; 14] = [
    0,
    1,
    2,
    5,
    31,
    0x7f,
    0xff,
    0xffff_ffff,
    0x1_0000_0000,
    1 << 62,
    i64::MAX as u64,
    u64::MAX,
    u64::MAX - 1,
    u64::MAX / 24 + 1,
];

/// Writes the low `width` bytes of `v` at `pos` (nothing when an earlier truncation removed it).
pub(crate) fn put(b: &mut [u8], pos: usize, width: usize, v: u64) {
    if pos + width > b.len() {
        return;
    }
    b[pos..pos + width].copy_from_slice(&v.to_le_bytes()[..width]);
}

pub(crate) fn get(b: &[u8], pos: usize, width: usize) -> u64 {
    let mut v = [0u8; 8];
    if pos + width > b.len() {
        return 0;
    }
    v[..width].copy_from_slice(&b[pos..pos + width]);
    u64::from_le_bytes(v)
}

pub(crate) fn pick_field(r: &mut ChaCha8Rng, map: &Map, kinds: &[Kind]) -> Field {
    let fs: Vec<&Field> = map
        .fields
        .iter()
        .filter(|f| kinds.contains(&f.kind))
        .collect();
    *fs[r.random_range(0..fs.len())]
}

/// One mutation of `b`; returns a short description for failure reports.
pub(crate) fn mutate(r: &mut ChaCha8Rng, b: &mut Vec<u8>, map: &Map, len0: usize) -> String {
    let n = b.len();
    match r.random_range(0..12u32) {
        0 => {
            let flips = r.random_range(1..9);
            for _ in 0..flips {
                let p = r.random_range(0..n);
                b[p] ^= 1 << r.random_range(0..8);
            }
            format!("{flips} bit flips")
        }
        1 => {
            let p = r.random_range(0..n);
            let v = [0u8, 0xff, 0x7f, 0x80, 1, b'\n', 0x1b][r.random_range(0..7)];
            b[p] = v;
            format!("byte {p} = {v:#x}")
        }
        2 => {
            // An interesting u64 anywhere (header-heavy: most files are header).
            let v = INTERESTING_U64[r.random_range(0..INTERESTING_U64.len())];
            let w = n.min(8);
            let p = r.random_range(0..=n - w);
            put(b, p, w, v);
            format!("u64 at {p} = {v:#x}")
        }
        3 => {
            // A count or length field set to something huge or off by a little.
            let f = pick_field(
                r,
                map,
                &[
                    Kind::TensorCount,
                    Kind::KvCount,
                    Kind::StrLen,
                    Kind::ArrayCount,
                ],
            );
            let old = get(b, f.pos, f.width);
            let v = match r.random_range(0..4) {
                0 => INTERESTING_U64[r.random_range(0..INTERESTING_U64.len())],
                1 => old.wrapping_add(r.random_range(1..4)),
                2 => old.wrapping_sub(r.random_range(1..4)),
                _ => len0 as u64 + r.random_range(0..64),
            };
            put(b, f.pos, f.width, v);
            format!("{:?} at {} = {v:#x}", f.kind, f.pos)
        }
        4 => {
            let cut = if r.random_bool(0.7) {
                map.boundaries[r.random_range(0..map.boundaries.len())]
            } else {
                r.random_range(0..n)
            };
            b.truncate(cut.min(n));
            format!("truncated to {cut}")
        }
        5 => {
            // A tensor offset past the end, unaligned, or onto another tensor.
            let f = pick_field(r, map, &[Kind::Offset]);
            let other = pick_field(r, map, &[Kind::Offset]);
            let data_len = (len0 - map.data_offset) as u64;
            let v = match r.random_range(0..5) {
                0 => get(b, other.pos, 8),
                1 => data_len,
                2 => data_len - 32,
                3 => get(b, f.pos, 8) + r.random_range(1..40),
                _ => INTERESTING_U64[r.random_range(0..INTERESTING_U64.len())],
            };
            put(b, f.pos, 8, v);
            format!("offset at {} = {v:#x}", f.pos)
        }
        6 => {
            let f = pick_field(r, map, &[Kind::ValueType, Kind::ArrayType]);
            let v = [13u64, 14, 255, 0xffff_ffff, 9, 8, 0, 12][r.random_range(0..8)];
            put(b, f.pos, 4, v);
            format!("{:?} at {} = {v}", f.kind, f.pos)
        }
        7 => {
            let f = pick_field(r, map, &[Kind::GgmlType]);
            let v = [
                4u64,
                5,
                31,
                36,
                40,
                1000,
                0xffff_ffff,
                0,
                1,
                2,
                8,
                12,
                14,
                15,
                39,
                30,
            ][r.random_range(0..16)];
            put(b, f.pos, 4, v);
            format!("ggml type at {} = {v}", f.pos)
        }
        8 => {
            let f = pick_field(r, map, &[Kind::Alignment]);
            let v = [0u64, 1, 3, 8, 24, 64, 1 << 20, 1 << 31, 0xffff_ffff][r.random_range(0..9)];
            put(b, f.pos, 4, v);
            format!("alignment = {v}")
        }
        9 => {
            // Shapes whose product overflows, or zero, or a dims count past 4.
            if r.random_bool(0.3) {
                let f = pick_field(r, map, &[Kind::NDims]);
                let v = [0u64, 1, 2, 3, 4, 5, 8, 0xffff_ffff][r.random_range(0..8)];
                put(b, f.pos, 4, v);
                format!("n_dims at {} = {v}", f.pos)
            } else {
                let f = pick_field(r, map, &[Kind::Dim]);
                let v = [
                    0u64,
                    1 << 32,
                    1 << 33,
                    1 << 62,
                    u64::MAX,
                    u64::MAX / 2 + 1,
                    1 << 31,
                    64,
                    256,
                ][r.random_range(0..9)];
                put(b, f.pos, 8, v);
                format!("dim at {} = {v:#x}", f.pos)
            }
        }
        10 => {
            let f = pick_field(r, map, &[Kind::Version]);
            let v = [0u64, 1, 2, 4, 0x0200_0000, 0x0300_0000, 0xffff_ffff][r.random_range(0..7)];
            put(b, f.pos, 4, v);
            format!("version = {v:#x}")
        }
        _ => {
            // Bytes inserted or removed in the header (everything after shifts).
            let p = r.random_range(0..map.data_offset.min(n));
            if r.random_bool(0.5) {
                let k = r.random_range(1..9);
                for _ in 0..k {
                    b.insert(p, r.random());
                }
                format!("{k} bytes inserted at {p}")
            } else {
                let k = r.random_range(1..9).min(n - p);
                b.drain(p..p + k);
                format!("{k} bytes removed at {p}")
            }
        }
    }
}
