//! Group requests: join, heartbeat, poll, commit, leave. Each member
//! belongs to the connection that joined it; the broker relays the
//! client's heartbeats to the library's coordinator.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fissionlog::{Error, GroupOptions, MemberOptions};

use super::auth::Access;
use super::conn::Conn;
use super::handlers::{
    blocking, lib, refused, response_budget, topic_for, wait_cap, Reply, RECORD_OVERHEAD,
};
use crate::protocol::{ErrorCode, PolledRecord, Request, Response};

pub(super) async fn join(
    conn: &Conn,
    topic: &str,
    group: &str,
    session_timeout_ms: u32,
    processing_timeout_ms: u32,
    instance_id: Option<String>,
) -> Reply {
    let t = topic_for(conn, topic, Access::Read(topic))?;
    if conn.members.lock().map_or(0, |m| m.len()) >= conn.shared.config.max_members_per_connection {
        return Err(refused(
            ErrorCode::Refused,
            "too many group members on this connection",
        ));
    }
    let group = group.to_string();
    let max_record_cost = t.config().effective_max_record_bytes() as usize + RECORD_OVERHEAD;
    let member = blocking(move || {
        let g = t.group(&group, GroupOptions::default())?;
        g.join(MemberOptions {
            session_timeout: Duration::from_millis(u64::from(session_timeout_ms.max(1))),
            processing_timeout: Duration::from_millis(u64::from(processing_timeout_ms.max(1))),
            instance_id,
            // The broker relays its client's heartbeats.
            background_heartbeat: None,
        })
    })
    .await?
    .map_err(lib)?;
    let (id, generation) = (member.id(), member.generation());
    let mut members = conn
        .members
        .lock()
        .map_err(|_| refused(ErrorCode::Internal, "member table poisoned"))?;
    let joined = super::conn::Joined {
        member,
        max_record_cost,
    };
    members.insert(id, Arc::new(std::sync::Mutex::new(joined)));
    Ok(Response::Joined {
        member: id,
        generation,
    })
}

fn slot(conn: &Conn, member: u64) -> Result<super::conn::MemberSlot, (ErrorCode, String)> {
    conn.members
        .lock()
        .ok()
        .and_then(|m| m.get(&member).cloned())
        .ok_or_else(|| {
            refused(
                ErrorCode::UnknownMember,
                format!("member {member} was not joined on this connection"),
            )
        })
}

fn forget_if_fenced(conn: &Conn, member: u64, e: &Error) {
    if matches!(e, Error::Fenced { .. }) {
        if let Ok(mut m) = conn.members.lock() {
            m.remove(&member);
        }
    }
}

pub(super) async fn member_call(
    conn: &Conn,
    opcode: u8,
    member: u64,
    f: impl FnOnce(&mut fissionlog::Member) -> fissionlog::Result<()> + Send + 'static,
) -> Reply {
    let s = slot(conn, member)?;
    let r = blocking(move || {
        let mut m = s.lock().map_err(|_| Error::Closed)?;
        f(&mut m.member).map(|()| m.member.generation())
    })
    .await?;
    match r {
        Ok(generation) => Ok(Response::Done { opcode, generation }),
        Err(e) => {
            forget_if_fenced(conn, member, &e);
            Err(lib(e))
        }
    }
}

pub(super) async fn leave(conn: &Conn, member: u64) -> Reply {
    let s = slot(conn, member)?;
    if let Ok(mut m) = conn.members.lock() {
        m.remove(&member);
    }
    let opcode = Request::LeaveGroup { member }.opcode();
    let r = blocking(move || match Arc::try_unwrap(s) {
        Ok(m) => match m.into_inner() {
            Ok(m) => m.member.leave().map(|()| 0),
            Err(_) => Err(Error::Closed),
        },
        // A poll still holds it: dropping it stops its heartbeats, and the
        // session timeout removes it.
        Err(_) => Ok(0),
    })
    .await?;
    r.map(|generation| Response::Done { opcode, generation })
        .map_err(lib)
}

pub(super) async fn group_poll(
    conn: &Conn,
    member: u64,
    max_records: u32,
    max_bytes: u32,
    max_wait_ms: u32,
) -> Reply {
    let s = slot(conn, member)?;
    let deadline = Instant::now() + wait_cap(conn, max_wait_ms);
    let budget = response_budget(conn, max_bytes);
    let max_records = (max_records as usize).clamp(1, 100_000);
    loop {
        let s2 = s.clone();
        let got = blocking(move || poll_within(&s2, max_records, budget)).await?;
        let (generation, records) = match got {
            Ok(x) => x,
            Err(e) => {
                forget_if_fenced(conn, member, &e);
                return Err(lib(e));
            }
        };
        let now = Instant::now();
        if !records.is_empty() || now >= deadline || conn.shared.shutting_down() {
            conn.shared
                .stats
                .records_sent
                .fetch_add(records.len() as u64, Ordering::Relaxed);
            return Ok(Response::Polled {
                generation,
                records,
            });
        }
        tokio::time::sleep(Duration::from_millis(5).min(deadline - now)).await;
    }
}

/// Polls the member in rounds small enough that every record handed out
/// fits the response (a record the library hands out must reach the
/// client, or the next commit would skip it).
fn poll_within(
    s: &super::conn::MemberSlot,
    max_records: usize,
    budget: usize,
) -> fissionlog::Result<(u64, Vec<PolledRecord>)> {
    let mut m = s.lock().map_err(|_| Error::Closed)?;
    let mut out = Vec::new();
    let mut left = budget;
    loop {
        // Each round asks for no more records than the budget left holds
        // at the topic's largest record; the first round takes at least
        // one, so a budget under one record still makes progress.
        let per = left / m.max_record_cost.max(1);
        let per = if out.is_empty() { per.max(1) } else { per };
        let n = per.min(max_records - out.len());
        if n == 0 {
            break;
        }
        let got = m.member.poll(n)?;
        if got.is_empty() {
            break;
        }
        let mut overflow = false;
        for r in got {
            if super::producers::is_stamp(r.key.as_deref()) {
                continue;
            }
            let cost = r.value.len() + r.key.as_ref().map_or(0, Vec::len) + RECORD_OVERHEAD;
            if cost > left {
                overflow = true;
            }
            left = left.saturating_sub(cost);
            out.push(PolledRecord {
                partition: r.partition,
                offset: r.offset,
                timestamp: r.timestamp,
                key: r.key.map(Bytes::from),
                value: Bytes::from(r.value),
            });
        }
        if overflow || out.len() >= max_records {
            break;
        }
    }
    Ok((m.member.generation(), out))
}
