//! A tail split's descendant index file: written durably at the split,
//! found, read and checked against its manifest record at open.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use crate::error::{Error, IoContext, Result};
use crate::format::manifest::TailMove;
use crate::format::tail_index::{self, TailIndex};
use crate::storage::fault::IoOp;
use crate::storage::{sync_dir, sync_file};
use crate::topic::{partition_dir, Topic};

use super::TailInfo;

/// Writes the descendant index durably: the file, then its directory.
pub(super) fn write_index(topic: &Topic, path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    let hook = &*topic.inner.core.hook;
    hook.before(IoOp::WriteIndex, path).at(path)?;
    let mut f = crate::storage::file::create_scratch(path)?;
    f.write_all(bytes).at(path)?;
    sync_file(hook, IoOp::SyncNewSegment, &f, path, true)?;
    let dir = path.parent().expect("the topic directory");
    sync_dir(hook, IoOp::SyncNewDir, dir)
}

/// Where a committed tail split's descendant index is: the topic's
/// directory, or the first child's for splits written before.
fn index_path(topic_dir: &std::path::Path, m: &TailMove, first: u32) -> PathBuf {
    if m.index_in_topic_dir {
        topic_dir.join(tail_index::file_name(m.parent))
    } else {
        partition_dir(topic_dir, first).join(tail_index::file_name(m.parent))
    }
}

/// Loads a topic's committed tail splits at open: reads and checks each
/// descendant index. Returns them by parent.
///
/// An index file that is missing or does not match its manifest record
/// is damage: `Strict` refuses the log naming the file. `Truncate` and
/// `Salvage` (with `report`) go on with the split's range and counts from
/// the manifest and a conservative translation (positions inside the
/// moved range resume the children at their first moved record, so
/// records may be read again but none is skipped), and report it at every
/// open. Any other error reading the file (permissions, descriptors) is
/// not damage and fails the open.
pub(crate) fn load_tails(
    topic_dir: &std::path::Path,
    moves: &[TailMove],
    mut report: Option<(
        crate::config::RecoveryMode,
        &mut crate::recovery::RecoveryReport,
    )>,
) -> Result<BTreeMap<u32, Arc<TailInfo>>> {
    let mut out = BTreeMap::new();
    for m in moves {
        let Some(&first) = m.children.first() else {
            continue;
        };
        let path = index_path(topic_dir, m, first);
        let index = match read_index(&path, m) {
            Ok(index) => index,
            Err(e) => {
                let damage = match &e {
                    Error::Corruption { .. } => true,
                    Error::Io { source, .. } => source.kind() == std::io::ErrorKind::NotFound,
                    _ => false,
                };
                match report.as_mut() {
                    Some((mode, report))
                        if damage && *mode != crate::config::RecoveryMode::Strict =>
                    {
                        report.add(
                            &path,
                            crate::recovery::FileAction::DescendantIndexLost {
                                parent: m.parent,
                                moved_offsets: (m.from, m.seal_offset),
                                reason: e.to_string(),
                            },
                        );
                        TailIndex::without_slots(m.parent, m.from, m.seal_offset, m.counts.clone())
                    }
                    _ => return Err(e),
                }
            }
        };
        out.insert(
            m.parent,
            Arc::new(TailInfo {
                children: m.children.clone(),
                index,
                reclaimed: m.reclaimed.into(),
            }),
        );
    }
    Ok(out)
}

/// The longest descendant index of the move `m` that is read: exactly
/// the length of the file its split wrote (a slot byte per moved record,
/// which no fixed cap bounds). A longer file is not that index, and is
/// refused before it is read whole.
fn index_max_bytes(m: &TailMove) -> u64 {
    TailIndex::file_len(m.from, m.seal_offset)
}

/// Reads a descendant index and checks it against its manifest record.
fn read_index(path: &std::path::Path, m: &TailMove) -> Result<TailIndex> {
    let file = crate::storage::file::open_file(path, crate::storage::file::Access::Read)?;
    let bytes = crate::storage::file::read_to_end(&file, path, index_max_bytes(m))?;
    let bad = |reason: String| Error::Corruption {
        file: path.to_path_buf(),
        position: 0,
        reason,
    };
    if TailIndex::crc(&bytes) != m.index_crc {
        return Err(bad(
            "descendant index does not match its manifest record".into()
        ));
    }
    let index = TailIndex::decode(&bytes).map_err(bad)?;
    if index.from != m.from || index.seal != m.seal_offset || index.counts() != m.counts {
        return Err(bad(
            "descendant index does not match its manifest record".into()
        ));
    }
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The read cap of a descendant index admits the file a split of any
    /// size writes (a slot byte per moved record: a split moving more
    /// than 2^30 records writes more than a GiB), and nothing longer.
    #[test]
    fn the_descendant_index_cap_admits_the_index_of_a_split_of_any_size() {
        for moved in [0u64, 1, 4096, 1 << 30, 1 << 31, 1 << 40] {
            let m = TailMove {
                parent: 0,
                from: 7,
                seal_offset: 7 + moved,
                children: vec![1, 2],
                counts: vec![moved, 0],
                index_crc: 0,
                reclaimed: false,
                index_in_topic_dir: true,
            };
            assert_eq!(
                index_max_bytes(&m),
                TailIndex::file_len(m.from, m.seal_offset),
                "{moved} records moved"
            );
        }
    }
}
