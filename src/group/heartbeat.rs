//! The background heartbeat of a [`super::Member`]: a thread that tells
//! the coordinator the member is alive, independently of processing, until
//! the member handle goes.

use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};

use super::Runtime;

/// A running heartbeat thread; dropping it stops the thread and waits for
/// it.
#[derive(Debug)]
pub(super) struct HeartbeatThread {
    stop: Arc<(Mutex<bool>, Condvar)>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Drop for HeartbeatThread {
    fn drop(&mut self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if let Some(h) = self.handle.take() {
            // A heartbeat that panicked has nothing left to stop.
            let _ = h.join();
        }
    }
}

/// Heartbeats member `id` every `every` while the group's runtime lives
/// and the member is one. [`Error::ThreadSpawn`] if the OS refused the
/// thread: the member would otherwise look alive to its caller and be
/// declared dead after its session timeout.
pub(super) fn spawn_heartbeat(
    runtime: Weak<Runtime>,
    id: u64,
    every: Duration,
) -> Result<HeartbeatThread> {
    let stop = Arc::new((Mutex::new(false), Condvar::new()));
    let stop_thread = stop.clone();
    let handle = std::thread::Builder::new()
        .name("fissionlog-heartbeat".into())
        .spawn(move || loop {
            {
                let mut stopped = stop_thread.0.lock();
                if *stopped {
                    return;
                }
                stop_thread.1.wait_for(&mut stopped, every);
                if *stopped {
                    return;
                }
            }
            let Some(runtime) = runtime.upgrade() else {
                return;
            };
            // Fenced (or the log closed): nothing to keep alive any more.
            if runtime.heartbeat(id).is_err() {
                return;
            }
        })
        .map_err(|source| Error::ThreadSpawn {
            thread: "fissionlog-heartbeat".to_string(),
            source,
        })?;
    Ok(HeartbeatThread {
        stop,
        handle: Some(handle),
    })
}
