//! The checks of single flag values, run by clap as each is parsed: URLs of the schemes a flag
//! takes (litestream's control URL among them), non-empty strings, the padding in seconds, and the secret, whose value is held back
//! from clap's messages and checked only once parsing is done.

use change_streamer_actors::litestream_control::ControlUrl;
use change_streamer_actors::secret::{Secret, SecretError};

/// The value of `--secret`, checked only after parsing: a value clap refuses is printed in its
/// message, and this one must never be.
#[derive(Clone, Debug)]
pub struct SecretArg(pub(super) Result<Secret, SecretError>);

pub(super) fn parse_secret(s: &str) -> Result<SecretArg, String> {
    Ok(SecretArg(Secret::new(s)))
}

/// A secret flag whose value cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SecretFlagError {
    #[error("--secret and --secret-file are both set: give one")]
    Both,
    #[error("--{flag}: {source}")]
    Bad {
        flag: &'static str,
        source: SecretError,
    },
}

impl SecretFlagError {
    /// The ids of the flags it is about.
    pub fn flags(&self) -> &'static [&'static str] {
        match self {
            SecretFlagError::Both => &["secret", "secret_file"],
            SecretFlagError::Bad { flag: "secret", .. } => &["secret"],
            SecretFlagError::Bad {
                flag: "secret-file",
                ..
            } => &["secret_file"],
            SecretFlagError::Bad { .. } => &["upstream_secret_file"],
        }
    }
}

pub(super) fn parse_url(s: &str, schemes: &[&str]) -> Result<String, String> {
    let u = url::Url::parse(s).map_err(|e| format!("not a URL: {e}"))?;
    if !schemes.contains(&u.scheme()) {
        return Err(format!(
            "scheme must be one of {}, not {}://",
            schemes.join("://, ") + "://",
            u.scheme()
        ));
    }
    if u.host_str().is_none_or(str::is_empty) {
        return Err("the URL has no host".into());
    }
    Ok(s.to_string())
}

pub(super) fn parse_ws_url(s: &str) -> Result<String, String> {
    parse_url(s, &["ws", "wss"])
}

pub(super) fn parse_http_url(s: &str) -> Result<String, String> {
    parse_url(s, &["http", "https"])
}

pub(super) fn parse_postgres_url(s: &str) -> Result<String, String> {
    parse_url(s, &["postgres", "postgresql"])
}

pub(super) fn parse_control_url(s: &str) -> Result<ControlUrl, String> {
    ControlUrl::parse(s).map_err(|e| e.to_string())
}

pub(super) fn parse_non_empty(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        Err("must not be empty".into())
    } else {
        Ok(s.to_string())
    }
}

pub(super) fn parse_padding(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a decimal number of seconds"))?;
    if !v.is_finite() || v.abs() > 1e9 {
        return Err(format!("{s:?} is not a finite number of seconds"));
    }
    Ok(v)
}
