//! A local S3-compatible server for tests, the demo and benchmarks (issue 44): moto's server,
//! installed into the project by `scripts/install-moto.sh` (which says why moto), started on a
//! free loopback port with its request log in a file, a bucket per backup, and the credentials
//! and replica URL that litestream and the service's VFS reader use to reach it.
//!
//! The request log is moto's own (werkzeug's access log, one line per request:
//! `127.0.0.1 - - [date] "GET /bucket?list-type=2&prefix=… HTTP/1.1" 200 -`); requests are
//! counted per bucket from it. Path-style addressing (`force-path-style=true`) puts the bucket
//! in the path, which is what makes a line's bucket readable. What the harness itself asks
//! (listing a bucket to wait for a backup) carries [`HARNESS_MARK`] and is not counted.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::stock_litestream::{repo_root, run_install_script};

/// The access key every test bucket is reached with (moto accepts any).
pub const ACCESS_KEY: &str = "change-streamer-test";
/// Its secret.
pub const SECRET_KEY: &str = "change-streamer-test-secret";
/// The region the test buckets are in.
pub const REGION: &str = "us-east-1";
/// A query parameter on the harness's own requests, so that they are not counted.
pub const HARNESS_MARK: &str = "change-streamer-harness=1";

/// Where moto's server is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moto {
    /// The `moto_server` script of its venv.
    pub bin: PathBuf,
}

/// The install folder: `$CHANGE_STREAMER_MOTO_DIR`, else `.tools/moto`.
fn install_dir() -> PathBuf {
    std::env::var_os("CHANGE_STREAMER_MOTO_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".tools/moto"))
}

/// Installs moto's server if it is not yet (once per process, serialised across processes) and
/// says where it is. Panics, with the script's own message, when it cannot be installed.
pub fn install() -> Moto {
    static INSTALLED: OnceLock<Moto> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            let vars = run_install_script("scripts/install-moto.sh", &install_dir());
            Moto {
                bin: vars("MOTO_SERVER"),
            }
        })
        .clone()
}

/// moto's server if it is installed already (the demo's check): a finished install.
pub fn installed() -> Option<Moto> {
    let dir = install_dir();
    let bin = dir.join("venv/bin/moto_server");
    let stamped = std::fs::read_dir(&dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(".installed-"))
    });
    (stamped && bin.is_file()).then_some(Moto { bin })
}

/// A running moto server on loopback; killed when dropped.
pub struct S3Server {
    child: Option<Child>,
    /// `127.0.0.1:port`.
    pub addr: String,
    /// Its request log (moto's stderr).
    pub log: PathBuf,
}

/// One bucket of an [`S3Server`], holding one backup under [`S3Bucket::PREFIX`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Bucket {
    pub name: String,
    /// The server's `127.0.0.1:port`.
    pub addr: String,
    /// The server's request log.
    pub log: PathBuf,
}

impl S3Server {
    /// Starts moto's server (installing it first if needed) on a free loopback port, its log
    /// in `dir`, and returns once it answers (60 s at most: a busy machine starts Python slowly).
    pub fn start(dir: &Path) -> S3Server {
        let moto = install();
        std::fs::create_dir_all(dir).expect("the S3 server's folder");
        // The port is free when asked, and may be taken before moto binds it: then moto exits,
        // and another port is tried.
        for _ in 0..3 {
            if let Some(server) = Self::start_on(&moto, dir, crate::process::free_port()) {
                return server;
            }
        }
        panic!("moto_server exited three times before answering (ports taken?)");
    }

    /// moto on `port`, once it answers; `None` when it exited first.
    fn start_on(moto: &Moto, dir: &Path, port: u16) -> Option<S3Server> {
        let log = dir.join(format!("moto-{port}.log"));
        let child = Command::new(&moto.bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .env("PYTHONUNBUFFERED", "1")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("create moto's log"))
            .spawn()
            .expect("start moto_server");
        let mut server = S3Server {
            child: Some(child),
            addr: format!("127.0.0.1:{port}"),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while http(&server.addr, "GET", "/", "").is_err() {
            let exited = server.child.as_mut().map(|c| c.try_wait());
            if matches!(exited, Some(Ok(Some(_)))) {
                return None;
            }
            assert!(
                Instant::now() < deadline,
                "moto_server did not answer on {} within 60 s; its log: {}",
                server.addr,
                std::fs::read_to_string(&server.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(server)
    }

    /// Creates bucket `name` and returns it.
    pub fn bucket(&self, name: &str) -> S3Bucket {
        let (status, body) =
            http(&self.addr, "PUT", &format!("/{name}"), "").expect("create the bucket");
        assert_eq!(status, 200, "create bucket {name}: {body}");
        S3Bucket {
            name: name.to_string(),
            addr: self.addr.clone(),
            log: self.log.clone(),
        }
    }

    /// The server's process id (`None` once killed).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stops the server for good (a backup whose object store is gone).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.kill();
    }
}

impl S3Bucket {
    /// The key prefix the backup lives under.
    pub const PREFIX: &'static str = "replica";

    /// The server's URL, for litestream's `endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The replica URL litestream (and the VFS, as `LITESTREAM_REPLICA_URL`) reaches the
    /// backup with: the endpoint, region and path style in its query.
    pub fn url(&self) -> String {
        format!(
            "s3://{}/{}?endpoint={}&region={REGION}&force-path-style=true",
            self.name,
            Self::PREFIX,
            self.endpoint()
        )
    }

    /// The environment litestream needs for this bucket: the credentials, and no
    /// `AWS_CA_BUNDLE` (litestream 0.5.17's S3 client refuses to start with it, issue 44).
    pub fn env() -> Vec<(String, Option<String>)> {
        vec![
            ("AWS_ACCESS_KEY_ID".into(), Some(ACCESS_KEY.into())),
            ("AWS_SECRET_ACCESS_KEY".into(), Some(SECRET_KEY.into())),
            ("AWS_REGION".into(), Some(REGION.into())),
            ("AWS_CA_BUNDLE".into(), None),
        ]
    }

    /// The keys in the bucket under `prefix` (the harness's request, not counted).
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        let path = format!("/{}?list-type=2&prefix={prefix}&{HARNESS_MARK}", self.name);
        let Ok((200, body)) = http(&self.addr, "GET", &path, "") else {
            return Vec::new();
        };
        body.split("<Key>")
            .skip(1)
            .filter_map(|s| s.split("</Key>").next())
            .map(String::from)
            .collect()
    }

    /// Every object of the backup, with its bytes (the harness's requests, not counted): to put
    /// back later with [`S3Bucket::put_back`].
    pub fn snapshot(&self) -> Vec<(String, Vec<u8>)> {
        self.keys(&format!("{}/", Self::PREFIX))
            .into_iter()
            .map(|key| {
                let path = format!("/{}/{key}?{HARNESS_MARK}", self.name);
                let (status, body) = http_bytes(&self.addr, "GET", &path, b"").expect("GET");
                assert_eq!(status, 200, "GET {key}");
                (key, body)
            })
            .collect()
    }

    /// Makes the backup hold exactly `objects` again (a bucket restored from an old copy, or put
    /// back as it was): each object written, then every other object of the backup deleted. Not
    /// atomic, unlike a `file://` folder's swap: a reader in between sees the union.
    pub fn put_back(&self, objects: &[(String, Vec<u8>)]) {
        for (key, bytes) in objects {
            let path = format!("/{}/{key}?{HARNESS_MARK}", self.name);
            let (status, _) = http_bytes(&self.addr, "PUT", &path, bytes).expect("PUT");
            assert_eq!(status, 200, "PUT {key}");
        }
        for key in self.keys(&format!("{}/", Self::PREFIX)) {
            if !objects.iter().any(|(k, _)| *k == key) {
                let path = format!("/{}/{key}?{HARNESS_MARK}", self.name);
                let (status, _) = http_bytes(&self.addr, "DELETE", &path, b"").expect("DELETE");
                assert!(status == 204 || status == 200, "DELETE {key}: {status}");
            }
        }
    }

    /// Whether litestream has written anything a restore can start from.
    pub fn holds_a_backup(&self) -> bool {
        self.keys(&format!("{}/", Self::PREFIX))
            .iter()
            .any(|k| k.ends_with(".ltx"))
    }

    /// The requests to this bucket so far, from the server's log (the harness's own excluded).
    pub fn requests(&self) -> Vec<String> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .filter_map(request_of_line)
            .filter(|(_, path, _)| bucket_of(path) == Some(self.name.as_str()))
            .filter(|(_, path, _)| !path.contains(HARNESS_MARK))
            .map(|(method, path, status)| format!("{method} {path} {status}"))
            .collect()
    }

    /// How many requests this bucket has had.
    pub fn request_count(&self) -> usize {
        self.requests().len()
    }
}

/// Puts [`S3Bucket::env`] into this process's environment, for what it starts without an
/// environment of its own: the in-process service's VFS reader inherits it.
pub fn export_credentials() {
    for (k, v) in S3Bucket::env() {
        match v {
            Some(v) => std::env::set_var(k, v),
            None => std::env::remove_var(k),
        }
    }
}

/// `(method, path, status)` of one access-log line; `None` for other lines. ANSI colour codes
/// (werkzeug colours some statuses) are dropped.
pub fn request_of_line(line: &str) -> Option<(String, String, u16)> {
    let mut clean = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            clean.push(c);
        }
    }
    let (_, rest) = clean.split_once("] \"")?;
    let (request, rest) = rest.split_once("\" ")?;
    let mut parts = request.split(' ');
    let (method, path) = (parts.next()?, parts.next()?);
    let status = rest.split(' ').next()?.parse().ok()?;
    Some((method.to_string(), path.to_string(), status))
}

/// The bucket of a path-style request path (`/bucket/key?…` or `/bucket?…`).
pub fn bucket_of(path: &str) -> Option<&str> {
    let rest = path.strip_prefix('/')?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let bucket = &rest[..end];
    (!bucket.is_empty() && bucket != "moto-api").then_some(bucket)
}

/// One HTTP/1.1 request to `addr` with `Connection: close`: the status and the body, as text.
fn http(addr: &str, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
    let (status, body) = http_bytes(addr, method, path, body.as_bytes())?;
    Ok((status, String::from_utf8_lossy(&body).to_string()))
}

/// An `Authorization` header naming [`ACCESS_KEY`]: moto answers an anonymous GET of an
/// object with 403, and does not check the signature.
const AUTHORIZATION: &str = "Authorization: AWS4-HMAC-SHA256 Credential=change-streamer-test/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0";

/// [`http`] with bytes: the status and the body.
fn http_bytes(
    addr: &str,
    method: &str,
    path: &str,
    body: &[u8],
) -> std::io::Result<(u16, Vec<u8>)> {
    let mut conn = TcpStream::connect(addr)?;
    conn.set_read_timeout(Some(Duration::from_secs(20)))?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n{AUTHORIZATION}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes())?;
    conn.write_all(body)?;
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer)?;
    let end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("an answer without a head"))?;
    let head = String::from_utf8_lossy(&answer[..end]).to_string();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not HTTP: {head:?}")))?;
    Ok((status, answer[end + 4..].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_access_log_line_gives_its_method_path_status_and_bucket() {
        let line = "127.0.0.1 - - [08/Dec/2026 00:13:42] \"GET /bk1?list-type=2&prefix=replica/0001/ HTTP/1.1\" 200 -";
        let (m, p, s) = request_of_line(line).expect("a request line");
        assert_eq!((m.as_str(), s), ("GET", 200));
        assert_eq!(bucket_of(&p), Some("bk1"));
        let coloured =
            "127.0.0.1 - - [d] \"\u{1b}[33mGET /b2/replica/0000/x.ltx HTTP/1.1\u{1b}[0m\" 404 -";
        let (_, p, s) = request_of_line(coloured).expect("a coloured line");
        assert_eq!((bucket_of(&p), s), (Some("b2"), 404));
        assert_eq!(request_of_line(" * Running on http://127.0.0.1:1"), None);
        assert_eq!(bucket_of("/moto-api/data.json"), None);
    }
}
