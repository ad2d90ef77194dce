//! Group commit for `acks quorum` on topics that don't sync every append:
//! one thread runs `Log::sync` whenever someone asked since its last
//! round, so concurrent requests share one round, and their
//! [`fissionlog::Durable`] futures resolve when it completes.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use fissionlog::Log;

#[derive(Default)]
struct State {
    wanted: bool,
    stop: bool,
}

pub(crate) struct Syncer {
    state: Arc<(Mutex<State>, Condvar)>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Syncer {
    pub fn start(log: Arc<Log>) -> Syncer {
        let state: Arc<(Mutex<State>, Condvar)> = Arc::default();
        let s = state.clone();
        let thread = std::thread::Builder::new()
            .name("broker-syncer".into())
            .spawn(move || loop {
                {
                    let mut st = match s.0.lock() {
                        Ok(g) => g,
                        Err(_) => return,
                    };
                    while !st.wanted && !st.stop {
                        st = match s.1.wait(st) {
                            Ok(g) => g,
                            Err(_) => return,
                        };
                    }
                    if st.stop {
                        return;
                    }
                    st.wanted = false;
                }
                let started = std::time::Instant::now();
                let r = log.sync();
                metrics::histogram!(super::metrics::names::SYNC_ROUND_SECONDS)
                    .record(started.elapsed());
                if let Err(e) = r {
                    // The waiting futures see the failure (a poisoned
                    // partition, a failed round) and answer with it.
                    tracing::error!(error = %e, "sync round failed");
                }
            })
            .ok();
        Syncer {
            state,
            thread: Mutex::new(thread),
        }
    }

    /// Asks for a sync round after this call.
    pub fn request(&self) {
        if let Ok(mut st) = self.state.0.lock() {
            st.wanted = true;
            self.state.1.notify_one();
        }
    }

    /// Stops the thread (after its current round) and drops its log handle.
    pub fn stop(&self) {
        if let Ok(mut st) = self.state.0.lock() {
            st.stop = true;
            self.state.1.notify_one();
        }
        if let Some(h) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = h.join();
        }
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        self.stop();
    }
}
