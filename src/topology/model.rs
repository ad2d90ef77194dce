//! The topology as data: applying manifest records to a [`ManifestState`]
//! with every invariant checked (pure; the fuzzer replays arbitrary
//! manifests through it).

use crate::format::manifest::{
    GroupPosition, GroupRecord, ManifestRecord, ManifestState, PartitionRecord, PartitionState,
    RemovedPartition, TailGroupMove, TailMove, TopicRecord,
};

/// Checks a topic's consumer groups: valid unique names, and partition ids
/// the topic handed out.
fn check_groups(t: &TopicRecord) -> Result<(), String> {
    let mut names: Vec<&str> = t.groups.iter().map(|g| g.name.as_str()).collect();
    names.sort_unstable();
    if names.windows(2).any(|w| w[0] == w[1]) {
        return Err(format!("topic {}: duplicate group name", t.name));
    }
    for g in &t.groups {
        crate::topic_name::validate(&g.name)
            .map_err(|e| format!("topic {}: group name: {e}", t.name))?;
        let ids = g
            .positions
            .keys()
            .chain(g.last_records.keys())
            .chain(&g.drained);
        if let Some(id) = ids.copied().find(|&id| id >= t.next_partition_id) {
            return Err(format!(
                "topic {}: group {} names partition {id}, never handed out",
                t.name, g.name
            ));
        }
        if g.last_records
            .keys()
            .any(|id| !g.positions.contains_key(id))
        {
            return Err(format!(
                "topic {}: group {} has a fingerprint without a position",
                t.name, g.name
            ));
        }
    }
    Ok(())
}

/// Whether group `g` lists partition `p` (a position, or drained) or a
/// descendant of it (every ancestor of a listed partition counts as read).
fn group_passed(t: &TopicRecord, g: &GroupRecord, p: u32) -> bool {
    let mut seen = std::collections::HashSet::from([p]);
    let mut stack = vec![p];
    while let Some(x) = stack.pop() {
        if g.positions.contains_key(&x) || g.drained.contains(&x) {
            return true;
        }
        for c in &t.partitions {
            if c.parents.contains(&x) && seen.insert(c.id) {
                stack.push(c.id);
            }
        }
    }
    false
}

/// Checks a topic's partitions: unique ids below `next_partition_id`,
/// well-formed ranges, parents known or removed, and active ranges tiling
/// `[0, u64::MAX]` exactly.
pub fn check_topic(t: &TopicRecord) -> Result<(), String> {
    crate::topic_name::validate(&t.name).map_err(|e| e.to_string())?;
    check_partition_ids(t)?;
    check_partition_shapes(t)?;
    check_active_tiling(t)?;
    check_groups(t)
}

/// Partition ids, live and removed, are unique and below
/// `next_partition_id`.
fn check_partition_ids(t: &TopicRecord) -> Result<(), String> {
    // Removed partitions share the id space: an id is never reused.
    let mut ids: Vec<u32> = t
        .partitions
        .iter()
        .map(|p| p.id)
        .chain(t.removed.iter().map(|r| r.id))
        .collect();
    ids.sort_unstable();
    if ids.windows(2).any(|w| w[0] == w[1]) {
        return Err(format!("topic {}: duplicate partition id", t.name));
    }
    if ids.last().is_some_and(|&m| m >= t.next_partition_id) {
        return Err(format!(
            "topic {}: partition id not below next_partition_id",
            t.name
        ));
    }
    Ok(())
}

/// Each partition has a well-formed range, and it and each removed one at
/// most two parents older than itself.
fn check_partition_shapes(t: &TopicRecord) -> Result<(), String> {
    for p in &t.partitions {
        if p.start > p.end {
            return Err(format!(
                "topic {}: partition {} has an empty range",
                t.name, p.id
            ));
        }
        if p.parents.len() > 2
            || p.parents.iter().any(|&q| q >= p.id)
            || p.removed_parents
                .iter()
                .any(|(q, _)| !p.parents.contains(q))
        {
            return Err(format!(
                "topic {}: partition {} has invalid parents",
                t.name, p.id
            ));
        }
    }
    if t.removed
        .iter()
        .any(|r| r.parents.len() > 2 || r.parents.iter().any(|&q| q >= r.id))
    {
        return Err(format!(
            "topic {}: a removed partition has invalid parents",
            t.name
        ));
    }
    Ok(())
}

/// The active partitions' ranges tile `[0, u64::MAX]` exactly.
fn check_active_tiling(t: &TopicRecord) -> Result<(), String> {
    let mut active: Vec<&PartitionRecord> = t
        .partitions
        .iter()
        .filter(|p| p.state == PartitionState::Active)
        .collect();
    active.sort_by_key(|p| p.start);
    let mut next: Option<u64> = Some(0);
    for p in &active {
        if Some(p.start) != next {
            return Err(format!(
                "topic {}: active ranges do not tile the hash space at {}",
                t.name, p.start
            ));
        }
        next = p.end.checked_add(1);
    }
    if next.is_some() {
        return Err(format!(
            "topic {}: active ranges do not reach the end of the hash space",
            t.name
        ));
    }
    Ok(())
}

/// How many removed partitions a topic remembers ([`TopicRecord::removed`]):
/// the earliest removed are forgotten first. A reader resuming from a position
/// older than this many removals still reports the partitions it held and
/// the removed parents of those it opens, but not every forgotten one in
/// between. Bounds the manifest snapshot (about 50 bytes each).
pub const MAX_REMOVED_KEPT: usize = 4096;

/// Forgets the earliest removed partitions beyond [`MAX_REMOVED_KEPT`].
pub(crate) fn bound_removed(removed: &mut Vec<RemovedPartition>) {
    if let Some(excess) = removed.len().checked_sub(MAX_REMOVED_KEPT) {
        removed.drain(..excess);
    }
}

fn topic_mut(state: &mut ManifestState, id: u32) -> Result<&mut TopicRecord, String> {
    state
        .topics
        .iter_mut()
        .find(|t| t.id == id)
        .ok_or_else(|| format!("unknown topic id {id}"))
}

/// The index of partition `id`, which must be active (to be sealed).
fn active_index(t: &TopicRecord, id: u32) -> Result<usize, String> {
    let i = t
        .partitions
        .iter()
        .position(|p| p.id == id)
        .ok_or_else(|| format!("unknown partition {id}"))?;
    if t.partitions[i].state != PartitionState::Active {
        return Err(format!("partition {id} is already sealed"));
    }
    Ok(i)
}

/// New children are new and active, in increasing id order from
/// `next_partition_id` (ids are never reused, and the last u32 can't be
/// handed out: no id would remain for the next partition), each with a
/// well-formed range and removed parents among its parents. With ranges
/// that tile a sealed parent's (checked by the caller), adding them keeps
/// every invariant [`check_topic`] checks, so a change costs no walk over
/// the topic's other partitions.
fn check_new_children(t: &TopicRecord, children: &[PartitionRecord]) -> Result<(), String> {
    let mut next = t.next_partition_id;
    for c in children {
        if c.id < next || c.state != PartitionState::Active {
            return Err(format!("child partition {} is not new and active", c.id));
        }
        next =
            c.id.checked_add(1)
                .ok_or_else(|| format!("partition id {} leaves no next id", c.id))?;
        if c.start > c.end {
            return Err(format!(
                "topic {}: partition {} has an empty range",
                t.name, c.id
            ));
        }
        if c.removed_parents
            .iter()
            .any(|(q, _)| !c.parents.contains(q))
        {
            return Err(format!(
                "topic {}: partition {} has invalid parents",
                t.name, c.id
            ));
        }
    }
    Ok(())
}

/// Adds children [`check_new_children`] accepted.
fn add_children(t: &mut TopicRecord, children: &[PartitionRecord]) {
    for c in children {
        t.next_partition_id = c.id + 1;
        t.partitions.push(c.clone());
    }
}

/// Applies one record; on error `state` is unchanged.
///
/// Every record is checked in full before anything changes, so no record
/// needs a copy of the state to fall back on: replaying K changes costs
/// O(K) applications, not O(K) copies of a topology that grows with K.
pub fn apply(state: &mut ManifestState, rec: &ManifestRecord) -> Result<(), String> {
    apply_in_place(state, rec)
}

/// [`apply`]: every record is checked before it changes anything, so on
/// error `state` is unchanged. One arm per record kind, each a call:
/// what a kind checks and changes lives in its own function.
pub fn apply_in_place(state: &mut ManifestState, rec: &ManifestRecord) -> Result<(), String> {
    match rec {
        ManifestRecord::CreateTopic(t) => create_topic(state, t),
        ManifestRecord::DeleteTopic { topic_id } => delete_topic(state, *topic_id),
        ManifestRecord::Split {
            topic_id,
            parent,
            seal_offset,
            children,
        } => split(
            topic_mut(state, *topic_id)?,
            *parent,
            *seal_offset,
            children,
        ),
        ManifestRecord::TailSplit { topic_id, .. } => tail_split(topic_mut(state, *topic_id)?, rec),
        ManifestRecord::TailReclaimed {
            topic_id,
            parent,
            index_in_topic_dir,
        } => reclaim_tail(topic_mut(state, *topic_id)?, *parent, *index_in_topic_dir),
        ManifestRecord::Merge {
            topic_id,
            parents,
            child,
        } => merge(topic_mut(state, *topic_id)?, parents, child),
        ManifestRecord::RemovePartition {
            topic_id,
            partition,
        } => remove_partition(topic_mut(state, *topic_id)?, *partition),
        ManifestRecord::UpdateConfig { topic_id, config } => {
            topic_mut(state, *topic_id)?.config = config.clone();
            Ok(())
        }
        ManifestRecord::GroupCommit { topic_id, .. } => {
            group_commit(topic_mut(state, *topic_id)?, rec)
        }
        ManifestRecord::HotKeyMode {
            topic_id,
            hash,
            era,
        } => add_hot_key_era(topic_mut(state, *topic_id)?, *hash, era),
        ManifestRecord::DeleteGroup { topic_id, group } => {
            delete_group(topic_mut(state, *topic_id)?, group)
        }
    }
}

/// [`ManifestRecord::TailSplit`]: a split sealed at the physical end, the
/// moved range, and the named groups' positions moved to the children.
fn tail_split(t: &mut TopicRecord, rec: &ManifestRecord) -> Result<(), String> {
    let ManifestRecord::TailSplit {
        parent,
        from,
        seal_offset,
        children,
        counts,
        index_crc,
        groups,
        index_in_topic_dir,
        ..
    } = rec
    else {
        unreachable!("called for a tail split");
    };
    check_tail_counts(*parent, *from, *seal_offset, counts, children.len())?;
    check_group_moves(t, children, groups)?;
    split(t, *parent, *seal_offset, children)?;
    t.tail_moves.push(TailMove {
        parent: *parent,
        from: *from,
        seal_offset: *seal_offset,
        children: children.iter().map(|c| c.id).collect(),
        counts: counts.clone(),
        index_crc: *index_crc,
        reclaimed: false,
        index_in_topic_dir: *index_in_topic_dir,
    });
    move_groups_to_children(t, *parent, groups);
    debug_assert_eq!(check_groups(t), Ok(()), "checked before the change");
    Ok(())
}

/// [`ManifestRecord::GroupCommit`]: checked, then applied to its group
/// (made empty if the topic has none of that name).
fn group_commit(t: &mut TopicRecord, rec: &ManifestRecord) -> Result<(), String> {
    let ManifestRecord::GroupCommit {
        group,
        generation,
        positions,
        drained,
        pruned,
        ..
    } = rec
    else {
        unreachable!("called for a group commit");
    };
    check_group_commit(t, group, positions, drained)?;
    let i = group_index_or_new(t, group);
    commit_group(&mut t.groups[i], *generation, positions, drained, pruned);
    debug_assert_eq!(check_groups(t), Ok(()), "checked before the change");
    Ok(())
}

/// What [`check_groups`] would find wrong once a group commit is applied:
/// a bad name for a new group, a partition never handed out, one both
/// positioned and drained.
fn check_group_commit(
    t: &TopicRecord,
    group: &str,
    positions: &[GroupPosition],
    drained: &[u32],
) -> Result<(), String> {
    if !t.groups.iter().any(|g| g.name == group) {
        crate::topic_name::validate(group)
            .map_err(|e| format!("topic {}: group name: {e}", t.name))?;
    }
    for p in positions {
        if drained.contains(&p.partition) {
            return Err(format!(
                "group {group}: partition {} is both positioned and drained",
                p.partition
            ));
        }
    }
    let ids = positions
        .iter()
        .map(|p| p.partition)
        .chain(drained.iter().copied());
    if let Some(id) = ids.into_iter().find(|&id| id >= t.next_partition_id) {
        return Err(format!(
            "topic {}: group {group} names partition {id}, never handed out",
            t.name
        ));
    }
    Ok(())
}

/// [`ManifestRecord::CreateTopic`]: a new id and name, a well-formed topic.
fn create_topic(state: &mut ManifestState, t: &TopicRecord) -> Result<(), String> {
    if t.id < state.next_topic_id || state.topics.iter().any(|x| x.name == t.name) {
        return Err(format!("topic {} reuses an id or a name", t.name));
    }
    check_topic(t)?;
    state.next_topic_id =
        t.id.checked_add(1)
            .ok_or_else(|| format!("topic id {} leaves no next id", t.id))?;
    state.topics.push(t.clone());
    Ok(())
}

/// [`ManifestRecord::DeleteTopic`].
fn delete_topic(state: &mut ManifestState, topic_id: u32) -> Result<(), String> {
    let before = state.topics.len();
    state.topics.retain(|t| t.id != topic_id);
    if state.topics.len() == before {
        return Err(format!("unknown topic id {topic_id}"));
    }
    Ok(())
}

/// [`ManifestRecord::Split`] (and the split part of a tail split): seals
/// `parent` and adds children that tile its range exactly.
fn split(
    t: &mut TopicRecord,
    parent: u32,
    seal_offset: u64,
    children: &[PartitionRecord],
) -> Result<(), String> {
    let i = active_index(t, parent)?;
    let (start, end) = (t.partitions[i].start, t.partitions[i].end);
    let mut sorted: Vec<(u64, u64)> = children.iter().map(|c| (c.start, c.end)).collect();
    sorted.sort_unstable();
    if sorted.len() < 2
        || sorted.first().map(|c| c.0) != Some(start)
        || sorted.last().map(|c| c.1) != Some(end)
        || sorted
            .windows(2)
            .any(|w| w[0].1.checked_add(1) != Some(w[1].0))
        || children.iter().any(|c| c.parents != [parent])
    {
        return Err(format!(
            "split children of partition {parent} do not tile its range"
        ));
    }
    check_new_children(t, children)?;
    t.partitions[i].state = PartitionState::Sealed {
        end_offset: seal_offset,
    };
    add_children(t, children);
    debug_assert_eq!(check_topic(t), Ok(()), "checked before the change");
    Ok(())
}

/// A tail split's moved counts, one per child, add up to `from..seal_offset`.
fn check_tail_counts(
    parent: u32,
    from: u64,
    seal_offset: u64,
    counts: &[u64],
    children: usize,
) -> Result<(), String> {
    if from > seal_offset
        || counts.len() != children
        || counts.iter().try_fold(0u64, |a, &c| a.checked_add(c)) != Some(seal_offset - from)
    {
        return Err(format!(
            "tail split of partition {parent}: moved counts do not add up to {from}..{seal_offset}"
        ));
    }
    Ok(())
}

/// A tail split's group moves name known groups and move them only to
/// the split's children.
fn check_group_moves(
    t: &TopicRecord,
    children: &[PartitionRecord],
    groups: &[TailGroupMove],
) -> Result<(), String> {
    for gm in groups {
        if !t.groups.iter().any(|g| g.name == gm.group) {
            return Err(format!("tail split moves unknown group {}", gm.group));
        }
        if gm
            .positions
            .iter()
            .any(|&(c, _)| !children.iter().any(|x| x.id == c))
        {
            return Err(format!(
                "tail split moves group {} to a non-child",
                gm.group
            ));
        }
    }
    Ok(())
}

/// A tail split's group moves ([`check_group_moves`] accepted them): each
/// named group leaves `parent` for positions in its children (a position
/// it already has there stays).
fn move_groups_to_children(t: &mut TopicRecord, parent: u32, groups: &[TailGroupMove]) {
    for gm in groups {
        let Some(g) = t.groups.iter_mut().find(|g| g.name == gm.group) else {
            continue;
        };
        g.positions.remove(&parent);
        g.last_records.remove(&parent);
        for &(c, off) in &gm.positions {
            g.positions.entry(c).or_insert(off);
        }
    }
}

/// [`ManifestRecord::TailReclaimed`]: marks `parent`'s tail split reclaimed.
fn reclaim_tail(t: &mut TopicRecord, parent: u32, index_in_topic_dir: bool) -> Result<(), String> {
    let m = t
        .tail_moves
        .iter_mut()
        .find(|m| m.parent == parent)
        .ok_or_else(|| format!("partition {parent} has no tail split to reclaim"))?;
    m.reclaimed = true;
    m.index_in_topic_dir |= index_in_topic_dir;
    Ok(())
}

/// [`ManifestRecord::Merge`]: seals two adjacent partitions and adds the
/// child that spans both.
fn merge(
    t: &mut TopicRecord,
    parents: &[(u32, u64)],
    child: &PartitionRecord,
) -> Result<(), String> {
    let &[(a, a_end), (b, b_end)] = parents else {
        return Err("a merge has exactly two parents, named by the child".into());
    };
    if child.parents != [a, b] {
        return Err("a merge has exactly two parents, named by the child".into());
    }
    let ia = active_index(t, a)?;
    if a == b {
        return Err(format!("partition {b} is already sealed"));
    }
    let ib = active_index(t, b)?;
    let (pa, pb) = (&t.partitions[ia], &t.partitions[ib]);
    if pa.end.checked_add(1) != Some(pb.start) || child.start != pa.start || child.end != pb.end {
        return Err("merged partitions are not adjacent or the child range is wrong".into());
    }
    check_new_children(t, std::slice::from_ref(child))?;
    t.partitions[ia].state = PartitionState::Sealed { end_offset: a_end };
    t.partitions[ib].state = PartitionState::Sealed { end_offset: b_end };
    add_children(t, std::slice::from_ref(child));
    debug_assert_eq!(check_topic(t), Ok(()), "checked before the change");
    Ok(())
}

/// [`ManifestRecord::RemovePartition`]: forgets a sealed partition whose
/// parents are gone, remembering it in [`TopicRecord::removed`].
fn remove_partition(t: &mut TopicRecord, partition: u32) -> Result<(), String> {
    let i = removable_index(t, partition)?;
    // A group that neither lists it nor has passed it (lists a
    // descendant) would have read it from its first offset: that
    // is its position in it from now on (see below).
    let unread: Vec<usize> = (0..t.groups.len())
        .filter(|&g| !group_passed(t, &t.groups[g], partition))
        .collect();
    let removed = t.partitions.remove(i);
    let PartitionState::Sealed { end_offset } = removed.state else {
        unreachable!("checked sealed above");
    };
    // A tail-split parent ends, for its readers, where its moved
    // range starts.
    let end_offset = t
        .tail_moves
        .iter()
        .find(|m| m.parent == partition)
        .map_or(end_offset, |m| m.from);
    for c in t.partitions.iter_mut() {
        if c.parents.contains(&partition) {
            c.removed_parents.push((partition, end_offset));
        }
    }
    t.removed.push(RemovedPartition {
        id: partition,
        parents: removed.parents,
        end_offset,
    });
    bound_removed(&mut t.removed);
    let kept = drop_tail_moves(t, partition);
    settle_group_positions(t, partition, &unread, &kept);
    Ok(())
}

/// The index of `partition` if it may be removed: sealed, and its parents
/// already removed.
fn removable_index(t: &TopicRecord, partition: u32) -> Result<usize, String> {
    let i = t
        .partitions
        .iter()
        .position(|p| p.id == partition)
        .ok_or_else(|| format!("unknown partition {partition}"))?;
    if t.partitions[i].state == PartitionState::Active {
        return Err(format!(
            "partition {partition} is active and cannot be removed"
        ));
    }
    // Oldest first: a partition whose parent is still there may
    // still be needed to continue a reader's lineage in order.
    let parents = &t.partitions[i].parents;
    if t.partitions.iter().any(|p| parents.contains(&p.id)) {
        return Err(format!(
            "partition {partition} is removed before its parents"
        ));
    }
    Ok(i)
}

/// Drops the tail entries no saved position can need once `partition` is
/// removed; returns the ids the topic still names (partitions and removed).
fn drop_tail_moves(t: &mut TopicRecord, partition: u32) -> std::collections::BTreeSet<u32> {
    // A tail entry stays while a saved position past the parent's
    // logical end may still need translating: while the topology
    // or the removed list names the parent (its index is in the
    // topic's directory), or, for an index written into the first
    // child's directory, while that child is there.
    let kept: std::collections::BTreeSet<u32> = t
        .partitions
        .iter()
        .map(|p| p.id)
        .chain(t.removed.iter().map(|r| r.id))
        .collect();
    t.tail_moves.retain(|m| {
        if m.index_in_topic_dir {
            kept.contains(&m.parent)
        } else {
            m.children.first() != Some(&partition)
        }
    });
    kept
}

/// The groups' entries once `partition` is removed.
fn settle_group_positions(
    t: &mut TopicRecord,
    partition: u32,
    unread: &[usize],
    kept: &std::collections::BTreeSet<u32>,
) {
    // A group's position in it stays (or starts at 0, above): what
    // the group had not consumed there is a loss the group reports
    // to a member, and the position leaves with the commit of a
    // member told of it (its children count it read meanwhile).
    // Positions in removed partitions the topic no longer
    // remembers go, so they stay bounded like `removed`. Its
    // fingerprint and a drained entry (read to the seal: nothing
    // lost) go now.
    for &g in unread {
        t.groups[g].positions.insert(partition, 0);
    }
    for g in &mut t.groups {
        g.positions.retain(|p, _| kept.contains(p));
        let positions = &g.positions;
        g.last_records
            .retain(|p, _| *p != partition && positions.contains_key(p));
        g.drained.remove(&partition);
    }
}

/// The index of the group named `group`, added empty if the topic has none.
fn group_index_or_new(t: &mut TopicRecord, group: &str) -> usize {
    match t.groups.iter().position(|g| g.name == group) {
        Some(i) => i,
        None => {
            t.groups.push(GroupRecord {
                name: group.to_owned(),
                ..Default::default()
            });
            t.groups.len() - 1
        }
    }
}

/// [`ManifestRecord::GroupCommit`] on its group ([`check_group_commit`]
/// accepted it): new positions, drained and pruned partitions; the
/// generation only grows.
fn commit_group(
    g: &mut GroupRecord,
    generation: u64,
    positions: &[GroupPosition],
    drained: &[u32],
    pruned: &[u32],
) {
    g.generation = g.generation.max(generation);
    for p in positions {
        g.positions.insert(p.partition, p.offset);
        match p.last_record {
            Some(f) => g.last_records.insert(p.partition, f),
            None => g.last_records.remove(&p.partition),
        };
        g.drained.remove(&p.partition);
    }
    for &d in drained {
        g.positions.remove(&d);
        g.last_records.remove(&d);
        g.drained.insert(d);
    }
    for d in pruned {
        g.drained.remove(d);
    }
}

/// [`ManifestRecord::HotKeyMode`]: a checked era appended to its key's.
fn add_hot_key_era(
    t: &mut TopicRecord,
    hash: u64,
    era: &crate::format::manifest::HotKeyEra,
) -> Result<(), String> {
    check_hot_key_era(hash, era)?;
    match t.hot_keys.iter_mut().find(|k| k.hash == hash) {
        Some(k) => k.eras.push(era.clone()),
        None => t.hot_keys.push(crate::format::manifest::HotKeyRecord {
            hash,
            eras: vec![era.clone()],
        }),
    }
    Ok(())
}

/// [`ManifestRecord::DeleteGroup`].
fn delete_group(t: &mut TopicRecord, group: &str) -> Result<(), String> {
    let before = t.groups.len();
    t.groups.retain(|g| g.name != group);
    if t.groups.len() == before {
        return Err(format!("unknown group {group}"));
    }
    Ok(())
}

/// Checks one hot-key era: lanes start at the key's hash, are distinct and
/// at most [`crate::config::MAX_HOT_KEY_LANES`]; strict has exactly one,
/// a window is at least 1 ms.
fn check_hot_key_era(hash: u64, era: &crate::format::manifest::HotKeyEra) -> Result<(), String> {
    use crate::config::{HotKeyMode, MAX_HOT_KEY_LANES};
    let n = era.lanes.len();
    if n == 0 || n > MAX_HOT_KEY_LANES as usize || era.lanes[0] != hash {
        return Err(format!("hot key {hash:#x}: bad lanes {:?}", era.lanes));
    }
    let mut sorted = era.lanes.clone();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != n {
        return Err(format!("hot key {hash:#x}: repeated lanes"));
    }
    match era.mode {
        HotKeyMode::Strict if n != 1 => Err(format!("hot key {hash:#x}: strict has one lane")),
        HotKeyMode::Windowed(w) if w.as_millis() == 0 => {
            Err(format!("hot key {hash:#x}: zero window"))
        }
        _ => Ok(()),
    }
}

/// Checks a whole state (a snapshot) for consistency.
pub fn check_state(state: &ManifestState) -> Result<(), String> {
    let mut names: Vec<&str> = state.topics.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    if names.windows(2).any(|w| w[0] == w[1]) {
        return Err("duplicate topic name".into());
    }
    for t in &state.topics {
        if t.id >= state.next_topic_id {
            return Err(format!(
                "topic {} has an id not below next_topic_id",
                t.name
            ));
        }
        check_topic(t)?;
        for k in &t.hot_keys {
            k.eras
                .iter()
                .try_for_each(|e| check_hot_key_era(k.hash, e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::TopicConfig;
    use crate::format::manifest::GroupPosition;

    pub(crate) fn part(id: u32, (start, end): (u64, u64), parents: Vec<u32>) -> PartitionRecord {
        PartitionRecord {
            id,
            start,
            end,
            parents,
            state: PartitionState::Active,
            created_ms: 0,
            removed_parents: vec![],
        }
    }

    /// Topic 0, "t", of one partition over the whole key range.
    pub(crate) fn whole_range_topic() -> TopicRecord {
        TopicRecord {
            id: 0,
            name: "t".into(),
            config: TopicConfig::default().to_record(),
            hash_key: [0, 0],
            next_partition_id: 1,
            partitions: vec![part(0, (0, u64::MAX), vec![])],
            groups: Vec::new(),
            removed: Vec::new(),
            tail_moves: Vec::new(),
            hot_keys: Vec::new(),
        }
    }

    fn split(parent: u32, ids: (u32, u32), (start, end): (u64, u64)) -> ManifestRecord {
        let mid = start + (end - start) / 2;
        ManifestRecord::Split {
            topic_id: 0,
            parent,
            seal_offset: 10,
            children: vec![
                part(ids.0, (start, mid), vec![parent]),
                part(ids.1, (mid + 1, end), vec![parent]),
            ],
        }
    }

    fn remove(partition: u32) -> ManifestRecord {
        ManifestRecord::RemovePartition {
            topic_id: 0,
            partition,
        }
    }

    /// A split, merge or group commit, valid or spoilt one field at a
    /// time: a refused one leaves the state exactly as it was, an accepted
    /// one leaves a state that passes every check. Seeded, with the seed
    /// in the failure message.
    #[test]
    fn a_refused_record_leaves_the_state_unchanged_and_an_accepted_one_consistent() {
        for seed in 1..=40u64 {
            let mut rng = seed;
            let mut next = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            let mut state = ManifestState::default();
            let topic = whole_range_topic();
            apply(&mut state, &ManifestRecord::CreateTopic(topic)).unwrap();
            let (mut accepted, mut refused) = (0, 0);
            for step in 0..300 {
                let t = &state.topics[0];
                let active: Vec<&PartitionRecord> = t
                    .partitions
                    .iter()
                    .filter(|p| p.state == PartitionState::Active)
                    .collect();
                let n = t.next_partition_id;
                let a = active[(next() as usize) % active.len()];
                let mut rec = match next() % 3 {
                    0 if a.start < a.end => split(a.id, (n, n + 1), (a.start, a.end)),
                    1 => {
                        let b = active
                            .iter()
                            .find(|b| a.end.checked_add(1) == Some(b.start));
                        match b {
                            Some(b) => ManifestRecord::Merge {
                                topic_id: 0,
                                parents: vec![(a.id, 3), (b.id, 4)],
                                child: part(n, (a.start, b.end), vec![a.id, b.id]),
                            },
                            None => remove(a.id),
                        }
                    }
                    _ => ManifestRecord::GroupCommit {
                        topic_id: 0,
                        group: "g".into(),
                        generation: step,
                        positions: vec![GroupPosition {
                            partition: a.id,
                            offset: step,
                            last_record: None,
                        }],
                        drained: vec![],
                        pruned: vec![],
                    },
                };
                // Spoil one field of about half of them.
                let spoil = next() % 12;
                match &mut rec {
                    ManifestRecord::Split {
                        children, parent, ..
                    } => match spoil {
                        0 => children[0].id = 0,
                        1 => children[1].start = children[1].start.wrapping_add(1),
                        2 => children[0].end = children[0].start.wrapping_sub(1),
                        3 => children[1].parents = vec![*parent, 0],
                        4 => children[0].removed_parents = vec![(99, 1)],
                        5 => *parent = n + 7,
                        _ => {}
                    },
                    ManifestRecord::Merge { parents, child, .. } => match spoil {
                        0 => child.id = 0,
                        1 => child.end = child.end.wrapping_sub(1),
                        2 => parents[1] = parents[0],
                        3 => child.parents.reverse(),
                        _ => {}
                    },
                    ManifestRecord::GroupCommit {
                        positions,
                        drained,
                        group,
                        ..
                    } => match spoil {
                        0 => positions[0].partition = n,
                        1 => drained.push(positions[0].partition),
                        2 => *group = "bad name!".into(),
                        _ => {}
                    },
                    _ => {}
                }
                let before = state.clone();
                match apply(&mut state, &rec) {
                    Ok(()) => {
                        accepted += 1;
                        if let Err(e) = check_state(&state) {
                            panic!("seed {seed} step {step}: {e} after {rec:?}");
                        }
                    }
                    Err(_) => {
                        refused += 1;
                        assert_eq!(state, before, "seed {seed} step {step}: {rec:?}");
                    }
                }
            }
            assert!(
                accepted > 50 && refused > 20,
                "seed {seed}: {accepted}/{refused}"
            );
        }
    }

    /// Only sealed partitions leave, oldest first; a removed id stays
    /// taken, and a child naming a removed parent passes every check.
    #[test]
    fn remove_partition_rules() {
        let mut state = ManifestState::default();
        let topic = whole_range_topic();
        apply(&mut state, &ManifestRecord::CreateTopic(topic)).unwrap();
        apply(&mut state, &split(0, (1, 2), (0, u64::MAX))).unwrap();
        apply(&mut state, &split(1, (3, 4), (0, u64::MAX / 2))).unwrap();
        assert!(apply(&mut state, &remove(2)).is_err(), "active");
        assert!(
            apply(&mut state, &remove(1)).is_err(),
            "parent 0 still there"
        );
        assert!(apply(&mut state, &remove(9)).is_err(), "unknown");
        apply(&mut state, &remove(0)).unwrap();
        apply(&mut state, &remove(1)).unwrap();
        assert!(apply(&mut state, &remove(1)).is_err(), "already removed");
        let t = &state.topics[0];
        let ids: Vec<u32> = t.partitions.iter().map(|p| p.id).collect();
        assert_eq!(ids, vec![2, 3, 4]);
        // Children remember where each removed parent was sealed.
        let removed: Vec<&[(u32, u64)]> = t
            .partitions
            .iter()
            .map(|p| p.removed_parents.as_slice())
            .collect();
        assert_eq!(removed, [&[(0, 10)][..], &[(1, 10)], &[(1, 10)]]);
        // The topic remembers both, with their parents.
        assert_eq!(
            t.removed,
            [
                RemovedPartition {
                    id: 0,
                    parents: vec![],
                    end_offset: 10
                },
                RemovedPartition {
                    id: 1,
                    parents: vec![0],
                    end_offset: 10
                }
            ]
        );
        assert_eq!(t.next_partition_id, 5);
        check_state(&state).unwrap();
        // A removed id may not come back as a partition.
        let mut bad = state.clone();
        bad.topics[0].partitions[0].id = 1;
        assert!(check_state(&bad).is_err());
    }

    /// A tail entry whose index lies in the topic's directory stays while
    /// the removed list names its parent (also after its first child left);
    /// an older entry (index in the first child's directory) goes with
    /// that child.
    #[test]
    fn tail_entries_stay_while_the_parent_is_named() {
        let max = MAX_REMOVED_KEPT as u32;
        let mut state = ManifestState::default();
        let entry = |parent: u32, index_in_topic_dir: bool| TailMove {
            parent,
            from: 4,
            seal_offset: 10,
            children: vec![1, 99],
            counts: vec![3, 3],
            index_crc: 0,
            reclaimed: false,
            index_in_topic_dir,
        };
        let gone = |id: u32| RemovedPartition {
            id,
            parents: vec![],
            end_offset: 4,
        };
        let topic = TopicRecord {
            id: 0,
            name: "t".into(),
            config: TopicConfig::default().to_record(),
            hash_key: [0, 0],
            next_partition_id: max + 100,
            partitions: vec![part(1, (0, u64::MAX), vec![0])],
            groups: Vec::new(),
            // Parent 0 is the earliest named: the next removal forgets it.
            removed: std::iter::once(gone(0))
                .chain((10..10 + max - 1).map(gone))
                .collect(),
            tail_moves: vec![entry(0, true), entry(10, false), entry(11, true)],
            hot_keys: Vec::new(),
        };
        apply(&mut state, &ManifestRecord::CreateTopic(topic)).unwrap();
        apply(&mut state, &split(1, (max + 100, max + 101), (0, u64::MAX))).unwrap();
        apply(&mut state, &remove(1)).unwrap();
        let t = &state.topics[0];
        assert_eq!(t.removed.len(), MAX_REMOVED_KEPT);
        assert!(t.removed.iter().all(|r| r.id != 0), "0 forgotten");
        // 0: no longer named; 10: its first child (1) left; 11: named.
        let kept: Vec<u32> = t.tail_moves.iter().map(|m| m.parent).collect();
        assert_eq!(kept, vec![11]);
    }

    /// The list of removed partitions keeps the newest `MAX_REMOVED_KEPT`.
    #[test]
    fn removed_partitions_are_bounded() {
        let max = MAX_REMOVED_KEPT as u32;
        let mut state = ManifestState::default();
        let topic = TopicRecord {
            id: 0,
            name: "t".into(),
            config: TopicConfig::default().to_record(),
            hash_key: [0, 0],
            next_partition_id: max + 1,
            partitions: vec![part(0, (0, u64::MAX), vec![])],
            groups: Vec::new(),
            tail_moves: Vec::new(),
            hot_keys: Vec::new(),
            removed: (1..=max)
                .map(|id| RemovedPartition {
                    id,
                    parents: vec![],
                    end_offset: 1,
                })
                .collect(),
        };
        apply(&mut state, &ManifestRecord::CreateTopic(topic)).unwrap();
        apply(&mut state, &split(0, (max + 1, max + 2), (0, u64::MAX))).unwrap();
        apply(&mut state, &remove(0)).unwrap();
        let t = &state.topics[0];
        assert_eq!(t.removed.len(), MAX_REMOVED_KEPT);
        // The earliest removed (id 1) is forgotten; the newest (0) kept.
        assert_eq!(t.removed[0].id, 2);
        assert_eq!(t.removed.last().map(|r| r.id), Some(0));
        check_state(&state).unwrap();
    }

    /// A group's position in a removed partition stays (the group reports
    /// what it had not read there, then drops it with a commit) while the
    /// topic remembers the partition; its fingerprint and a drained entry
    /// go at once, and positions in partitions `removed` forgot go too. A
    /// group that neither listed nor passed it gets a position at 0.
    #[test]
    fn group_positions_in_removed_partitions_are_kept_while_remembered() {
        let max = MAX_REMOVED_KEPT as u32;
        let mut state = ManifestState::default();
        let group = |name: &str, positions: &[(u32, u64)], drained: &[u32]| GroupRecord {
            name: name.into(),
            generation: 1,
            positions: positions.iter().copied().collect(),
            last_records: positions.iter().map(|&(p, _)| (p, 77)).collect(),
            drained: drained.iter().copied().collect(),
        };
        let topic = TopicRecord {
            id: 0,
            name: "t".into(),
            config: TopicConfig::default().to_record(),
            hash_key: [0, 0],
            next_partition_id: max + 1,
            partitions: vec![part(0, (0, u64::MAX), vec![])],
            groups: vec![
                group("g", &[(0, 5), (1, 3), (2, 4)], &[]),
                group("h", &[], &[0]),
                group("u", &[], &[]),
            ],
            tail_moves: Vec::new(),
            hot_keys: Vec::new(),
            removed: (1..=max)
                .map(|id| RemovedPartition {
                    id,
                    parents: vec![],
                    end_offset: 9,
                })
                .collect(),
        };
        apply(&mut state, &ManifestRecord::CreateTopic(topic)).unwrap();
        apply(&mut state, &split(0, (max + 1, max + 2), (0, u64::MAX))).unwrap();
        // "v" read 0 and lists a child.
        apply(
            &mut state,
            &ManifestRecord::GroupCommit {
                topic_id: 0,
                group: "v".into(),
                generation: 1,
                positions: vec![GroupPosition {
                    partition: max + 1,
                    offset: 3,
                    last_record: None,
                }],
                drained: vec![],
                pruned: vec![],
            },
        )
        .unwrap();
        apply(&mut state, &remove(0)).unwrap();
        let t = &state.topics[0];
        // "u" listed nothing and passed nothing: it was to read 0 from 0.
        assert_eq!(t.groups[2].positions.iter().collect::<Vec<_>>(), [(&0, &0)]);
        assert!(!t.groups[3].positions.contains_key(&0), "v passed 0");
        assert!(!t.groups[1].positions.contains_key(&0), "h drained 0");
        let g = &t.groups[0];
        // 1 fell out of `removed`; 0 and 2 are remembered.
        assert_eq!(g.positions.iter().collect::<Vec<_>>(), [(&0, &5), (&2, &4)]);
        assert!(!g.last_records.contains_key(&0));
        assert!(t.groups[1].drained.is_empty());
        check_state(&state).unwrap();
        // A commit naming it drained and pruned drops it.
        apply(
            &mut state,
            &ManifestRecord::GroupCommit {
                topic_id: 0,
                group: "g".into(),
                generation: 2,
                positions: vec![],
                drained: vec![0],
                pruned: vec![0],
            },
        )
        .unwrap();
        let g = &state.topics[0].groups[0];
        assert_eq!(g.positions.keys().collect::<Vec<_>>(), [&2]);
        assert!(g.drained.is_empty());
    }
}
