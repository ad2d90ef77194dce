//! The live view on a terminal: throughput, active partitions, one load bar
//! per partition, and topology changes as they happen.

use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::report::si;

/// Most partition bars drawn; the rest are summarised in one line.
const MAX_BARS: usize = 24;
/// Width of a load bar in characters.
const BAR_WIDTH: usize = 30;

/// The live view (only built when stdout is a terminal and not `--json`).
pub struct Live {
    multi: MultiProgress,
    head: ProgressBar,
    parts: ProgressBar,
}

/// One active partition as the live view draws it.
pub struct LiveRow {
    /// Partition id.
    pub id: u32,
    /// First hash of its range.
    pub start: u64,
    /// Last hash of its range.
    pub end: u64,
    /// Recent records/s.
    pub records_per_sec: f64,
}

impl Live {
    /// A view whose progress runs to `length` (tenths of seconds, or records).
    pub fn new(length: u64) -> Live {
        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stdout_with_hz(10));
        let head = multi.add(ProgressBar::new(length));
        head.set_style(
            ProgressStyle::with_template("{elapsed:>4} [{bar:30.cyan/blue}] {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        let parts = multi.add(ProgressBar::new(1));
        parts.set_style(
            ProgressStyle::with_template("{msg}").unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        head.enable_steady_tick(Duration::from_millis(200));
        Live { multi, head, parts }
    }

    /// Redraws with the latest figures.
    pub fn update(&self, position: u64, headline: String, rows: &[LiveRow]) {
        self.head.set_position(position);
        self.head.set_message(headline);
        let max = rows
            .iter()
            .map(|r| r.records_per_sec)
            .fold(0.0f64, f64::max)
            .max(1.0);
        let mut lines: Vec<String> = rows
            .iter()
            .take(MAX_BARS)
            .map(|r| {
                let filled = ((r.records_per_sec / max) * BAR_WIDTH as f64).round() as usize;
                let filled = filled.min(BAR_WIDTH);
                format!(
                    "  p{:<4} {:016x}..{:016x} {}{} {:>8}/s",
                    r.id,
                    r.start,
                    r.end,
                    "#".repeat(filled),
                    ".".repeat(BAR_WIDTH - filled),
                    si(r.records_per_sec)
                )
            })
            .collect();
        if rows.len() > MAX_BARS {
            lines.push(format!("  ... and {} more", rows.len() - MAX_BARS));
        }
        self.parts.set_message(lines.join("\n"));
    }

    /// Prints one line above the bars (a split, a merge, a phase change).
    pub fn event(&self, line: &str) {
        let _ = self.multi.println(line);
    }

    /// Removes the bars.
    pub fn finish(&self) {
        self.head.finish_and_clear();
        self.parts.finish_and_clear();
        let _ = self.multi.clear();
    }
}
