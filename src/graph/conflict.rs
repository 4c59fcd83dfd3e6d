//! The one conflict rule, stated once in its plainest form; every pass and executor implements it
//! faster, and the property tests hold each of them to this statement.
//!
//! **Dependency.** Two dispatches, `earlier` before `later` in program order, conflict when a byte
//! one of them writes is a byte the other reads or writes: read-after-write, write-after-read and
//! write-after-write on overlapping bytes of one allocation. Read-read never conflicts, ranges of
//! different allocations never do, and an empty range touches no byte. Conflicting dispatches run
//! in program order everywhere: the barrier pass puts a barrier between them
//! ([`passes::place_barriers`](super::passes::place_barriers)), the reorder pass keeps them in
//! order ([`passes::reorder`](super::passes::reorder)), fusion proves an intermediate dead only
//! when a later dispatch overwrites it before any conflicting read, and an instantiated graph (a
//! CUDA graph, the CPU's levels) has a path from one to the other
//! ([`reduced_dependencies`](crate::executable::reduced_dependencies)). Every other pair may run
//! concurrently. [`RangeSet`](super::RangeSet) is the same rule for a set of dispatches.
//!
//! **Position.** A dispatch whose op kind is not reorderable
//! ([`OpKind::is_reorderable`](super::OpKind::is_reorderable)) keeps its place in the list: the
//! reorder pass moves no dispatch across it. That is all it means: it adds no dependency, since
//! its declared ranges are all it touches, as for any dispatch.
//!
//! **Aliasing.** Within one dispatch, a written buffer argument may overlap no other buffer
//! argument ([`write_alias`]); an in-place update is one read-write argument.

use super::{Arg, DispatchRef, Range, Ranges};

/// Whether a dispatch reading `reads_a` and writing `writes_a` conflicts with one reading
/// `reads_b` and writing `writes_b` (in either order: the rule is symmetric).
pub fn ranges_conflict(
    reads_a: &[Range],
    writes_a: &[Range],
    reads_b: &[Range],
    writes_b: &[Range],
) -> bool {
    let hit = |xs: &[Range], ys: &[Range]| xs.iter().any(|x| ys.iter().any(|y| x.overlaps(y)));
    hit(writes_a, reads_b) || hit(writes_a, writes_b) || hit(reads_a, writes_b)
}

/// Whether two dispatches conflict (see the module documentation): [`ranges_conflict`] over
/// their read and write ranges.
pub fn conflict(a: DispatchRef<'_>, b: DispatchRef<'_>) -> bool {
    let hit = |xs: Ranges<'_>, ys: Ranges<'_>| xs.iter().any(|x| ys.iter().any(|y| x.overlaps(&y)));
    hit(a.writes(), b.reads()) || hit(a.writes(), b.writes()) || hit(a.reads(), b.writes())
}

/// The first pair `(written, other)` of buffer arguments of one dispatch where a written argument
/// overlaps another buffer argument, if any.
pub fn write_alias(args: &[Arg]) -> Option<(usize, usize)> {
    let buffers = || {
        args.iter().enumerate().filter_map(|(i, a)| match a {
            Arg::Buffer(b, access) => Some((i, Range::of(b), *access)),
            Arg::Scalar(_) => None,
        })
    };
    buffers()
        .filter(|(_, _, access)| access.writes())
        .find_map(|(i, mine, _)| {
            buffers()
                .find(|(j, other, _)| *j != i && mine.overlaps(other))
                .map(|(j, _, _)| (i, j))
        })
}
