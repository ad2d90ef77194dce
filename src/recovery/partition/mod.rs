//! Recovering one partition's segment chain, in two phases: [`open_chain`]
//! opens and maps every file and changes nothing; [`repair_chain`] walks
//! the files oldest first, lets the pure [`classify`] decide what each one
//! is, and lets [`apply::apply`] do what that takes (the only I/O).

mod apply;
pub(crate) mod classify;
pub(crate) mod keep;

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::RecoveryMode;
use crate::error::{Error, IoContext, Result};
use crate::format::checkpoint::PartitionCheckpoint;
use crate::format::segment::{HeaderInfo, SEGMENT_HEADER_LEN};
use crate::recovery::{FileAction, RecoveryReport};
use crate::storage::fault::IoOp;
use crate::storage::position::DurablePoint;
use crate::storage::segment::{parse_segment_file_name, segment_file_name, Segment};

use apply::Repairs;
use classify::{classify, Cursor, CutState, FileFacts, FileKind};

/// How recovery may act.
#[derive(Debug, Clone, Copy)]
pub struct RecoverMode {
    /// Repair files (false: analyse only, as `verify` and `--dry-run` do).
    pub write: bool,
    /// Scan everything, not only what follows the checkpoint.
    pub full_scan: bool,
    /// What to do with corruption in synced data.
    pub recovery: RecoveryMode,
}

/// A problem found in analyse-only mode (or refused in strict mode).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    /// The damaged (or missing) file.
    pub file: PathBuf,
    /// Byte position of the damage in it.
    pub position: u64,
    /// What is wrong.
    pub what: String,
    /// What `recover` would do about it.
    pub repair: String,
}

/// A recovered partition's segments and durable position.
#[derive(Debug)]
pub struct RecoveredChain {
    /// Segments, oldest first (may be empty for a sealed partition).
    pub segments: Vec<Segment>,
    /// Where the partition's data is known durable.
    pub durable: DurablePoint,
    /// Offset ranges that read as holes (salvaged damage, missing files).
    pub holes: Vec<Range<u64>>,
    /// Problems found (analyse-only mode).
    pub problems: Vec<Problem>,
    /// Offset the partition continues at: the end of the chain, never below
    /// an offset the checkpoint knows was handed out.
    pub next_offset: u64,
}

/// Inputs of partition recovery.
#[derive(Debug)]
pub struct ChainParams<'a> {
    /// Partition directory.
    pub dir: &'a Path,
    /// Which partition the segment headers must name.
    pub ids: PartitionIds,
    /// Bytes of data between two sparse index entries.
    pub index_interval: u64,
    /// The topic's segment size: no segment of it holds data past this
    /// position, so a seal that names a later one is damage.
    pub segment_bytes: u64,
    /// Checkpoint entry, when the checkpoint has one.
    pub checkpoint: Option<&'a PartitionCheckpoint>,
    /// The checkpoint was written by a clean shutdown.
    pub clean: bool,
    /// The manifest says the partition is sealed at this offset (retention
    /// may have emptied it). Every offset below the seal was handed out.
    pub sealed: Option<u64>,
    /// No valid checkpoint exists although the manifest knows partitions:
    /// both checkpoint files were damaged or removed (every log writes one
    /// at its first open, before any topic exists).
    pub checkpoint_lost: bool,
    /// One of the partitions the topic was created with (no parents): its
    /// first segment becomes durable in the sync round that first has
    /// something of it to make durable, not at its creation, so while no
    /// checkpoint entry calls any of its data durable, no file at all is
    /// what a power loss leaves of an unsynced partition, not a loss.
    /// (Children of splits and merges are durable before their record
    /// commits.)
    pub initial: bool,
    /// What recovery may do.
    pub mode: RecoverMode,
    /// The caller has checked, once for the whole topic, that neither
    /// the topic's directory nor `topics` is a symlink; otherwise the
    /// chain checks them with the partition's own directory.
    pub parents_checked: bool,
    /// Sees the fsyncs recovery makes after a repair.
    pub hook: &'a dyn crate::storage::fault::IoHook,
}

/// The topic and partition a chain's segment headers must name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionIds {
    /// The topic's id.
    pub topic: u32,
    /// The partition's id in its topic.
    pub partition: u32,
}

impl<'a> ChainParams<'a> {
    /// The checkpoint entry, when it names a position inside a segment's
    /// data (a position below the header says nothing about the data).
    pub(crate) fn checkpoint_in_data(&self) -> Option<&'a PartitionCheckpoint> {
        self.checkpoint
            .filter(|c| c.position >= SEGMENT_HEADER_LEN as u64)
    }

    /// Whether nothing says the partition's first segment was ever made
    /// durable: an active initial partition (see [`ChainParams::initial`])
    /// whose checkpoint entry, in a checkpoint that is there, calls none
    /// of its data durable.
    pub(crate) fn first_segment_may_be_unsynced(&self) -> bool {
        self.initial
            && self.sealed.is_none()
            && !self.checkpoint_lost
            && self.checkpoint_in_data().is_none()
    }
}

/// One segment file of a partition, opened and mapped before recovery
/// decides anything about it.
#[derive(Debug)]
enum SegmentFile {
    /// Below the retention floor: retired, not opened.
    Retired,
    /// Opened; the header is valid. With `true`, a sealed partition's last
    /// segment that ends where a clean shutdown's checkpoint says, its
    /// batch headers leading there: kept as it is, unmapped.
    Opened(Segment, HeaderInfo, bool),
    /// The bytes prove damage: the header does not decode (torn or
    /// corrupt) or the file size is impossible.
    Damaged(Error),
}

impl SegmentFile {
    /// What `classify` may know of the file.
    fn kind(&self) -> FileKind<'_> {
        match self {
            SegmentFile::Retired => FileKind::Retired,
            SegmentFile::Opened(_, info, _) => FileKind::Opened(info),
            SegmentFile::Damaged(e) => FileKind::Damaged(e),
        }
    }
}

/// A partition's files, each opened (or proven damaged) before any repair.
#[derive(Debug)]
pub struct OpenedChain {
    files: Vec<(u64, PathBuf, SegmentFile)>,
    foreign: Vec<PathBuf>,
    /// Base offsets of segments an earlier repair set aside (`.seg.damaged`).
    set_aside: Vec<u64>,
    /// Offset after the last record those segments held (0 without any).
    set_aside_end: u64,
    /// The partition directory does not exist.
    dir_missing: bool,
}

/// What a partition directory holds.
#[derive(Debug, Default)]
struct Listing {
    /// Segment files `(base offset, path)`, oldest first.
    segments: Vec<(u64, PathBuf)>,
    /// Files that are not ours (set-aside segments included).
    foreign: Vec<PathBuf>,
    /// Segments a repair set aside: (base offset, path).
    set_aside: Vec<(u64, PathBuf)>,
    /// The directory does not exist.
    dir_missing: bool,
}

/// Lists a partition directory.
fn list_segments(dir: &Path, parents_checked: bool) -> Result<Listing> {
    let mut out = Listing::default();
    // The partition's directory, its topic's and `topics`: none may be a
    // symlink (see `storage::file::refuse_symlinked_dir`).
    for d in dir.ancestors().take(if parents_checked { 1 } else { 3 }) {
        crate::storage::file::refuse_symlinked_dir(d)?;
    }
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            out.dir_missing = true;
            return Ok(out);
        }
        Err(e) => return Err(Error::io(dir, e)),
    };
    for entry in rd {
        let entry = entry.at(dir)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(base) = parse_segment_file_name(&name) {
            crate::storage::file::check_listed(&entry)?;
            out.segments.push((base, entry.path()));
        } else if name.ends_with(".idx") && name.len() == 24
            || crate::format::tail_index::is_file_name(&name)
        {
            // Index caches and tail splits' descendant indexes belong to us.
            crate::storage::file::check_listed(&entry)?;
        } else if name.ends_with(".idx.tmp") || name.ends_with(".seg.tmp") {
            // An interrupted index write or hole segment creation: scratch,
            // replaced by the next one.
        } else {
            if let Some(base) = name
                .strip_suffix(".damaged")
                .and_then(parse_segment_file_name)
            {
                out.set_aside.push((base, entry.path()));
            }
            out.foreign.push(entry.path());
        }
    }
    out.segments.sort();
    Ok(out)
}

/// Phase one of partition recovery: lists, opens and maps every segment
/// file, changing nothing. A failing OS call (EMFILE, ENFILE, ENOMEM from
/// `mmap`, EACCES, EIO) or a newer format version fails here with its own
/// typed error, before any file of any partition is repaired: an error
/// while opening a file is never taken for damage. Only bytes that decode
/// as invalid are [`SegmentFile::Damaged`].
pub fn open_chain(p: &ChainParams<'_>) -> Result<OpenedChain> {
    let listing = list_segments(p.dir, p.parents_checked).map_err(open_failed)?;
    let mut files = Vec::with_capacity(listing.segments.len());
    for (base, path) in listing.segments {
        let file = if p.checkpoint.is_some_and(|c| base < c.start_offset) {
            SegmentFile::Retired
        } else {
            open_segment(p, base, &path)?
        };
        files.push((base, path, file));
    }
    // Offsets a set-aside segment held were handed out: a repair that
    // a crash interrupted after setting segments aside (before the hole
    // that covers them was written), or a checkpoint older than their
    // last records, must not let the partition continue below them.
    let mut set_aside_end = 0;
    for (base, path) in &listing.set_aside {
        let held = match Segment::open_with(path, false, p.hook) {
            Ok((mut seg, info))
                if info.base_offset == *base
                    && (info.topic_id, info.partition_id) == (p.ids.topic, p.ids.partition) =>
            {
                apply::held_until(&mut seg, &info, p)
            }
            Ok(_) | Err(Error::Corruption { .. }) => *base,
            Err(e) => return Err(open_failed(e)),
        };
        set_aside_end = set_aside_end.max(held);
    }
    Ok(OpenedChain {
        files,
        foreign: listing.foreign,
        set_aside: listing.set_aside.into_iter().map(|(b, _)| b).collect(),
        set_aside_end,
        dir_missing: listing.dir_missing,
    })
}

/// Opens one segment file for [`open_chain`]. A durable sealed segment
/// already trimmed to its seal is neither scanned nor changed by the
/// repair phase (without a full scan), nor is a sealed partition's last
/// segment that ends where a clean shutdown's checkpoint says, and an
/// analysis (`verify`, dry runs) changes nothing: those are opened for
/// their header only, neither mapped nor keeping the descriptor, so an
/// open costs no mapping and no descriptor for the sealed segments and
/// partitions it does not scan (a read maps them under the log's budget).
/// Any other segment is mapped and closes its descriptor: a repair opens
/// the file again for its call, and the sync rounds under the log's
/// budget, so an open of 10,000 active partitions fits in `ulimit -n`
/// 1,024. Opening every file here still fails the open on a refused open
/// (or a refused mapping of a segment it scans) before anything is
/// repaired.
fn open_segment(p: &ChainParams<'_>, base: u64, path: &Path) -> Result<SegmentFile> {
    let (file, len, info) = match Segment::open_header(path, p.mode.write, p.hook) {
        Ok(opened) => opened,
        Err(e @ Error::Corruption { .. }) => return Ok(SegmentFile::Damaged(e)),
        Err(e) => return Err(open_failed(e)),
    };
    let trusted_seal = info.seal.is_some_and(|(_, end_pos)| {
        len == end_pos && p.checkpoint.is_some_and(|c| base < c.segment_base) && !p.mode.full_scan
    });
    let at_checkpoint = sealed_partition_end_settled(p, base, len, &info);
    let unmapped = !p.mode.write || trusted_seal || at_checkpoint;
    let seg = match Segment::from_file(
        path,
        (file, len),
        &info,
        p.mode.write,
        (!unmapped).then_some(p.hook),
    ) {
        Ok(seg) => seg,
        Err(e @ Error::Corruption { .. }) => return Ok(SegmentFile::Damaged(e)),
        Err(e) => return Err(open_failed(e)),
    };
    // Checked while the descriptor is open: the batch headers must lead
    // to the checkpointed end (see `keep::reaches_checkpoint`). Otherwise
    // the segment is scanned as any other, mapped when the scan asks.
    let settled = at_checkpoint && keep::reaches_checkpoint(&seg, base, p);
    if unmapped {
        seg.release_fd();
    } else if p.mode.write {
        seg.close_file();
    }
    Ok(SegmentFile::Opened(seg, info, settled))
}

fn problem(file: &Path, position: u64, what: String, repair: &str) -> Problem {
    Problem {
        file: file.to_path_buf(),
        position,
        what,
        repair: repair.to_string(),
    }
}

/// Whether the segment at `base`, `file_len` bytes long, with header
/// `info`, is the last one of a sealed partition, trimmed to exactly what
/// a clean shutdown's checkpoint names, its header carrying no seal or
/// that same end: nothing to scan or repair (once its batch headers are
/// seen to lead there), so it keeps neither its descriptor nor a mapping
/// (a read maps it), and an open of a log with many sealed partitions
/// holds none for them.
fn sealed_partition_end_settled(
    p: &ChainParams<'_>,
    base: u64,
    file_len: u64,
    info: &HeaderInfo,
) -> bool {
    p.clean
        && !p.mode.full_scan
        && p.mode.write
        && p.checkpoint.is_some_and(|c| {
            p.sealed == Some(c.end_offset)
                && c.segment_base == base
                && c.position == file_len
                && info.seal.is_none_or(|s| s == (c.end_offset, c.position))
        })
}

/// An OS error while opening or mapping becomes [`Error::OpenFailed`].
pub(crate) fn open_failed(e: Error) -> Error {
    match e {
        Error::Io { path, source } => Error::OpenFailed { path, source },
        e => e,
    }
}

/// Recovers the chain of segments of one partition: [`open_chain`], then
/// [`repair_chain`].
pub fn recover_chain(p: &ChainParams<'_>, report: &mut RecoveryReport) -> Result<RecoveredChain> {
    let opened = open_chain(p)?;
    repair_chain(p, opened, report)
}

/// Phase two of partition recovery: validates the opened files against the
/// checkpoint and repairs what the mode allows.
pub fn repair_chain(
    p: &ChainParams<'_>,
    mut opened: OpenedChain,
    report: &mut RecoveryReport,
) -> Result<RecoveredChain> {
    for f in &opened.foreign {
        report.add(f, FileAction::ForeignFile);
    }
    let floor = p.checkpoint.map_or(0, |c| c.start_offset);
    // Offsets known to have been handed out: what the checkpoint calls
    // durable, and what segments set aside by a repair held.
    let known_end = p
        .checkpoint_in_data()
        .map_or(floor, |c| c.end_offset.max(floor))
        .max(opened.set_aside_end);
    let mut cur = Cursor::start(known_end);
    let mut r = Repairs {
        p,
        report,
        out: RecoveredChain {
            segments: Vec::new(),
            // Until a checkpoint names a kept segment: a segment recovery
            // creates, or one no checkpoint describes, is synced by the
            // open's first round, and the checkpoint written in that same
            // round must not call its header durable yet.
            durable: DurablePoint::NOTHING,
            holes: Vec::new(),
            problems: Vec::new(),
            next_offset: 0,
        },
        removed: false,
        torn_creation: None,
        index_rewrites: Vec::new(),
    };
    let live: Vec<u64> = opened
        .files
        .iter()
        .filter(|f| !matches!(f.2, SegmentFile::Retired))
        .map(|f| f.0)
        .collect();
    // Checked before anything is changed, so Strict refuses untouched.
    if let Some(&first) = live.first().filter(|&&b| b > floor) {
        r.first_segment_missing(floor..first, &mut cur)?;
    }
    if cur.expected.is_none() && cur.cut == CutState::None {
        cur.expected = Some(floor);
    }
    for (base, path, file) in std::mem::take(&mut opened.files) {
        // Hole segments written for missing offsets count as kept too.
        cur.complete_until = r
            .out
            .segments
            .last()
            .filter(|s| s.is_sealed())
            .map(|s| s.end_offset());
        cur.last_kept = r.out.segments.last().map(|s| s.base_offset);
        let facts = FileFacts {
            base,
            path: &path,
            kind: file.kind(),
        };
        let verdict = classify(&facts, &cur, p);
        apply::apply(verdict, base, &path, file, &mut cur, &mut r)?;
    }
    finish_chain(r, cur, &opened, &live, floor)
}

/// What the end of a repaired chain looks like.
#[derive(Debug, Clone)]
pub(crate) struct ChainEnd {
    /// The offset after the last kept segment (the floor without any).
    pub chain_end: u64,
    /// The checkpoint's segment is gone: not retired, not set aside by an
    /// earlier repair.
    pub checkpoint_file_missing: bool,
    /// An active partition has no segment at all, though something says
    /// its first segment was durable (see
    /// [`ChainParams::first_segment_may_be_unsynced`]).
    pub no_segment: bool,
    /// The chain ends with a rolled segment, complete up to its seal: the
    /// segment after it existed (whatever followed it here was cut or is
    /// missing).
    pub ends_rolled: bool,
    /// The last kept segment's file.
    pub last_file: Option<PathBuf>,
    /// The partition directory does not exist.
    pub dir_missing: bool,
}

impl ChainEnd {
    /// The end of a chain of `segments` repaired from `opened`, whose live
    /// (not retired) files start at `live`.
    fn of(
        segments: &[Segment],
        opened: &OpenedChain,
        live: &[u64],
        floor: u64,
        p: &ChainParams<'_>,
    ) -> ChainEnd {
        let cp = p.checkpoint_in_data();
        ChainEnd {
            chain_end: segments.last().map_or(floor, |s| s.end_offset()),
            checkpoint_file_missing: cp.is_some_and(|c| {
                c.segment_base >= floor
                    && !live.contains(&c.segment_base)
                    && !opened.set_aside.contains(&c.segment_base)
            }),
            no_segment: live.is_empty()
                && opened.set_aside.is_empty()
                && (p.sealed.is_none() || p.checkpoint.is_none())
                && !p.first_segment_may_be_unsynced(),
            ends_rolled: segments.last().is_some_and(|s| s.is_sealed()),
            last_file: segments.last().map(|s| s.path().to_path_buf()),
            dir_missing: opened.dir_missing,
        }
    }
}

/// Data missing at the end of a chain: the offsets, the file that should
/// hold them, and what the report says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EndLoss {
    /// The lost offsets.
    pub lost: Range<u64>,
    /// The missing (or short) file.
    pub file: PathBuf,
    /// What is missing.
    pub what: String,
}

/// The offsets a chain ending at `end` lost, when the cursor (with the
/// seal's offsets counted) knows more were handed out. Pure.
pub(crate) fn end_loss(end: &ChainEnd, cur: &Cursor, p: &ChainParams<'_>) -> Option<EndLoss> {
    let chain_end = end.chain_end;
    let known_end = cur.known_end;
    if cur.cut == CutState::Synced
        || !(chain_end < known_end || end.checkpoint_file_missing || end.no_segment)
    {
        return None;
    }
    let lost = chain_end..known_end.max(chain_end);
    let (a, b) = (lost.start, lost.end);
    let cp = p.checkpoint_in_data();
    let (file, what) = if end.dir_missing {
        let what = format!(
            "partition directory {} is missing (offsets {a}..{b} lost)",
            p.dir.display()
        );
        (p.dir.to_path_buf(), what)
    } else if end.checkpoint_file_missing || end.no_segment {
        let named = cp.map_or(chain_end, |c| c.segment_base.max(chain_end));
        let path = p.dir.join(segment_file_name(named));
        let what = format!(
            "segment file {} is missing: offsets {a}..{b} the checkpoint calls durable are gone",
            path.display()
        );
        (path, what)
    } else {
        // The files are there but end early (a segment shorter than the
        // checkpointed position, or lost with the ones after it).
        let path = end.last_file.clone().unwrap_or_else(|| p.dir.to_path_buf());
        let floor = p.checkpoint.map_or(0, |c| c.start_offset);
        let by_checkpoint = cp.map_or(floor, |c| c.end_offset.max(floor));
        let what = if end.ends_rolled && p.sealed == Some(b) && by_checkpoint < b {
            format!(
                "the partition ends at offset {a} with a rolled segment but was sealed at {b}: offsets {a}..{b} are missing"
            )
        } else {
            format!(
                "the partition ends at offset {a} but the checkpoint says offsets up to {b} are durable: offsets {a}..{b} are missing"
            )
        };
        (path, what)
    };
    Some(EndLoss { lost, file, what })
}

/// After the last file: makes removals durable, accounts for data missing
/// at the end, fills what was handed out but lost with a hole, and seals
/// every segment but the last.
fn finish_chain(
    mut r: Repairs<'_, '_>,
    mut cur: Cursor,
    opened: &OpenedChain,
    live: &[u64],
    floor: u64,
) -> Result<RecoveredChain> {
    let p = r.p;
    if r.removed {
        // The segments after a torn tail (or retired ones a crash brought
        // back) must stay deleted: without this fsync a second power loss
        // can bring them back after new appends reused their offsets, and
        // their stale records would continue the chain (phantoms, C2).
        crate::storage::sync_dir(p.hook, IoOp::SyncRecoveryDir, p.dir)?;
    }
    let end = ChainEnd::of(&r.out.segments, opened, live, floor, p);
    // A sealed partition whose files hold less than its seal lost data
    // whatever its files look like (its only segment unreadable, say): the
    // split or merge that sealed it synced its segments and their names
    // before its record committed. Its offsets up to the manifest's seal
    // were handed out (its children continue after them), whether or not a
    // checkpoint recorded them. Below the seal they read as a hole, never
    // as nothing: an empty chain that ends at the seal without a durable
    // floor is not a state a later open can tell from missing files. A
    // chain that ends with a rolled segment below the seal lost the files
    // after it: a split or merge syncs the parent (and the name of every
    // segment it rolled to) before its record commits, and the checkpoint,
    // written only when due, need not name them.
    if p.sealed.is_some() || end.no_segment || cur.cut == CutState::Synced || end.ends_rolled {
        cur.handed_out(p.sealed.unwrap_or(0));
    }
    if let Some(loss) = end_loss(&end, &cur, p) {
        r.missing(&loss.file, loss.lost, loss.what)?;
    }
    // Removed only now: a mode that refuses missing data (above) leaves
    // every file as it was.
    if let Some(path) = r.torn_creation.take() {
        std::fs::remove_file(&path).at(&path)?;
        let _ = std::fs::remove_file(path.with_extension("idx"));
        crate::storage::sync_dir(p.hook, IoOp::SyncRecoveryDir, p.dir)?;
    }
    r.rewrite_indexes();
    if p.mode.write && cur.known_end > end.chain_end {
        // Offsets below `known_end` were handed out (and may sit in a saved
        // Cut): they read as a hole, and appends continue after them.
        r.fill_hole(end.chain_end..cur.known_end)?;
    }
    let mut out = r.out;
    out.next_offset = out
        .segments
        .last()
        .map_or(cur.known_end, |s| s.end_offset());
    if p.mode.write {
        // Every segment but the last was rolled: make sure its header says
        // so (a crash may have kept the next segment but not the seal).
        let n = out.segments.len();
        for seg in out.segments.iter_mut().take(n.saturating_sub(1)) {
            seg.seal_recovered();
        }
        // The last one, unless recovery found it sealed, takes appends: a
        // seal a torn roll left in its header is not true any more.
        if let Some(last) = out.segments.last_mut() {
            last.clear_stale_seal()?;
        }
    }
    Ok(out)
}

/// Shares recovered segments.
pub fn into_arcs(segments: Vec<Segment>) -> Vec<Arc<Segment>> {
    segments.into_iter().map(Arc::new).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::fault::NoFaults;
    use crate::{Log, LogOptions, NewRecord, TopicConfig};

    /// Mappings of files under `dir` in this process.
    fn mappings_under(dir: &Path) -> usize {
        let dir = dir.to_string_lossy().into_owned();
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter(|l| l.contains(dir.as_str()))
            .count()
    }

    /// An analysis (`verify`) scans every segment of a partition: it holds
    /// no mapping of one once it is checked, so a partition of more
    /// segments than `vm.max_map_count` allows mappings (or than a log's
    /// budget keeps) is checked as well as a small one.
    #[test]
    fn an_analysis_keeps_no_mapping_of_the_segments_it_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let log = Log::open(
            tmp.path(),
            LogOptions {
                balancer: false,
                ..LogOptions::default()
            },
        )
        .unwrap();
        let t = log
            .create_topic(
                "t",
                TopicConfig {
                    partitions: 1,
                    segment_bytes: 4096,
                    ..TopicConfig::default()
                },
            )
            .unwrap();
        // One record of 3000 bytes fills a segment of 4 KiB: each rolls.
        let value = vec![7u8; 3000];
        for _ in 0..200 {
            t.append_to(
                0,
                &[NewRecord {
                    key: None,
                    value: &value,
                    timestamp: None,
                }],
            )
            .unwrap();
        }
        drop(t);
        log.close().unwrap();
        let dir = tmp.path().join("topics/t0/p0");
        let p = ChainParams {
            dir: &dir,
            ids: PartitionIds {
                topic: 0,
                partition: 0,
            },
            index_interval: 4096,
            segment_bytes: 4096,
            checkpoint: None,
            clean: false,
            sealed: None,
            checkpoint_lost: false,
            initial: true,
            mode: RecoverMode {
                write: false,
                full_scan: true,
                recovery: RecoveryMode::Strict,
            },
            parents_checked: false,
            hook: &NoFaults,
        };
        let mut report = RecoveryReport::default();
        let chain = recover_chain(&p, &mut report).unwrap();
        assert!(chain.problems.is_empty(), "{:?}", chain.problems);
        assert_eq!(chain.segments.len(), 200);
        assert_eq!(chain.next_offset, 200);
        let mapped = mappings_under(&dir);
        assert!(
            mapped <= 1,
            "{mapped} mappings held after checking {} segments",
            chain.segments.len()
        );
    }
}
