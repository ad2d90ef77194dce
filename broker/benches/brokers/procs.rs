//! The servers under test as child processes: found on `PATH` (or not,
//! and then skipped), started on a free loopback port with a temporary
//! data directory, and killed, reaped and cleaned up by [`Server`]'s
//! `Drop` on every path out of the benchmark. A cluster is a `Vec` of
//! them, one directory each: dropping it (also half started) kills every
//! member.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::R;

/// A running server: its process, its port and its data directory.
/// Dropping it kills and reaps the process, then removes the directory.
pub struct Server {
    child: Child,
    pub port: u16,
    // Declared last: removed after the process is gone.
    _dir: TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where every system keeps its data (and the raw baselines their files):
/// `BENCH_DIR`, else the target directory's scratch space, so all of them
/// write to the same disk.
pub fn scratch_base() -> PathBuf {
    std::env::var_os("BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")))
}

/// A fresh temporary directory under [`scratch_base`].
pub fn scratch_dir(what: &str) -> R<TempDir> {
    let base = scratch_base();
    std::fs::create_dir_all(&base)?;
    Ok(tempfile::Builder::new()
        .prefix(&format!("brokers-{what}-"))
        .tempdir_in(base)?)
}

/// The first executable called `name` on `PATH`.
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> R<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// `n` distinct free loopback ports, all bound before any is let go
/// (cluster members must know each other's ports before they start).
fn free_ports(n: usize) -> R<Vec<u16>> {
    let ls = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ls
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<_, _>>()?)
}

/// A command whose process is killed when this benchmark dies, even by a
/// signal that runs no destructor (Ctrl-C, SIGKILL).
fn command(program: &Path) -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(program);
    cmd.stdin(Stdio::null()).stderr(Stdio::null());
    // SAFETY: the closure runs in the child between fork and exec and
    // calls only prctl and getppid, both async-signal-safe; it touches no
    // memory of the parent. The death signal follows the thread that
    // forked: every server is spawned from the main thread, which lives
    // until the benchmark ends.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died before the prctl: nobody would kill us.
            if libc::getppid() == 1 {
                return Err(std::io::Error::other("the benchmark exited"));
            }
            Ok(())
        });
    }
    cmd
}

/// Waits until something accepts TCP connections on `port`.
fn wait_listening(child: &mut Child, port: u16, what: &str) -> R<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            return Err(format!("{what} exited before listening: {status}").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!("{what} did not listen on port {port} within 15 s").into())
}

/// `redis-server` with `appendonly yes`, `appendfsync always` and no RDB
/// snapshots: every write command is fsynced before its reply.
pub fn start_redis(bin: &Path) -> R<Server> {
    let dir = scratch_dir("redis")?;
    let port = free_port()?;
    let mut child = command(bin)
        .args(["--bind", "127.0.0.1", "--port"])
        .arg(port.to_string())
        .arg("--dir")
        .arg(dir.path())
        .args([
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
            "--daemonize",
            "no",
            "--protected-mode",
            "no",
            "--logfile",
            "",
        ])
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    wait_listening(&mut child, port, "redis-server").inspect_err(|_| {
        let _ = child.kill();
        let _ = child.wait();
    })?;
    Ok(Server {
        child,
        port,
        _dir: dir,
    })
}

/// `nats-server -js` with file storage in a temporary directory (its
/// default sync interval: the page cache holds acknowledged messages).
pub fn start_nats(bin: &Path) -> R<Server> {
    let dir = scratch_dir("nats")?;
    let port = free_port()?;
    let mut child = command(bin)
        .args(["-js", "-a", "127.0.0.1", "-p"])
        .arg(port.to_string())
        .arg("-sd")
        .arg(dir.path())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    wait_listening(&mut child, port, "nats-server").inspect_err(|_| {
        let _ = child.kill();
        let _ = child.wait();
    })?;
    Ok(Server {
        child,
        port,
        _dir: dir,
    })
}

/// Three `nats-server -js` processes clustered on loopback (one
/// cluster name, each soliciting routes to the other two), each with
/// its own store directory. The caller waits for the stream's leader
/// and replicas (`Target::setup`).
pub fn start_nats_cluster(bin: &Path) -> R<Vec<Server>> {
    let client_ports = free_ports(3)?;
    let route_ports = free_ports(3)?;
    let route = |p: &u16| format!("nats://127.0.0.1:{p}");
    let mut members = Vec::with_capacity(3);
    for (i, (port, own)) in client_ports.iter().zip(&route_ports).enumerate() {
        let dir = scratch_dir(&format!("nats-node{}", i + 1))?;
        let routes = route_ports
            .iter()
            .filter(|p| *p != own)
            .map(route)
            .collect::<Vec<_>>()
            .join(",");
        let mut child = command(bin)
            .args(["-js", "-a", "127.0.0.1", "-p"])
            .arg(port.to_string())
            .arg("-sd")
            .arg(dir.path())
            .arg("--server_name")
            .arg(format!("n{}", i + 1))
            .args(["--cluster_name", "brokers-bench", "--cluster"])
            .arg(route(own))
            .arg("--routes")
            .arg(routes)
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let what = format!("nats-server n{}", i + 1);
        wait_listening(&mut child, *port, &what).inspect_err(|_| {
            let _ = child.kill();
            let _ = child.wait();
        })?;
        members.push(Server {
            child,
            port: *port,
            _dir: dir,
        });
    }
    Ok(members)
}

/// This package's `fissionlog-broker serve` on port 0; the port is read
/// from the `listening on ADDR` line it prints first.
pub fn start_fissionlog() -> R<Server> {
    spawn_fissionlog(&[], "fissionlog")
}

/// Three `fissionlog-broker serve --node-id --peers` processes on
/// 127.0.0.1, one data directory each; Raft peers reach a broker on its
/// client port. The caller waits for leaders (`Target::setup`).
pub fn start_fissionlog_cluster() -> R<Vec<Server>> {
    let ports = free_ports(3)?;
    let peers = ports
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{}=127.0.0.1:{p}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let mut members = Vec::with_capacity(ports.len());
    for (i, port) in ports.iter().enumerate() {
        let listen = format!("127.0.0.1:{port}");
        let id = (i + 1).to_string();
        let args = ["--listen", &listen, "--node-id", &id, "--peers", &peers];
        let server = spawn_fissionlog(&args, &format!("fissionlog-node{id}"))?;
        if server.port != *port {
            return Err(format!(
                "broker {id} listens on port {} instead of {port}, where its peers look for it",
                server.port
            )
            .into());
        }
        members.push(server);
    }
    Ok(members)
}

/// `fissionlog-broker serve` with `args` (`--listen 127.0.0.1:0` when
/// they name no address).
fn spawn_fissionlog(args: &[&str], what: &str) -> R<Server> {
    let dir = scratch_dir(what)?;
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_fissionlog-broker"));
    let mut cmd = command(&bin);
    cmd.arg("serve").arg("--dir").arg(dir.path());
    if !args.contains(&"--listen") {
        cmd.args(["--listen", "127.0.0.1:0"]);
    }
    let mut child = cmd
        .args(args)
        // PB keeps 256 requests outstanding, the server's default limit.
        // The server counts a produce as in flight until a moment after
        // its answer is queued, so a client that sends its next request as
        // soon as an answer arrives can be refused with TooManyInFlight
        // while it keeps within the limit; twice the window leaves room.
        .args(["--max-in-flight", "512"])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    let port = match read_port(&mut child) {
        Ok(p) => p,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    };
    Ok(Server {
        child,
        port,
        _dir: dir,
    })
}

fn read_port(child: &mut Child) -> R<u16> {
    let out = child
        .stdout
        .take()
        .ok_or("the broker's stdout is not piped")?;
    let (tx, rx) = mpsc::channel();
    // The reader thread keeps the pipe open (and drained) for the
    // broker's lifetime; it ends when the broker exits.
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(l) = line else { break };
            if let Some(addr) = l.strip_prefix("listening on ") {
                let _ = tx.send(addr.to_string());
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(15))
        .map_err(|_| "fissionlog-broker did not print its address within 15 s")?;
    let port = addr
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("cannot read a port from {addr:?}"))?;
    Ok(port)
}
