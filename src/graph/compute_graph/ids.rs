//! The view index of every range a graph recorded (reads, then writes, of each dispatch), with
//! room past them that recording writes into before it commits.

/// The room [`Ids::room`] gives.
pub(super) const ROOM: usize = 16;

/// The view indices of a graph's recorded ranges: the first `len` of `list`. The rest of `list`
/// is room that recording writes a dispatch's indices into, in place, before it commits them
/// (not one push at a time, each storing and loading the length again).
#[derive(Default)]
pub(super) struct Ids {
    list: Vec<u32>,
    len: usize,
}

impl Clone for Ids {
    fn clone(&self) -> Self {
        Ids {
            list: self.as_slice().to_vec(),
            len: self.len,
        }
    }
}

impl Ids {
    /// Number of recorded indices.
    #[inline(always)]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The recorded indices.
    #[inline(always)]
    pub(super) fn as_slice(&self) -> &[u32] {
        &self.list[..self.len]
    }

    /// The indices `range` (recorded ones, or for a dispatch being recorded, those pushed past
    /// them).
    #[inline(always)]
    pub(super) fn get(&self, range: std::ops::Range<usize>) -> &[u32] {
        &self.list[range]
    }

    /// Room for `n` more indices.
    pub(super) fn reserve(&mut self, n: usize) {
        let room = self.list.len() - self.len;
        if room < n {
            self.list.reserve(n - room);
        }
    }

    /// Appends `v`.
    #[inline(always)]
    pub(super) fn push(&mut self, v: u32) {
        match self.list.get_mut(self.len) {
            Some(slot) => *slot = v,
            None => self.list.push(v),
        }
        self.len += 1;
    }

    /// The [`ROOM`] slots past the recorded indices, to write a dispatch's indices into before
    /// [`commit`](Self::commit).
    #[inline(always)]
    pub(super) fn room(&mut self) -> &mut [u32] {
        let end = self.len + ROOM;
        if self.list.len() < end {
            self.list.resize(end, 0);
        }
        &mut self.list[self.len..end]
    }

    /// Counts the first `n` slots of the [`room`](Self::room) as recorded.
    #[inline(always)]
    pub(super) fn commit(&mut self, n: usize) {
        debug_assert!(n <= ROOM);
        self.len += n;
    }

    /// Keeps the first `n` indices.
    #[inline(always)]
    pub(super) fn truncate(&mut self, n: usize) {
        self.len = self.len.min(n);
    }

    /// Empties the indices.
    pub(super) fn clear(&mut self) {
        self.len = 0;
    }
}
