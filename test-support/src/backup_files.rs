//! One stock-litestream backup inside a test's folder, named once: the backup replicator's
//! SQLite file that litestream backs up, its replica (a `file://` folder, or a bucket of the
//! local S3 server, [`crate::s3`]), litestream's control socket and config, and the service
//! flags that point at them, for the control source (PROTOCOL.md §8.1c) or the VFS source
//! (§8.1b). The end-to-end litestream tests each set up the same files and flags; here they are
//! written once, for both kinds of replica.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::s3::{S3Bucket, S3Server};
use crate::stock_litestream::{copy_dir, file_replica_dir, replace_dir, Litestream, Replication};

/// Where a backup's replica is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// A `file://` folder beside the backup's files.
    File,
    /// A bucket of a local S3 server of its own ([`crate::s3`]).
    S3,
}

/// A copy of what a backup's replica held at some moment ([`BackupFiles::save`]).
pub enum Saved {
    /// A copy of the `file://` folder.
    Folder(PathBuf),
    /// The bucket's objects.
    Objects(Vec<(String, Vec<u8>)>),
}

/// The files of one backup under `dir`.
pub struct BackupFiles {
    pub dir: PathBuf,
    /// The S3 server and bucket the backup is replicated to; `None`: the `file://` folder
    /// `dir/backup`.
    pub s3: Option<(S3Server, S3Bucket)>,
}

impl BackupFiles {
    /// A backup whose files live in `dir` (created if missing).
    pub fn in_dir(dir: &Path) -> BackupFiles {
        std::fs::create_dir_all(dir).expect("the backup's folder");
        BackupFiles {
            dir: dir.to_path_buf(),
            s3: None,
        }
    }

    /// A backup whose files live in `dir`, replicated as `store` says: for [`Store::S3`], to
    /// bucket `backup` of an S3 server of its own, started here (and the credentials exported
    /// to this process, for the service's VFS reader: [`crate::s3::export_credentials`]).
    pub fn new(dir: &Path, store: Store) -> BackupFiles {
        match store {
            Store::S3 => {
                crate::s3::export_credentials();
                BackupFiles::on_own_s3(dir)
            }
            Store::File => BackupFiles::in_dir(dir),
        }
    }

    /// A backup whose files live in `dir`, replicated to bucket `backup` of an S3 server of its
    /// own, started here; this process's environment is left as it is (litestream gets the
    /// credentials from [`BackupFiles::litestream`], the service must find its own).
    pub fn on_own_s3(dir: &Path) -> BackupFiles {
        BackupFiles::on_own_s3_bucket(dir, "backup")
    }

    /// [`BackupFiles::on_own_s3`] with the bucket named `name`.
    pub fn on_own_s3_bucket(dir: &Path, name: &str) -> BackupFiles {
        let server = S3Server::start(dir);
        let bucket = server.bucket(name);
        BackupFiles {
            s3: Some((server, bucket)),
            ..BackupFiles::in_dir(dir)
        }
    }

    /// The bucket of an S3 backup.
    pub fn bucket(&self) -> Option<&S3Bucket> {
        self.s3.as_ref().map(|(_, b)| b)
    }

    /// litestream as this backup runs it: with the bucket's credentials and environment for S3.
    pub fn litestream(&self, litestream: &Litestream) -> Litestream {
        match &self.s3 {
            Some(_) => litestream.with_env(S3Bucket::env()),
            None => litestream.clone(),
        }
    }

    /// The backup replicator's SQLite file: what litestream backs up.
    pub fn db(&self) -> PathBuf {
        self.dir.join("replica.db")
    }

    /// The replica litestream writes and restores from: the `file://` folder, or the bucket's
    /// `s3://` URL.
    pub fn url(&self) -> String {
        match &self.s3 {
            Some((_, bucket)) => bucket.url(),
            None => format!("file://{}", self.dir.join("backup").display()),
        }
    }

    /// litestream's control socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("ls.sock")
    }

    /// The service's `--litestream-control-url` for [`BackupFiles::socket`].
    pub fn control_url(&self) -> String {
        format!("unix:{}", self.socket().display())
    }

    /// litestream's config file (its log beside it, `.log` appended).
    pub fn config(&self) -> PathBuf {
        self.dir.join("litestream.yml")
    }

    /// The service's flags for the control source: the backup's URL, the control socket and
    /// the file it backs up.
    pub fn control_flags(&self) -> Vec<String> {
        vec![
            "--litestream-backup-url".into(),
            self.url(),
            "--litestream-control-url".into(),
            self.control_url(),
            "--litestream-db-path".into(),
            self.db().display().to_string(),
        ]
    }

    /// The service's flags for the VFS source: the backup's URL and litestream's VFS extension.
    pub fn vfs_flags(&self, litestream: &Litestream) -> Vec<String> {
        vec![
            "--litestream-backup-url".into(),
            self.url(),
            "--litestream-vfs".into(),
            litestream.vfs.display().to_string(),
        ]
    }

    /// Both: the control API confirms and the VFS audits (PROTOCOL.md §8.1d).
    pub fn control_and_vfs_flags(&self, litestream: &Litestream) -> Vec<String> {
        let mut flags = self.control_flags();
        flags.extend([
            "--litestream-vfs".into(),
            litestream.vfs.display().to_string(),
        ]);
        flags
    }

    /// `litestream replicate` of [`BackupFiles::db`] syncing only when asked (an hourly
    /// interval), with its control socket, returned once the socket accepts connections: what
    /// the backup holds within a test, it holds because the service asked.
    pub async fn replicate_controlled(&self, litestream: &Litestream) -> Replication {
        self.replicate_controlled_every(litestream, "1h").await
    }

    /// [`BackupFiles::replicate_controlled`] syncing by itself every `sync_interval` too.
    pub async fn replicate_controlled_every(
        &self,
        litestream: &Litestream,
        sync_interval: &str,
    ) -> Replication {
        self.litestream(litestream)
            .replicate_controlled_ready(
                &self.db(),
                &self.url(),
                &self.config(),
                &self.socket(),
                sync_interval,
            )
            .await
    }

    /// `litestream replicate` of [`BackupFiles::db`] syncing every 50 ms by itself.
    pub fn replicate(&self, litestream: &Litestream) -> Replication {
        self.litestream(litestream)
            .replicate(&self.db(), &self.url(), &self.config())
    }

    /// The latest backup restored into a new file `name` in the backup's folder.
    pub fn restore(&self, litestream: &Litestream, name: &str) -> PathBuf {
        let out = self.dir.join(name);
        self.litestream(litestream)
            .restore(&self.url(), &out)
            .expect("litestream restore");
        out
    }

    /// A copy of what the replica holds now, `name` naming the copy's folder for `file://`.
    pub fn save(&self, name: &str) -> Saved {
        match &self.s3 {
            Some((_, bucket)) => Saved::Objects(bucket.snapshot()),
            None => {
                let copy = self.dir.join(name);
                copy_dir(&file_replica_dir(&self.url()), &copy);
                Saved::Folder(copy)
            }
        }
    }

    /// Makes the replica hold what `saved` held (rolled back, or put back as it was).
    pub fn put_back(&self, saved: &Saved) {
        match (&self.s3, saved) {
            (Some((_, bucket)), Saved::Objects(objects)) => bucket.put_back(objects),
            (None, Saved::Folder(copy)) => replace_dir(&file_replica_dir(&self.url()), copy),
            _ => panic!("a copy of another kind of replica"),
        }
    }

    /// Waits (up to `limit`) until litestream has written a first snapshot of this backup.
    pub async fn wait_for_backup(&self, replication: &Replication, limit: Duration) {
        match &self.s3 {
            Some((_, bucket)) => {
                // A listing every 100 ms: each is a request to a Python server.
                let deadline = std::time::Instant::now() + limit;
                while !bucket.holds_a_backup() {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "litestream wrote no backup to {} within {limit:?}",
                        bucket.url()
                    );
                    actix_rt::time::sleep(Duration::from_millis(100)).await;
                }
            }
            None => replication.wait_for_backup(&self.url(), limit).await,
        }
    }
}

/// The service's flags for a test in which the backup is confirmed only when asked (the
/// periodic poll an hour apart: every confirmation comes from an ack or a join) and the log is
/// purged as soon as the rules allow (no cleanup delay, no retention, a 100 ms purge delay).
pub const ASKED_AND_PURGED_AT_ONCE: [&str; 8] = [
    "--backup-check-interval-ms",
    "3600000",
    "--min-cleanup-delay-ms",
    "0",
    "--purge-delay-ms",
    "100",
    "--change-log-retention-ms",
    "0",
];

/// `flags` and `more` as the `&str`s a service's start takes.
pub fn flag_refs<'a>(flags: &'a [String], more: &[&'a str]) -> Vec<&'a str> {
    flags
        .iter()
        .map(String::as_str)
        .chain(more.iter().copied())
        .collect()
}
