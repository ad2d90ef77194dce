//! Self-tests of the power-loss harness in tests/common/crash.rs.

use crate::common;

use common::crash::*;
use proptest::prelude::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const SEEDS: u64 = 2000;

fn filled(len: usize, byte: u8) -> Vec<u8> {
    vec![byte; len]
}

/// Pseudo-random bytes, for content that is not a single repeated value.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut r = SplitMix64::new(seed);
    (0..len).map(|_| r.next_u64() as u8).collect()
}

fn opts(torn_any_byte: bool) -> CrashOptions {
    CrashOptions {
        torn_any_byte,
        ..CrashOptions::default()
    }
}

#[test]
fn default_options() {
    let o = CrashOptions::default();
    assert!(!o.torn_any_byte);
    assert_eq!(o.keep_all_new_probability, 0.0);
}

#[test]
fn identical_images_give_identical_results() {
    let mut img = DirImage::new();
    img.insert_file("manifest", noise(1, 100));
    img.insert_file("t/p0/00000000.seg", noise(2, 3 * PAGE_SIZE + 17));
    img.insert_file("t/p1/00000000.seg", Vec::new());
    img.insert_file(LOCK_FILE_NAME, Vec::new());
    img.insert_dir("empty/dir");
    for seed in 0..SEEDS {
        for any in [false, true] {
            let out = power_loss_image(&img, &img, seed, &opts(any));
            assert_eq!(out, img, "seed {seed}: {}", out.diff_summary(&img));
        }
    }
}

#[test]
fn unchanged_file_is_never_changed() {
    let mut durable = DirImage::new();
    durable.insert_file("a/stable", noise(3, 5 * PAGE_SIZE + 3));
    durable.insert_file("a/changing", noise(4, 2 * PAGE_SIZE));
    durable.insert_file("gone", noise(5, 10));
    let mut current = durable.clone();
    current.insert_file("a/changing", noise(6, 4 * PAGE_SIZE + 100));
    current.insert_file("a/b/new", noise(7, 300));
    current.files.remove(Path::new("gone"));
    for seed in 0..SEEDS {
        let out = power_loss_image(&durable, &current, seed, &opts(seed % 2 == 0));
        assert_eq!(
            out.file("a/stable"),
            durable.file("a/stable"),
            "seed {seed}"
        );
    }
}

/// Checks every per-byte invariant of a mixed file.
fn check_file_mix(old: &[u8], new: &[u8], got: &[u8], torn_any_byte: bool, ctx: &str) {
    assert!(
        got.len() == old.len() || got.len() == new.len(),
        "{ctx}: length {} not in {{{}, {}}}",
        got.len(),
        old.len(),
        new.len()
    );
    let b = |v: &[u8], i: usize| v.get(i).copied().unwrap_or(0);
    for (i, &g) in got.iter().enumerate() {
        let (o, n) = (b(old, i), b(new, i));
        if o == n {
            assert_eq!(g, o, "{ctx}: byte {i} equal in both images changed");
        } else {
            assert!(
                g == o || g == n,
                "{ctx}: byte {i} = {g} is neither old {o} nor new {n}"
            );
        }
    }
    // Page structure: each page is new-prefix then old-suffix (on the bytes where they differ).
    for (p, page) in got.chunks(PAGE_SIZE).enumerate() {
        let base = p * PAGE_SIZE;
        let differing: Vec<usize> = (0..page.len())
            .filter(|&k| b(old, base + k) != b(new, base + k))
            .collect();
        let is_new: Vec<bool> = differing
            .iter()
            .map(|&k| page[k] == b(new, base + k))
            .collect();
        // Once an old byte appears, no new byte may follow.
        if let Some(first_old) = is_new.iter().position(|&x| !x) {
            assert!(
                !is_new[first_old..].iter().any(|&x| x),
                "{ctx}: page {p} is not prefix-new/suffix-old"
            );
            if first_old > 0 && !torn_any_byte {
                // The cut lies in (last new differing byte, first old differing byte]; some multiple of 512 must.
                let lo = differing[first_old - 1] + 1;
                let hi = differing[first_old];
                let ok = (lo..=hi).any(|c| c % SECTOR_SIZE == 0);
                assert!(
                    ok,
                    "{ctx}: page {p} torn between {lo} and {hi}, no sector boundary"
                );
            }
        }
    }
}

#[test]
fn synced_prefix_always_intact() {
    // Durable: a synced prefix; current: the same prefix, then more data, and
    // also some rewrites of the unsynced tail that was durable as zeros.
    for seed in 0..SEEDS {
        let synced = 3 * PAGE_SIZE + 700;
        let prefix = noise(seed, synced);
        let mut old = prefix.clone();
        old.resize(8 * PAGE_SIZE, 0); // preallocated segment
        let mut new = prefix.clone();
        new.extend(noise(seed + 1_000_000, 2 * PAGE_SIZE + 5));
        new.resize(8 * PAGE_SIZE, 0);
        let mut durable = DirImage::new();
        durable.insert_file("p/seg", old.clone());
        let mut current = DirImage::new();
        current.insert_file("p/seg", new.clone());
        let any = seed % 3 == 0;
        let out = power_loss_image(&durable, &current, seed, &opts(any));
        let got = out.file("p/seg").expect("file in both images must survive");
        assert_eq!(
            &got[..synced],
            &prefix[..],
            "seed {seed}: synced prefix damaged"
        );
        check_file_mix(&old, &new, got, any, &format!("seed {seed}"));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn mixed_files_keep_invariants(
        common_len in 0usize..3 * PAGE_SIZE,
        old_tail in proptest::collection::vec(any::<u8>(), 0..2 * PAGE_SIZE),
        new_tail in proptest::collection::vec(any::<u8>(), 0..3 * PAGE_SIZE),
        content_seed in any::<u64>(),
        seed in any::<u64>(),
        any_byte in any::<bool>(),
        old_exists in any::<bool>(),
    ) {
        let common = noise(content_seed, common_len);
        let mut old = common.clone();
        old.extend(&old_tail);
        let mut new = common.clone();
        new.extend(&new_tail);
        let mut durable = DirImage::new();
        if old_exists {
            durable.insert_file("d/f", old.clone());
        }
        let mut current = DirImage::new();
        current.insert_file("d/f", new.clone());
        let o = opts(any_byte);
        let out = power_loss_image(&durable, &current, seed, &o);
        prop_assert_eq!(&out, &power_loss_image(&durable, &current, seed, &o));
        let ctx = format!("seed {seed}");
        match out.file("d/f") {
            Some(got) => {
                let old_ref: &[u8] = if old_exists { &old } else { &[] };
                check_file_mix(old_ref, &new, got, any_byte, &ctx);
                if old_exists {
                    // The common prefix (equal in both) is intact.
                    let keep = common_len.min(got.len());
                    prop_assert_eq!(&got[..keep], &common[..keep]);
                    prop_assert!(got.len() >= common_len.min(old.len()).min(new.len()));
                }
            }
            None => prop_assert!(!old_exists, "{}: file present in both images vanished", ctx),
        }
    }
}

#[test]
fn every_mode_occurs() {
    // Durable: old content 0xAA on 2 pages, a file that will be deleted, dir "a".
    // Current: 0xBB on 3 pages, a new file in "a", a new file in a new dir "n".
    let mut durable = DirImage::new();
    durable.insert_file("a/seg", filled(2 * PAGE_SIZE, 0xAA));
    durable.insert_file("a/deleted", filled(10, 0x11));
    let mut current = DirImage::new();
    current.insert_file("a/seg", filled(3 * PAGE_SIZE, 0xBB));
    current.insert_file("a/created", filled(PAGE_SIZE + 10, 0xCC));
    current.insert_file("n/inner", filled(5, 0xDD));

    #[derive(Default)]
    struct Seen {
        page_new: bool,
        page_old: bool,
        page_torn: bool,
        torn_unaligned: bool,
        zero_page: bool,
        len_old: bool,
        len_new: bool,
        created_missing: bool,
        created_present: bool,
        created_zero_page: bool,
        created_torn: bool,
        created_empty: bool,
        deleted_back: bool,
        deleted_gone: bool,
        dir_missing: bool,
        dir_present: bool,
    }
    for any in [false, true] {
        let mut s = Seen::default();
        for seed in 0..SEEDS {
            let out = power_loss_image(&durable, &current, seed, &opts(any));
            let seg = out.file("a/seg").expect("a/seg survives");
            match seg.len() {
                l if l == 2 * PAGE_SIZE => s.len_old = true,
                l if l == 3 * PAGE_SIZE => s.len_new = true,
                l => panic!("seed {seed}: a/seg length {l}"),
            }
            for (p, page) in seg.chunks(PAGE_SIZE).enumerate() {
                let old = if p < 2 { 0xAA } else { 0x00 };
                let cut = page.iter().position(|&b| b != 0xBB).unwrap_or(PAGE_SIZE);
                assert!(
                    page[cut..].iter().all(|&b| b == old),
                    "seed {seed}: page {p} malformed"
                );
                match cut {
                    0 => {
                        s.page_old = true;
                        if old == 0 {
                            s.zero_page = true;
                        }
                    }
                    PAGE_SIZE => s.page_new = true,
                    c => {
                        s.page_torn = true;
                        if c % SECTOR_SIZE != 0 {
                            assert!(
                                any,
                                "seed {seed}: unaligned torn cut {c} without torn_any_byte"
                            );
                            s.torn_unaligned = true;
                        }
                    }
                }
            }
            match out.file("a/created") {
                None => s.created_missing = true,
                Some(c) => {
                    s.created_present = true;
                    check_file_mix(
                        &[],
                        &filled(PAGE_SIZE + 10, 0xCC),
                        c,
                        any,
                        &format!("seed {seed}"),
                    );
                    if c.is_empty() {
                        s.created_empty = true;
                    } else {
                        if c[..PAGE_SIZE].iter().all(|&b| b == 0) {
                            s.created_zero_page = true;
                        }
                        if c[0] == 0xCC && c[PAGE_SIZE - 1] == 0 {
                            s.created_torn = true;
                        }
                    }
                }
            }
            match out.file("a/deleted") {
                Some(d) => {
                    assert_eq!(
                        d,
                        &filled(10, 0x11)[..],
                        "seed {seed}: reappeared with wrong content"
                    );
                    s.deleted_back = true;
                }
                None => s.deleted_gone = true,
            }
            if out.dirs.contains(Path::new("n")) {
                s.dir_present = true;
            } else {
                s.dir_missing = true;
                assert!(
                    out.file("n/inner").is_none(),
                    "seed {seed}: file below a missing dir"
                );
            }
            if out.file("n/inner").is_some() {
                assert!(
                    out.dirs.contains(Path::new("n")),
                    "seed {seed}: file without its dir"
                );
            }
        }
        let all = [
            ("page new", s.page_new),
            ("page old", s.page_old),
            ("page torn", s.page_torn),
            ("zero page for fresh space", s.zero_page),
            ("length old", s.len_old),
            ("length new", s.len_new),
            ("created file missing", s.created_missing),
            ("created file present", s.created_present),
            ("created file zero page", s.created_zero_page),
            ("created file torn page", s.created_torn),
            ("created file empty", s.created_empty),
            ("deleted file reappears", s.deleted_back),
            ("deleted file stays deleted", s.deleted_gone),
            ("new dir missing", s.dir_missing),
            ("new dir present", s.dir_present),
        ];
        for (name, seen) in all {
            assert!(seen, "mode never seen (torn_any_byte={any}): {name}");
        }
        assert_eq!(
            s.torn_unaligned, any,
            "unaligned torn cuts iff torn_any_byte"
        );
    }
}

#[test]
fn missing_dir_takes_everything_below() {
    let mut durable = DirImage::new();
    durable.insert_dir("t");
    let mut current = durable.clone();
    current.insert_file("t/p/0.seg", filled(10, 1));
    current.insert_file("t/p/q/1.seg", filled(10, 2));
    current.insert_dir("t/p/q/r");
    let (mut saw_missing, mut saw_partial) = (false, false);
    for seed in 0..SEEDS {
        let out = power_loss_image(&durable, &current, seed, &CrashOptions::default());
        assert!(out.dirs.contains(Path::new("t")));
        for f in out.files.keys() {
            for a in f.ancestors().skip(1).filter(|a| !a.as_os_str().is_empty()) {
                assert!(
                    out.dirs.contains(a),
                    "seed {seed}: {} present without {}",
                    f.display(),
                    a.display()
                );
            }
        }
        for d in &out.dirs {
            if let Some(p) = d.parent().filter(|p| !p.as_os_str().is_empty()) {
                assert!(
                    out.dirs.contains(p),
                    "seed {seed}: dir {} without parent",
                    d.display()
                );
            }
        }
        if !out.dirs.contains(Path::new("t/p")) {
            saw_missing = true;
            assert!(out.files.is_empty(), "seed {seed}");
        } else if !out.dirs.contains(Path::new("t/p/q")) {
            saw_partial = true;
        }
    }
    assert!(saw_missing && saw_partial);
}

#[test]
fn deleted_file_reappears_with_its_directory() {
    let mut durable = DirImage::new();
    durable.insert_file("old/part/seg", filled(100, 7));
    let current = DirImage::new(); // whole tree removed since the sync
    let mut back = 0;
    for seed in 0..SEEDS {
        let out = power_loss_image(&durable, &current, seed, &CrashOptions::default());
        if let Some(f) = out.file("old/part/seg") {
            back += 1;
            assert_eq!(f, &filled(100, 7)[..]);
            assert!(
                out.dirs.contains(Path::new("old/part")) && out.dirs.contains(Path::new("old"))
            );
        }
    }
    assert!(
        back > SEEDS / 4 && back < 3 * SEEDS / 4,
        "reappeared {back}/{SEEDS}"
    );
}

#[test]
fn same_seed_same_image_and_seeds_matter() {
    let mut durable = DirImage::new();
    durable.insert_file("x/a", noise(10, 6 * PAGE_SIZE));
    durable.insert_file("x/b", noise(11, 100));
    let mut current = DirImage::new();
    current.insert_file("x/a", noise(12, 7 * PAGE_SIZE + 1));
    current.insert_file("x/c", noise(13, 2 * PAGE_SIZE));
    current.insert_file("y/d", noise(14, 10));
    let mut distinct = BTreeSet::new();
    for seed in 0..200u64 {
        let s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15); // spread seeds over the u64 range
        let o = opts(seed % 2 == 1);
        let a = power_loss_image(&durable, &current, s, &o);
        let b = power_loss_image(&durable, &current, s, &o);
        assert_eq!(a, b, "seed {s}");
        let (c, trace) = power_loss_image_traced(&durable, &current, s, &o);
        assert_eq!(a, c, "seed {s}: traced differs from plain");
        assert!(!trace.is_empty());
        distinct.insert(format!("{:?}", a));
    }
    assert!(
        distinct.len() > 50,
        "only {} distinct images over 200 seeds",
        distinct.len()
    );
}

#[test]
fn choices_for_one_file_do_not_depend_on_other_files() {
    let mut durable = DirImage::new();
    durable.insert_file("p/seg", filled(4 * PAGE_SIZE, 1));
    let mut current = DirImage::new();
    current.insert_file("p/seg", filled(4 * PAGE_SIZE, 2));
    let mut current2 = current.clone();
    current2.insert_file("p/other", filled(PAGE_SIZE, 3));
    for seed in 0..200 {
        let a = power_loss_image(&durable, &current, seed, &CrashOptions::default());
        let b = power_loss_image(&durable, &current2, seed, &CrashOptions::default());
        assert_eq!(a.file("p/seg"), b.file("p/seg"), "seed {seed}");
    }
}

#[test]
fn keep_all_new_probability() {
    let mut durable = DirImage::new();
    durable.insert_file("s", filled(3 * PAGE_SIZE, 1));
    let mut current = DirImage::new();
    current.insert_file("s", filled(4 * PAGE_SIZE, 2));
    current.insert_file("t", filled(10, 3));
    let always = CrashOptions {
        keep_all_new_probability: 1.0,
        ..CrashOptions::default()
    };
    let half = CrashOptions {
        keep_all_new_probability: 0.5,
        ..CrashOptions::default()
    };
    let mut kept = [0u64; 2];
    for seed in 0..SEEDS {
        assert_eq!(power_loss_image(&durable, &current, seed, &always), current);
        if power_loss_image(&durable, &current, seed, &half) == current {
            kept[1] += 1;
        }
        if power_loss_image(&durable, &current, seed, &CrashOptions::default()) == current {
            kept[0] += 1;
        }
    }
    // Without the option, all 4 pages new, length new and "t" present: (1/3)^4 * 1/2 * 1/2.
    assert!(
        kept[0] < SEEDS / 50,
        "default kept current {} times",
        kept[0]
    );
    assert!(
        kept[1] > SEEDS * 4 / 10 && kept[1] < SEEDS * 6 / 10,
        "p=0.5 kept {}",
        kept[1]
    );
}

#[test]
fn capture_and_write_roundtrip() {
    let src = tempfile::tempdir().unwrap();
    let root = src.path();
    std::fs::create_dir_all(root.join("t/p0")).unwrap();
    std::fs::create_dir_all(root.join("empty/nested")).unwrap();
    std::fs::write(root.join("t/p0/00.seg"), noise(20, 10_000)).unwrap();
    std::fs::write(root.join("manifest"), b"hello").unwrap();
    std::fs::write(root.join("zero"), b"").unwrap();
    std::fs::write(root.join(LOCK_FILE_NAME), b"pid 1234").unwrap();

    let img = DirImage::capture(root).unwrap();
    let dirs: Vec<&Path> = img.dirs.iter().map(PathBuf::as_path).collect();
    assert_eq!(
        dirs,
        [
            Path::new("empty"),
            Path::new("empty/nested"),
            Path::new("t"),
            Path::new("t/p0")
        ]
    );
    assert_eq!(img.files.len(), 4);
    assert_eq!(img.file("t/p0/00.seg").unwrap(), &noise(20, 10_000)[..]);
    assert_eq!(img.file("manifest").unwrap(), b"hello");
    assert_eq!(img.file("zero").unwrap(), b"");
    assert_eq!(
        img.file(LOCK_FILE_NAME).unwrap(),
        b"",
        "lock content must not be captured"
    );

    let dst = tempfile::tempdir().unwrap();
    let out = dst.path().join("restored");
    img.write_to(&out).unwrap();
    assert!(out.join(LOCK_FILE_NAME).is_file());
    assert!(out.join("empty/nested").is_dir());
    assert_eq!(DirImage::capture(&out).unwrap(), img);

    // Refuses a non-empty target.
    let err = img.write_to(&out).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists);

    // A crash image round-trips too.
    let mut current = img.clone();
    current.insert_file("t/p0/00.seg", noise(21, 13_000));
    current.insert_file("t/p1/00.seg", noise(22, 5_000));
    for seed in 0..20 {
        let crash = power_loss_image(&img, &current, seed, &CrashOptions::default());
        let dir = dst.path().join(format!("crash{seed}"));
        crash.write_to(&dir).unwrap();
        assert_eq!(DirImage::capture(&dir).unwrap(), crash, "seed {seed}");
    }
}

#[test]
fn capture_of_missing_root_fails() {
    let d = tempfile::tempdir().unwrap();
    assert!(DirImage::capture(&d.path().join("nope")).is_err());
}

#[test]
fn corruption_helpers() {
    let d = tempfile::tempdir().unwrap();
    let rel = Path::new("sub/f");
    std::fs::create_dir(d.path().join("sub")).unwrap();
    let orig = noise(30, 9000);
    std::fs::write(d.path().join(rel), &orig).unwrap();

    flip_byte(d.path(), rel, 4097);
    let after = std::fs::read(d.path().join(rel)).unwrap();
    assert_eq!(after.len(), orig.len());
    for i in 0..orig.len() {
        if i == 4097 {
            assert_eq!(after[i], !orig[i]);
        } else {
            assert_eq!(after[i], orig[i], "byte {i}");
        }
    }
    flip_byte(d.path(), rel, 4097);
    assert_eq!(std::fs::read(d.path().join(rel)).unwrap(), orig);

    zero_range(d.path(), rel, 100, 8000);
    let after = std::fs::read(d.path().join(rel)).unwrap();
    assert_eq!(after.len(), orig.len());
    assert_eq!(&after[..100], &orig[..100]);
    assert!(after[100..8100].iter().all(|&b| b == 0));
    assert_eq!(&after[8100..], &orig[8100..]);

    zero_range(d.path(), rel, 9000, 0); // empty range at EOF is fine
    let r = std::panic::catch_unwind(|| flip_byte(d.path(), rel, 9000));
    assert!(r.is_err(), "flip past EOF must panic");
    let r = std::panic::catch_unwind(|| zero_range(d.path(), rel, 8999, 2));
    assert!(r.is_err(), "zero past EOF must panic");
}

#[test]
fn large_zero_range() {
    let d = tempfile::tempdir().unwrap();
    let rel = Path::new("big");
    std::fs::write(d.path().join(rel), filled(200_000, 0xFF)).unwrap();
    zero_range(d.path(), rel, 1, 199_998);
    let after = std::fs::read(d.path().join(rel)).unwrap();
    assert_eq!(after[0], 0xFF);
    assert_eq!(after[199_999], 0xFF);
    assert!(after[1..199_999].iter().all(|&b| b == 0));
}

// ---- Per-file durability (tests/common/durable.rs) ----

mod per_file {
    use super::common::crash::{CrashOptions, PAGE_SIZE};
    use super::common::durable::*;
    use super::{filled, noise};
    use std::ffi::OsString;
    use std::path::Path;

    const SEEDS: u64 = 1000;
    const ROOT: u64 = 1;

    fn id(n: u64) -> NodeId {
        NodeId::synthetic(n)
    }

    fn entries(list: &[(&str, Entry)]) -> Entries {
        list.iter().map(|(n, e)| (OsString::from(n), *e)).collect()
    }

    fn durable(dirs: &[(u64, Entries)], files: &[(u64, Vec<u8>)]) -> Durable {
        Durable {
            root: id(ROOT),
            nodes: nodes(dirs, files),
        }
    }

    fn nodes(dirs: &[(u64, Entries)], files: &[(u64, Vec<u8>)]) -> Nodes {
        Nodes {
            dirs: dirs.iter().map(|(d, e)| (id(*d), e.clone())).collect(),
            files: files.iter().map(|(f, b)| (id(*f), b.clone())).collect(),
        }
    }

    fn images(d: &Durable, live: &Nodes) -> Vec<super::common::crash::DirImage> {
        (0..SEEDS)
            .map(|s| crash_image(d, live, s, &CrashOptions::default()))
            .collect()
    }

    /// fdatasync of a new file does not make its name durable: the file may
    /// be missing; when present it holds its synced content.
    #[test]
    fn synced_file_in_unsynced_directory_may_vanish() {
        let content = noise(1, 2 * PAGE_SIZE + 5);
        let d = durable(&[(ROOT, Entries::new())], &[(2, content.clone())]);
        let live = nodes(
            &[(ROOT, entries(&[("f", Entry::File(id(2)))]))],
            &[(2, content.clone())],
        );
        let (mut present, mut missing) = (0, 0);
        for img in images(&d, &live) {
            match img.file("f") {
                Some(b) => {
                    assert_eq!(b, &content[..]);
                    present += 1;
                }
                None => missing += 1,
            }
        }
        assert!(
            present > 0 && missing > 0,
            "{present} present, {missing} missing"
        );
    }

    /// A durable name whose file was never synced: always there, holding
    /// nothing, the new content or a page mix of the two (never anything
    /// else).
    #[test]
    fn unsynced_file_in_synced_directory_keeps_its_name() {
        let content = filled(2 * PAGE_SIZE, 0xAB);
        let e = entries(&[("f", Entry::File(id(2)))]);
        let d = durable(&[(ROOT, e.clone())], &[]);
        let live = nodes(&[(ROOT, e)], &[(2, content.clone())]);
        let (mut empty, mut full) = (false, false);
        for img in images(&d, &live) {
            let b = img.file("f").expect("durable name");
            assert!(b.is_empty() || b.len() == content.len());
            assert!(b.iter().all(|&x| x == 0 || x == 0xAB));
            empty |= b.is_empty();
            full |= b == &content[..];
        }
        assert!(empty && full);
    }

    /// The synced prefix of a file survives; only pages changed since its
    /// own last fsync vary.
    #[test]
    fn synced_content_survives_and_later_pages_vary() {
        let synced = noise(3, 3 * PAGE_SIZE);
        let mut now = synced.clone();
        now[2 * PAGE_SIZE + 7] ^= 0xFF;
        let e = entries(&[("f", Entry::File(id(2)))]);
        let d = durable(&[(ROOT, e.clone())], &[(2, synced.clone())]);
        let live = nodes(&[(ROOT, e)], &[(2, now.clone())]);
        let (mut old, mut new) = (false, false);
        for img in images(&d, &live) {
            let b = img.file("f").expect("durable name");
            assert_eq!(&b[..2 * PAGE_SIZE], &synced[..2 * PAGE_SIZE]);
            old |= b == &synced[..];
            new |= b == &now[..];
        }
        assert!(old && new);
    }

    /// A rename inside a directory happens entirely or not at all, and the
    /// file keeps its durable content under either name.
    #[test]
    fn rename_is_atomic_and_carries_content() {
        let content = noise(4, 100);
        let d = durable(
            &[(ROOT, entries(&[("tmp", Entry::File(id(2)))]))],
            &[(2, content.clone())],
        );
        let live = nodes(
            &[(ROOT, entries(&[("final", Entry::File(id(2)))]))],
            &[(2, content.clone())],
        );
        let (mut done, mut not_done) = (false, false);
        for img in images(&d, &live) {
            match (img.file("tmp"), img.file("final")) {
                (Some(b), None) => {
                    assert_eq!(b, &content[..]);
                    not_done = true;
                }
                (None, Some(b)) => {
                    assert_eq!(b, &content[..]);
                    done = true;
                }
                other => panic!("rename half done: {other:?}"),
            }
        }
        assert!(done && not_done);
    }

    /// A rename over an existing name: the name holds the old file or the
    /// new one, and the source name exists exactly when it was not renamed.
    #[test]
    fn rename_over_a_name_replaces_it_whole() {
        let (old, new) = (noise(5, 50), noise(6, 60));
        let d = durable(
            &[(
                ROOT,
                entries(&[("snap", Entry::File(id(2))), ("tmp", Entry::File(id(3)))]),
            )],
            &[(2, old.clone()), (3, new.clone())],
        );
        let live = nodes(
            &[(ROOT, entries(&[("snap", Entry::File(id(3)))]))],
            &[(3, new.clone())],
        );
        let (mut a, mut b) = (false, false);
        for img in images(&d, &live) {
            let snap = img.file("snap").expect("snap always named");
            if snap == &old[..] {
                assert_eq!(img.file("tmp"), Some(&new[..]));
                a = true;
            } else {
                assert_eq!(snap, &new[..]);
                assert_eq!(img.file("tmp"), None);
                b = true;
            }
        }
        assert!(a && b);
    }

    /// A file deleted since its directory's fsync may come back, with its
    /// durable content only.
    #[test]
    fn deleted_file_returns_with_durable_content() {
        let synced = noise(7, PAGE_SIZE);
        let d = durable(
            &[(ROOT, entries(&[("f", Entry::File(id(2)))]))],
            &[(2, synced.clone())],
        );
        let live = nodes(&[(ROOT, Entries::new())], &[]);
        let mut back = 0;
        for img in images(&d, &live) {
            if let Some(b) = img.file("f") {
                assert_eq!(b, &synced[..]);
                back += 1;
            }
        }
        assert!(back > SEEDS / 4 && back < 3 * SEEDS / 4, "{back}");
    }

    /// A directory whose name is not durable takes everything below it,
    /// even files and directories synced themselves.
    #[test]
    fn missing_directory_takes_everything_below() {
        let content = noise(8, 10);
        let sub = entries(&[("f", Entry::File(id(3)))]);
        let d = durable(
            &[(ROOT, Entries::new()), (2, sub.clone())],
            &[(3, content.clone())],
        );
        let live = nodes(
            &[(ROOT, entries(&[("d", Entry::Dir(id(2)))])), (2, sub)],
            &[(3, content.clone())],
        );
        let (mut with, mut without) = (false, false);
        for img in images(&d, &live) {
            if img.dirs.contains(Path::new("d")) {
                assert_eq!(img.file("d/f"), Some(&content[..]));
                with = true;
            } else {
                assert!(img.files.is_empty());
                without = true;
            }
        }
        assert!(with && without);
    }

    /// Same seed, same image; the trace describes the same image.
    #[test]
    fn per_file_images_are_reproducible() {
        let d = durable(&[(ROOT, Entries::new())], &[]);
        let live = nodes(
            &[(
                ROOT,
                entries(&[("a", Entry::File(id(2))), ("b", Entry::File(id(3)))]),
            )],
            &[(2, noise(9, 3 * PAGE_SIZE)), (3, noise(10, 10))],
        );
        let mut distinct = std::collections::BTreeSet::new();
        for s in 0..64 {
            let o = CrashOptions::default();
            let a = crash_image(&d, &live, s, &o);
            let (b, trace) = crash_image_traced(&d, &live, s, &o);
            assert_eq!(a, b);
            assert!(!trace.is_empty());
            distinct.insert(format!("{:?}", a.files));
        }
        assert!(distinct.len() > 4);
    }

    /// On a real directory: identities survive a rename, and a capture
    /// sees what the model needs (entries by identity, file bytes).
    #[test]
    fn capture_tracks_files_across_renames() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tmp"), b"abc").unwrap();
        let (root, before) = Nodes::capture(dir.path()).unwrap();
        std::fs::rename(dir.path().join("tmp"), dir.path().join("final")).unwrap();
        let (root2, after) = Nodes::capture(dir.path()).unwrap();
        assert_eq!(root, root2);
        let id_before = before.dirs[&root][&OsString::from("tmp")];
        let id_after = after.dirs[&root][&OsString::from("final")];
        assert_eq!(id_before, id_after);
        assert_eq!(after.files[&id_after.id()], b"abc");
    }
}

/// The hook makes a file durable only when its fsync succeeds and its op
/// is not the one removed (tests/common/model_hook.rs).
#[test]
fn model_hook_counts_only_successful_kept_fsyncs() {
    use common::durable::Synced;
    use common::model_hook::ModelHook;
    use fissionlog::{IoHook, IoOp};
    let image_of = |drop: Option<IoOp>, ok: bool| {
        let dir = tempfile::tempdir().unwrap();
        let hook = ModelHook::new(dir.path(), drop);
        let f = dir.path().join("f");
        std::fs::write(&f, b"data").unwrap();
        hook.before(IoOp::SyncNewDir, dir.path()).unwrap();
        let _ = hook.after(IoOp::SyncNewDir, dir.path(), Ok(()));
        hook.before(IoOp::SyncNewSegment, &f).unwrap();
        let r = if ok {
            Ok(())
        } else {
            Err(std::io::Error::from_raw_os_error(libc::EIO))
        };
        let _ = hook.after(IoOp::SyncNewSegment, &f, r);
        assert!(matches!(Synced::take(&f).unwrap(), Synced::File(..)));
        // With the name durable, the content is durable iff the fsync counted.
        (0..64)
            .map(|s| hook.crash_image(s, &CrashOptions::default()).0)
            .all(|img| img.file("f") == Some(&b"data"[..]))
    };
    assert!(
        image_of(None, true),
        "a successful fsync makes the content durable"
    );
    assert!(
        !image_of(None, false),
        "a failed fsync makes nothing durable"
    );
    assert!(
        !image_of(Some(IoOp::SyncNewSegment), true),
        "a removed op makes nothing durable"
    );
    assert!(
        image_of(Some(IoOp::SyncSegment), true),
        "other ops still count"
    );
}
