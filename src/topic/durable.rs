//! Waiting for durability without a thread per request.
//!
//! A broker acknowledges a produce request once its records are durable.
//! [`Topic::append_to`] under `SyncPolicy::Always` does that by blocking
//! the appending thread in a group commit; [`Topic::durable`] instead
//! returns a [`Durable`] future, so an async broker can append with another
//! policy (or from a thread that must not block) and await the durable
//! watermark: the future resolves once a completed sync round covers the
//! offset (`Partition::durable_end_offset` passed it). It needs no runtime
//! (a plain `std::future::Future`): the sync round that raises the
//! watermark of its partition wakes it (a round moving other partitions
//! does not, nor does an append), as do a failed fsync that poisons the
//! partition, a seal, and the log closing or the topic being deleted,
//! which resolve it with an error.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::error::{Error, Result};
use crate::topic::Topic;

/// Resolves once record `offset` of a partition is durable (see
/// [`Topic::durable`]).
#[derive(Debug, Clone)]
#[must_use = "a future does nothing unless awaited"]
pub struct Durable {
    topic: Topic,
    partition: u32,
    offset: u64,
}

impl Durable {
    /// `Some` once the wait is over: durable, or an error that will not
    /// go away (log closed, topic deleted, partition unknown or poisoned,
    /// sync rounds failing for good, offset that can never be written).
    fn check(&self) -> Option<Result<()>> {
        let p = match self.topic.partition(self.partition) {
            Ok(p) => p,
            Err(e) => return Some(Err(e)),
        };
        // A deleted topic's handle still holds its partitions (and a sync
        // round may still fsync their unlinked files): nothing of it will
        // ever be durable.
        if !self.topic.is_live() {
            return Some(Err(Error::UnknownTopic(self.topic.name().to_string())));
        }
        if p.durable_end_offset() > self.offset {
            return Some(Ok(()));
        }
        // The flag (a SeqCst load, paired with `poison`'s notify), then the
        // reason, which `poison` stores before the flag.
        if p.is_poisoned() {
            if let Err(e) = p.check_not_poisoned() {
                return Some(Err(e));
            }
        }
        // A failed checkpoint fsync fails every later sync round.
        if let Some(f) = &*self.topic.inner.core.sync_failure.lock() {
            return Some(Err(Error::Io {
                path: self.topic.inner.core.dir.clone(),
                source: std::io::Error::other(format!("an earlier sync failed: {f}")),
            }));
        }
        if p.is_sealed() && self.offset >= p.end_offset() {
            // Sealed below it: that offset is never written here.
            return Some(Err(Error::OffsetOutOfRange {
                partition: self.partition,
                offset: self.offset,
                start: p.start_offset(),
                end: p.end_offset(),
            }));
        }
        None
    }
}

impl Future for Durable {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        if let Some(r) = self.check() {
            return Poll::Ready(r);
        }
        // With this partition's wakers: a sync round wakes the futures of
        // the partitions whose durable end it moved, and no others.
        self.topic.inner.wake.register(self.partition, cx.waker());
        // Checked again after registering: a sync round that raised the
        // watermark in between either is seen here or wakes the waker.
        match self.check() {
            Some(r) => Poll::Ready(r),
            None => Poll::Pending,
        }
    }
}

impl Topic {
    /// A future that resolves once record `offset` of `partition` is
    /// durable: `Ok(())` when a completed sync round covered it (it then
    /// survives a power loss, C1), `Err` when it can no longer become
    /// durable: the log closed ([`Error::Closed`]), the topic was deleted
    /// ([`Error::UnknownTopic`]), a failed checkpoint fsync failed every
    /// later sync round ([`Error::Io`]), the partition was
    /// poisoned by a failed fsync ([`Error::Poisoned`]), or it was sealed
    /// below `offset` ([`Error::OffsetOutOfRange`]). An offset not written
    /// yet is waited for too. The future is woken by the sync round that
    /// moves the watermark; it does not sync by itself, so something must
    /// (`Log::sync`, `SyncPolicy::Interval`, or an `Always` append).
    pub fn durable(&self, partition: u32, offset: u64) -> Durable {
        Durable {
            topic: self.clone(),
            partition,
            offset,
        }
    }
}
