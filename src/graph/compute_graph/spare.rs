//! The arrays of the last graph dropped on each thread, emptied, for the next one: recording a
//! step after dropping the previous one then allocates nothing.

use std::cell::RefCell;

use super::{Arrays, ComputeGraph};

thread_local! {
    static ARRAYS: RefCell<Option<Arrays>> = const { RefCell::new(None) };
}

/// Kept arrays, if this thread has some, else new ones.
pub(super) fn take() -> Arrays {
    ARRAYS
        .try_with(|a| a.try_borrow_mut().ok().and_then(|mut a| a.take()))
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Empties `graph` (its views' references are dropped here) and keeps its arrays.
pub(super) fn keep(graph: &mut ComputeGraph) {
    let mut arrays = std::mem::take(&mut graph.a);
    if arrays.headers.capacity() == 0 {
        return;
    }
    arrays.args.reset();
    arrays.views.clear();
    arrays.view_ranges.clear();
    arrays.headers.clear();
    arrays.spans.clear();
    arrays.range_views.clear();
    arrays.order.clear();
    arrays.scratch.clear();
    // A thread being torn down, or a slot already filled, frees the arrays instead.
    let _ = ARRAYS.try_with(|a| {
        if let Ok(mut a) = a.try_borrow_mut() {
            if a.is_none() {
                *a = Some(arrays);
            }
        }
    });
}
