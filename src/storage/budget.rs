//! The log's bounded budget of mappings and descriptors of segments that
//! take no more appends.
//!
//! Every segment keeps what the OS lends it (its mapping and its open
//! file) in a [`Resident`]. The mapping of a partition's active segment
//! is pinned: its writer stores into it, and nothing here ever takes it.
//! Its descriptor is not: every writable segment's open file counts
//! against the [`Budget`] once the segment is attached, so a log of
//! 10,000 active partitions holds `max_open_files` descriptors of
//! segments, not 10,000. The writer opens the file again when it needs it
//! (allocating ahead of itself, a `pwrite` of a large batch) and keeps it
//! until the budget closes it; a sync round opens the file of a segment
//! with unsynced bytes again (a descriptor opened after a write still
//! reports a writeback error nobody has seen: the kernel samples the
//! file's error sequence at open as unseen, and only this log syncs the
//! file). A segment that takes no more appends (rolled, or the last one
//! of a sealed partition) becomes *evictable*: from then on its cached
//! mapping counts against the budget too. Past its limits the budget
//! gives back what it holds, least recently used first. Reading a segment
//! whose mapping was given back maps it again (and opens its file for
//! that call only).
//!
//! Eviction only drops the cache's reference. A [`Mapping`] is an `Arc`:
//! a read batch (or the `Bytes` made from one) that holds it keeps it
//! mapped until its last holder drops it, so an eviction never unmaps
//! memory a reader can still address (rule 4 of the soundness argument in
//! `storage/segment/mod.rs`).
//!
//! Eviction is the CLOCK approximation of LRU: a use sets the resident's
//! `referenced` bit (one atomic store, no lock), and the eviction hand
//! gives a referenced entry a second chance (clears the bit, moves it to
//! the back) instead of evicting it. Each admission pushes one entry and
//! each pop handles one, and a use never touches the queue, so admission
//! and eviction cost O(1) amortised. Entries of residents that left the
//! budget another way (dropped, cut by retention) are skipped when popped,
//! and the queue is compacted when they outnumber the live ones.

use std::collections::VecDeque;
use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use memmap2::MmapRaw;
use parking_lot::Mutex;

/// One segment's mapping. Unmapped when the last `Arc` drops: the budget's
/// reference, a read batch's, a `Bytes` owner's or the writer's.
#[derive(Debug)]
pub(crate) struct Mapping {
    raw: MmapRaw,
}

impl Mapping {
    pub(crate) fn new(raw: MmapRaw) -> Mapping {
        Mapping { raw }
    }

    /// Mapped length in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.raw.len() as u64
    }

    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.raw.as_ptr()
    }

    pub(crate) fn as_mut_ptr(&self) -> *mut u8 {
        self.raw.as_mut_ptr()
    }
}

/// What the budget allows, from `LogOptions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BudgetLimits {
    /// Mappings of evictable segments kept cached.
    pub max_mapped_segments: usize,
    /// Descriptors of segments kept open (active ones included).
    pub max_open_files: usize,
}

/// What a log's budget of mappings and descriptors holds now
/// ([`crate::Log::resource_stats`]). Counts the mappings of segments
/// that take no more appends and the descriptors of every segment
/// (active ones included); each active partition holds one mapping
/// besides, and a `ReadBatch` keeps the mapping it reads from alive after
/// an eviction until it drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ResourceStats {
    /// Mappings of sealed segments the log keeps cached.
    pub mapped_segments: usize,
    /// Descriptors of segments (sealed or active) the log keeps open.
    pub open_segment_files: usize,
    /// [`crate::LogOptions::max_mapped_segments`].
    pub max_mapped_segments: usize,
    /// [`crate::LogOptions::max_open_files`].
    pub max_open_files: usize,
    /// Mappings given back so far (a later read maps the segment again).
    pub mappings_evicted: u64,
    /// Descriptors closed by the budget so far.
    pub files_evicted: u64,
}

/// Which of a resident's two resources an operation is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Map,
    File,
}

/// A log's budget of cached mappings and descriptors of evictable
/// segments.
#[derive(Debug)]
pub(crate) struct Budget {
    limits: BudgetLimits,
    maps: Mutex<VecDeque<Weak<Resident>>>,
    files: Mutex<VecDeque<Weak<Resident>>>,
    mapped: AtomicUsize,
    open: AtomicUsize,
    mappings_evicted: AtomicU64,
    files_evicted: AtomicU64,
}

impl Budget {
    pub(crate) fn new(limits: BudgetLimits) -> Budget {
        Budget {
            limits: BudgetLimits {
                max_mapped_segments: limits.max_mapped_segments.max(1),
                max_open_files: limits.max_open_files.max(1),
            },
            maps: Mutex::default(),
            files: Mutex::default(),
            mapped: AtomicUsize::new(0),
            open: AtomicUsize::new(0),
            mappings_evicted: AtomicU64::new(0),
            files_evicted: AtomicU64::new(0),
        }
    }

    /// What it holds now, and its limits.
    pub(crate) fn counts(&self) -> ResourceStats {
        ResourceStats {
            mapped_segments: self.mapped.load(Ordering::Acquire),
            open_segment_files: self.open.load(Ordering::Acquire),
            max_mapped_segments: self.limits.max_mapped_segments,
            max_open_files: self.limits.max_open_files,
            mappings_evicted: self.mappings_evicted.load(Ordering::Acquire),
            files_evicted: self.files_evicted.load(Ordering::Acquire),
        }
    }

    fn parts(&self, kind: Kind) -> (&Mutex<VecDeque<Weak<Resident>>>, &AtomicUsize, usize) {
        match kind {
            Kind::Map => (&self.maps, &self.mapped, self.limits.max_mapped_segments),
            Kind::File => (&self.files, &self.open, self.limits.max_open_files),
        }
    }

    /// Takes a resident's counted resource in, then evicts down to the
    /// limit. Called without the resident's lock held.
    fn admit(&self, kind: Kind, r: &Arc<Resident>) {
        let (queue, count, max) = self.parts(kind);
        let mut q = queue.lock();
        q.push_back(Arc::downgrade(r));
        if q.len() > 2 * max + 64 {
            // Entries of residents that left another way: drop them, so
            // the queue stays within a constant factor of the live ones.
            q.retain(|w| w.upgrade().is_some_and(|r| r.counted(kind)));
        }
        while count.load(Ordering::Acquire) > max {
            if !Self::evict_one(kind, &mut q) {
                break;
            }
            self.count_eviction(kind);
        }
    }

    fn count_eviction(&self, kind: Kind) {
        match kind {
            Kind::Map => self.mappings_evicted.fetch_add(1, Ordering::AcqRel),
            Kind::File => self.files_evicted.fetch_add(1, Ordering::AcqRel),
        };
    }

    /// Evicts the least recently used entry of `q` (CLOCK: a referenced
    /// one gets a second chance). Returns whether one was evicted.
    fn evict_one(kind: Kind, q: &mut VecDeque<Weak<Resident>>) -> bool {
        // Every entry is looked at at most twice: once to clear its bit,
        // once to evict it.
        let mut budget = 2 * q.len() + 1;
        while budget > 0 {
            budget -= 1;
            let Some(w) = q.pop_front() else {
                return false;
            };
            let Some(r) = w.upgrade() else {
                continue;
            };
            if !r.counted(kind) {
                continue;
            }
            if kind == Kind::Map && r.referenced.swap(false, Ordering::AcqRel) {
                q.push_back(w);
                continue;
            }
            if r.release(kind) {
                return true;
            }
        }
        false
    }

    /// Gives back half of the cached mappings and every cached descriptor
    /// of evictable segments, after the OS refused a descriptor or a
    /// mapping (EMFILE, ENFILE, ENOMEM): what fissionlog holds for reads
    /// is the one thing it can give back. Returns whether anything went.
    pub(crate) fn shed(&self) -> bool {
        let mut any = false;
        for kind in [Kind::Map, Kind::File] {
            let (queue, count, _) = self.parts(kind);
            let mut q = queue.lock();
            let keep = match kind {
                Kind::Map => count.load(Ordering::Acquire) / 2,
                Kind::File => 0,
            };
            while count.load(Ordering::Acquire) > keep {
                if !Self::evict_one(kind, &mut q) {
                    break;
                }
                self.count_eviction(kind);
                any = true;
            }
        }
        any
    }
}

/// The mapping and open file of one segment, as the budget sees them.
#[derive(Debug)]
pub(crate) struct Resident {
    state: Mutex<ResidentState>,
    /// Used since the eviction hand last passed (CLOCK's reference bit).
    referenced: AtomicBool,
    budget: OnceLock<Arc<Budget>>,
}

#[derive(Debug, Default)]
struct ResidentState {
    map: Option<Arc<Mapping>>,
    /// `map` counts against the budget (it is `Some`, the resident is
    /// evictable and attached).
    map_counted: bool,
    file: Option<Arc<File>>,
    file_counted: bool,
    /// Takes no more appends: its mapping may be given back.
    evictable: bool,
    /// Its descriptor may be closed: every writable segment's, active
    /// ones included (the writer and the sync round open the file again
    /// when they need it; stores go through the mapping, which stays).
    file_evictable: bool,
}

impl Resident {
    pub(crate) fn new(map: Option<Arc<Mapping>>, file: Option<Arc<File>>) -> Arc<Resident> {
        Arc::new(Resident {
            state: Mutex::new(ResidentState {
                map,
                file,
                ..ResidentState::default()
            }),
            referenced: AtomicBool::new(true),
            budget: OnceLock::new(),
        })
    }

    fn counted(&self, kind: Kind) -> bool {
        let s = self.state.lock();
        match kind {
            Kind::Map => s.map_counted,
            Kind::File => s.file_counted,
        }
    }

    /// Drops the budget's reference to one resource; returns whether it
    /// held one.
    fn release(&self, kind: Kind) -> bool {
        let mut s = self.state.lock();
        let (slot_empty, was_counted) = match kind {
            Kind::Map => {
                let had = s.map.take().is_some();
                (!had, std::mem::take(&mut s.map_counted))
            }
            Kind::File => {
                let had = s.file.take().is_some();
                (!had, std::mem::take(&mut s.file_counted))
            }
        };
        drop(s);
        if was_counted {
            self.uncount(kind);
        }
        !slot_empty
    }

    fn uncount(&self, kind: Kind) {
        if let Some(b) = self.budget.get() {
            let (_, count, _) = b.parts(kind);
            count.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Counts what it holds when it is evictable and attached; returns
    /// which resources the budget must admit.
    fn count_held(s: &mut ResidentState, attached: bool) -> (bool, bool) {
        if !attached {
            return (false, false);
        }
        let map = s.evictable && s.map.is_some() && !s.map_counted;
        let file = (s.evictable || s.file_evictable) && s.file.is_some() && !s.file_counted;
        s.map_counted |= map;
        s.file_counted |= file;
        (map, file)
    }

    fn admit_counted(self: &Arc<Self>, (map, file): (bool, bool)) {
        let Some(b) = self.budget.get() else {
            return;
        };
        if map {
            b.mapped.fetch_add(1, Ordering::AcqRel);
            b.admit(Kind::Map, self);
        }
        if file {
            b.open.fetch_add(1, Ordering::AcqRel);
            b.admit(Kind::File, self);
        }
    }

    /// Puts it under `budget` (the partition that takes the segment does);
    /// a resident keeps the first budget it is given.
    pub(crate) fn attach(self: &Arc<Self>, budget: &Arc<Budget>) {
        if self.budget.set(budget.clone()).is_err() {
            return;
        }
        let admit = Self::count_held(&mut self.state.lock(), true);
        self.admit_counted(admit);
    }

    /// The segment's descriptor may be closed by the budget while it
    /// still takes appends (its mapping stays pinned): a log of many
    /// active partitions holds descriptors for the ones in use, not for
    /// every partition.
    pub(crate) fn make_file_evictable(self: &Arc<Self>) {
        let mut s = self.state.lock();
        s.file_evictable = true;
        let admit = Self::count_held(&mut s, self.budget.get().is_some());
        drop(s);
        self.admit_counted(admit);
    }

    /// The segment takes no more appends: what it holds may be evicted.
    pub(crate) fn make_evictable(self: &Arc<Self>) {
        let mut s = self.state.lock();
        s.evictable = true;
        let admit = Self::count_held(&mut s, self.budget.get().is_some());
        drop(s);
        self.admit_counted(admit);
    }

    /// The cached mapping, marked as used.
    pub(crate) fn map(&self) -> Option<Arc<Mapping>> {
        let m = self.state.lock().map.clone();
        if m.is_some() && !self.referenced.load(Ordering::Relaxed) {
            self.referenced.store(true, Ordering::Relaxed);
        }
        m
    }

    /// Caches `map` (mapped again on demand) unless another reader cached
    /// one meanwhile; returns the one cached.
    pub(crate) fn set_map(self: &Arc<Self>, map: Arc<Mapping>) -> Arc<Mapping> {
        let mut s = self.state.lock();
        if let Some(m) = &s.map {
            return m.clone();
        }
        s.map = Some(map.clone());
        self.referenced.store(true, Ordering::Relaxed);
        let admit = Self::count_held(&mut s, self.budget.get().is_some());
        drop(s);
        self.admit_counted(admit);
        map
    }

    /// Replaces the mapping of a segment recovery readies for appends
    /// (mapped again at the full segment size).
    pub(crate) fn replace_map(self: &Arc<Self>, map: Arc<Mapping>) {
        self.release(Kind::Map);
        self.set_map(map);
    }

    /// The open file, if it holds one.
    pub(crate) fn file(&self) -> Option<Arc<File>> {
        self.state.lock().file.clone()
    }

    /// Keeps `file` open (a sync round's reopen of an unsynced segment)
    /// unless one is kept already; returns the one kept.
    pub(crate) fn set_file(self: &Arc<Self>, file: Arc<File>) -> Arc<File> {
        let mut s = self.state.lock();
        if let Some(f) = &s.file {
            return f.clone();
        }
        s.file = Some(file.clone());
        let admit = Self::count_held(&mut s, self.budget.get().is_some());
        drop(s);
        self.admit_counted(admit);
        file
    }

    /// Closes the kept descriptor (a reader or the writer holding the
    /// `Arc<File>` keeps it open until it drops it).
    pub(crate) fn take_file(&self) {
        self.release(Kind::File);
    }

    /// Drops the cached mapping (read batches holding it keep it mapped).
    pub(crate) fn take_map(&self) {
        self.release(Kind::Map);
    }

    /// The budget it is under, once attached.
    pub(crate) fn budget(&self) -> Option<&Arc<Budget>> {
        self.budget.get()
    }

    /// Whether a mapping is cached.
    #[cfg(test)]
    pub(crate) fn is_mapped(&self) -> bool {
        self.state.lock().map.is_some()
    }
}

impl Drop for Resident {
    fn drop(&mut self) {
        let s = self.state.get_mut();
        let (map, file) = (s.map_counted, s.file_counted);
        if map {
            self.uncount(Kind::Map);
        }
        if file {
            self.uncount(Kind::File);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping() -> Arc<Mapping> {
        let raw = memmap2::MmapOptions::new()
            .len(4096)
            .map_anon()
            .expect("an anonymous page maps");
        Arc::new(Mapping::new(MmapRaw::from(raw)))
    }

    fn budget(maps: usize, files: usize) -> Arc<Budget> {
        Arc::new(Budget::new(BudgetLimits {
            max_mapped_segments: maps,
            max_open_files: files,
        }))
    }

    #[test]
    fn evictable_mappings_beyond_the_limit_are_given_back_least_recently_used_first() {
        let b = budget(2, 8);
        let rs: Vec<_> = (0..3)
            .map(|_| {
                let r = Resident::new(Some(mapping()), None);
                r.attach(&b);
                r
            })
            .collect();
        assert_eq!(b.counts().mapped_segments, 0, "pinned until evictable");
        rs[0].make_evictable();
        rs[1].make_evictable();
        // Clear the reference bits the way the hand does, then use r0.
        for r in &rs {
            r.referenced.store(false, Ordering::Relaxed);
        }
        assert!(rs[0].map().is_some());
        rs[2].make_evictable();
        assert_eq!(b.counts().mapped_segments, 2);
        assert!(rs[0].is_mapped(), "used since the hand passed");
        assert!(!rs[1].is_mapped(), "least recently used");
        assert!(rs[2].is_mapped());
        assert_eq!(b.counts().mappings_evicted, 1);
    }

    #[test]
    fn an_evicted_mapping_a_reader_holds_stays_mapped_until_it_drops() {
        let b = budget(1, 1);
        let r0 = Resident::new(Some(mapping()), None);
        r0.attach(&b);
        r0.make_evictable();
        let held = r0.map().expect("cached");
        r0.referenced.store(false, Ordering::Relaxed);
        let r1 = Resident::new(Some(mapping()), None);
        r1.attach(&b);
        r1.make_evictable();
        assert!(!r0.is_mapped());
        assert_eq!(Arc::strong_count(&held), 1, "only the reader holds it");
        // SAFETY: the mapping is alive (held) and at least one byte long.
        assert_eq!(unsafe { *held.as_ptr() }, 0);
    }

    #[test]
    fn pinned_residents_never_count_and_dropped_ones_give_their_count_back() {
        let b = budget(1, 1);
        let pinned = Resident::new(Some(mapping()), None);
        pinned.attach(&b);
        let r = Resident::new(Some(mapping()), None);
        r.attach(&b);
        r.make_evictable();
        assert_eq!(b.counts().mapped_segments, 1);
        drop(r);
        assert_eq!(b.counts().mapped_segments, 0);
        assert!(pinned.is_mapped());
        assert!(!b.shed());
        assert!(pinned.is_mapped(), "shedding never takes a pinned mapping");
    }

    #[test]
    fn descriptors_of_segments_that_take_appends_count_and_close_past_the_limit_while_their_mappings_stay(
    ) {
        let b = budget(8, 2);
        let rs: Vec<_> = (0..3)
            .map(|_| {
                let f = File::open("/dev/null").expect("/dev/null opens");
                let r = Resident::new(Some(mapping()), Some(Arc::new(f)));
                r.attach(&b);
                r.make_file_evictable();
                r
            })
            .collect();
        assert_eq!(b.counts().open_segment_files, 2);
        assert_eq!(b.counts().files_evicted, 1);
        assert!(rs[0].file().is_none(), "the oldest descriptor is closed");
        assert!(rs[1].file().is_some() && rs[2].file().is_some());
        assert_eq!(b.counts().mapped_segments, 0, "their mappings stay pinned");
        assert!(rs.iter().all(|r| r.is_mapped()));
        assert!(b.shed());
        assert_eq!(b.counts().open_segment_files, 0);
        assert!(rs.iter().all(|r| r.is_mapped()), "shedding keeps them too");
    }

    #[test]
    fn shedding_gives_back_half_the_mappings() {
        let b = budget(8, 8);
        let rs: Vec<_> = (0..8)
            .map(|_| {
                let r = Resident::new(Some(mapping()), None);
                r.attach(&b);
                r.make_evictable();
                r
            })
            .collect();
        assert_eq!(b.counts().mapped_segments, 8);
        assert!(b.shed());
        assert_eq!(b.counts().mapped_segments, 4);
        assert_eq!(rs.iter().filter(|r| r.is_mapped()).count(), 4);
    }

    #[test]
    fn the_queue_stays_bounded_when_residents_leave_without_eviction() {
        let b = budget(4, 4);
        for _ in 0..1000 {
            let r = Resident::new(Some(mapping()), None);
            r.attach(&b);
            r.make_evictable();
            r.take_map();
        }
        assert_eq!(b.counts().mapped_segments, 0);
        assert!(b.maps.lock().len() <= 2 * 4 + 65);
    }
}
