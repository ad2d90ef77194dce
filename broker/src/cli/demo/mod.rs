//! `demo`: the distributed main job on loopback. A broker process, producer
//! processes with a skewed key workload, a consumer group of processes;
//! partitions split under load, one consumer is SIGKILLed mid-run, and a
//! checked summary ends it (docs/BROKER.md defines every field).

mod tally;
mod workers;

pub(crate) use workers::{consumer, producer, ConsumerArgs, ProducerArgs};

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fissionlog_broker::client::{Admin, Connection};
use fissionlog_broker::protocol::{SplitSpec, SyncSpec};
use serde_json::Value;

use super::{CmdResult, Failure};
use tally::{print_text, summarize, Tally};

pub(super) const TOPIC: &str = "demo";
pub(super) const GROUP: &str = "demo-group";
/// The hot key: this share of every producer's records.
pub(super) const HOT_KEY: &str = "k0";
pub(super) const HOT_SHARE_PERCENT: u64 = 40;

#[derive(clap::Args)]
pub(crate) struct DemoArgs {
    /// Records per producer.
    #[arg(long, default_value_t = 6000)]
    pub records: u64,
    /// Producer processes.
    #[arg(long, default_value_t = 2)]
    pub producers: u32,
    /// Consumer processes in the group.
    #[arg(long, default_value_t = 3)]
    pub consumers: u32,
    /// Distinct keys.
    #[arg(long, default_value_t = 32)]
    pub keys: u64,
    /// Records per second per producer.
    #[arg(long, default_value_t = 2000)]
    pub rate: u64,
    /// Seed of the key choice.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// One JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Children killed and reaped however the demo ends.
#[derive(Default)]
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

enum Line {
    Broker(String),
    Producer(u32, String),
    Consumer(u32, String),
    Closed,
}

fn pipe_lines(
    child: &mut Child,
    tx: mpsc::Sender<Line>,
    wrap: impl Fn(String) -> Line + Send + 'static,
) {
    if let Some(out) = child.stdout.take() {
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(l) = line else { break };
                if tx.send(wrap(l)).is_err() {
                    break;
                }
            }
            let _ = tx.send(Line::Closed);
        });
    }
}

fn spawn(args: &[String]) -> Result<Child, Failure> {
    let exe = std::env::current_exe()
        .map_err(|e| Failure::usage(format!("cannot find this program: {e}")))?;
    Command::new(exe)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| Failure::usage(format!("cannot start a child process: {e}")))
}

/// When the demo acts, in acknowledged records.
struct Plan {
    split_hot_at: usize,
    kill_at: usize,
    split_even_at: usize,
}

/// The running demo: its children and what they print.
struct Demo {
    kids: Children,
    rx: mpsc::Receiver<Line>,
    tx: Option<mpsc::Sender<Line>>,
    broker_pid: u32,
    addr: String,
    /// Indices in `kids` of the consumers.
    consumers: Vec<usize>,
}

/// The consumer the demo SIGKILLs.
const KILLED: u32 = 0;

impl Demo {
    fn start_broker(dir: &std::path::Path) -> Result<Demo, Failure> {
        let (tx, rx) = mpsc::channel::<Line>();
        let mut broker = spawn(&[
            "serve".into(),
            "--dir".into(),
            dir.display().to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
        ])?;
        pipe_lines(&mut broker, tx.clone(), Line::Broker);
        let broker_pid = broker.id();
        let kids = Children(vec![broker]);
        let addr = loop {
            match rx.recv_timeout(Duration::from_secs(10)) {
                Ok(Line::Broker(l)) => {
                    if let Some(a) = l.strip_prefix("listening on ") {
                        break a.to_string();
                    }
                }
                Ok(Line::Closed) | Err(_) => {
                    return Err(Failure::refused("the broker did not start"))
                }
                Ok(_) => {}
            }
        };
        Ok(Demo {
            kids,
            rx,
            tx: Some(tx),
            broker_pid,
            addr,
            consumers: Vec::new(),
        })
    }

    fn sender(&self) -> Result<mpsc::Sender<Line>, Failure> {
        self.tx
            .clone()
            .ok_or_else(|| Failure::refused("the demo's line channel is closed"))
    }

    fn start_consumers(&mut self, n: u32) -> CmdResult {
        for i in 0..n {
            let mut c = spawn(&[
                "demo-consumer".into(),
                "--server".into(),
                self.addr.clone(),
                "--id".into(),
                i.to_string(),
            ])?;
            pipe_lines(&mut c, self.sender()?, move |l| Line::Consumer(i, l));
            self.consumers.push(self.kids.0.len());
            self.kids.0.push(c);
        }
        let mut joined = 0;
        while joined < n {
            match self.rx.recv_timeout(Duration::from_secs(10)) {
                Ok(Line::Consumer(_, l)) if l.starts_with('J') => joined += 1,
                Ok(_) => {}
                Err(_) => return Err(Failure::refused("the consumers did not join")),
            }
        }
        Ok(())
    }

    fn start_producers(&mut self, a: &DemoArgs) -> CmdResult {
        for i in 0..a.producers {
            let mut p = spawn(&[
                "demo-producer".into(),
                "--server".into(),
                self.addr.clone(),
                "--id".into(),
                i.to_string(),
                "--records".into(),
                a.records.to_string(),
                "--keys".into(),
                a.keys.to_string(),
                "--rate".into(),
                a.rate.to_string(),
                "--seed".into(),
                (a.seed + u64::from(i)).to_string(),
            ])?;
            pipe_lines(&mut p, self.sender()?, move |l| Line::Producer(i, l));
            self.kids.0.push(p);
        }
        // Only the children's threads send from now on.
        self.tx = None;
        Ok(())
    }

    fn kill_consumer(&mut self, i: u32) {
        if let Some(c) = self
            .consumers
            .get(i as usize)
            .and_then(|&k| self.kids.0.get_mut(k))
        {
            let _ = c.kill(); // SIGKILL
            let _ = c.wait();
        }
    }

    /// Reads the children's lines until every acknowledged record was
    /// consumed (or a deadline), splitting and killing on the way.
    async fn drive(&mut self, a: &DemoArgs, admin: &Admin) -> (Tally, u64) {
        let total = (a.records * u64::from(a.producers)) as usize;
        let plan = Plan {
            split_hot_at: total * 3 / 10,
            kill_at: total / 2,
            split_even_at: total * 6 / 10,
        };
        let mut t = Tally::default();
        let mut producers_done = 0;
        let mut splits = 0u64;
        let (mut did_hot, mut did_kill, mut did_even) = (false, false, false);
        let mut done_at: Option<Instant> = None;
        let hard_deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < hard_deadline {
            if let Some(d) = done_at {
                let consumed_all = t.acked.iter().all(|r| t.deliveries.contains_key(r));
                if consumed_all || d.elapsed() > Duration::from_secs(10) {
                    break;
                }
            }
            let line = match self.rx.recv_timeout(Duration::from_millis(50)) {
                Ok(l) => l,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            };
            match line {
                Line::Producer(p, l) if t.acknowledged(p, &l) => {
                    producers_done += 1;
                    if producers_done == a.producers {
                        done_at = Some(Instant::now());
                    }
                }
                Line::Consumer(c, l) if l.starts_with("R ") => t.delivered(c, &l),
                _ => {}
            }
            let n = t.acked.len();
            if !did_hot && n >= plan.split_hot_at {
                did_hot = true;
                splits += split_partition(admin, true).await;
            }
            if !did_kill && n >= plan.kill_at {
                did_kill = true;
                self.kill_consumer(KILLED);
                t.killed = Some((KILLED, workers::now_us()));
            }
            if !did_even && n >= plan.split_even_at {
                did_even = true;
                splits += split_partition(admin, false).await;
            }
        }
        (t, splits)
    }

    /// Closes the live consumers' stdin (they commit, leave and exit),
    /// then SIGTERMs the broker. True if the broker exited cleanly.
    fn stop(mut self) -> bool {
        for (i, &k) in self.consumers.iter().enumerate() {
            if i as u32 != KILLED {
                if let Some(c) = self.kids.0.get_mut(k) {
                    drop(c.stdin.take());
                }
            }
        }
        let until = Instant::now() + Duration::from_secs(5);
        for &k in &self.consumers {
            if let Some(c) = self.kids.0.get_mut(k) {
                while Instant::now() < until && matches!(c.try_wait(), Ok(None)) {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
        // SAFETY: kill(2) on the pid of our own child process, which has
        // not been reaped yet (it is in `kids`), so the pid names it.
        unsafe {
            libc::kill(self.broker_pid as libc::pid_t, libc::SIGTERM);
        }
        let Some(b) = self.kids.0.first_mut() else {
            return false;
        };
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            match b.try_wait() {
                Ok(Some(s)) => return s.success(),
                Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(20)),
                _ => return false,
            }
        }
    }
}

pub(crate) async fn run(a: DemoArgs) -> CmdResult {
    let started = Instant::now();
    let dir = tempfile::Builder::new()
        .prefix("fissionlog-broker-demo")
        .tempdir()
        .map_err(|e| Failure::usage(format!("cannot create a temporary directory: {e}")))?;
    let mut demo = Demo::start_broker(dir.path())?;
    let admin = Admin::new(Connection::connect(demo.addr.as_str(), None).await?);
    admin
        .create_topic(TOPIC, 2, SyncSpec::Never, 0, false)
        .await?;
    demo.start_consumers(a.consumers)?;
    demo.start_producers(&a)?;
    let (t, splits) = demo.drive(&a, &admin).await;
    let groups = admin.groups(Some(TOPIC)).await.unwrap_or(Value::Null);
    let describe = admin.describe(TOPIC).await.unwrap_or(Value::Null);
    let broker_clean = demo.stop();
    let summary = summarize(
        &a,
        &t,
        &groups,
        &describe,
        splits,
        KILLED,
        broker_clean,
        started.elapsed(),
    );
    if a.json {
        println!("{summary}");
    } else {
        print_text(&summary);
    }
    drop(dir);
    if summary["ok"].as_bool() == Some(true) {
        Ok(())
    } else {
        Err(Failure::refused("the check failed: records missing, out of order or duplicated beyond the kill's redelivery"))
    }
}

/// Splits the active partition holding the hot key (isolating it), or the
/// widest other active partition in the middle. Returns 1 if it split.
async fn split_partition(admin: &Admin, hot: bool) -> u64 {
    let Ok(d) = admin.describe(TOPIC).await else {
        return 0;
    };
    let active: Vec<&Value> = d["partitions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["state"] == "active")
        .collect();
    let target = if hot {
        // The producers' first records went everywhere; the partition with
        // the most records holds the hot key.
        active
            .iter()
            .max_by_key(|p| p["end_offset"].as_u64().unwrap_or(0))
    } else {
        active.iter().max_by_key(|p| {
            p["end"]
                .as_u64()
                .unwrap_or(0)
                .saturating_sub(p["start"].as_u64().unwrap_or(0))
        })
    };
    let Some(p) = target.and_then(|p| p["id"].as_u64()) else {
        return 0;
    };
    let plan = if hot {
        SplitSpec::HotKey(Bytes::from_static(HOT_KEY.as_bytes()))
    } else {
        SplitSpec::Even
    };
    match admin.split(TOPIC, p as u32, plan).await {
        Ok(_) => 1,
        Err(_) if hot => match admin.split(TOPIC, p as u32, SplitSpec::Even).await {
            Ok(_) => 1,
            Err(_) => 0,
        },
        Err(_) => 0,
    }
}
