//! The real binary as a child process on loopback, for what an in-process service cannot
//! show: `kill -9` (SIGKILL) and SIGTERM at any moment, then a start on the same data directory.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::wait::{POLL, STATUS_LIMIT};

/// The `change-streamer` binary an example beside it starts: `$CHANGE_STREAMER_BIN`, else the
/// one in the example's target directory (`target/<profile>/change-streamer`).
pub fn sibling_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("CHANGE_STREAMER_BIN") {
        return p.into();
    }
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    dir.join("change-streamer")
}

/// A loopback port free at the moment of asking, for a service that must restart on the same
/// one.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A running `change-streamer` process.
pub struct ServiceProcess {
    child: Child,
    /// `host:port` it listens on.
    pub addr: String,
    /// Every line it logged so far (its stderr).
    log: Arc<Mutex<Vec<String>>>,
}

impl ServiceProcess {
    /// Starts `bin` on loopback `port` (0: an ephemeral one) with `data_dir` and `args`, and
    /// returns once it logged where it listens. Its stderr is drained on a thread (a full pipe
    /// would stall the service's logging).
    pub fn spawn(bin: &Path, port: u16, data_dir: &Path, args: &[&str]) -> ServiceProcess {
        Self::spawn_logging(bin, port, data_dir, args, "info")
    }

    /// [`ServiceProcess::spawn`] with `RUST_LOG=rust_log`, which must keep the info line of
    /// `change_streamer::instance` saying where it listens (a benchmark keeps the rest quiet).
    pub fn spawn_logging(
        bin: &Path,
        port: u16,
        data_dir: &Path,
        args: &[&str],
        rust_log: &str,
    ) -> ServiceProcess {
        let mut child = Command::new(bin)
            .args([
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--data-dir",
            ])
            .arg(data_dir)
            .args(args)
            .env("RUST_LOG", rust_log)
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the binary");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        let log = Arc::new(Mutex::new(Vec::new()));
        let lines = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on ").nth(1) {
                    let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_string());
                }
                if let Ok(mut l) = lines.lock() {
                    l.push(line);
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the service never said where it listens");
        ServiceProcess { child, addr, log }
    }

    /// The lines it logged so far that contain `needle`.
    pub fn logged(&self, needle: &str) -> Vec<String> {
        self.log
            .lock()
            .map(|l| l.iter().filter(|x| x.contains(needle)).cloned().collect())
            .unwrap_or_default()
    }

    /// Its process id (for `/proc/PID/...`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn ws(&self, path: &str) -> String {
        format!("ws://{}{}", self.addr, path)
    }

    /// `kill -9`: nothing of the service runs after this.
    pub fn kill9(mut self) {
        self.child.kill().expect("SIGKILL");
        let _ = self.child.wait();
    }

    /// SIGTERM, then waits (up to 20 s) for the graceful stop; panics if it fails.
    pub async fn terminate(mut self) {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(sent.success());
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                assert!(status.success(), "graceful stop exited with {status:?}");
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "still running 20 s after SIGTERM"
            );
            actix_rt::time::sleep(POLL).await;
        }
    }

    /// `/readyz`: its status code and its line, trimmed.
    pub async fn readyz(&self) -> (u16, String) {
        let mut resp = crate::client::http_client()
            .get(format!("http://{}/readyz", self.addr))
            .send()
            .await
            .expect("readyz");
        let body = resp.body().await.expect("readyz body");
        (
            resp.status().as_u16(),
            String::from_utf8_lossy(&body).trim().to_string(),
        )
    }

    /// `/status` as JSON.
    pub async fn status(&self) -> Value {
        let mut resp = crate::client::http_client()
            .get(format!("http://{}/status", self.addr))
            .send()
            .await
            .expect("status");
        resp.json().await.expect("status JSON")
    }

    /// `GET path`: the status code and the body.
    pub async fn get(&self, path: &str) -> (u16, String) {
        let mut resp = crate::client::http_client()
            .get(format!("http://{}{path}", self.addr))
            .send()
            .await
            .expect("http get");
        let body = resp.body().limit(16 << 20).await.expect("body");
        (
            resp.status().as_u16(),
            String::from_utf8_lossy(&body).into_owned(),
        )
    }

    /// Polls `/status` until `cond` holds ([`STATUS_LIMIT`] at most) and returns it.
    pub async fn wait_status(&self, what: &str, mut cond: impl FnMut(&Value) -> bool) -> Value {
        let start = Instant::now();
        loop {
            let st = self.status().await;
            if cond(&st) {
                return st;
            }
            assert!(
                start.elapsed() < STATUS_LIMIT,
                "{what} never happened within {STATUS_LIMIT:?}: {st}"
            );
            actix_rt::time::sleep(POLL).await;
        }
    }
}

/// How long [`ServiceProcess::wait_readyz`] and [`ServiceProcess::wait_logged`] wait: a safety
/// net against a test that would hang, not what a test waits for.
pub const SAFETY_LIMIT: Duration = Duration::from_secs(60);

impl ServiceProcess {
    /// `/readyz` polled until `cond` holds on its (status, line); returns the line.
    pub async fn wait_readyz(&self, what: &str, cond: impl Fn(u16, &str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let (code, line) = self.readyz().await;
            if cond(code, &line) {
                return line;
            }
            assert!(
                start.elapsed() < SAFETY_LIMIT,
                "{what} within {SAFETY_LIMIT:?}: {code} {line}"
            );
            actix_rt::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `change_streamer_stage_stalled{stage="STAGE"}`'s value on `/metrics` (PROTOCOL.md §11.1).
    pub async fn stalled_gauge(&self, stage: &str) -> Option<String> {
        let (_, page) = self.get("/metrics").await;
        let series = format!("change_streamer_stage_stalled{{stage=\"{stage}\"}} ");
        page.lines()
            .find_map(|l| l.strip_prefix(&series))
            .map(str::to_string)
    }

    /// The lines logged so far that contain `needle`, once there is one.
    pub async fn wait_logged(&self, needle: &str) -> Vec<String> {
        let start = Instant::now();
        loop {
            let lines = self.logged(needle);
            if !lines.is_empty() {
                return lines;
            }
            assert!(
                start.elapsed() < SAFETY_LIMIT,
                "no line {needle:?} within {SAFETY_LIMIT:?}"
            );
            actix_rt::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for ServiceProcess {
    /// A test that fails half-way leaves no service running.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
