//! The monitor of a `fissionlog simulate` run: the thread that samples
//! partition offsets, counts topology events, steers `--phases` and draws
//! the live view.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use fissionlog::{PartitionInfo, Topic, TopologyEvent};

use super::check::ConsumerShared;
use super::live::{Live, LiveRow};
use super::report::{self, window_load, EventNote, PhasesReport, Sample};
use super::workload::Shared;
use super::{Plan, Stop, CALM_SHARE, SURGE_SHARE, TOPIC};

/// Topology events of the run, counted.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) splits: u64,
    pub(super) merges: u64,
    pub(super) hot_keys: u64,
    pub(super) first_split: Option<f64>,
    /// Time of the last split or merge.
    pub(super) last_change: Option<f64>,
    pub(super) notes: Vec<EventNote>,
}

impl Tally {
    /// Takes every pending event of the simulated topic; returns the new notes.
    pub(super) fn drain(&mut self, events: &Receiver<TopologyEvent>, t: f64) -> Vec<EventNote> {
        let mut fresh = Vec::new();
        while let Ok(e) = events.try_recv() {
            let note = match e {
                TopologyEvent::Split {
                    topic,
                    parent,
                    seal_offset,
                    children,
                } if topic == TOPIC => {
                    self.splits += 1;
                    self.first_split.get_or_insert(t);
                    self.last_change = Some(t);
                    EventNote {
                        t,
                        kind: "split",
                        what: format!("p{parent} split at offset {seal_offset} into {children:?}"),
                    }
                }
                TopologyEvent::Merge {
                    topic,
                    parents,
                    child,
                } if topic == TOPIC => {
                    self.merges += 1;
                    self.last_change = Some(t);
                    let ids: Vec<u32> = parents.iter().map(|p| p.0).collect();
                    EventNote {
                        t,
                        kind: "merge",
                        what: format!("{ids:?} merged into p{child}"),
                    }
                }
                TopologyEvent::HotKey {
                    topic,
                    partition,
                    hash,
                } if topic == TOPIC => {
                    self.hot_keys += 1;
                    EventNote {
                        t,
                        kind: "hot_key",
                        what: format!("p{partition} holds one hot key (hash {hash:016x})"),
                    }
                }
                _ => continue,
            };
            fresh.push(note.clone());
            self.notes.push(note);
        }
        fresh
    }

    pub(super) fn phase(&mut self, t: f64, what: String) -> EventNote {
        let note = EventNote {
            t,
            kind: "phase",
            what,
        };
        self.notes.push(note.clone());
        note
    }
}

/// The `--phases` schedule and what it measured.
#[derive(Debug, Clone, Copy)]
pub(super) struct PhaseState {
    pub(super) surge: Duration,
    /// Set when the calm phase begins: (t, acked then, active partitions,
    /// merges so far, surge records/s).
    pub(super) calm_from: Option<(f64, u64, usize, u64, f64)>,
}

/// The thread that samples, steers phases and draws the live view.
pub(super) struct Monitor {
    pub(super) started: Instant,
    pub(super) producers: u32,
    pub(super) stop: Stop,
    pub(super) samples: Vec<Sample>,
    pub(super) active: Vec<(u32, u64, u64)>,
    pub(super) tally: Tally,
    pub(super) phases: Option<PhaseState>,
    pub(super) live: Option<Live>,
}

impl Monitor {
    pub(super) fn new(plan: &Plan) -> Monitor {
        let phases = match (plan.phases, plan.stop) {
            (true, Stop::After(d)) => Some(PhaseState {
                surge: d.mul_f64(SURGE_SHARE),
                calm_from: None,
            }),
            _ => None,
        };
        let live = plan.live().then(|| {
            Live::new(match plan.stop {
                Stop::After(d) => (d.as_secs_f64() * 10.0) as u64,
                Stop::Records(n) => n,
            })
        });
        Monitor {
            started: Instant::now(),
            producers: plan.workload.producers,
            stop: plan.stop,
            samples: Vec::new(),
            active: Vec::new(),
            tally: Tally::default(),
            phases,
            live,
        }
    }

    pub(super) fn t(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Records a sample; returns the partitions it read.
    pub(super) fn sample(&mut self, topic: &Topic, shared: &Shared) -> Vec<PartitionInfo> {
        let t = self.t();
        let infos = topic.partitions();
        let mut active: Vec<(u32, u64, u64)> = infos
            .iter()
            .filter(|p| p.sealed_at.is_none())
            .map(|p| (p.id, p.start, p.end))
            .collect();
        active.sort_by_key(|a| a.1);
        self.active = active;
        let end_offsets: BTreeMap<u32, u64> = infos.iter().map(|p| (p.id, p.end_offset)).collect();
        self.samples.push(Sample {
            t,
            end_offsets,
            initial_ranges: shared.initial_range_counts(),
            acked: shared.acked.load(Ordering::Acquire),
        });
        infos
    }

    pub(super) fn events(&mut self, events: &Receiver<TopologyEvent>) {
        let t = self.t();
        let fresh = self.tally.drain(events, t);
        if let Some(live) = &self.live {
            for n in fresh {
                live.event(&format!("{:6.2} s  {}", n.t, n.what));
            }
        }
    }

    /// Switches phases; returns true when the producers should stop.
    pub(super) fn steer(&mut self, shared: &Shared) -> bool {
        let t = self.t();
        if let Some(ph) = &mut self.phases {
            if ph.calm_from.is_none() && t >= ph.surge.as_secs_f64() {
                let acked = shared.acked.load(Ordering::Acquire);
                let surge_rate = acked as f64 / t.max(1e-3);
                let producers = f64::from(self.producers.max(1));
                shared.set_limit_per_producer((surge_rate * CALM_SHARE / producers).max(1.0));
                ph.calm_from = Some((t, acked, self.active.len(), self.tally.merges, surge_rate));
                let note = self.tally.phase(
                    t,
                    format!(
                        "calm phase: producers throttled to {:.0}% of {} records/s",
                        CALM_SHARE * 100.0,
                        report::si(surge_rate)
                    ),
                );
                if let Some(live) = &self.live {
                    live.event(&format!("{:6.2} s  {}", note.t, note.what));
                }
            }
        }
        matches!(self.stop, Stop::After(d) if t >= d.as_secs_f64())
    }

    pub(super) fn draw(&self, consumer: &ConsumerShared, shared: &Shared) {
        let Some(live) = &self.live else { return };
        let ids: Vec<u32> = self.active.iter().map(|a| a.0).collect();
        let recent = window_load(&self.samples, &ids, 1.0);
        let rows: Vec<LiveRow> = self
            .active
            .iter()
            .map(|&(id, start, end)| LiveRow {
                id,
                start,
                end,
                records_per_sec: recent.rates.get(&id).copied().unwrap_or(0.0),
            })
            .collect();
        let acked = shared.acked.load(Ordering::Acquire);
        let lag = acked.saturating_sub(consumer.read.load(Ordering::Relaxed));
        let phase = match &self.phases {
            Some(p) if p.calm_from.is_some() => "calm  ",
            Some(_) => "surge ",
            None => "",
        };
        let status = consumer
            .status
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default();
        let headline = format!(
            "{phase}{} rec/s  {} active  {} splits  {} merges  {} hot keys  consumer lag {}{status}",
            report::si(recent.records_per_sec),
            self.active.len(),
            self.tally.splits,
            self.tally.merges,
            self.tally.hot_keys,
            report::si(lag as f64)
        );
        let position = match self.stop {
            Stop::After(_) => (self.t() * 10.0) as u64,
            Stop::Records(_) => acked,
        };
        live.update(position, headline, &rows);
    }

    pub(super) fn phases_report(&self, shared: &Shared) -> Option<PhasesReport> {
        let ph = self.phases?;
        let end = self.samples.last().map_or(0.0, |s| s.t);
        let acked = shared.acked.load(Ordering::Acquire);
        Some(match ph.calm_from {
            Some((t, acked_then, parts, merges_then, surge_rate)) => PhasesReport {
                surge_secs: t,
                calm_secs: end - t,
                surge_records_per_sec: surge_rate,
                calm_records_per_sec: (acked - acked_then) as f64 / (end - t).max(1e-3),
                partitions_after_surge: parts,
                merges_in_calm: self.tally.merges - merges_then,
            },
            None => PhasesReport {
                surge_secs: end,
                calm_secs: 0.0,
                surge_records_per_sec: acked as f64 / end.max(1e-3),
                calm_records_per_sec: 0.0,
                partitions_after_surge: self.active.len(),
                merges_in_calm: 0,
            },
        })
    }
}
