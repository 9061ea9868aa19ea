//! The service's flags for a litestream harness's backups (`litestream_world`): the
//! single-backup `--litestream-*` flags of one backup, or a `--backups` file with a table per
//! backup (PROTOCOL.md §7.1), for the source the service learns each backup's watermark from.

use std::path::{Path, PathBuf};

use crate::backup_files::BackupFiles;
use crate::stock_litestream::Litestream;

/// How the service learns what each backup holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// litestream's control socket (PROTOCOL.md §8.1c); litestream syncs only when asked.
    Control,
    /// The service reads the backup through litestream's VFS (§8.1b); litestream syncs every
    /// 50 ms by itself.
    Vfs,
    /// The control socket confirms and the VFS audits (§8.1d).
    ControlAndVfs,
}

impl Source {
    pub(crate) fn reads_through_the_vfs(self) -> bool {
        self != Source::Control
    }

    /// The `source` key of a `--backups` table.
    fn key(self) -> &'static str {
        match self {
            Source::Vfs => "vfs",
            Source::Control | Source::ControlAndVfs => "control",
        }
    }
}

/// A backup's `url` in the `--backups` file and the keys written after its `source`.
pub type Table = Box<dyn Fn(&BackupFiles) -> (String, String)>;

/// The single-backup flags of `files` for `source`.
pub(crate) fn single_backup_flags(
    files: &BackupFiles,
    source: Source,
    litestream: &Litestream,
) -> Vec<String> {
    match source {
        Source::Control => files.control_flags(),
        Source::Vfs => files.vfs_flags(litestream),
        Source::ControlAndVfs => files.control_and_vfs_flags(litestream),
    }
}

/// The `--backups` file of `backups` for `source`, written in `root`: each table with its
/// replica's URL and the keys of the control socket, or with the URL and keys `table` gives.
pub(crate) fn backups_file(
    root: &Path,
    backups: &[(&str, &BackupFiles)],
    source: Source,
    litestream: &Litestream,
    table: Option<&Table>,
) -> PathBuf {
    let mut text = String::new();
    for (name, files) in backups {
        let (url, keys) = match table {
            Some(table) => table(files),
            None => (files.url(), control_keys(files, source)),
        };
        let vfs = match source.reads_through_the_vfs() {
            true => format!("vfs = \"{}\"\n", litestream.vfs.display()),
            false => String::new(),
        };
        text += &format!(
            "[[backup]]\nname = \"{name}\"\nurl = \"{url}\"\nsource = \"{}\"\n{vfs}{keys}\n",
            source.key()
        );
    }
    let path = root.join("backups.toml");
    std::fs::write(&path, text).expect("write the backups file");
    path
}

/// The `control_url` and `db_path` keys of a backup's table, for the sources that ask.
fn control_keys(files: &BackupFiles, source: Source) -> String {
    match source {
        Source::Vfs => String::new(),
        Source::Control | Source::ControlAndVfs => format!(
            "control_url = \"{}\"\ndb_path = \"{}\"\n",
            files.control_url(),
            files.db().display()
        ),
    }
}
