//! The argument array of a [`ComputeGraph`](super::ComputeGraph): every buffer argument is a
//! reference of its own, and a step recorded again over the same buffers keeps the arguments of
//! the last one instead of taking new references.
//!
//! Recording writes each argument past the recorded ones, over what the last recording (or a
//! refused dispatch) left there. Beside every argument is a key that says what it is (a buffer
//! argument's view index and access, or a scalar's kind and bits), so an argument equal to the
//! one already there is found by comparing keys, and then nothing is written.

use crate::graph::borrowed::ArgRef;
use crate::graph::dispatch::Arg;
use crate::kernels::{Access, Scalar};
use crate::memory::Buffer;

/// The key of a buffer argument of view `v` (an index of the graph) with `access`.
#[inline(always)]
pub(super) fn buffer_key(v: u32, access: Access) -> u64 {
    let code = match access {
        Access::Read => 1,
        Access::Write => 2,
        Access::ReadWrite => 3,
    };
    u64::from(v) << 2 | code
}

/// The key of scalar argument `s`: its kind and bits, above every buffer argument's key.
#[inline(always)]
pub(super) fn scalar_key(s: Scalar) -> u64 {
    let (kind, bits) = match s {
        Scalar::U32(x) => (1, x),
        Scalar::I32(x) => (2, x as u32),
        Scalar::F32(x) => (3, x.to_bits()),
    };
    kind << 32 | u64::from(bits) | 1 << 63
}

/// `arg` as an argument of its own (one reference, for a buffer).
#[inline(always)]
fn owned(arg: ArgRef<'_>) -> Arg {
    match arg {
        ArgRef::Buffer(b, access) => Arg::Buffer(b.clone(), access),
        ArgRef::Scalar(s) => Arg::Scalar(s),
    }
}

/// The arguments of a graph's dispatches, and past them those kept from an earlier recording.
#[derive(Default)]
pub(super) struct Args {
    /// The recorded arguments (the first `len`), then the kept ones. Every buffer here is a view
    /// the graph holds (they go when the views go: see [`reset`](Self::reset)).
    list: Vec<Arg>,
    /// The key of every argument in `list` ([`buffer_key`] or [`scalar_key`]).
    keys: Vec<u64>,
    /// Number of recorded arguments.
    len: usize,
}

impl Clone for Args {
    /// The recorded arguments (one reference each), not the kept ones.
    fn clone(&self) -> Self {
        Args {
            list: self.list[..self.len].to_vec(),
            keys: self.keys[..self.len].to_vec(),
            len: self.len,
        }
    }
}

impl Args {
    /// Number of recorded arguments: where the next dispatch's arguments start.
    #[inline(always)]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The arguments `range`, as written (recorded, or written for a dispatch being recorded).
    #[inline(always)]
    pub(super) fn get(&self, range: std::ops::Range<usize>) -> &[Arg] {
        &self.list[range]
    }

    /// Room for `n` arguments past the recorded ones.
    #[inline(always)]
    pub(super) fn reserve(&mut self, n: usize) {
        let kept = self.list.len() - self.len;
        if kept < n {
            self.list.reserve(n - kept);
            self.keys.reserve(n - kept);
        }
    }

    /// Makes the arguments past the recorded ones `args`, whose keys are `keys` (buffers by the
    /// graph's view index). Where the kept arguments have the same keys, nothing is written.
    #[inline(always)]
    pub(super) fn put_all(&mut self, args: &[ArgRef<'_>], keys: &[u64]) {
        let at = self.len;
        let kept = self.keys.get(at..at + keys.len());
        if !kept.is_some_and(|k| k.iter().zip(keys).all(|(x, y)| x == y)) {
            self.put_each(args, keys);
        }
    }

    /// [`put_all`](Self::put_all) where some argument differs from the one kept there.
    #[inline(never)]
    fn put_each(&mut self, args: &[ArgRef<'_>], keys: &[u64]) {
        if self.list.len() == self.len {
            // None kept here (a new graph): appended at once.
            self.list.extend(args.iter().map(|&a| owned(a)));
            self.keys.extend_from_slice(keys);
            return;
        }
        for (i, (arg, &k)) in args.iter().zip(keys).enumerate() {
            let at = self.len + i;
            if self.keys.get(at) == Some(&k) {
                continue;
            }
            self.set(at, owned(*arg), k);
        }
    }

    /// Makes argument `at` past the recorded ones (at most the number written: arguments are
    /// written in order) buffer `b`, view `v` of the graph, with `access`. An argument there of
    /// the same view and access is kept as it is: no reference count.
    #[inline(always)]
    pub(super) fn put_buffer(&mut self, at: usize, v: u32, b: &Buffer, access: Access) {
        let k = buffer_key(v, access);
        if self.keys.get(at) != Some(&k) {
            self.set(at, Arg::Buffer(b.clone(), access), k);
        }
    }

    /// Makes argument `at` (as for [`put_buffer`](Self::put_buffer)) scalar `s`.
    #[inline(always)]
    pub(super) fn put_scalar(&mut self, at: usize, s: Scalar) {
        let k = scalar_key(s);
        if self.keys.get(at) != Some(&k) {
            self.set(at, Arg::Scalar(s), k);
        }
    }

    /// Writes `arg` with key `k` at `at`, over the argument there or as the next one.
    fn set(&mut self, at: usize, arg: Arg, k: u64) {
        if at < self.list.len() {
            self.list[at] = arg;
            self.keys[at] = k;
        } else {
            debug_assert_eq!(at, self.list.len());
            self.list.push(arg);
            self.keys.push(k);
        }
    }

    /// Counts the `n` arguments written past the recorded ones as recorded.
    #[inline(always)]
    pub(super) fn commit(&mut self, n: usize) {
        debug_assert!(self.len + n <= self.list.len());
        self.len += n;
    }

    /// Empties the recorded arguments, keeping them for the next recording.
    pub(super) fn clear(&mut self) {
        self.len = 0;
    }

    /// Drops every argument, recorded or kept (their view indices are to lose their meaning).
    pub(super) fn reset(&mut self) {
        self.list.clear();
        self.keys.clear();
        self.len = 0;
    }
}
