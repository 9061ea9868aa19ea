//! `--backups FILE` and `--purge-quorum K` (PROTOCOL.md §8.4): the backups the service watches,
//! one [`BackupSpec`] each, read from a TOML file of `[[backup]]` tables or made from the
//! single-backup flags (a list of one, named [`SINGLE_BACKUP`]); and how many of them must hold
//! a watermark before it may be purged.
//!
//! The file is read and checked as clap parses the flag ([`parse_backups_file`]), so that a bad
//! one stops the start with clap's message naming `--backups`, the file, the backup and the key;
//! the quorum is checked against the number of backups once every flag is parsed
//! ([`Config::check_purge_quorum`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use change_streamer_actors::litestream_control::ControlUrl;
use serde::Deserialize;

use super::values::{parse_control_url, parse_http_url, parse_non_empty};
use super::Config;

pub use s3::S3Settings;

mod s3;

/// `--litestream-metrics-url`'s default, and a `[[backup]]`'s `metrics_url`'s.
pub const DEFAULT_METRICS_URL: &str = "http://localhost:4850/metrics";

/// `--backup-watermark-query`'s default, and a `[[backup]]`'s `watermark_query`'s.
pub const DEFAULT_WATERMARK_QUERY: &str = r#"SELECT stateVersion FROM "_zero.replicationState""#;

/// The name of the one backup the single-backup flags describe (the audit's too).
pub use change_streamer_actors::monitor::SINGLE_BACKUP;

/// An audit's period when `--backup-audit-interval-ms` (or `audit_interval_ms`) is unset
/// (PROTOCOL.md §8.1d).
pub const DEFAULT_AUDIT_INTERVAL_MS: u64 = 60_000;

/// One backup: its name, its URL and where its monitor learns what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupSpec {
    /// `backup=NAME` on `/changes` (PROTOCOL.md §7.1), and its name in `/status` and `/metrics`.
    pub name: String,
    /// The backup URL (the first backup's is sent to restoring replicas).
    pub url: String,
    pub source: SourceSpec,
    /// Its `s3_` settings (PROTOCOL.md §8.4, "On S3"), for the service's own reads.
    pub s3: S3Settings,
}

/// A backup's source and its settings (PROTOCOL.md §8.1, §8.1b, §8.1c).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceSpec {
    Metrics {
        url: String,
    },
    Vfs {
        extension: PathBuf,
        query: String,
    },
    Control {
        url: ControlUrl,
        db_path: String,
        /// Its audit through the VFS (PROTOCOL.md §8.1d), if any.
        audit: Option<AuditSpec>,
    },
}

/// A control backup's audit through the VFS (PROTOCOL.md §8.1d): the extension, the watermark
/// query and how often (`None`: no audit, as `--backup-audit-interval-ms 0`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditSpec {
    pub extension: PathBuf,
    pub query: String,
    pub interval: Option<std::time::Duration>,
}

/// An audit's period from its setting in ms: unset, [`DEFAULT_AUDIT_INTERVAL_MS`]; 0, none.
pub fn audit_interval(ms: Option<u64>) -> Option<std::time::Duration> {
    match ms.unwrap_or(DEFAULT_AUDIT_INTERVAL_MS) {
        0 => None,
        ms => Some(std::time::Duration::from_millis(ms)),
    }
}

/// `--backups`: the file, read and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupsFile {
    pub path: PathBuf,
    pub backups: Vec<BackupSpec>,
}

/// The file as written: a list of `[[backup]]` tables and nothing else.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    backup: Option<Vec<Table>>,
}

/// One `[[backup]]` table as written; every key optional here, so that a missing one is
/// reported by name.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Table {
    name: Option<String>,
    url: Option<String>,
    source: Option<String>,
    metrics_url: Option<String>,
    vfs: Option<PathBuf>,
    watermark_query: Option<String>,
    control_url: Option<String>,
    db_path: Option<String>,
    audit_interval_ms: Option<u64>,
    s3_endpoint: Option<String>,
    s3_region: Option<String>,
    s3_path_style: Option<bool>,
    s3_credentials_file: Option<PathBuf>,
}

/// clap's value parser of `--backups`: reads the file and checks it.
pub(super) fn parse_backups_file(s: &str) -> Result<BackupsFile, String> {
    let path = PathBuf::from(s);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("{}: cannot be read: {e}", path.display()))?;
    let backups = parse_backups(&path, &text)?;
    Ok(BackupsFile { path, backups })
}

/// The backups `text` (the content of `path`) lists, or why it cannot be used: the file, the
/// backup and the key in one line.
pub fn parse_backups(path: &Path, text: &str) -> Result<Vec<BackupSpec>, String> {
    let file = path.display();
    let doc: Document = toml::from_str(text).map_err(|e| {
        let start = e.span().map(|s| s.start);
        let at = start.map(|s| line_col(text, s)).unwrap_or_default();
        let key = start
            .and_then(|s| key_at(text, s))
            .map(|k| format!("key `{k}`: "))
            .unwrap_or_default();
        format!("{file}{at}: {key}{}", e.message().trim())
    })?;
    let tables = doc.backup.unwrap_or_default();
    if tables.is_empty() {
        return Err(format!(
            "{file}: no [[backup]] table: list at least one backup"
        ));
    }
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut backups = Vec::with_capacity(tables.len());
    for (i, table) in tables.into_iter().enumerate() {
        let n = i + 1;
        let Some(name) = table.name.clone() else {
            return Err(format!("{file}: backup {n}: key `name` is missing"));
        };
        let at = format!("{file}: backup {n} ({name:?})");
        check_name(&name).map_err(|e| format!("{at}: key `name`: {e}"))?;
        if let Some(first) = seen.insert(name.clone(), n) {
            return Err(format!(
                "{at}: key `name`: {name:?} is the name of backup {first} too; names must be unique"
            ));
        }
        backups.push(table.into_spec(name).map_err(|e| format!("{at}: {e}"))?);
    }
    Ok(backups)
}

/// ` (line L, column C)` of byte `offset` of `text`.
fn line_col(text: &str, offset: usize) -> String {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!(":{line}:{column}")
}

/// The key of the `key = value` line holding byte `offset` of `text`, if it is one (toml's
/// message about a value's type does not name its key).
fn key_at(text: &str, offset: usize) -> Option<&str> {
    let start = text[..offset.min(text.len())]
        .rfind('\n')
        .map_or(0, |i| i + 1);
    let line = text[start..].lines().next()?;
    let (key, _) = line.split_once('=')?;
    let key = key.trim();
    (!key.is_empty() && !key.starts_with('[')).then_some(key)
}

/// A name fit for a URL parameter and a metric label.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    match name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        Some(c) => Err(format!(
            "{c:?} is not allowed: use letters, digits, '-', '_' and '.'"
        )),
        None => Ok(()),
    }
}

impl Table {
    /// A key of another source than `source`'s is refused, as a likely mistake; so is
    /// `audit_interval_ms` without `vfs`.
    fn check_keys_of(&self, source: &str) -> Result<(), String> {
        // With source "control", `vfs` and `watermark_query` are its audit's (PROTOCOL.md §8.1d).
        let audited = source == "control";
        let settings: [(&str, bool, &str); 6] = [
            ("metrics_url", self.metrics_url.is_some(), "metrics"),
            ("vfs", self.vfs.is_some() && !audited, "vfs"),
            (
                "watermark_query",
                self.watermark_query.is_some() && !audited,
                "vfs",
            ),
            ("control_url", self.control_url.is_some(), "control"),
            ("db_path", self.db_path.is_some(), "control"),
            (
                "audit_interval_ms",
                self.audit_interval_ms.is_some(),
                "control",
            ),
        ];
        if let Some((k, _, of)) = settings.iter().find(|(_, set, of)| *set && *of != source) {
            return Err(format!(
                "key `{k}` is a setting of source {of:?}, not of {source:?}"
            ));
        }
        if self.audit_interval_ms.is_some() && self.vfs.is_none() {
            return Err(
                "key `audit_interval_ms`: the audit reads the backup through the VFS: key `vfs` is missing".into(),
            );
        }
        Ok(())
    }

    /// The backup this table describes, each setting checked as its flag would be.
    fn into_spec(self, name: String) -> Result<BackupSpec, String> {
        fn key(k: &'static str) -> impl Fn(String) -> String {
            move |e| format!("key `{k}`: {e}")
        }
        let url = parse_non_empty(self.url.as_deref().ok_or("key `url` is missing")?)
            .map_err(key("url"))?;
        let source = match self.source.as_deref() {
            Some(s) => s.to_string(),
            None if self.control_url.is_some() => "control".into(),
            None if self.vfs.is_some() => "vfs".into(),
            None => "metrics".into(),
        };
        self.check_keys_of(&source)?;
        let query = parse_non_empty(
            self.watermark_query
                .as_deref()
                .unwrap_or(DEFAULT_WATERMARK_QUERY),
        )
        .map_err(key("watermark_query"))?;
        let source = match source.as_str() {
            "metrics" => SourceSpec::Metrics {
                url: parse_http_url(self.metrics_url.as_deref().unwrap_or(DEFAULT_METRICS_URL))
                    .map_err(key("metrics_url"))?,
            },
            "vfs" => SourceSpec::Vfs {
                extension: self
                    .vfs
                    .ok_or("key `vfs` is missing: source \"vfs\" needs the extension's path")?,
                query,
            },
            "control" => SourceSpec::Control {
                url: parse_control_url(self.control_url.as_deref().ok_or(
                    "key `control_url` is missing: source \"control\" needs litestream's control URL",
                )?)
                .map_err(key("control_url"))?,
                db_path: parse_non_empty(self.db_path.as_deref().ok_or(
                    "key `db_path` is missing: source \"control\" needs the replica's file",
                )?)
                .map_err(key("db_path"))?,
                audit: self.vfs.map(|extension| AuditSpec {
                    extension,
                    query,
                    interval: audit_interval(self.audit_interval_ms),
                }),
            },
            other => {
                return Err(format!(
                    "key `source`: must be \"metrics\", \"vfs\" or \"control\", not {other:?}"
                ))
            }
        };
        let s3 = S3Settings {
            endpoint: self.s3_endpoint,
            region: self.s3_region,
            path_style: self.s3_path_style.unwrap_or(false),
            credentials_file: self.s3_credentials_file,
        };
        s3.check(&url)?;
        Ok(BackupSpec {
            name,
            url,
            source,
            s3,
        })
    }
}

impl Config {
    /// The backups the service watches: `--backups`' list, or the one the single-backup flags
    /// describe (named [`SINGLE_BACKUP`]), or none without `--litestream-backup-url`.
    pub fn backups(&self) -> Vec<BackupSpec> {
        if let Some(file) = &self.backups {
            return file.backups.clone();
        }
        let Some(url) = &self.litestream_backup_url else {
            return Vec::new();
        };
        let source = match (&self.litestream_vfs, &self.litestream_control_url) {
            (vfs, Some(control)) => SourceSpec::Control {
                url: control.clone(),
                // clap makes sure that one comes with the other.
                db_path: self.litestream_db_path.clone().unwrap_or_default(),
                // With the control API the VFS audits (PROTOCOL.md §8.1d).
                audit: vfs.as_ref().map(|extension| AuditSpec {
                    extension: extension.clone(),
                    query: self.backup_watermark_query.clone(),
                    interval: audit_interval(self.backup_audit_interval_ms),
                }),
            },
            (Some(extension), None) => SourceSpec::Vfs {
                extension: extension.clone(),
                query: self.backup_watermark_query.clone(),
            },
            (None, None) => SourceSpec::Metrics {
                url: self.litestream_metrics_url.clone(),
            },
        };
        vec![BackupSpec {
            name: SINGLE_BACKUP.into(),
            url: url.clone(),
            source,
            s3: S3Settings::default(),
        }]
    }

    /// The URL sent to restoring replicas: the first backup's; `None` without a backup.
    pub fn backup_url(&self) -> Option<String> {
        self.backups().into_iter().next().map(|b| b.url)
    }

    /// K: how many backups must hold a watermark before it may be purged; by default all.
    pub fn purge_quorum(&self) -> usize {
        let m = self.backups().len();
        self.purge_quorum
            .map_or(m, |k| usize::try_from(k).unwrap_or(usize::MAX))
    }

    /// PROTOCOL.md §8.4: `--purge-quorum` must not exceed the number of backups (clap checks
    /// that it is at least 1).
    pub(super) fn check_purge_quorum(&self) -> Result<(), String> {
        let Some(k) = self.purge_quorum else {
            return Ok(());
        };
        let m = self.backups().len();
        if usize::try_from(k).is_ok_and(|k| k <= m) {
            return Ok(());
        }
        let listed = match &self.backups {
            Some(file) => format!("the {m} backup(s) of --backups {}", file.path.display()),
            None if m == 0 => "the 0 backups (no --litestream-backup-url or --backups)".into(),
            None => "the 1 backup of --litestream-backup-url".into(),
        };
        Err(format!("--purge-quorum {k} is more than {listed}"))
    }
}

#[cfg(test)]
mod tests;
