//! The live view in a real browser: headless Chromium opens the page of a
//! broker on loopback, the page draws the topic's partitions, and after a
//! split forced through the admin API the children appear in the page's
//! DOM within a few seconds, pushed by server-sent events. A screenshot is
//! left at target/view-test/screenshot.png.
//!
//! Chromium is driven over the DevTools protocol on a pipe
//! (`--remote-debugging-pipe`: commands on fd 3, answers on fd 4, each a
//! JSON document ended by a NUL byte), so the test needs no WebSocket
//! client or browser-driver crate. Without a chromium binary the test
//! says it skipped and passes; .ci/run installs chromium.

mod common;

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::TestServer;
use fissionlog_broker::client::{Admin, Connection, Producer, ProducerConfig};
use fissionlog_broker::protocol::{SplitSpec, SyncSpec};
use fissionlog_broker::server::ServerConfig;
use serde_json::{json, Value};

/// How long the page may take to show a split after it was forced.
const SPLIT_SHOWN_WITHIN: Duration = Duration::from_secs(5);

fn find_chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome", "chrome"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |d| d.join(name)))
        .find(|p| p.is_file())
}

/// A pipe whose ends are above the descriptors the child will use (3, 4)
/// and close on exec (the child's copies are made by `dup2`).
fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` is a valid two-element array for pipe2 to fill.
    let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(r, 0, "pipe2: {}", std::io::Error::last_os_error());
    let lift = |fd: RawFd| {
        // SAFETY: `fd` is an open descriptor this function owns; the copy
        // is at 10 or above, away from 3 and 4.
        let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10) };
        assert!(high >= 10, "fcntl: {}", std::io::Error::last_os_error());
        // SAFETY: both descriptors are open and owned here; `fd` is not used again.
        unsafe {
            libc::close(fd);
            OwnedFd::from_raw_fd(high)
        }
    };
    (lift(fds[0]), lift(fds[1]))
}

/// Headless Chromium on a DevTools pipe; killed when dropped, on every path.
struct Browser {
    child: Child,
    commands: std::fs::File,
    answers: mpsc::Receiver<Value>,
    next_id: u64,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Browser {
    fn launch(binary: &Path, log: &Path) -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let (cmd_read, cmd_write) = pipe();
        let (ans_read, ans_write) = pipe();
        let (child_in, child_out) = (cmd_read.as_raw_fd(), ans_write.as_raw_fd());
        let stderr = std::fs::File::create(log).unwrap();
        let mut cmd = Command::new(binary);
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-extensions",
            "--no-first-run",
            "--no-default-browser-check",
            "--mute-audio",
            "--remote-debugging-pipe",
            "--window-size=1280,900",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("about:blank")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
        // SAFETY: between fork and exec only dup2 runs, which is
        // async-signal-safe; the descriptors stay open in the parent until
        // spawn returns. dup2's copies don't close on exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(child_in, 3) < 0 || libc::dup2(child_out, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("chromium starts");
        drop(cmd_read);
        drop(ans_write);
        let (tx, answers) = mpsc::channel();
        let mut from_browser = std::fs::File::from(ans_read);
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 64 * 1024];
            loop {
                let n = match from_browser.read(&mut chunk) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                buf.extend_from_slice(&chunk[..n]);
                while let Some(end) = buf.iter().position(|&b| b == 0) {
                    let msg: Vec<u8> = buf.drain(..=end).collect();
                    if let Ok(v) = serde_json::from_slice::<Value>(&msg[..end]) {
                        if tx.send(v).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Browser {
            child,
            commands: std::fs::File::from(cmd_write),
            answers,
            next_id: 1,
            _profile: profile,
        }
    }

    /// Sends a DevTools command and waits (at most 10 s) for its answer.
    fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        let mut bytes = serde_json::to_vec(&msg).unwrap();
        bytes.push(0);
        self.commands
            .write_all(&bytes)
            .expect("the browser takes commands");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let v = self
                .answers
                .recv_timeout(left)
                .unwrap_or_else(|e| panic!("no answer to {method} within 10 s: {e}"));
            if v["id"] == json!(id) {
                assert!(v.get("error").is_none(), "{method} failed: {v}");
                return v["result"].clone();
            }
        }
    }

    /// Evaluates a JavaScript expression in the page; its value.
    fn eval(&mut self, session: &str, expr: &str) -> Value {
        let r = self.call(
            Some(session),
            "Runtime.evaluate",
            json!({"expression": expr, "returnByValue": true}),
        );
        r["result"]["value"].clone()
    }

    /// Polls `expr` until it is true, for at most `within`; how long it took.
    fn wait_for(&mut self, session: &str, expr: &str, within: Duration) -> Option<Duration> {
        let start = Instant::now();
        while start.elapsed() < within {
            if self.eval(session, expr) == json!(true) {
                return Some(start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for v in s.bytes().filter_map(val) {
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

fn artifacts_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let dir = target.join("view-test");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn the_live_view_draws_the_partitions_and_shows_a_forced_split_within_seconds() {
    let Some(chromium) = find_chromium() else {
        println!("skipped: chromium not installed (apt-get install chromium)");
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let srv = rt.block_on(TestServer::start_with_http(ServerConfig {
        view_refresh: Duration::from_millis(500),
        ..Default::default()
    }));
    let admin = rt.block_on(async {
        let conn = Connection::connect(srv.addr, None).await.unwrap();
        let admin = Admin::new(conn.clone());
        admin
            .create_topic("view", 2, SyncSpec::Never, 0, false)
            .await
            .unwrap();
        let producer = Producer::new(conn, ProducerConfig::new("view"));
        let mut acks = Vec::new();
        for i in 0..300u32 {
            let key = Bytes::from(format!("k{}", i % 23));
            acks.push(producer.send(Some(key), Bytes::from(vec![b'v'; 64])).await);
        }
        for a in acks {
            a.await.unwrap();
        }
        admin
    });

    let dir = artifacts_dir();
    let mut browser = Browser::launch(&chromium, &dir.join("chromium.log"));
    let url = format!("http://{}/", srv.http_addr.unwrap());
    let target = browser.call(None, "Target.createTarget", json!({"url": url}));
    let target_id = target["targetId"].as_str().unwrap().to_string();
    let attached = browser.call(
        None,
        "Target.attachToTarget",
        json!({"targetId": target_id, "flatten": true}),
    );
    let session = attached["sessionId"].as_str().unwrap().to_string();

    let drawn = browser.wait_for(
        &session,
        r#"document.querySelectorAll('li.partition[data-topic="view"][data-state="active"]').length === 2"#,
        Duration::from_secs(15),
    );
    assert!(
        drawn.is_some(),
        "the page drew the topic's two partitions: {}",
        browser.eval(&session, "document.body.innerText")
    );

    let split = rt
        .block_on(admin.split("view", 0, SplitSpec::Even))
        .unwrap();
    let children: Vec<u64> = split["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_u64().unwrap())
        .collect();
    assert_eq!(children.len(), 2);
    let shown = format!(
        r#"(() => {{
            const p = id => document.querySelector('li.partition[data-topic="view"][data-partition="' + id + '"]');
            const parent = p(0);
            return !!parent && parent.dataset.state === "sealed"
                && {children:?}.every(c => p(c) && p(c).dataset.state === "active" && p(c).dataset.born === "live"
                    && parent.contains(p(c)));
        }})()"#
    );
    let took = browser.wait_for(&session, &shown, SPLIT_SHOWN_WITHIN);
    let shot = browser.call(
        Some(&session),
        "Page.captureScreenshot",
        json!({"format": "png"}),
    );
    let png = base64_decode(shot["data"].as_str().unwrap_or(""));
    let shot_path = dir.join("screenshot.png");
    std::fs::write(&shot_path, &png).unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    let took = took.unwrap_or_else(|| {
        panic!(
            "the split's children {children:?} did not appear under the sealed parent within {SPLIT_SHOWN_WITHIN:?}: {}",
            browser.eval(&session, "document.body.innerText")
        )
    });
    // The children stay marked as born live on later redraws, so a check
    // that polls slower than the view refreshes still sees them.
    let updates = |browser: &mut Browser| {
        browser
            .eval(&session, "Number(document.body.dataset.updates || 0)")
            .as_u64()
            .unwrap_or(0)
    };
    let seen_at = updates(&mut browser);
    let redrawn = format!(
        "Number(document.body.dataset.updates || 0) >= {}",
        seen_at + 2
    );
    assert!(
        browser
            .wait_for(&session, &redrawn, SPLIT_SHOWN_WITHIN)
            .is_some(),
        "the view redrew twice after showing the split"
    );
    assert_eq!(
        browser.eval(&session, &shown),
        json!(true),
        "after two more redraws the split's children {children:?} are still shown as born live under the sealed parent: {}",
        browser.eval(&session, "document.body.innerText")
    );
    println!(
        "the split showed {took:?} after it was forced; screenshot at {}",
        shot_path.display()
    );
    let events = browser.eval(&session, "document.getElementById('events').innerText");
    assert!(
        events.as_str().unwrap_or("").contains("split p0"),
        "the event list names the split: {events}"
    );
    drop(browser);
    rt.block_on(srv.stop()).unwrap();
}
