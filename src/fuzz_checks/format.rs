//! Checks of the pure byte layers: batches, checkpoints, segment scans.

use super::*;
use crate::recovery::scan::ScanOutcome;

/// `format::batch`: `validate` never panics; a valid batch iterates exactly
/// `record_count` well-formed records with consecutive offsets, and
/// re-encoding them gives a batch with the same payload.
pub fn check_batch_decode(data: &[u8]) {
    let _ = batch::parse_header(data);
    let Ok(h) = batch::validate(data, None) else {
        return;
    };
    if h.magic.get() == batch::BATCH_MAGIC_V2 {
        return check_batch_v2(data);
    }
    let base = h.base_offset.get();
    let len = h.batch_len.get() as usize;
    assert!(len <= data.len(), "validated batch longer than its input");
    assert!(
        batch::validate(data, Some(base)).is_ok(),
        "batch does not validate at its own base offset"
    );
    assert!(
        batch::validate(data, Some(base.wrapping_add(1))).is_err(),
        "batch validates at a foreign offset"
    );
    if batch::is_hole(&h) {
        return;
    }
    let mut records = Vec::new();
    for (i, r) in RecordIter::new(data, &h).enumerate() {
        let r = r.unwrap_or_else(|e| panic!("record {i} of a validated batch is invalid: {e}"));
        assert_eq!(
            r.offset,
            base + i as u64,
            "record offsets are not consecutive"
        );
        records.push(batch::RecordIn {
            key: r.key,
            value: r.value,
            timestamp: r.timestamp,
        });
    }
    assert_eq!(
        records.len() as u64,
        u64::from(h.record_count.get()),
        "record count differs from the header"
    );
    let mut again = vec![0u8; batch::batch_len(&records)];
    batch::encode_batch(&mut again, base, &records);
    assert_eq!(
        &again[batch::BATCH_HEADER_LEN..],
        &data[batch::BATCH_HEADER_LEN..len],
        "re-encoded records differ"
    );
    assert!(
        batch::validate(&again, Some(base)).is_ok(),
        "re-encoded batch is invalid"
    );
}

/// `format::batch`, format 2: `validate` never panics; a valid format-2
/// batch carries its log id, a control batch yields no record and a known
/// kind, and encoding what was decoded (records or control body, with the
/// same base offset, log id and timestamps) gives back the same bytes,
/// CRC included.
pub fn check_batch_v2(data: &[u8]) {
    let _ = batch::parse_header(data);
    let Ok(f) = batch::validate_fields(data, None) else {
        return;
    };
    if f.magic != batch::BATCH_MAGIC_V2 {
        return;
    }
    let len = f.batch_len as usize;
    let h = batch::header_v2(data).expect("a validated format-2 batch has a format-2 header");
    assert!(
        !f.is_hole(),
        "a format-2 batch validated with the hole flag"
    );
    let mut again = vec![0u8; len];
    if f.is_control() {
        assert_eq!(f.record_count, 0, "a control batch validated with records");
        assert_eq!(
            RecordIter::from_fields(data, &f).count(),
            0,
            "a control batch yields records"
        );
        let (kind, body) = batch::control_body(data).expect("a validated control batch has a body");
        assert_eq!(f.first_ts, f.max_ts, "a control batch's timestamps differ");
        let entry = batch::EntryBody::Control(kind, body);
        assert_eq!(entry.batch_len(), len, "control body length differs");
        batch::encode_batch_v2(&mut again, f.base_offset, h.log_id(), entry, f.first_ts);
    } else {
        let mut records = Vec::new();
        for (i, r) in RecordIter::from_fields(data, &f).enumerate() {
            let r = r.unwrap_or_else(|e| panic!("record {i} of a validated batch is invalid: {e}"));
            assert_eq!(
                r.offset,
                f.base_offset + i as u64,
                "record offsets are not consecutive"
            );
            records.push(batch::RecordIn {
                key: r.key,
                value: r.value,
                timestamp: r.timestamp,
            });
        }
        assert_eq!(
            records.len() as u64,
            u64::from(f.record_count),
            "record count differs"
        );
        let entry = batch::EntryBody::Records(&records);
        assert_eq!(entry.batch_len(), len, "records fill a different length");
        let header = batch::encode_batch_v2(&mut again, f.base_offset, h.log_id(), entry, 0);
        if header.base.first_ts.get() != f.first_ts || header.base.max_ts.get() != f.max_ts {
            // Timestamps in the header are the writer's claim about its
            // records: a foreign claim that validates is not a re-encoding.
            return;
        }
    }
    assert_eq!(
        &again[..],
        &data[..len],
        "re-encoded format-2 batch differs"
    );
}

// ------------------------------------------------------------- checkpoints

/// `format::checkpoint`: decoding never panics; whatever decodes encodes to
/// bytes that decode to the same value (compared through its encoding, so
/// NaN rates compare equal to themselves).
pub fn check_checkpoint_decode(data: &[u8]) {
    let Ok(c) = checkpoint::decode_checkpoint(data) else {
        return;
    };
    let bytes = checkpoint::encode_checkpoint(&c);
    let back = checkpoint::decode_checkpoint(&bytes)
        .unwrap_or_else(|e| panic!("re-encoded checkpoint does not decode: {e}"));
    assert_eq!(
        checkpoint::encode_checkpoint(&back),
        bytes,
        "checkpoint round trip changed the value"
    );
}

// ---------------------------------------------------------------- segments

/// Builds the segment file a `segment_scan` input describes: byte 0 chooses
/// whether a valid segment header is prepended (bit 0) and which base offset
/// it names (bits 1-2), so the fuzzer starts past the header.
pub(super) fn segment_input(data: &[u8]) -> (Vec<u8>, u64, u8) {
    let Some((&sel, rest)) = data.split_first() else {
        return (Vec::new(), 0, 0);
    };
    let base = match (sel >> 1) & 3 {
        0 => 0,
        1 => 100,
        2 => u64::from(u32::MAX) - 3,
        _ => u64::MAX - 3,
    };
    if sel & 1 == 1 {
        let mut f = encode_header(1, 0, base, 0).to_vec();
        f.extend_from_slice(rest);
        (f, base, sel)
    } else {
        (rest.to_vec(), base, sel)
    }
}

/// `recovery::scan::scan_segment` on arbitrary bytes, in every mode and for
/// several durable positions: see `check_scan_outcome`.
pub fn check_segment_scan(data: &[u8]) {
    let (file, base, sel) = segment_input(data);
    let len = file.len() as u64;
    let interval = if sel & 8 == 0 { 4096 } else { 64 };
    for durable_until in [0, SEGMENT_HEADER_LEN as u64, len / 2, len, len + 1] {
        for mode in MODES {
            let p = ScanParams {
                base_offset: base,
                from_pos: SEGMENT_HEADER_LEN as u64,
                from_offset: base,
                durable_until,
                mode,
                index_interval: interval,
                batch_version: 1,
            };
            check_scan_outcome(&file, &p);
        }
    }
}

/// The contract of one scan: the scanned range `[64, end_pos)` is made of
/// valid batches (salvage holes aside) at consecutive offsets, the counters
/// agree with the batches, and scanning the repaired file again finds the
/// same end (recovery is idempotent, C7).
pub(super) fn check_scan_outcome(file: &[u8], p: &ScanParams) {
    let o = scan_segment(file, p);
    let ctx = format!("mode {:?}, durable_until {}", p.mode, p.durable_until);
    if !check_scan_bounds(file, p, &o, &ctx) {
        return;
    }
    let walk = walk_scanned_range(file, p, &o, &ctx);
    assert_eq!(walk.pos, o.end_pos, "{ctx}: last batch overruns end_pos");
    assert_eq!(walk.offset, o.end_offset, "{ctx}: end_offset");
    assert_eq!(
        walk.records, o.records,
        "{ctx}: records counted != records iterated"
    );
    assert_eq!(walk.max_ts, o.max_ts, "{ctx}: max timestamp");
    for e in &o.index {
        let at = (
            u64::from(e.position),
            p.base_offset + u64::from(e.rel_offset),
        );
        assert!(
            walk.batch_starts.contains(&at),
            "{ctx}: index entry {e:?} names no batch start"
        );
    }
    check_rescan_of_repair(file, p, &o, &ctx);
}

/// Where a scan may end and what it may report; false when the file holds
/// no data past its header (nothing more to check).
fn check_scan_bounds(file: &[u8], p: &ScanParams, o: &ScanOutcome, ctx: &str) -> bool {
    if file.len() as u64 <= SEGMENT_HEADER_LEN as u64 {
        assert_eq!(o.end_pos, p.from_pos, "{ctx}: data found in an empty file");
        assert!(
            o.holes.is_empty() && o.records == 0,
            "{ctx}: data found in an empty file"
        );
        return false;
    }
    assert!(o.end_pos >= p.from_pos, "{ctx}: end before start");
    assert!(
        o.end_pos <= (file.len() as u64).max(p.from_pos),
        "{ctx}: end past the file"
    );
    if p.mode != RecoveryMode::Salvage {
        assert!(o.holes.is_empty(), "{ctx}: holes outside salvage mode");
    }
    true
}

/// What walking the scanned range batch by batch found.
struct Walk {
    pos: u64,
    offset: u64,
    records: u64,
    max_ts: i64,
    /// (position, offset) of every batch and hole.
    batch_starts: Vec<(u64, u64)>,
}

/// Walks `[64, end_pos)`: every batch validates at its expected offset and
/// yields its records at consecutive offsets; every salvage hole lies
/// inside the range and loses at least one offset.
fn walk_scanned_range(file: &[u8], p: &ScanParams, o: &ScanOutcome, ctx: &str) -> Walk {
    let mut w = Walk {
        pos: SEGMENT_HEADER_LEN as u64,
        offset: p.from_offset,
        records: 0,
        max_ts: i64::MIN,
        batch_starts: Vec::new(),
    };
    let mut holes = o.holes.iter().peekable();
    while w.pos < o.end_pos {
        let pos = w.pos;
        if let Some(h) = holes.next_if(|h| h.position == pos) {
            assert!(h.lost > 0, "{ctx}: salvage hole at {pos} loses no offsets");
            assert!(
                h.len >= batch::BATCH_HEADER_LEN as u64 && pos + h.len <= o.end_pos,
                "{ctx}: salvage hole at {pos} outside the scanned range"
            );
            assert_eq!(
                h.first_offset, w.offset,
                "{ctx}: hole starts at the wrong offset"
            );
            w.batch_starts.push((pos, w.offset));
            w.pos += h.len;
            w.offset += h.lost;
            continue;
        }
        let bytes = &file[pos as usize..o.end_pos as usize];
        let hdr = batch::validate(bytes, Some(w.offset)).unwrap_or_else(|e| {
            panic!("{ctx}: invalid batch at {pos} inside the scanned range: {e}")
        });
        w.batch_starts.push((pos, w.offset));
        if !batch::is_hole(&hdr) {
            for (i, r) in RecordIter::new(bytes, &hdr).enumerate() {
                let r = r.unwrap_or_else(|e| panic!("{ctx}: bad record in batch at {pos}: {e}"));
                assert_eq!(r.offset, w.offset + i as u64, "{ctx}: record offsets");
                w.records += 1;
            }
            w.max_ts = w.max_ts.max(hdr.max_ts.get());
        }
        w.pos += u64::from(hdr.batch_len.get());
        w.offset += u64::from(hdr.record_count.get());
    }
    assert!(
        holes.next().is_none(),
        "{ctx}: hole outside the walked batches"
    );
    w
}

/// Repairs the file as recovery does (holes written, tail zeroed), then
/// scans it again: the same end, offset and count (C7).
fn check_rescan_of_repair(file: &[u8], p: &ScanParams, o: &ScanOutcome, ctx: &str) {
    let mut repaired = file[..o.end_pos as usize].to_vec();
    for h in &o.holes {
        let lost = u32::try_from(h.lost).expect("salvage holes span < 2^32 offsets");
        let at = h.position as usize..(h.position + h.len) as usize;
        batch::encode_hole(&mut repaired[at], h.first_offset, lost);
    }
    repaired.resize(file.len().max(o.end_pos as usize), 0);
    let again = scan_segment(
        &repaired,
        &ScanParams {
            durable_until: o.end_pos,
            mode: RecoveryMode::Strict,
            ..*p
        },
    );
    assert_eq!(
        again.stop,
        ScanStop::End,
        "{ctx}: rescan of the repaired file stopped"
    );
    assert_eq!(
        (again.end_pos, again.end_offset, again.records),
        (o.end_pos, o.end_offset, o.records),
        "{ctx}: rescan is not idempotent"
    );
}
