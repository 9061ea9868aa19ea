//! The takeover demo's service processes: this binary run with [`SERVE`] as the real service,
//! started, watched through what it says on its log (owner or standby), killed, and asked for
//! its role over `/status` with the run's secret.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use change_streamer_test_support::status::Status;
use serde_json::Value;

/// The hidden first argument that makes this binary a service process.
pub const SERVE: &str = "__serve";

/// The instances' `--takeover-interval-ms`.
pub const TAKEOVER_INTERVAL_MS: u64 = 200;

/// Runs the real service with the flags after [`SERVE`], until SIGINT or SIGTERM.
pub fn serve() -> std::process::ExitCode {
    use clap::Parser;
    let args = std::iter::once("change-streamer".to_string()).chain(std::env::args().skip(2));
    let config = match change_streamer::Config::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let run = change_streamer::instance::run(
        config,
        change_streamer_actors::clock::Clock::System,
        change_streamer::shutdown::wait_for_signal(),
    );
    match actix_rt::System::new().block_on(run) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("change-streamer: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// What a service process said on its log.
pub enum Said {
    Standby(usize, String),
    Owner(usize, Instant),
}

/// One service process.
pub struct Instance {
    pub name: char,
    pub child: Child,
    pub addr: Option<String>,
    _dir: tempfile::TempDir,
}

impl Drop for Instance {
    /// A demo that ends early (a panic, say) leaves no service process running.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn start_instance(i: usize, db: &str, up: &str, said: &mpsc::Sender<Said>) -> Instance {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("the demo's own path");
    let mut child = Command::new(exe)
        .arg(SERVE)
        .args(["--host", "127.0.0.1", "--port", "0", "--upstream", up])
        .args(["--change-db", db, "--takeover-interval-ms"])
        .arg(TAKEOVER_INTERVAL_MS.to_string())
        .arg("--data-dir")
        .arg(dir.path())
        .env("RUST_LOG", "info")
        // In the environment, not on the command line, where `ps` would show it.
        .env("ZERO_CHANGE_STREAMER_SECRET", secret())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start a service process");
    let stderr = child.stderr.take().expect("stderr");
    let said = said.clone();
    std::thread::spawn(move || {
        let addr = |rest: &str| rest.split_whitespace().next().unwrap_or("").to_string();
        let mut said_unreachable = false;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("standby on ").nth(1) {
                let _ = said.send(Said::Standby(i, addr(rest)));
            } else if line.contains("listening on ") {
                let _ = said.send(Said::Owner(i, Instant::now()));
            } else if line.contains("unreachable") && !said_unreachable {
                said_unreachable = true;
                eprintln!("instance {}: {line}", (b'A' + i as u8) as char);
            } else if line.contains("change-streamer: ") {
                eprintln!("instance {}: {line}", (b'A' + i as u8) as char);
            }
        }
    });
    Instance {
        name: (b'A' + i as u8) as char,
        child,
        addr: None,
        _dir: dir,
    }
}

/// `/status` of the instance at `addr`, typed; `None` while it does not answer with one (down,
/// starting, stopping). An answer that does not read as the type stops the demo, naming the key.
pub async fn role(addr: &str) -> Option<Status> {
    let mut resp = awc::Client::new()
        .get(format!("http://{addr}/status"))
        .insert_header(("authorization", format!("Bearer {}", secret())))
        .timeout(Duration::from_secs(1))
        .send()
        .await
        .ok()?;
    let v = resp.json::<Value>().limit(1 << 20).await.ok()?;
    Some(Status::from_value(v).unwrap_or_else(|e| panic!("demo: {e}")))
}

/// The secret every instance asks for, generated for this run (as in the single-instance demo).
pub fn secret() -> &'static str {
    static SECRET: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SECRET.get_or_init(crate::demo_secret)
}
