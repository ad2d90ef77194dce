//! An offline check of a replicated run's history: every acknowledged
//! write, every record a consumer read (with the isolation it read at),
//! against the final committed log every live node converged on.
//!
//! The rules, one `Violation` each:
//! - no acknowledged write is missing from the final log (read back at
//!   the offset its acknowledgement reported);
//! - no read saw a record that is not in the final committed log (an
//!   uncommitted record, or one truncated later);
//! - no value appears twice in the final log: every write the tests make
//!   carries a value of its own, and a retried write is either made with
//!   an idempotent producer stamp or not retried at all, so a second copy
//!   is a duplicate the log let through;
//! - the values of one key sit in the log in the order they were
//!   acknowledged.

use std::collections::{BTreeMap, HashMap};

use fissionlog_raft::client::ReadRecord;

/// A write the cluster acknowledged as committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acked {
    /// Its key.
    pub key: String,
    /// Its value, unique across the run.
    pub value: String,
    /// The offset the acknowledgement reported.
    pub offset: u64,
}

/// The isolation a consumer read at. The node serves committed reads
/// only (records below the high watermark), so that is the one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Only records below the high watermark.
    Committed,
}

/// A record a consumer read during the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// What it read.
    pub record: ReadRecord,
    /// How it read.
    pub isolation: Isolation,
}

/// A broken rule, with what shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// The final log's offsets are not 0, 1, 2, …
    NotDense { index: usize, offset: u64 },
    /// An acknowledged write is not at its offset in the final log.
    LostWrite {
        acked: Acked,
        found: Option<(String, String)>,
    },
    /// A read saw a record the final committed log does not hold.
    PhantomRead {
        observed: Observed,
        final_record: Option<Box<ReadRecord>>,
    },
    /// A value sits at two offsets of the final log.
    Duplicate { value: String, offsets: (u64, u64) },
    /// Two acknowledged values of one key sit in the log out of the order
    /// they were acknowledged in.
    OutOfOrder {
        key: String,
        earlier: (String, u64),
        later: (String, u64),
    },
}

fn text(r: &ReadRecord) -> (String, String) {
    (
        String::from_utf8_lossy(r.key.as_deref().unwrap_or_default()).into_owned(),
        String::from_utf8_lossy(&r.value).into_owned(),
    )
}

/// Checks `acks` (in the order they were acknowledged) and `observed`
/// against `final_log`; the first broken rule, if any.
pub fn check(
    acks: &[Acked],
    observed: &[Observed],
    final_log: &[ReadRecord],
) -> Result<(), Violation> {
    for (index, r) in final_log.iter().enumerate() {
        if r.offset != index as u64 {
            return Err(Violation::NotDense {
                index,
                offset: r.offset,
            });
        }
    }
    for a in acks {
        let found = final_log.get(a.offset as usize).map(text);
        if found.as_ref() != Some(&(a.key.clone(), a.value.clone())) {
            return Err(Violation::LostWrite {
                acked: a.clone(),
                found,
            });
        }
    }
    for o in observed {
        let final_record = final_log.get(o.record.offset as usize);
        let Isolation::Committed = o.isolation;
        if final_record != Some(&o.record) {
            return Err(Violation::PhantomRead {
                observed: o.clone(),
                final_record: final_record.cloned().map(Box::new),
            });
        }
    }
    let mut at: HashMap<String, u64> = HashMap::new();
    for r in final_log {
        let (_, value) = text(r);
        if let Some(first) = at.insert(value.clone(), r.offset) {
            return Err(Violation::Duplicate {
                value,
                offsets: (first, r.offset),
            });
        }
    }
    let mut last_per_key: BTreeMap<&str, (&str, u64)> = BTreeMap::new();
    for a in acks {
        // Present: the lost-write rule above saw it at its offset.
        let offset = at[&a.value];
        if let Some(&(earlier, earlier_offset)) = last_per_key.get(a.key.as_str()) {
            if earlier_offset > offset {
                return Err(Violation::OutOfOrder {
                    key: a.key.clone(),
                    earlier: (earlier.to_string(), earlier_offset),
                    later: (a.value.clone(), offset),
                });
            }
        }
        last_per_key.insert(&a.key, (&a.value, offset));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(offset: u64, key: &str, value: &str) -> ReadRecord {
        ReadRecord {
            offset,
            key: Some(key.as_bytes().to_vec()),
            value: value.as_bytes().to_vec(),
            timestamp_ms: 0,
        }
    }

    fn ack(key: &str, value: &str, offset: u64) -> Acked {
        Acked {
            key: key.into(),
            value: value.into(),
            offset,
        }
    }

    fn seen(r: ReadRecord) -> Observed {
        Observed {
            record: r,
            isolation: Isolation::Committed,
        }
    }

    fn log() -> Vec<ReadRecord> {
        vec![
            rec(0, "a", "a:0"),
            rec(1, "b", "b:0"),
            rec(2, "a", "a:1"),
            rec(3, "c", "c:0"),
        ]
    }

    #[test]
    fn a_consistent_history_passes_with_unacknowledged_committed_records_in_the_log() {
        // c:0 was never acknowledged (its call timed out) but committed.
        let acks = [ack("a", "a:0", 0), ack("b", "b:0", 1), ack("a", "a:1", 2)];
        let observed = [seen(rec(0, "a", "a:0")), seen(rec(2, "a", "a:1"))];
        assert_eq!(check(&acks, &observed, &log()), Ok(()));
    }

    #[test]
    fn an_acknowledged_write_missing_from_the_final_log_is_a_lost_write() {
        let acks = [ack("a", "a:0", 0), ack("d", "d:0", 4)];
        assert!(matches!(
            check(&acks, &[], &log()),
            Err(Violation::LostWrite { found: None, .. })
        ));
        // At an offset that holds another record: lost as well.
        let acks = [ack("b", "b:9", 1)];
        assert!(matches!(
            check(&acks, &[], &log()),
            Err(Violation::LostWrite { found: Some(_), .. })
        ));
    }

    #[test]
    fn a_read_of_a_record_the_final_log_does_not_hold_is_a_phantom_read() {
        // Past the final log's end: read while uncommitted.
        let observed = [seen(rec(4, "x", "x:0"))];
        assert!(matches!(
            check(&[], &observed, &log()),
            Err(Violation::PhantomRead {
                final_record: None,
                ..
            })
        ));
        // Replaced at its offset: read, then truncated and rewritten.
        let observed = [seen(rec(3, "x", "x:0"))];
        assert!(matches!(
            check(&[], &observed, &log()),
            Err(Violation::PhantomRead {
                final_record: Some(_),
                ..
            })
        ));
    }

    #[test]
    fn a_value_at_two_offsets_is_a_duplicate() {
        let mut l = log();
        l.push(rec(4, "a", "a:1"));
        assert_eq!(
            check(&[], &[], &l),
            Err(Violation::Duplicate {
                value: "a:1".into(),
                offsets: (2, 4)
            })
        );
    }

    #[test]
    fn values_of_one_key_in_the_log_against_their_acknowledgement_order_are_out_of_order() {
        // a:1 acknowledged before a:0, but the log holds a:0 first.
        let acks = [ack("a", "a:1", 2), ack("a", "a:0", 0)];
        assert!(matches!(
            check(&acks, &[], &log()),
            Err(Violation::OutOfOrder { .. })
        ));
    }

    #[test]
    fn a_final_log_with_a_gap_is_not_dense() {
        let mut l = log();
        l.remove(1);
        assert!(matches!(
            check(&[], &[], &l),
            Err(Violation::NotDense {
                index: 1,
                offset: 2
            })
        ));
    }
}
