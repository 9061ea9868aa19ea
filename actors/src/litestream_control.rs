//! litestream 0.5's control API, as the backup monitor's control source uses it (PROTOCOL.md
//! §8.1c): [`ControlUrl`] says where it is (`unix:/path/to/litestream.sock` or
//! `http://host:port[/prefix]`), and [`ControlClient::sync_wait`] sends the one request the
//! monitor needs, `POST /sync {"path", "wait": true, "timeout"}`, whose success means that
//! everything the database file held when it was sent is in the backup.
//!
//! The request goes through awc, the HTTP client the metrics source already uses; for a unix
//! socket awc is given a connector that opens the socket instead of a TCP connection, so HTTP
//! itself (chunked bodies, keep-alive) stays awc's business.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use actix_tls::connect::{ConnectError, ConnectInfo, Connection};
use awc::http::Uri;
use serde::Deserialize;

/// The most an answer may weigh; litestream's is one short JSON object.
const MAX_ANSWER_BYTES: usize = 64 << 10;

/// Where litestream's control API is (`--litestream-control-url`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlUrl {
    /// `unix:PATH` (or `unix://PATH`): its control socket, as `litestream.yml`'s `socket.path`.
    Unix(PathBuf),
    /// `http://host:port[/prefix]`, without a trailing `/`; requests go to `{base}/sync`.
    Http(String),
}

/// Why a `--litestream-control-url` is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlUrlError {
    #[error("`unix:` needs the socket's path after it, e.g. unix:/var/run/litestream.sock")]
    NoSocketPath,
    #[error("not a URL with a host: {0}")]
    BadHttp(String),
    #[error("expected unix:/path/to/litestream.sock or http://host:port")]
    Scheme,
}

impl ControlUrl {
    pub fn parse(text: &str) -> Result<ControlUrl, ControlUrlError> {
        if let Some(rest) = text.strip_prefix("unix:") {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if path.is_empty() {
                return Err(ControlUrlError::NoSocketPath);
            }
            return Ok(ControlUrl::Unix(PathBuf::from(path)));
        }
        if !text.starts_with("http://") {
            return Err(ControlUrlError::Scheme);
        }
        let url = url::Url::parse(text).map_err(|e| ControlUrlError::BadHttp(e.to_string()))?;
        if url.host_str().is_none_or(str::is_empty) || url.query().is_some() {
            return Err(ControlUrlError::BadHttp(text.to_string()));
        }
        Ok(ControlUrl::Http(text.trim_end_matches('/').to_string()))
    }

    /// The URL of `POST /sync` (for a unix socket the host is a placeholder awc needs).
    fn sync_url(&self) -> String {
        match self {
            ControlUrl::Unix(_) => "http://litestream/sync".to_string(),
            ControlUrl::Http(base) => format!("{base}/sync"),
        }
    }
}

impl fmt::Display for ControlUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlUrl::Unix(path) => write!(f, "unix:{}", path.display()),
            ControlUrl::Http(base) => f.write_str(base),
        }
    }
}

/// A successful `sync` with `wait`: litestream's answer.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Synced {
    /// `synced` (something new was uploaded) or `no_change`.
    pub status: String,
    /// The database's newest litestream transaction.
    pub txid: u64,
    /// The newest one in the backup.
    pub replicated_txid: u64,
}

/// Why a `sync` did not confirm anything.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    #[error("cannot connect to litestream's control API at {url}: {reason}{hint}")]
    Connect {
        url: String,
        reason: String,
        hint: &'static str,
    },
    #[error("no answer from litestream's control API within {0:?}")]
    Timeout(Duration),
    #[error("sending the request: {0}")]
    Send(String),
    #[error("litestream answered HTTP {status}: {error}{hint}")]
    Status {
        status: u16,
        error: String,
        hint: &'static str,
    },
    #[error("litestream's answer is not the JSON of a sync: {0}")]
    Garbage(String),
    #[error(
        "litestream says the backup holds txid {replicated_txid}, below the database's {txid}"
    )]
    Behind { txid: u64, replicated_txid: u64 },
}

/// litestream's error answers: `{"error": …, "details": …}`.
#[derive(Deserialize)]
struct ErrorAnswer {
    error: String,
    #[serde(default)]
    details: Option<serde_json::Value>,
}

/// Sends `sync` requests to one litestream. Holds an awc client: create it on the actix
/// runtime that uses it.
#[derive(Clone)]
pub struct ControlClient {
    url: ControlUrl,
    client: awc::Client,
}

impl ControlClient {
    pub fn new(url: ControlUrl) -> ControlClient {
        let client = match &url {
            ControlUrl::Http(_) => awc::Client::default(),
            ControlUrl::Unix(path) => {
                let path = path.clone();
                let connect = actix_service::fn_service(move |req: ConnectInfo<Uri>| {
                    let path = path.clone();
                    async move {
                        let io = actix_rt::net::UnixStream::connect(&path)
                            .await
                            .map_err(ConnectError::Io)?;
                        Ok::<_, ConnectError>(Connection::new(req.request().clone(), io))
                    }
                });
                awc::Client::builder()
                    .connector(awc::Connector::new().connector(connect))
                    .finish()
            }
        };
        ControlClient { url, client }
    }

    pub fn url(&self) -> &ControlUrl {
        &self.url
    }

    /// `POST /sync` of `db_path` with `wait`, bounded by `timeout` (which litestream is asked
    /// to keep too, in whole seconds); `Ok` once litestream says the backup has everything the
    /// file held when the request was sent.
    pub async fn sync_wait(
        &self,
        db_path: &str,
        timeout: Duration,
    ) -> Result<Synced, ControlError> {
        let seconds = timeout.as_secs_f64().ceil().max(1.0) as u64;
        let body = serde_json::json!({"path": db_path, "wait": true, "timeout": seconds});
        let ask = async {
            let mut resp = self
                .client
                .post(self.url.sync_url())
                .timeout(timeout)
                .send_json(&body)
                .await
                .map_err(|e| self.send_error(e, timeout))?;
            let bytes = resp
                .body()
                .limit(MAX_ANSWER_BYTES)
                .await
                .map_err(|e| ControlError::Send(format!("reading the answer: {e}")))?;
            Ok::<_, ControlError>((resp.status().as_u16(), bytes))
        };
        let (status, bytes) = actix_rt::time::timeout(timeout, ask)
            .await
            .map_err(|_| ControlError::Timeout(timeout))??;
        if status != 200 {
            return Err(status_error(status, &bytes));
        }
        let synced: Synced = serde_json::from_slice(&bytes)
            .map_err(|e| ControlError::Garbage(format!("{e}: {}", excerpt(&bytes))))?;
        if synced.replicated_txid < synced.txid {
            return Err(ControlError::Behind {
                txid: synced.txid,
                replicated_txid: synced.replicated_txid,
            });
        }
        Ok(synced)
    }

    fn send_error(&self, e: awc::error::SendRequestError, timeout: Duration) -> ControlError {
        use awc::error::SendRequestError as E;
        match e {
            E::Timeout => ControlError::Timeout(timeout),
            E::Connect(c) => ControlError::Connect {
                url: self.url.to_string(),
                reason: c.to_string(),
                hint: match self.url {
                    ControlUrl::Unix(_) => " (is litestream running, with `socket: {enabled: true, path: …}` in litestream.yml?)",
                    ControlUrl::Http(_) => "",
                },
            },
            other => ControlError::Send(other.to_string()),
        }
    }
}

/// A non-200 answer: litestream's `error` (and `details`) when it sent its JSON, else the
/// body's first line; with a hint for the two answers an operator can fix.
fn status_error(status: u16, bytes: &[u8]) -> ControlError {
    let (error, json) = match serde_json::from_slice::<ErrorAnswer>(bytes) {
        Ok(ErrorAnswer { error, details }) => match details {
            Some(d) => (format!("{error} ({d})"), true),
            None => (error, true),
        },
        Err(_) => (excerpt(bytes), false),
    };
    let hint = match (status, json) {
        (404, true) => " (check --litestream-db-path: it must be the path litestream.yml gives)",
        (404 | 405, false) => {
            " (litestream 0.5.17 serves its control API on its unix socket only, not on its addr)"
        }
        _ => "",
    };
    ControlError::Status {
        status,
        error,
        hint,
    }
}

/// The first line of `bytes`, at most 200 characters.
fn excerpt(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(200)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_url_parses_unix_and_http() {
        assert_eq!(
            ControlUrl::parse("unix:/run/ls.sock"),
            Ok(ControlUrl::Unix("/run/ls.sock".into()))
        );
        assert_eq!(
            ControlUrl::parse("unix:///run/ls.sock"),
            Ok(ControlUrl::Unix("/run/ls.sock".into()))
        );
        assert_eq!(
            ControlUrl::parse("http://127.0.0.1:4851/control/"),
            Ok(ControlUrl::Http("http://127.0.0.1:4851/control".into()))
        );
        assert_eq!(
            ControlUrl::parse("http://127.0.0.1:4851")
                .unwrap()
                .sync_url(),
            "http://127.0.0.1:4851/sync"
        );
    }

    #[test]
    fn control_url_refuses_what_is_not_one() {
        assert_eq!(
            ControlUrl::parse("unix:"),
            Err(ControlUrlError::NoSocketPath)
        );
        assert_eq!(
            ControlUrl::parse("/run/ls.sock"),
            Err(ControlUrlError::Scheme)
        );
        assert_eq!(
            ControlUrl::parse("https://x:1"),
            Err(ControlUrlError::Scheme)
        );
        assert!(matches!(
            ControlUrl::parse("http://"),
            Err(ControlUrlError::BadHttp(_))
        ));
    }

    #[test]
    fn a_not_found_database_names_the_db_path_flag() {
        let e = status_error(404, br#"{"error":"database not found: /x.db"}"#);
        assert!(e.to_string().contains("--litestream-db-path"), "{e}");
        let e = status_error(404, b"404 page not found\n");
        assert!(e.to_string().contains("unix socket only"), "{e}");
    }
}
