//! The safe public API keeps its memory promises whatever the caller does: a mapped window never
//! reaches past its map, and a graph run without barriers still never runs two conflicting
//! dispatches at once on the CPU backend.
#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

use std::sync::Arc;

use onepass::backend::cpu::map_allocation;
use onepass::backend::MappedMemory;
use onepass::graph::ComputeGraph;
use onepass::{DType, Device, Error, Executor};

/// A read-only anonymous map holding `0, 1, 2, ...` (mod 256).
fn map_of(len: usize) -> Arc<memmap2::Mmap> {
    let mut map = memmap2::MmapOptions::new()
        .len(len)
        .map_anon()
        .expect("an anonymous map");
    for (i, b) in map.iter_mut().enumerate() {
        *b = i as u8;
    }
    Arc::new(map.make_read_only().expect("a read-only map"))
}

fn is_view_error(r: Result<impl Sized, Error>, what: &str) {
    match r {
        Err(Error::View(msg)) => assert!(msg.contains("exceeds"), "{what}: {msg}"),
        Err(e) => panic!("{what}: expected a view error, got {e}"),
        Ok(_) => panic!("{what}: a window past the map was accepted"),
    }
}

#[test]
fn a_mapped_window_past_the_map_is_refused() {
    let map = map_of(64);
    is_view_error(MappedMemory::new(map.clone(), 0, 65), "one byte too long");
    is_view_error(MappedMemory::new(map.clone(), 64, 1), "starting at the end");
    is_view_error(MappedMemory::new(map.clone(), 65, 0), "empty, past the end");
    is_view_error(
        MappedMemory::new(map.clone(), usize::MAX, 2),
        "offset + len overflows",
    );
    is_view_error(map_allocation(map.clone(), 60, 8), "map_allocation");
    is_view_error(
        map_allocation(map, 1, usize::MAX),
        "map_allocation overflow",
    );
}

#[test]
fn a_mapped_window_inside_the_map_reads_its_bytes() {
    let map = map_of(64);
    let window = MappedMemory::new(map.clone(), 16, 48).unwrap();
    assert_eq!((window.offset(), window.len()), (16, 48));
    assert!(!window.is_empty());
    assert!(Arc::ptr_eq(window.map(), &map));
    assert!(MappedMemory::new(map.clone(), 64, 0).unwrap().is_empty());
    // SAFETY: the window's `len()` bytes from `as_ptr()` lie in the map, which `window` keeps
    // alive and nothing writes (it is read-only).
    let bytes = unsafe { std::slice::from_raw_parts(window.as_ptr(), window.len()) };
    assert_eq!(bytes, (16..64u8).collect::<Vec<_>>());

    // The same window as a CPU allocation.
    let alloc = map_allocation(map, 16, 48).unwrap();
    assert_eq!(alloc.size(), 48);
    assert_eq!(alloc.location(), "cpu (mapped file)");
}

/// y = x + x; z = y + y; w = z + z, pushed into a graph with no barrier at all.
#[test]
fn a_graph_without_barriers_still_runs_in_order() {
    let dev = Device::cpu(2).unwrap();
    let exec = Executor::new(dev.clone());
    let n = 4096;
    let host: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let x = dev.upload(&host, &[n]).unwrap();
    for round in 0..20 {
        let y = dev.alloc(DType::F32, &[n]).unwrap();
        let z = dev.alloc(DType::F32, &[n]).unwrap();
        let w = dev.alloc(DType::F32, &[n]).unwrap();
        let mut graph = ComputeGraph::new();
        graph.push(onepass::ops::elementwise::add(&x, &x, &y).unwrap());
        graph.push(onepass::ops::elementwise::add(&y, &y, &z).unwrap());
        graph.push(onepass::ops::elementwise::add(&z, &z, &w).unwrap());
        assert_eq!(graph.barrier_count(), 0);
        exec.run(&graph, false).unwrap();
        let got = dev.download::<f32>(&w).unwrap();
        let want: Vec<f32> = host.iter().map(|v| v * 8.0).collect();
        assert_eq!(got, want, "round {round}");
    }
}
