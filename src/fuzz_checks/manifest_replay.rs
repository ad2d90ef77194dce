//! Checks of manifest replay and snapshots.

use super::*;

/// `topology::manifest::replay` on arbitrary journal (or snapshot) bytes:
/// a typed error or a state that passes `model::check_state`; whatever a
/// lenient mode accepts replays again, strictly, from its valid prefix to
/// the same state (C7). Byte 0: bit 0 prepends a valid journal header,
/// bit 1 reads the rest as a snapshot instead.
pub fn check_manifest_replay(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    if sel & 2 != 0 {
        check_snapshot(rest);
        return;
    }
    let mut journal = Vec::new();
    if sel & 1 == 1 {
        journal.extend_from_slice(&mfmt::encode_file_header(mfmt::JOURNAL_MAGIC));
    }
    journal.extend_from_slice(rest);
    replay_all_modes(None, &journal);
}

pub(super) fn replay_all_modes(snapshot: Option<(u64, mfmt::ManifestState)>, journal: &[u8]) {
    let path = Path::new("manifest.log");
    let mut strict_state = None;
    for mode in MODES {
        let Ok((state, _seq, valid_end, _report)) =
            manifest::replay(snapshot.clone(), journal, path, mode)
        else {
            assert!(
                strict_state.is_none(),
                "{mode:?} replay fails where strict replay succeeded"
            );
            continue;
        };
        if let Err(e) = model::check_state(&state) {
            panic!("{mode:?} replay produced an inconsistent state: {e}");
        }
        assert!(
            valid_end as usize <= journal.len(),
            "valid_end past the journal"
        );
        if let Some(s) = &strict_state {
            assert_eq!(s, &state, "{mode:?} replay differs from strict replay");
        }
        // Open cuts the journal at valid_end; the next open must agree.
        let cut = &journal[..valid_end as usize];
        match manifest::replay(snapshot.clone(), cut, path, RecoveryMode::Strict) {
            Ok((again, ..)) => {
                assert_eq!(again, state, "{mode:?}: replay of the cut journal differs")
            }
            Err(e) => panic!("{mode:?}: the journal cut at its valid end does not replay: {e}"),
        }
        if mode == RecoveryMode::Strict {
            strict_state = Some(state);
        }
    }
}

pub(super) fn check_snapshot(buf: &[u8]) {
    if mfmt::check_file_header(buf, mfmt::SNAPSHOT_MAGIC).is_err() {
        return;
    }
    let Ok(frame) = mfmt::decode_frame(&buf[mfmt::MANIFEST_HEADER_LEN..]) else {
        return;
    };
    let Ok(state) = serde_json::from_slice::<mfmt::ManifestState>(frame.payload) else {
        return;
    };
    if model::check_state(&state).is_err() {
        return;
    }
    let json = serde_json::to_vec(&state).expect("a state serializes");
    let back: mfmt::ManifestState = serde_json::from_slice(&json)
        .unwrap_or_else(|e| panic!("re-serialized snapshot does not parse: {e}"));
    assert_eq!(back, state, "snapshot state round trip");
    let journal = mfmt::encode_file_header(mfmt::JOURNAL_MAGIC);
    replay_all_modes(Some((frame.seq, state)), &journal);
}
