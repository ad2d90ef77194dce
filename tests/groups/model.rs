//! Model-based property test of consumer groups, in simulated time: random
//! joins (static or not), leaves, crashes (a member stops), stalls (time
//! passes while some members neither heartbeat nor poll), polls, commits,
//! splits, tail splits, merges and log reopens, through the group model of
//! `tests/common/group_model.rs` without retention. The oracle checks:
//!
//! - a record the group committed is never delivered again;
//! - every other duplicate comes from a member that lost its partition
//!   (died, left, was replaced, was stuck) before committing it;
//! - per key, what one member receives is in append order (apart from
//!   those duplicates);
//! - at the end every appended record was delivered at least once;
//! - no partition is readable by two live members at once: every record a
//!   poll returns belongs to a partition the coordinator assigns to that
//!   member (or pins to one it owns).
//!
//! `FISSIONLOG_GROUP_MODEL_CASES` raises the number of cases (default 32);
//! they are the same in every run unless `FISSIONLOG_GROUP_MODEL_SEED`
//! (`N`, or `random`) picks others.

use crate::common;

use common::group_model::{cases, rng_seed, Model, Op, Tail};
use proptest::prelude::*;

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u8..30).prop_map(|n| Op::Append(n, false)),
        2 => proptest::option::of(0u8..3).prop_map(Op::Join),
        4 => (any::<u8>(), 1u8..40).prop_map(|(m, n)| Op::Poll(m, n)),
        3 => any::<u8>().prop_map(Op::Commit),
        5 => (any::<u8>(), 1u8..40).prop_map(|(m, n)| Op::PollCommit(m, n)),
        2 => (any::<u8>(), 1u8..20).prop_map(|(mask, s)| Op::Advance(mask, s)),
        1 => any::<u8>().prop_map(Op::Crash),
        1 => any::<u8>().prop_map(Op::Leave),
        1 => any::<u8>().prop_map(Op::Split),
        1 => any::<u8>().prop_map(Op::Merge),
        // From this many records before the end, or (255) from the
        // group's slowest position.
        2 => (any::<u8>(), prop_oneof![0u8..40, Just(255u8)]).prop_map(|(p, b)| {
            Op::TailSplit(p, if b == 255 { Tail::SlowestGroup } else { Tail::Back(b) })
        }),
        1 => any::<bool>().prop_map(Op::Reopen),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        max_shrink_iters: 200,
        rng_seed: rng_seed(),
        ..ProptestConfig::default()
    })]

    #[test]
    fn groups_keep_their_promises(
        hash_seed in any::<u64>(),
        ops in proptest::collection::vec(op(), 1..40),
    ) {
        Model::new(hash_seed).run(&ops);
    }
}
