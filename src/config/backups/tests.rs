//! PROTOCOL.md §8.4's start errors and defaults: the `--backups` file, its combination with the
//! single-backup flags, and `--purge-quorum`; each message names the file (or flag) and the key.

use std::io::Write;

use super::super::parse_from;
use super::*;

/// A `--backups` file holding `text`, kept until the test ends.
fn file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().expect("a temporary file");
    f.write_all(text.as_bytes()).expect("written");
    f
}

fn parse(args: &[&str]) -> Result<Config, String> {
    let args: Vec<std::ffi::OsString> = std::iter::once("change-streamer")
        .chain(args.iter().copied())
        .map(Into::into)
        .collect();
    parse_from(&args).map(|(c, _)| c).map_err(|e| e.to_string())
}

/// The error `text` as a `--backups` file (with `extra` flags) gives; it names the file.
fn refused(text: &str, extra: &[&str]) -> String {
    let f = file(text);
    let path = f.path().to_str().expect("a UTF-8 path").to_string();
    let mut args = vec!["--backups", path.as_str()];
    args.extend_from_slice(extra);
    let e = parse(&args).expect_err("a start error");
    assert!(
        e.contains("--backups") || e.contains("--purge-quorum"),
        "{e}"
    );
    assert!(e.contains(&path), "the message names the file: {e}");
    e
}

const THREE: &str = r#"
[[backup]]
name = "east"
url = "s3://east/replica"
source = "control"
control_url = "unix:/run/east.sock"
db_path = "/data/east.db"

[[backup]]
name = "west"
url = "file:///backups/west"
vfs = "/opt/litestream-vfs.so"

[[backup]]
name = "fork"
url = "s3://fork/replica"
"#;

#[test]
fn backups_file_lists_each_backup_with_its_flag_defaults() {
    let f = file(THREE);
    let c = parse(&["--backups", f.path().to_str().unwrap()]).unwrap();
    let b = c.backups();
    assert_eq!(b.len(), 3);
    assert_eq!(
        b[0].source,
        SourceSpec::Control {
            url: ControlUrl::parse("unix:/run/east.sock").unwrap(),
            db_path: "/data/east.db".into(),
            audit: None
        }
    );
    assert_eq!(
        b[1].source,
        SourceSpec::Vfs {
            extension: "/opt/litestream-vfs.so".into(),
            query: DEFAULT_WATERMARK_QUERY.into()
        }
    );
    assert_eq!(
        b[2].source,
        SourceSpec::Metrics {
            url: DEFAULT_METRICS_URL.into()
        }
    );
    assert_eq!(c.purge_quorum(), 3, "K defaults to M");
    assert_eq!(c.backup_url().as_deref(), Some("s3://east/replica"));
    let c = parse(&[
        "--backups",
        f.path().to_str().unwrap(),
        "--purge-quorum",
        "2",
    ])
    .unwrap();
    assert_eq!(c.purge_quorum(), 2);
}

#[test]
fn single_backup_flags_mean_a_one_entry_file() {
    let c = parse(&["--litestream-backup-url", "s3://b/r"]).unwrap();
    assert_eq!(
        c.backups(),
        vec![BackupSpec {
            name: SINGLE_BACKUP.into(),
            url: "s3://b/r".into(),
            source: SourceSpec::Metrics {
                url: DEFAULT_METRICS_URL.into()
            },
            s3: Default::default(),
        }]
    );
    assert_eq!(c.purge_quorum(), 1);
    assert!(parse(&[]).unwrap().backups().is_empty());
}

#[test]
fn backups_with_a_single_backup_flag_is_a_start_error_naming_both() {
    let f = file(THREE);
    let path = f.path().to_str().unwrap();
    for flag in [
        "--litestream-backup-url",
        "--litestream-metrics-url",
        "--litestream-vfs",
        "--backup-watermark-query",
    ] {
        let value = if flag.ends_with("url") {
            "http://x/metrics"
        } else {
            "x"
        };
        let e = parse(&["--backups", path, flag, value]).expect_err("both refused");
        assert!(e.contains("--backups") && e.contains(flag), "{e}");
    }
}

#[test]
fn purge_quorum_above_the_backups_is_a_start_error() {
    let e = refused(THREE, &["--purge-quorum", "4"]);
    assert!(
        e.contains("--purge-quorum 4") && e.contains("3 backup"),
        "{e}"
    );
    let e = parse(&["--litestream-backup-url", "s3://b/r", "--purge-quorum", "2"]).unwrap_err();
    assert!(e.contains("--purge-quorum 2"), "{e}");
}

#[test]
fn purge_quorum_below_one_is_a_start_error() {
    for k in ["0", "-1"] {
        let e = parse(&["--litestream-backup-url", "s3://b/r", "--purge-quorum", k]).unwrap_err();
        assert!(e.contains("--purge-quorum"), "{e}");
    }
}

#[test]
fn duplicate_backup_names_are_a_start_error() {
    let e = refused(
        "[[backup]]\nname = \"a\"\nurl = \"s3://a\"\n[[backup]]\nname = \"a\"\nurl = \"s3://b\"\n",
        &[],
    );
    assert!(
        e.contains("backup 2") && e.contains("`name`") && e.contains("backup 1"),
        "{e}"
    );
}

#[test]
fn unknown_backup_key_is_a_start_error() {
    let e = refused(
        "[[backup]]\nname = \"a\"\nurl = \"s3://a\"\nbucket = \"x\"\n",
        &[],
    );
    assert!(
        e.contains("bucket") && e.contains(":4:"),
        "the key and its line: {e}"
    );
    let e = refused("retention = 3\n", &[]);
    assert!(e.contains("retention"), "{e}");
}

#[test]
fn missing_backup_name_is_a_start_error() {
    let e = refused(
        "[[backup]]\nname = \"a\"\nurl = \"s3://a\"\n[[backup]]\nurl = \"s3://b\"\n",
        &[],
    );
    assert!(
        e.contains("backup 2") && e.contains("`name` is missing"),
        "{e}"
    );
}

#[test]
fn backups_file_without_a_backup_is_a_start_error() {
    let e = refused("", &[]);
    assert!(e.contains("no [[backup]]"), "{e}");
}

#[test]
fn backup_settings_are_checked_as_their_flags() {
    for (table, key) in [
        ("name = \"a\"\n", "`url`"),
        ("name = \"a b\"\nurl = \"s3://a\"\n", "`name`"),
        (
            "name = \"a\"\nurl = \"s3://a\"\nsource = \"s3\"\n",
            "`source`",
        ),
        (
            "name = \"a\"\nurl = \"s3://a\"\nmetrics_url = \"ws://x\"\n",
            "`metrics_url`",
        ),
        (
            "name = \"a\"\nurl = \"s3://a\"\nsource = \"vfs\"\n",
            "`vfs`",
        ),
        (
            "name = \"a\"\nurl = \"s3://a\"\ncontrol_url = \"unix:/s\"\n",
            "`db_path`",
        ),
        (
            "name = \"a\"\nurl = \"s3://a\"\nvfs = \"/v.so\"\ndb_path = \"/d\"\n",
            "`db_path`",
        ),
        ("name = 3\nurl = \"s3://a\"\n", "`name`"),
    ] {
        let e = refused(&format!("[[backup]]\n{table}"), &[]);
        assert!(e.contains(key), "{table:?} → {e}");
    }
}

#[test]
fn unreadable_backups_file_is_a_start_error() {
    let e = parse(&["--backups", "/nonexistent/backups.toml"]).unwrap_err();
    assert!(
        e.contains("/nonexistent/backups.toml") && e.contains("cannot be read"),
        "{e}"
    );
}

/// PROTOCOL.md §8.1d, §8.4: a `"control"` backup with `vfs` is audited through it, every
/// `audit_interval_ms` (60 s unset, none at 0); the single-backup flags say the same with
/// `--litestream-vfs` beside `--litestream-control-url`.
#[test]
fn a_control_backup_with_vfs_is_audited_every_audit_interval_ms() {
    let f = file(
        r#"
[[backup]]
name = "east"
url = "s3://b/east"
control_url = "unix:/run/east.sock"
db_path = "/data/east.db"
vfs = "/opt/litestream-vfs.so"
audit_interval_ms = 5000

[[backup]]
name = "west"
url = "s3://b/west"
source = "control"
control_url = "unix:/run/west.sock"
db_path = "/data/west.db"
vfs = "/opt/litestream-vfs.so"
"#,
    );
    let c = parse(&["--backups", f.path().to_str().unwrap()]).unwrap();
    let audits: Vec<Option<AuditSpec>> = c
        .backups()
        .into_iter()
        .map(|b| match b.source {
            SourceSpec::Control { audit, .. } => audit,
            other => panic!("a control backup, not {other:?}"),
        })
        .collect();
    let audit = |ms: u64| AuditSpec {
        extension: "/opt/litestream-vfs.so".into(),
        query: DEFAULT_WATERMARK_QUERY.into(),
        interval: Some(std::time::Duration::from_millis(ms)),
    };
    assert_eq!(audits, vec![Some(audit(5000)), Some(audit(60_000))]);

    let flags = parse(&[
        "--litestream-backup-url",
        "s3://b/one",
        "--litestream-control-url",
        "unix:/run/one.sock",
        "--litestream-db-path",
        "/data/one.db",
        "--litestream-vfs",
        "/opt/litestream-vfs.so",
        "--backup-audit-interval-ms",
        "0",
    ])
    .unwrap();
    match &flags.backups()[0].source {
        SourceSpec::Control { audit: Some(a), .. } => assert_eq!(a.interval, None),
        other => panic!("the control source with an audit spec, not {other:?}"),
    }
}

#[test]
fn audit_interval_ms_without_vfs_is_a_start_error() {
    let e = refused(
        r#"
[[backup]]
name = "east"
url = "s3://b/east"
control_url = "unix:/run/east.sock"
db_path = "/data/east.db"
audit_interval_ms = 5000
"#,
        &[],
    );
    assert!(e.contains("audit_interval_ms"), "{e}");
}
