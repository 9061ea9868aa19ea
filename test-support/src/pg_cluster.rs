//! A throwaway PostgreSQL cluster for the tests of a process, started from the installed server
//! binaries when no server answers (or when `CHANGE_STREAMER_TEST_PG=own` asks for one).
//!
//! Why a cluster of our own: the second command of the README must pass on a machine where
//! PostgreSQL is installed but not running, and a test must not depend on the machine's own
//! server. So, once per test process, [`start`] runs `initdb` into a temporary folder (trust
//! auth, user `postgres`), then `pg_ctl start` on a free loopback port with its socket in that
//! folder, and hands back the server's URL.
//!
//! Stopping at exit: Rust runs no destructor for a static, and a test binary may be killed. So
//! beside the cluster runs a small reaper (`sh`) whose stdin is a pipe this process holds the
//! only write end of: when the process ends, however it ends, the kernel closes that end, the
//! reaper reads end-of-file, stops the cluster (`pg_ctl stop -m immediate`) and removes the
//! folder. Nothing polls and nothing waits for a guessed time.
//!
//! A test that needs the change DB to go away and come back (tests/change_db_outage.rs) starts a
//! cluster of its own with [`start`] and stops, starts or restarts it ([`Cluster::stop`],
//! [`Cluster::start_again`], [`Cluster::restart`]); dropping the [`Cluster`] ends it.
//!
//! `initdb` and `pg_ctl` refuse to run as root (which CI here is): as root, both, the server
//! and the reaper run as the unprivileged user `postgres` (or `nobody` where there is none),
//! which owns the folder.

use std::fs;
use std::io::Write;
use std::net::TcpListener;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};

/// What to install when no server binaries are found.
const INSTALL_HINT: &str = "install PostgreSQL's server binaries (Debian/Ubuntu: `apt-get install \
     postgresql`; Fedora: `dnf install postgresql-server`; macOS: `brew install postgresql`), or \
     point CHANGE_STREAMER_TEST_PG at a running server (trust auth, user postgres)";

/// A running throwaway cluster: its URL, and the pipe whose closing stops it.
pub struct Cluster {
    /// `postgres://postgres@127.0.0.1:PORT`, without a database.
    pub url: String,
    /// The folder holding the cluster's data, socket and log; removed when it stops.
    pub dir: PathBuf,
    /// Held for the life of the cluster; its end-of-file tells the reaper to stop the cluster.
    _reaper_stdin: ChildStdin,
    /// What [`Cluster::stop`], [`Cluster::start_again`] and [`Cluster::restart`] run.
    server: Server,
}

/// How to run `pg_ctl` on the cluster: its binaries, data folder, the server's options (its
/// port among them) and the user that runs it.
struct Server {
    bin: PathBuf,
    base: PathBuf,
    data: PathBuf,
    options: String,
    run_as: Option<RunAs>,
}

/// The user that runs the cluster's programs: `None` to run them as ourselves (not root).
struct RunAs {
    uid: u32,
    gid: u32,
    name: String,
}

/// Starts a cluster, or says why it could not (with what to install, where binaries lack).
pub fn start() -> Result<Cluster, String> {
    let bin = find_binaries()?;
    let run_as = unprivileged_user()?;
    let base = tempfile::Builder::new()
        .prefix("change-streamer-test-pg-")
        .tempdir()
        .map_err(|e| format!("creating the throwaway cluster's folder: {e}"))?
        .keep();
    if let Some(user) = &run_as {
        std::os::unix::fs::chown(&base, Some(user.uid), Some(user.gid))
            .map_err(|e| format!("giving {} to user {}: {e}", base.display(), user.name))?;
    }
    let data = base.join("data");
    let reaper_stdin = spawn_reaper(&bin, &base, &data, run_as.as_ref())?;
    init_db(&bin, &base, &data, run_as.as_ref())?;
    let (port, options) = start_server(&bin, &base, &data, run_as.as_ref())?;
    log::info!(
        "throwaway PostgreSQL cluster started on port {port} in {}",
        base.display()
    );
    Ok(Cluster {
        url: format!("postgres://postgres@127.0.0.1:{port}"),
        dir: base.clone(),
        _reaper_stdin: reaper_stdin,
        server: Server {
            bin,
            base,
            data,
            options,
            run_as,
        },
    })
}

impl Cluster {
    /// Stops the server (`pg_ctl stop -m fast`: every session is ended, as an operator's stop
    /// does), returning once it is down; the folder stays, for [`Cluster::start_again`].
    pub fn stop(&self) -> Result<(), String> {
        self.pg_ctl(&["-w", "-m", "fast", "stop"])
    }

    /// Starts the stopped server again on the same port, returning once it accepts connections.
    pub fn start_again(&self) -> Result<(), String> {
        self.pg_ctl_serving(&["start"])
    }

    /// `pg_ctl restart -m fast`: every session ended, the server back on the same port once
    /// this returns.
    pub fn restart(&self) -> Result<(), String> {
        self.pg_ctl_serving(&["-m", "fast", "restart"])
    }

    /// `pg_ctl` with the server's log and options, waiting until it accepts connections.
    fn pg_ctl_serving(&self, action: &[&str]) -> Result<(), String> {
        let s = &self.server;
        let log = s.base.join("server.log").display().to_string();
        let mut args = vec!["-l", &log, "-w", "-t", "120", "-o", &s.options];
        args.extend_from_slice(action);
        self.pg_ctl(&args)
    }

    fn pg_ctl(&self, args: &[&str]) -> Result<(), String> {
        let s = &self.server;
        let out = command(&s.bin.join("pg_ctl"), &s.base, s.run_as.as_ref())
            .arg("-D")
            .arg(&s.data)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| format!("running pg_ctl {args:?}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "pg_ctl {args:?} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }
}

/// The folder holding `initdb` and `pg_ctl`: on PATH, else the newest `/usr/lib/postgresql/*/bin`
/// (Debian's layout, which keeps them off PATH).
fn find_binaries() -> Result<PathBuf, String> {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    if let Some(dir) = on_path.into_iter().find(|d| is_server_bin(d)) {
        return Ok(dir);
    }
    let mut versioned: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            Some((version, e.path().join("bin")))
        })
        .filter(|(_, d)| is_server_bin(d))
        .collect();
    versioned.sort();
    versioned.pop().map(|(_, d)| d).ok_or_else(|| {
        format!("no PostgreSQL server answers and no initdb/pg_ctl was found on PATH or under /usr/lib/postgresql/*/bin: {INSTALL_HINT}")
    })
}

fn is_server_bin(dir: &Path) -> bool {
    dir.join("initdb").is_file() && dir.join("pg_ctl").is_file()
}

/// As root, the user `postgres` (or `nobody`) from /etc/passwd; otherwise ourselves.
fn unprivileged_user() -> Result<Option<RunAs>, String> {
    let euid = fs::metadata("/proc/self")
        .map(|m| m.uid())
        .map_err(|e| format!("reading our own user id from /proc/self: {e}"))?;
    if euid != 0 {
        return Ok(None);
    }
    let passwd =
        fs::read_to_string("/etc/passwd").map_err(|e| format!("reading /etc/passwd: {e}"))?;
    for wanted in ["postgres", "nobody"] {
        let found = passwd.lines().find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.len() > 3 && fields[0] == wanted)
                .then(|| Some((fields[2].parse().ok()?, fields[3].parse().ok()?)))
                .flatten()
        });
        if let Some((uid, gid)) = found {
            return Ok(Some(RunAs {
                uid,
                gid,
                name: wanted.to_string(),
            }));
        }
    }
    Err(
        "running as root, and neither user `postgres` nor `nobody` exists to run initdb as \
         (initdb refuses root): create one, or point CHANGE_STREAMER_TEST_PG at a server"
            .to_string(),
    )
}

/// A command run in `base` (the user's own folder, so a cwd it cannot read does not matter), as
/// `run_as` where given.
fn command(program: &Path, base: &Path, run_as: Option<&RunAs>) -> Command {
    let mut cmd = Command::new(program);
    cmd.current_dir(base).stdin(Stdio::null());
    if let Some(user) = run_as {
        cmd.uid(user.uid).gid(user.gid);
    }
    cmd
}

/// The reaper: waits for end-of-file on its stdin, then stops the cluster and removes its folder.
fn spawn_reaper(
    bin: &Path,
    base: &Path,
    data: &Path,
    run_as: Option<&RunAs>,
) -> Result<ChildStdin, String> {
    let script =
        r#"cat >/dev/null; "$1/pg_ctl" -D "$2" stop -m immediate >/dev/null 2>&1; rm -rf "$3""#;
    let mut child = command(Path::new("sh"), base, run_as)
        .arg("-c")
        .arg(script)
        .arg("reaper")
        .arg(bin)
        .arg(data)
        .arg(base)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting the throwaway cluster's reaper (sh): {e}"))?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or("the reaper's stdin was not piped")?;
    // Nothing to say yet; a write proves the pipe is open.
    let _ = stdin.flush();
    Ok(stdin)
}

fn init_db(bin: &Path, base: &Path, data: &Path, run_as: Option<&RunAs>) -> Result<(), String> {
    let out = command(&bin.join("initdb"), base, run_as)
        .arg("-D")
        .arg(data)
        .args([
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ])
        .output()
        .map_err(|e| format!("running {}: {e}", bin.join("initdb").display()))?;
    if !out.status.success() {
        return Err(format!(
            "initdb of the throwaway cluster failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// Starts the server on a free loopback port (a few tries: the port is free when chosen, and
/// another process may take it before the server binds it); `pg_ctl -w` returns once it accepts
/// connections.
fn start_server(
    bin: &Path,
    base: &Path,
    data: &Path,
    run_as: Option<&RunAs>,
) -> Result<(u16, String), String> {
    let mut last_error = String::new();
    for _ in 0..3 {
        let port = free_port()?;
        let options = format!(
            "-c listen_addresses=127.0.0.1 -p {port} -k {} -c fsync=off -c synchronous_commit=off \
             -c full_page_writes=off -c max_connections=200",
            base.display()
        );
        let out = command(&bin.join("pg_ctl"), base, run_as)
            .arg("-D")
            .arg(data)
            .arg("-l")
            .arg(base.join("server.log"))
            .args(["-w", "-t", "120", "-o", &options, "start"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| format!("running {}: {e}", bin.join("pg_ctl").display()))?;
        if out.status.success() {
            return Ok((port, options));
        }
        let log = fs::read_to_string(base.join("server.log")).unwrap_or_default();
        last_error = format!(
            "pg_ctl start failed ({}): {} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            log.lines().rev().take(5).collect::<Vec<_>>().join(" | ")
        );
    }
    Err(format!("starting the throwaway cluster: {last_error}"))
}

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("finding a free loopback port: {e}"))
}
