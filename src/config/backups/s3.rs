//! A `[[backup]]`'s `s3_` keys (PROTOCOL.md §8.4, "On S3"): the endpoint, region, path style
//! and credentials file the service's own reads of an `s3://` backup use, checked at start, and
//! turned into the VFS reader's `LITESTREAM_REPLICA_URL` and environment. No value of the
//! credentials file is ever put in a message.

use std::path::{Path, PathBuf};

use super::super::values::parse_http_url;

/// The `s3_` keys of one backup; all unset for a backup of the single-backup flags.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct S3Settings {
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub path_style: bool,
    pub credentials_file: Option<PathBuf>,
}

/// The variables a credentials file replaces in the reader's environment.
const REPLACED: [&str; 4] = [
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
];

impl S3Settings {
    fn any(&self) -> bool {
        *self != S3Settings::default()
    }

    /// The start checks: the keys belong to an `s3://` `url`, the endpoint is an HTTP URL, and
    /// the credentials file is readable and holds both keys in `[default]`.
    pub(super) fn check(&self, url: &str) -> Result<(), String> {
        if self.any() && !url.starts_with("s3://") {
            let key = match self {
                S3Settings {
                    endpoint: Some(_), ..
                } => "s3_endpoint",
                S3Settings {
                    region: Some(_), ..
                } => "s3_region",
                S3Settings {
                    credentials_file: Some(_),
                    ..
                } => "s3_credentials_file",
                _ => "s3_path_style",
            };
            return Err(format!(
                "key `{key}` is a setting of an s3:// backup, and `url` is not one"
            ));
        }
        if let Some(e) = &self.endpoint {
            parse_http_url(e).map_err(|e| format!("key `s3_endpoint`: {e}"))?;
        }
        if let Some(r) = &self.region {
            if r.trim().is_empty() {
                return Err("key `s3_region`: must not be empty".into());
            }
        }
        match &self.credentials_file {
            Some(f) => {
                check_credentials_file(f).map_err(|e| format!("key `s3_credentials_file`: {e}"))
            }
            None => Ok(()),
        }
    }

    /// `url` as the VFS reader's `LITESTREAM_REPLICA_URL`: litestream's `endpoint`, `region`
    /// and `force-path-style` parameters added, each unless `url` has it already.
    pub fn reader_url(&self, url: &str) -> String {
        let mut params = Vec::new();
        if let Some(e) = &self.endpoint {
            params.push(("endpoint", e.clone()));
        }
        if let Some(r) = &self.region {
            params.push(("region", r.clone()));
        }
        if self.path_style {
            params.push(("force-path-style", "true".into()));
        }
        let query = url.split_once('?').map_or("", |(_, q)| q);
        let has = |k: &str| query.split('&').any(|p| p.split('=').next() == Some(k));
        let mut out = url.to_string();
        for (k, v) in params.into_iter().filter(|(k, _)| !has(k)) {
            out.push(if out.contains('?') { '&' } else { '?' });
            out.push_str(&format!("{k}={v}"));
        }
        out
    }

    /// The reader's environment: with a credentials file, `AWS_SHARED_CREDENTIALS_FILE` set to
    /// it and the variables that would take precedence over it removed.
    pub fn reader_env(&self) -> Vec<(String, Option<String>)> {
        let Some(file) = &self.credentials_file else {
            return Vec::new();
        };
        let mut env = vec![(
            "AWS_SHARED_CREDENTIALS_FILE".to_string(),
            Some(file.display().to_string()),
        )];
        env.extend(REPLACED.iter().map(|k| (k.to_string(), None)));
        env
    }
}

/// The file is readable and its `[default]` profile has both keys, non-empty. The message
/// names the file and the missing key, never a value.
fn check_credentials_file(path: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: cannot be read: {e}", path.display()))?;
    let mut section = String::new();
    let mut found = Vec::new();
    for line in text.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.trim().to_string();
        } else if let Some((k, v)) = line.split_once('=') {
            if section == "default" && !v.trim().is_empty() {
                found.push(k.trim().to_string());
            }
        }
    }
    for key in ["aws_access_key_id", "aws_secret_access_key"] {
        if !found.iter().any(|k| k == key) {
            return Err(format!(
                "{}: no `{key}` in its [default] profile",
                path.display()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> S3Settings {
        S3Settings {
            endpoint: Some("http://127.0.0.1:9000".into()),
            region: Some("us-east-1".into()),
            path_style: true,
            credentials_file: None,
        }
    }

    #[test]
    fn s3_settings_go_into_the_readers_url_unless_the_url_has_them() {
        assert_eq!(
            settings().reader_url("s3://b/p"),
            "s3://b/p?endpoint=http://127.0.0.1:9000&region=us-east-1&force-path-style=true"
        );
        assert_eq!(
            settings().reader_url("s3://b/p?region=eu-west-1"),
            "s3://b/p?region=eu-west-1&endpoint=http://127.0.0.1:9000&force-path-style=true"
        );
        assert_eq!(S3Settings::default().reader_url("s3://b/p"), "s3://b/p");
    }

    #[test]
    fn s3_settings_belong_to_an_s3_url_and_are_checked() {
        let e = settings().check("file:///b").unwrap_err();
        assert!(e.contains("`s3_endpoint`") && e.contains("s3://"), "{e}");
        let bad = S3Settings {
            endpoint: Some("ftp://x".into()),
            ..S3Settings::default()
        };
        assert!(bad.check("s3://b/p").unwrap_err().contains("`s3_endpoint`"));
        assert_eq!(settings().check("s3://b/p"), Ok(()));
    }

    #[test]
    fn s3_credentials_file_needs_both_keys_and_no_value_is_ever_shown() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("credentials");
        std::fs::write(&file, "[default]\naws_access_key_id = AKIDSECRETVALUE\n").unwrap();
        let with = S3Settings {
            credentials_file: Some(file.clone()),
            ..S3Settings::default()
        };
        let e = with.check("s3://b/p").unwrap_err();
        assert!(
            e.contains("aws_secret_access_key") && e.contains("credentials"),
            "{e}"
        );
        assert!(!e.contains("AKIDSECRETVALUE"), "{e}");
        std::fs::write(
            &file,
            "[default]\naws_access_key_id = a\naws_secret_access_key = b\n",
        )
        .unwrap();
        assert_eq!(with.check("s3://b/p"), Ok(()));
        let env = with.reader_env();
        assert_eq!(
            env[0],
            (
                "AWS_SHARED_CREDENTIALS_FILE".into(),
                Some(file.display().to_string())
            )
        );
        assert!(env.contains(&("AWS_ACCESS_KEY_ID".into(), None)), "{env:?}");
        let missing = S3Settings {
            credentials_file: Some(dir.path().join("none")),
            ..S3Settings::default()
        };
        assert!(missing
            .check("s3://b/p")
            .unwrap_err()
            .contains("cannot be read"));
    }
}
