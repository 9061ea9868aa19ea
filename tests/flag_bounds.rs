//! PROTOCOL.md §2 "Every configuration valid before stays valid" (issue 41, item 6): the real
//! binary starts with each numeric flag at its smallest and at its largest valid value, and
//! refuses the value just beyond each. The flags are enumerated from [`Config`]'s definition, so a
//! numeric flag added without an entry in [`BOUNDS`] fails here.

use std::any::TypeId;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use change_streamer::Config;
use change_streamer_test_support::client::http_client;
use change_streamer_test_support::stock_litestream;
use clap::CommandFactory;

const MAX: &str = "18446744073709551615";
const PAST_MAX: &str = "18446744073709551616";

/// What else a flag needs for its value to be used at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Needs {
    Nothing,
    /// A change source (`--upstream`; nothing listens there: the client connects and backs off).
    Upstream,
    /// A backup (`--litestream-backup-url`): the monitor and the cleanup run.
    Backup,
    /// A `--backups` file of two backups.
    TwoBackups,
    /// A control-source backup with the VFS: the audit runs.
    Audit,
    /// `--max-subscriber-queue-bytes` at its largest (the window's bound).
    LargestQueue,
}

/// One numeric flag's range: its clap id, its smallest and largest valid values, the values just
/// outside them (`None`: nothing is below or above, e.g. a negative seconds value is valid).
struct Bounds {
    id: &'static str,
    smallest: &'static str,
    below: Option<&'static str>,
    largest: &'static str,
    above: &'static str,
    needs: Needs,
}

const fn ms(id: &'static str, smallest: &'static str, below: &'static str, needs: Needs) -> Bounds {
    Bounds {
        id,
        smallest,
        below: Some(below),
        largest: MAX,
        above: PAST_MAX,
        needs,
    }
}

/// Every numeric flag of [`Config`] (PROTOCOL.md §2's table and its "Values").
const BOUNDS: &[Bounds] = &[
    ms("upstream_ping_interval_ms", "1", "0", Needs::Upstream),
    ms("backup_check_interval_ms", "1", "0", Needs::Backup),
    ms("initial_cleanup_delay_ms", "0", "-1", Needs::Backup),
    ms("min_cleanup_delay_ms", "0", "-1", Needs::Backup),
    ms("max_reservation_ms", "0", "-1", Needs::Backup),
    ms("backup_audit_interval_ms", "0", "-1", Needs::Audit),
    Bounds {
        id: "purge_quorum",
        smallest: "1",
        below: Some("0"),
        largest: "2",
        above: "3",
        needs: Needs::TwoBackups,
    },
    ms("purge_delay_ms", "0", "-1", Needs::Backup),
    ms("change_log_retention_ms", "0", "-1", Needs::Backup),
    Bounds {
        id: "flow_control_consensus_padding_seconds",
        smallest: "-1000000000",
        below: Some("-1000000001"),
        largest: "1000000000",
        above: "1000000001",
        needs: Needs::Nothing,
    },
    ms("ping_interval_ms", "1", "0", Needs::Nothing),
    ms("slow_subscriber_grace_ms", "0", "-1", Needs::Nothing),
    ms("max_subscriber_queue_changes", "1", "0", Needs::Nothing),
    ms(
        "max_subscriber_queue_bytes",
        "65536",
        "65535",
        Needs::Nothing,
    ),
    ms(
        "catchup_window_bytes",
        "65536",
        "65535",
        Needs::LargestQueue,
    ),
    ms("max_queued_bytes", "65536", "65535", Needs::Nothing),
    Bounds {
        id: "port",
        smallest: "0",
        below: Some("-1"),
        largest: "65535",
        above: "65536",
        needs: Needs::Nothing,
    },
    ms("stall_alarm_ms", "1", "0", Needs::Backup),
    ms("takeover_interval_ms", "1", "0", Needs::Nothing),
];

/// The ids of [`Config`]'s flags that take a number.
fn numeric_flags() -> Vec<String> {
    let numeric = [
        TypeId::of::<u64>(),
        TypeId::of::<u32>(),
        TypeId::of::<u16>(),
        TypeId::of::<usize>(),
        TypeId::of::<i64>(),
        TypeId::of::<f64>(),
    ];
    Config::command()
        .get_arguments()
        .filter(|a| {
            let ty = a.get_value_parser().type_id();
            numeric.iter().any(|n| ty == *n)
        })
        .map(|a| a.get_id().to_string())
        .collect()
}

fn long(id: &str) -> String {
    let command = Config::command();
    let arg = command
        .get_arguments()
        .find(|a| a.get_id() == id)
        .unwrap_or_else(|| panic!("{id} is not a flag of Config"));
    format!("--{}", arg.get_long().expect("a long flag"))
}

#[test]
fn every_numeric_flag_has_its_bounds() {
    let numeric = numeric_flags();
    assert!(numeric.len() >= 15, "{numeric:?}");
    for id in &numeric {
        assert!(
            BOUNDS.iter().any(|b| b.id == id),
            "{id} takes a number but has no entry in BOUNDS: add its smallest and largest values"
        );
    }
    for b in BOUNDS {
        assert!(
            numeric.iter().any(|id| id == b.id),
            "{} is not a numeric flag",
            b.id
        );
    }
}

/// The files a flag's [`Needs`] name, kept until the test ends.
struct Setup {
    dir: tempfile::TempDir,
    vfs: String,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().expect("a temporary directory");
        std::fs::write(
            dir.path().join("backups.toml"),
            "[[backup]]\nname = \"east\"\nurl = \"file:///nowhere/east\"\n\n\
             [[backup]]\nname = \"west\"\nurl = \"file:///nowhere/west\"\n",
        )
        .expect("write backups.toml");
        let vfs = stock_litestream::install()
            .vfs
            .to_string_lossy()
            .into_owned();
        Setup { dir, vfs }
    }

    fn args(&self, needs: Needs) -> Vec<String> {
        let path = |name: &str| self.dir.path().join(name).to_string_lossy().into_owned();
        let backup = ["--litestream-backup-url", "file:///nowhere/replica"];
        let owned = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        match needs {
            Needs::Nothing => Vec::new(),
            Needs::Upstream => owned(&["--upstream", "ws://127.0.0.1:9/changes"]),
            Needs::Backup => owned(&backup),
            Needs::TwoBackups => vec!["--backups".into(), path("backups.toml")],
            Needs::LargestQueue => owned(&["--max-subscriber-queue-bytes", MAX]),
            Needs::Audit => {
                let mut a = owned(&backup);
                a.extend([
                    "--litestream-control-url".into(),
                    format!("unix:{}", path("litestream.sock")),
                    "--litestream-db-path".into(),
                    path("replica.db"),
                    "--litestream-vfs".into(),
                    self.vfs.clone(),
                ]);
                a
            }
        }
    }
}

/// The binary started with `args` (and `--port 0` unless they name a port), on loopback.
fn spawn(data: &Path, args: &[String]) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_change-streamer"));
    cmd.args(["--host", "127.0.0.1", "--data-dir"]).arg(data);
    if !args.iter().any(|a| a == "--port") {
        cmd.args(["--port", "0"]);
    }
    cmd.args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the binary")
}

/// Where the child says it listens, or everything it printed before it stopped.
fn listening(child: &mut Child) -> Result<String, String> {
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut seen = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("listening on ").nth(1) {
                let addr = rest.split_whitespace().next().unwrap_or("").to_string();
                let _ = tx.send(Ok(addr));
            }
            seen.push_str(&line);
            seen.push('\n');
        }
        let _ = tx.send(Err(seen));
    });
    rx.recv_timeout(Duration::from_secs(60))
        .map_err(|_| "said nothing for 60 s".to_string())?
}

/// Starts the binary with `args`, checks that it listens, answers `/readyz` and `/status`, and
/// is still running then; stops it.
async fn starts(data: &Path, args: &[String]) {
    let mut child = spawn(data, args);
    let addr = match listening(&mut child) {
        Ok(addr) => addr,
        Err(text) => {
            let _ = child.kill();
            panic!("{args:?} did not start ({:?}):\n{text}", child.wait());
        }
    };
    let client = http_client();
    for path in ["/readyz", "/status"] {
        let resp = client
            .get(format!("http://{addr}{path}"))
            .timeout(Duration::from_secs(30))
            .send()
            .await;
        let code = match resp {
            Ok(r) => r.status().as_u16(),
            Err(e) => {
                let _ = child.kill();
                panic!("{args:?}: {path} did not answer: {e} ({:?})", child.wait());
            }
        };
        assert!(code == 200 || code == 503, "{args:?}: {path} {code}");
    }
    let exited = child.try_wait().expect("try_wait");
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        exited.is_none(),
        "{args:?} exited with {exited:?} after it started"
    );
}

/// The binary refuses `args` at start: a non-zero exit naming `flag`.
fn refused(data: &Path, args: &[String], flag: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_change-streamer"))
        .args(["--host", "127.0.0.1", "--port", "0", "--data-dir"])
        .arg(data)
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run the binary");
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code().is_some_and(|c| c != 0),
        "{args:?} was not refused: {:?} {text}",
        out.status
    );
    assert!(text.contains(flag), "{args:?}: {flag} not named:\n{text}");
}

#[actix_rt::test]
async fn every_numeric_flag_starts_at_its_smallest_and_largest_value() {
    let setup = Setup::new();
    let started = Instant::now();
    for b in BOUNDS {
        let flag = long(b.id);
        for value in [b.smallest, b.largest] {
            let mut args = setup.args(b.needs);
            args.extend([flag.clone(), value.to_string()]);
            let data = tempfile::tempdir().expect("a data directory");
            starts(data.path(), &args).await;
        }
        for value in b.below.iter().chain([&b.above]) {
            let mut args = setup.args(b.needs);
            args.extend([flag.clone(), value.to_string()]);
            let data = tempfile::tempdir().expect("a data directory");
            refused(data.path(), &args, &flag);
        }
    }
    eprintln!("{} flags checked in {:?}", BOUNDS.len(), started.elapsed());
}

/// Issue 41: `--max-subscriber-queue-bytes` under 4 MiB, valid since the flag exists, still
/// starts without `--catchup-window-bytes` (the window defaults to the bound, PROTOCOL.md §2).
#[actix_rt::test]
async fn a_subscriber_bound_under_4_mib_starts_without_a_window() {
    for bound in ["1048576", "65536"] {
        let data = tempfile::tempdir().expect("a data directory");
        starts(
            data.path(),
            &["--max-subscriber-queue-bytes".into(), bound.into()],
        )
        .await;
    }
}
