//! One litestream harness for the end-to-end backup tests: a builder that lays out one or
//! several stock-litestream backups ([`BackupFiles`], on `file://` folders or local S3 buckets),
//! starts the service with the flags that point at them (the single-backup `--litestream-*`
//! flags, or a `--backups` file for several, PROTOCOL.md §7.1), fed by a fake change source up to
//! the initial sync at watermark 100; then, step by step as each test orders them, the backup
//! replicators following the service into the files litestream backs up, real `litestream
//! replicate` on each (with its control socket for the control source, §8.1c), and what a test
//! does to a backup: freeze it (SIGSTOP), thaw it, kill it, save its replica and roll it back.
//!
//! The service runs in-process ([`WorldBuilder::start`], a [`TestService`]) or as the real
//! binary ([`WorldBuilder::spawn`], a [`ServiceProcess`], which a test may kill and start again
//! with the same flags and data: [`LitestreamWorld::into_parts`], [`LitestreamWorld::spawn_service`]).

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use tempfile::TempDir;

use crate::backup_files::{BackupFiles, Saved, Store};
use crate::backup_replica::BackupReplica;
pub use crate::litestream_flags::Source;
use crate::litestream_flags::{backups_file, single_backup_flags, Table};
use crate::process::ServiceProcess;
use crate::service::TestService;
use crate::stock_litestream::{self, Litestream, Replication};
use crate::upstream::{txn, FakeUpstream};
use crate::wait::wait_until;

/// The watermark of the initial sync every world starts from.
pub const INITIAL: u64 = 100;

/// Rows per transaction [`LitestreamWorld::send`] sends.
pub const ROWS: u64 = 2;

/// `n` as the service's watermark text.
fn w(n: u64) -> String {
    change_streamer_actors::watermark::Watermark::from_u64(n).to_string()
}

/// What a world is made of, before it starts.
pub struct WorldBuilder {
    bin: PathBuf,
    store: Store,
    source: Source,
    names: Vec<String>,
    flags: Vec<String>,
    export_credentials: bool,
    table: Option<Table>,
}

/// One backup of the world: its files, its backup replicator and its litestream.
pub struct Backup {
    /// `backup` for the single-backup flags, else its name in the `--backups` file.
    pub name: String,
    pub files: BackupFiles,
    /// Following the service once [`LitestreamWorld::follow`] ran.
    pub replica: Option<BackupReplica>,
    /// Running once [`LitestreamWorld::replicate`] ran; `None` again once killed.
    pub replication: Option<Replication>,
}

/// The service `S` (or `()` once taken out), the fake change source and the backups.
pub struct LitestreamWorld<S> {
    pub dir: TempDir,
    pub litestream: Litestream,
    pub up: FakeUpstream,
    pub svc: S,
    pub backups: Vec<Backup>,
    /// `/status` at the initial sync.
    pub initial: Value,
    source: Source,
    bin: PathBuf,
    flags: Vec<String>,
}

/// A service a world runs: in-process or the real binary.
pub trait Served {
    /// `host:port` it listens on.
    fn address(&self) -> String;
    /// `/status` once `cond` holds on it.
    fn status_when(
        &self,
        what: &str,
        cond: impl FnMut(&Value) -> bool,
    ) -> impl Future<Output = Value>;
}

/// [`Served`] for a service type whose `host:port` is `$address`.
macro_rules! served {
    ($service:ty, $address:expr) => {
        impl Served for $service {
            fn address(&self) -> String {
                $address(self)
            }
            fn status_when(
                &self,
                what: &str,
                cond: impl FnMut(&Value) -> bool,
            ) -> impl Future<Output = Value> {
                self.wait_status(what, cond)
            }
        }
    };
}

served!(TestService, TestService::base);
served!(ServiceProcess, |s: &ServiceProcess| s.addr.clone());

impl LitestreamWorld<()> {
    /// A world of one backup on a `file://` folder, asked through litestream's control socket;
    /// `bin` is the service's binary (`env!("CARGO_BIN_EXE_change-streamer")`): what
    /// [`WorldBuilder::spawn`] runs, and the VFS reader the in-process service starts.
    pub fn builder(bin: &str) -> WorldBuilder {
        WorldBuilder {
            bin: PathBuf::from(bin),
            store: Store::File,
            source: Source::Control,
            names: Vec::new(),
            flags: Vec::new(),
            export_credentials: true,
            table: None,
        }
    }
}

impl WorldBuilder {
    /// Where each backup's replica is kept.
    pub fn store(mut self, store: Store) -> Self {
        self.store = store;
        self
    }

    /// How the service learns what each backup holds.
    pub fn source(mut self, source: Source) -> Self {
        self.source = source;
        self
    }

    /// Several backups with these names, in a `--backups` file (else one, by the single-backup
    /// flags, named `backup`).
    pub fn backups(mut self, names: &[&str]) -> Self {
        self.names = names.iter().map(|n| n.to_string()).collect();
        self
    }

    /// With [`Store::S3`]: this process's environment left as it is (litestream still gets the
    /// bucket's credentials; the service must find its own: [`BackupFiles::on_own_s3`]).
    pub fn without_exported_credentials(mut self) -> Self {
        self.export_credentials = false;
        self
    }

    /// Each backup's table in the `--backups` file with the `url` and extra keys (TOML lines)
    /// that `table` gives for its files, in place of its replica's URL and the source's keys.
    pub fn table(mut self, table: impl Fn(&BackupFiles) -> (String, String) + 'static) -> Self {
        self.table = Some(Box::new(table));
        self
    }

    /// More service flags, after those of the backups and the change source.
    pub fn flags(mut self, flags: &[&str]) -> Self {
        self.flags.extend(flags.iter().map(|f| f.to_string()));
        self
    }

    /// Lays out the backups and the change source; returns them with the service's flags.
    async fn lay_out(self) -> LitestreamWorld<()> {
        let litestream = stock_litestream::install();
        if self.source.reads_through_the_vfs() {
            // The in-process service starts its VFS readers from the binary.
            std::env::set_var(change_streamer_actors::vfs::ENV_READER, &self.bin);
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let several = !self.names.is_empty();
        let names = if several {
            self.names.clone()
        } else {
            vec!["backup".to_string()]
        };
        let backups: Vec<Backup> = names
            .into_iter()
            .map(|name| Backup {
                files: match (self.store, self.export_credentials) {
                    (Store::S3, false) => BackupFiles::on_own_s3(&dir.path().join(&name)),
                    (store, _) => BackupFiles::new(&dir.path().join(&name), store),
                },
                name,
                replica: None,
                replication: None,
            })
            .collect();
        let up = FakeUpstream::start().await;
        let mut flags = if several {
            let table = self.table.as_ref();
            let tables: Vec<(&str, &BackupFiles)> = backups
                .iter()
                .map(|b| (b.name.as_str(), &b.files))
                .collect();
            let file = backups_file(dir.path(), &tables, self.source, &litestream, table);
            vec!["--backups".to_string(), file.display().to_string()]
        } else {
            single_backup_flags(&backups[0].files, self.source, &litestream)
        };
        flags.extend(["--upstream".to_string(), up.url()]);
        flags.extend(self.flags);
        LitestreamWorld {
            dir,
            litestream,
            up,
            svc: (),
            backups,
            initial: Value::Null,
            source: self.source,
            bin: self.bin,
            flags,
        }
    }

    /// The world with the service in-process, past its initial sync.
    pub async fn start(self) -> LitestreamWorld<TestService> {
        let world = self.lay_out().await;
        let svc = TestService::start(&world.flag_refs()).await;
        world.with(svc).initial_sync().await
    }

    /// The world with the service's real binary, its data in the world's folder `data`, past
    /// its initial sync.
    pub async fn spawn(self) -> LitestreamWorld<ServiceProcess> {
        let world = self.lay_out().await;
        let svc = world.spawn_service();
        world.with(svc).initial_sync().await
    }
}

impl<S> LitestreamWorld<S> {
    fn with<T>(self, svc: T) -> LitestreamWorld<T> {
        LitestreamWorld {
            dir: self.dir,
            litestream: self.litestream,
            up: self.up,
            svc,
            backups: self.backups,
            initial: self.initial,
            source: self.source,
            bin: self.bin,
            flags: self.flags,
        }
    }

    /// The service's flags, as `&str`s.
    pub fn flag_refs(&self) -> Vec<&str> {
        self.flags.iter().map(String::as_str).collect()
    }

    /// The service taken out of the world (to kill it, say); the world keeps the rest.
    pub fn into_parts(self) -> (LitestreamWorld<()>, S) {
        let world = LitestreamWorld {
            dir: self.dir,
            litestream: self.litestream,
            up: self.up,
            svc: (),
            backups: self.backups,
            initial: self.initial,
            source: self.source,
            bin: self.bin,
            flags: self.flags,
        };
        (world, self.svc)
    }

    /// The service's real binary started with the world's flags and data folder (again, after
    /// a kill: the same data).
    pub fn spawn_service(&self) -> ServiceProcess {
        ServiceProcess::spawn(
            &self.bin,
            0,
            &self.dir.path().join("data"),
            &self.flag_refs(),
        )
    }

    /// The backup named `name`.
    pub fn backup(&self, name: &str) -> &Backup {
        self.backups
            .iter()
            .find(|b| b.name == name)
            .unwrap_or_else(|| panic!("no backup {name}"))
    }

    fn backup_mut(&mut self, name: &str) -> &mut Backup {
        self.backups
            .iter_mut()
            .find(|b| b.name == name)
            .unwrap_or_else(|| panic!("no backup {name}"))
    }

    /// The files of the first (or only) backup.
    pub fn files(&self) -> &BackupFiles {
        &self.backups[0].files
    }

    /// The backup replicator of the first (or only) backup.
    pub fn replica(&self) -> &BackupReplica {
        self.backups[0]
            .replica
            .as_ref()
            .expect("the backup replicator follows (LitestreamWorld::follow)")
    }

    /// Takes the backup replicators out of the world (to drop them with a killed service).
    pub fn take_replicas(&mut self) -> Vec<BackupReplica> {
        self.backups
            .iter_mut()
            .filter_map(|b| b.replica.take())
            .collect()
    }

    /// Starts `litestream replicate` of every backup: with its control socket (returned once
    /// it accepts connections) for the control source, syncing every 50 ms for the VFS source.
    pub async fn replicate(&mut self) {
        for b in &mut self.backups {
            b.replication = Some(match self.source {
                Source::Vfs => b.files.replicate(&self.litestream),
                _ => b.files.replicate_controlled(&self.litestream).await,
            });
        }
    }

    /// [`LitestreamWorld::replicate`], then waits for each backup's first snapshot.
    pub async fn replicate_and_wait(&mut self) {
        self.replicate().await;
        for b in &self.backups {
            let r = b.replication.as_ref().expect("replicating");
            b.files.wait_for_backup(r, Duration::from_secs(20)).await;
        }
    }

    fn replication(&self, name: &str) -> &Replication {
        self.backup(name)
            .replication
            .as_ref()
            .unwrap_or_else(|| panic!("litestream of {name} is not running"))
    }

    /// Freezes litestream of backup `name` (SIGSTOP): it holds its sockets and answers nothing.
    pub fn freeze(&self, name: &str) {
        self.replication(name).signal("-STOP");
    }

    /// Lets the frozen litestream of backup `name` go on (SIGCONT).
    pub fn thaw(&self, name: &str) {
        self.replication(name).signal("-CONT");
    }

    /// Kills litestream of backup `name`.
    pub fn kill(&mut self, name: &str) {
        self.backup_mut(name).replication = None;
    }

    /// Kills what keeps backup `name`: its S3 server for an S3 replica, else its litestream.
    pub fn kill_store(&mut self, name: &str) {
        let b = self.backup_mut(name);
        match b.files.s3.as_mut() {
            Some((server, _)) => server.kill(),
            None => b.replication = None,
        }
    }

    /// A copy of what backup `name`'s replica holds now (`copy` names the copy's folder).
    pub fn save(&self, name: &str, copy: &str) -> Saved {
        self.backup(name).files.save(copy)
    }

    /// Makes backup `name`'s replica hold what `saved` held: rolled back, or put back.
    pub fn roll_back(&self, name: &str, saved: &Saved) {
        self.backup(name).files.put_back(saved);
    }

    /// The latest backup of `name` restored into a new file `out` in its folder.
    pub fn restore(&self, name: &str, out: &str) -> PathBuf {
        self.backup(name).files.restore(&self.litestream, out)
    }

    /// Sends transactions `from..=to` and waits until every backup replicator applied them.
    pub async fn send(&self, from: u64, to: u64) {
        for n in from..=to {
            self.up.send(txn(n, ROWS));
        }
        let last = w(to);
        wait_until(
            "every backup replicator applies what was sent",
            Duration::from_secs(20),
            || {
                self.backups.iter().all(|b| {
                    b.replica
                        .as_ref()
                        .is_some_and(|r| r.applied().as_deref() == Some(last.as_str()))
                })
            },
        )
        .await;
    }
}

impl<S: Served> LitestreamWorld<S> {
    /// The fake change source connected, the initial sync at [`INITIAL`] done.
    async fn initial_sync(mut self) -> Self {
        self.up.wait_connections(1).await;
        self.up.send(txn(INITIAL, 1));
        self.initial = self
            .svc
            .status_when("the initial sync", |s| s["replicaVersion"].is_string())
            .await;
        self
    }

    /// Each backup's replicator follows the service from the initial sync, into the file its
    /// litestream backs up (`backup=NAME` when there are several, PROTOCOL.md §7.1).
    pub async fn follow(&mut self) {
        let (base, rv) = (self.svc.address(), w(INITIAL));
        let several = self.flags.first().is_some_and(|f| f == "--backups");
        for b in &mut self.backups {
            let db = b.files.db();
            b.replica = Some(if several {
                BackupReplica::start_for_backup(&base, &b.name, &rv, &rv, &db).await
            } else {
                BackupReplica::start(&base, &b.name, &rv, &rv, &db).await
            });
        }
    }
}
