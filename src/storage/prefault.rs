//! Prefaulting segment pages ahead of the writer.
//!
//! The first touch of each page of a fresh (fallocated, unwritten) segment
//! faults, and the kernel zero-fills the page cache pages (with readahead,
//! whole windows at a time). Measured on the target machine, that zeroing
//! was about 45% of a single-record append's time. A background thread
//! asks the kernel to populate the pages a few MiB ahead of the writer with
//! `MADV_POPULATE_READ`, which brings them into the page cache *clean* (no
//! extra write-back of zeros, unlike `MADV_POPULATE_WRITE`); the writer's
//! later store costs only a cheap write-protect fault.
//!
//! The thread never reads or writes the mapped bytes itself (the kernel
//! does the faulting), so it cannot race with the writer or readers. A
//! request holds an `Arc<Segment>`, which keeps the mapping alive for the
//! duration of the call. Where `MADV_POPULATE_READ` is unavailable (Linux
//! before 5.14) the request fails harmlessly and the writer faults as before.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, OnceLock};

use super::segment::Segment;

/// How far ahead of the write position pages are populated.
pub const PREFAULT_AHEAD: u64 = 8 << 20;
/// Size of one populate request.
pub const PREFAULT_CHUNK: u64 = 2 << 20;

struct Request {
    segment: Arc<Segment>,
    start: u64,
    len: u64,
}

fn sender() -> Option<Sender<Request>> {
    static TX: OnceLock<Option<Mutex<Sender<Request>>>> = OnceLock::new();
    let tx = TX.get_or_init(|| {
        let (tx, rx) = channel::<Request>();
        std::thread::Builder::new()
            .name("fissionlog-prefault".into())
            .spawn(move || {
                for r in rx {
                    r.segment.populate(r.start, r.len);
                }
            })
            .ok()
            .map(|_| Mutex::new(tx))
    });
    tx.as_ref().and_then(|m| m.lock().ok().map(|g| g.clone()))
}

/// Asks the prefault thread to populate `[start, start + len)` of `segment`.
pub(crate) fn request(segment: Arc<Segment>, start: u64, len: u64) {
    thread_local! {
        static TX: Option<Sender<Request>> = sender();
    }
    TX.with(|tx| {
        if let Some(tx) = tx {
            let _ = tx.send(Request {
                segment,
                start,
                len,
            });
        }
    });
}
