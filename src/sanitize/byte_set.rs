//! Sets of byte ranges per allocation, with exact union, difference and intersection: the
//! sanitizer's liveness analysis works on these.

use std::collections::BTreeMap;

use crate::backend::AllocId;
use crate::graph::Range;

/// A set of byte ranges, per allocation: sorted, disjoint, non-adjacent intervals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct ByteSet {
    map: BTreeMap<AllocId, Vec<(usize, usize)>>,
}

pub(super) fn byte_set_of(ranges: impl IntoIterator<Item = Range>) -> ByteSet {
    let mut s = ByteSet::default();
    for r in ranges {
        s.insert(&r);
    }
    s
}

impl ByteSet {
    pub(super) fn insert(&mut self, r: &Range) {
        if r.is_empty() {
            return;
        }
        let v = self.map.entry(r.alloc).or_default();
        let mut out = Vec::with_capacity(v.len() + 1);
        let (mut s, mut e) = (r.start, r.end);
        let mut placed = false;
        for &(a, b) in v.iter() {
            if b < s {
                out.push((a, b));
            } else if e < a {
                if !placed {
                    out.push((s, e));
                    placed = true;
                }
                out.push((a, b));
            } else {
                s = s.min(a);
                e = e.max(b);
            }
        }
        if !placed {
            out.push((s, e));
        }
        *v = out;
    }

    pub(super) fn remove(&mut self, r: &Range) {
        let Some(v) = self.map.get_mut(&r.alloc) else {
            return;
        };
        let mut out = Vec::with_capacity(v.len() + 1);
        for &(a, b) in v.iter() {
            if b <= r.start || r.end <= a || r.is_empty() {
                out.push((a, b));
                continue;
            }
            if a < r.start {
                out.push((a, r.start));
            }
            if r.end < b {
                out.push((r.end, b));
            }
        }
        if out.is_empty() {
            self.map.remove(&r.alloc);
        } else {
            *v = out;
        }
    }

    pub(super) fn ranges(&self) -> impl Iterator<Item = Range> + '_ {
        self.map.iter().flat_map(|(&alloc, v)| {
            v.iter()
                .map(move |&(start, end)| Range { alloc, start, end })
        })
    }

    pub(super) fn has_alloc(&self, alloc: AllocId) -> bool {
        self.map.contains_key(&alloc)
    }

    pub(super) fn union_with(&mut self, other: &ByteSet) {
        for r in other.ranges() {
            self.insert(&r);
        }
    }

    pub(super) fn subtract(&mut self, other: &ByteSet) {
        for r in other.ranges() {
            self.remove(&r);
        }
    }

    pub(super) fn intersection(&self, other: &ByteSet) -> ByteSet {
        let mut out = ByteSet::default();
        for (alloc, xs) in &self.map {
            let Some(ys) = other.map.get(alloc) else {
                continue;
            };
            let (mut i, mut j) = (0, 0);
            let mut v = Vec::new();
            while i < xs.len() && j < ys.len() {
                let (s, e) = (xs[i].0.max(ys[j].0), xs[i].1.min(ys[j].1));
                if s < e {
                    v.push((s, e));
                }
                if xs[i].1 < ys[j].1 {
                    i += 1;
                } else {
                    j += 1;
                }
            }
            if !v.is_empty() {
                out.map.insert(*alloc, v);
            }
        }
        out
    }

    pub(super) fn covers(&self, r: &Range) -> bool {
        self.map
            .get(&r.alloc)
            .is_some_and(|v| v.iter().any(|&(a, b)| a <= r.start && r.end <= b))
    }

    pub(super) fn bytes(&self) -> u64 {
        self.map
            .values()
            .flatten()
            .map(|&(a, b)| (b - a) as u64)
            .sum()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::sanitize) fn r(alloc: u64, start: usize, end: usize) -> Range {
        Range {
            alloc: AllocId(alloc),
            start,
            end,
        }
    }

    pub(in crate::sanitize) fn intervals(s: &ByteSet) -> Vec<(u64, usize, usize)> {
        s.ranges().map(|r| (r.alloc.0, r.start, r.end)).collect()
    }

    #[test]
    fn given_overlapping_and_touching_ranges_when_inserted_should_merge_them() {
        let s = byte_set_of([
            r(1, 10, 20),
            r(1, 30, 40),
            r(1, 20, 25),
            r(1, 38, 50),
            r(2, 0, 4),
            r(1, 5, 5),
        ]);
        assert_eq!(intervals(&s), vec![(1, 10, 25), (1, 30, 50), (2, 0, 4)]);
        assert_eq!(s.bytes(), 15 + 20 + 4);
        assert!(s.covers(&r(1, 30, 50)));
        assert!(!s.covers(&r(1, 20, 31)));
    }

    #[test]
    fn given_a_set_when_ranges_are_removed_or_intersected_should_keep_exact_bytes() {
        let mut s = byte_set_of([r(1, 0, 100), r(3, 0, 8)]);
        s.remove(&r(1, 10, 20));
        s.remove(&r(1, 90, 200));
        s.remove(&r(3, 0, 8));
        assert_eq!(intervals(&s), vec![(1, 0, 10), (1, 20, 90)]);
        let other = byte_set_of([r(1, 5, 25), r(1, 80, 95), r(2, 0, 10)]);
        assert_eq!(
            intervals(&s.intersection(&other)),
            vec![(1, 5, 10), (1, 20, 25), (1, 80, 90)]
        );
        assert!(!s.has_alloc(AllocId(3)));
    }
}
