//! Real, stock litestream 0.5.17 for tests, examples and benchmarks: installs it (and its SQLite
//! VFS extension) into the project with `scripts/install-litestream.sh`, runs `litestream
//! replicate` on a database with short intervals, and `litestream restore`s a backup.
//!
//! [`install`] needs only python3 with pip and the network the first time; afterwards the script
//! sees the complete install and returns at once. Test binaries run in parallel, so the script
//! runs under an exclusive `flock` on a lock file beside the install folder.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Where litestream and its VFS extension are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Litestream {
    /// The `litestream` binary.
    pub bin: PathBuf,
    /// `litestream-vfs.so`, for `--litestream-vfs`.
    pub vfs: PathBuf,
    /// Variables set (`Some`) or removed (`None`) for every litestream command: an S3
    /// replica's credentials, say ([`Litestream::with_env`], [`crate::s3`]).
    pub env: Vec<(String, Option<String>)>,
}

/// The repository's root (this crate lives in `test-support/`).
pub(crate) fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("test-support lives in the repository")
        .to_path_buf()
}

/// The install folder: `$CHANGE_STREAMER_LITESTREAM_DIR`, else `.tools/litestream`.
fn install_dir() -> PathBuf {
    std::env::var_os("CHANGE_STREAMER_LITESTREAM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".tools/litestream"))
}

/// Installs litestream if it is not yet (once per process, serialised across processes) and
/// says where it is. Panics, with the script's own message, when it cannot be installed.
pub fn install() -> Litestream {
    static INSTALLED: OnceLock<Litestream> = OnceLock::new();
    INSTALLED.get_or_init(run_litestream_install).clone()
}

fn run_litestream_install() -> Litestream {
    let var = run_install_script("scripts/install-litestream.sh", &install_dir());
    Litestream {
        bin: var("LITESTREAM_BIN"),
        vfs: var("LITESTREAM_VFS"),
        env: Vec::new(),
    }
}

/// Runs the install script `script` (relative to the repository) with `dir` under an exclusive
/// `flock` on `dir.lock`, and returns a look-up of the `export NAME='value'` lines it printed.
pub(crate) fn run_install_script(script: &str, dir: &Path) -> impl Fn(&str) -> PathBuf + use<> {
    let parent = dir.parent().expect("install folder has a parent");
    std::fs::create_dir_all(parent).expect("create the install folder's parent");
    let lock = PathBuf::from(format!("{}.lock", dir.display()));
    let out = Command::new("flock")
        .arg(&lock)
        .arg("bash")
        .arg(repo_root().join(script))
        .arg(dir)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("run `flock` (util-linux) with {script}: {e}"));
    assert!(
        out.status.success(),
        "{script} failed ({}): it needs python3 with pip and access to PyPI",
        out.status
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let script = script.to_string();
    move |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("export {name}=")))
            .map(|v| PathBuf::from(v.trim_matches('\'')))
            .unwrap_or_else(|| panic!("{script} printed no {name}: {text}"))
    }
}

/// litestream if it is already there, without installing it: `$LITESTREAM_BIN` and
/// `$LITESTREAM_VFS` when both are set, else a complete install in the install folder (one the
/// install script has finished).
pub fn installed() -> Option<Litestream> {
    if let (Some(bin), Some(vfs)) = (
        std::env::var_os("LITESTREAM_BIN"),
        std::env::var_os("LITESTREAM_VFS"),
    ) {
        return Some(Litestream {
            bin: bin.into(),
            vfs: vfs.into(),
            env: Vec::new(),
        });
    }
    let dir = install_dir();
    let found = Litestream {
        bin: dir.join("bin/litestream"),
        vfs: dir.join("litestream_vfs/litestream-vfs.so"),
        env: Vec::new(),
    };
    // The script's stamp is written last: a folder without it is still being installed.
    let stamped = std::fs::read_dir(&dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(".installed-"))
    });
    (stamped && found.bin.is_file() && found.vfs.is_file()).then_some(found)
}

/// A running `litestream replicate` of one database to one replica; killed when dropped.
pub struct Replication {
    child: Child,
}

impl Litestream {
    /// This litestream with `env` set (`Some`) or removed (`None`) for each command it runs.
    pub fn with_env(&self, env: Vec<(String, Option<String>)>) -> Litestream {
        let mut l = self.clone();
        l.env.extend(env);
        l
    }

    /// `litestream` with [`Litestream::env`] applied.
    fn command(&self) -> Command {
        let mut c = Command::new(&self.bin);
        for (k, v) in &self.env {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        c
    }

    /// Starts `litestream replicate` of `db` to `replica_url`, with its config file written to
    /// `config` and litestream's 50 ms monitor and sync intervals (seconds by default).
    pub fn replicate(&self, db: &Path, replica_url: &str, config: &Path) -> Replication {
        std::fs::write(config, replicate_config(db, replica_url, "50ms"))
            .expect("write litestream.yml");
        let child = self
            .command()
            .args(["replicate", "-config"])
            .arg(config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start litestream replicate");
        Replication { child }
    }

    /// Starts `litestream replicate` of `db` to `replica_url` as [`Litestream::replicate`] does,
    /// syncing every `sync_interval` (`"50ms"`, `"1s"`, …), with its control API on the unix
    /// socket `socket` (PROTOCOL.md §8.1c); its log goes to `config` with `.log` appended.
    pub fn replicate_controlled(
        &self,
        db: &Path,
        replica_url: &str,
        config: &Path,
        socket: &Path,
        sync_interval: &str,
    ) -> Replication {
        self.replicate_with(
            config,
            &control_config(db, replica_url, socket, sync_interval),
        )
    }

    /// [`Litestream::replicate_controlled`], returned once its control socket accepts
    /// connections (20 s at most).
    pub async fn replicate_controlled_ready(
        &self,
        db: &Path,
        replica_url: &str,
        config: &Path,
        socket: &Path,
        sync_interval: &str,
    ) -> Replication {
        let replication = self.replicate_controlled(db, replica_url, config, socket, sync_interval);
        replication
            .wait_for_socket(socket, Duration::from_secs(20))
            .await;
        replication
    }

    /// Starts `litestream replicate` with `yml` written to `config`; its log goes to `config`
    /// with `.log` appended.
    pub fn replicate_with(&self, config: &Path, yml: &str) -> Replication {
        std::fs::write(config, yml).expect("write litestream.yml");
        let log = std::fs::File::create(format!("{}.log", config.display()))
            .expect("create litestream's log file");
        let child = self
            .command()
            .args(["replicate", "-config"])
            .arg(config)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start litestream replicate");
        Replication { child }
    }

    /// `litestream restore -o out replica_url`: the latest backup, into `out`.
    pub fn restore(&self, replica_url: &str, out: &Path) -> Result<(), String> {
        let res = self
            .command()
            .args(["restore", "-o"])
            .arg(out)
            .arg(replica_url)
            .output()
            .map_err(|e| format!("run litestream restore: {e}"))?;
        if res.status.success() {
            Ok(())
        } else {
            Err(format!(
                "litestream restore {replica_url}: {}\n{}",
                res.status,
                String::from_utf8_lossy(&res.stderr)
            ))
        }
    }
}

/// The `litestream.yml` that replicates `db` to `replica_url`, checking for changes and
/// syncing every `interval`.
pub fn replicate_config(db: &Path, replica_url: &str, interval: &str) -> String {
    format!(
        "dbs:\n  - path: {}\n    monitor-interval: {interval}\n    replicas:\n      - url: {replica_url}\n        sync-interval: {interval}\n",
        db.display()
    )
}

/// [`replicate_config`] with litestream's control API on the unix socket `socket`.
pub fn control_config(db: &Path, replica_url: &str, socket: &Path, interval: &str) -> String {
    format!(
        "socket:\n  enabled: true\n  path: {}\n{}",
        socket.display(),
        replicate_config(db, replica_url, interval)
    )
}

/// The local folder of a `file://` replica URL.
pub fn file_replica_dir(replica_url: &str) -> PathBuf {
    PathBuf::from(
        replica_url
            .strip_prefix("file://")
            .expect("a file:// replica URL"),
    )
}

/// Copies the folder `from` (a `file://` replica, say) to `to`, recursively.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir").flatten() {
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// Puts a copy of `from` in place of the folder `dir` (a `file://` replica rolled back or put
/// back, say), swapped by two renames so that a reader sees one or the other, never a mix.
pub fn replace_dir(dir: &Path, from: &Path) {
    let staged = dir.with_extension("staged");
    let _ = std::fs::remove_dir_all(&staged);
    copy_dir(from, &staged);
    let old = dir.with_extension("old");
    let _ = std::fs::remove_dir_all(&old);
    std::fs::rename(dir, &old).expect("move the replica aside");
    std::fs::rename(&staged, dir).expect("put the copy in place");
}

impl Replication {
    /// The process id of `litestream replicate` (to stop it with SIGSTOP, say).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `sig` (`-STOP` to freeze it, `-CONT` to let it go on) to `litestream replicate`.
    pub fn signal(&self, sig: &str) {
        let sent = Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .expect("kill");
        assert!(sent.success(), "kill {sig} litestream");
    }

    /// Waits (up to `limit`) until litestream listens on its control socket `socket`.
    pub async fn wait_for_socket(&self, socket: &Path, limit: Duration) {
        let deadline = Instant::now() + limit;
        while std::os::unix::net::UnixStream::connect(socket).is_err() {
            assert!(
                Instant::now() < deadline,
                "litestream opened no control socket at {} within {limit:?}",
                socket.display()
            );
            actix_rt::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits (up to `limit`) until litestream has written a first snapshot to the `file://`
    /// replica at `replica_url`.
    pub async fn wait_for_backup(&self, replica_url: &str, limit: Duration) {
        let snapshots = file_replica_dir(replica_url).join("ltx/9");
        let deadline = Instant::now() + limit;
        while !std::fs::read_dir(&snapshots).is_ok_and(|mut d| d.next().is_some()) {
            assert!(
                Instant::now() < deadline,
                "litestream wrote no backup to {replica_url} within {limit:?}"
            );
            actix_rt::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Replication {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
