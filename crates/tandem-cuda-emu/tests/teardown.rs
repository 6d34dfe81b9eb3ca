//! Destroying a stream, or the context that holds streams, ends their worker threads. One
//! test: it counts the process's threads.

mod common;

use std::time::{Duration, Instant};

use common::*;

/// The threads of this process (Linux's `/proc/self/status`).
fn threads() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Threads:")).unwrap();
    line["Threads:".len()..].trim().parse().unwrap()
}

/// Whether the thread count comes back to `count` (a worker ends after its stream's last
/// work, on its own time).
fn back_to(count: usize) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if threads() == count {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

#[test]
fn destroyed_streams_end_their_threads() {
    check!(cuInit(0));
    let before = threads();
    let ctx = context(0);
    let streams: Vec<Handle> = (0..8).map(|_| stream()).collect();
    assert!(threads() >= before + 8, "a worker thread a stream");
    for s in streams {
        check!(cuStreamDestroy_v2(s));
    }
    check!(cuCtxDestroy_v2(ctx));
    assert!(back_to(before), "{} threads, {before} before", threads());
    let ctx = context(1);
    for _ in 0..8 {
        stream();
    }
    check!(cuCtxDestroy_v2(ctx));
    assert!(back_to(before), "{} threads, {before} before", threads());
}
