//! Headless Chromium driven over the DevTools protocol, for the live page's test (issue 45):
//! finds Debian's `chromium` (or installs it with apt-get, as `.ci/run` does), starts it on a
//! fresh profile with nothing of its own on the network, opens a tab and speaks CDP to it over a
//! websocket: evaluate an expression in the page, collect every console error and uncaught
//! exception, take a screenshot.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use actix_codec::Framed;
use awc::ws::{Codec, Frame, Message};
use awc::BoxedSocket;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};

/// The names Chromium goes by in PATH.
const NAMES: &[&str] = &["chromium", "chromium-browser", "google-chrome"];

fn in_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_string_lossy()
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// `$CHROMIUM`, else the first of [`NAMES`] in PATH, else Debian's `chromium` installed with
/// apt-get (as root); the error says what is missing and what was tried.
pub fn find_or_install() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("CHROMIUM") {
        return Ok(p.into());
    }
    let find = || NAMES.iter().find_map(|n| in_path(n));
    if let Some(p) = find() {
        return Ok(p);
    }
    let Some(apt) = in_path("apt-get") else {
        return Err(format!("no Chromium in PATH (tried {NAMES:?}) and no apt-get to install Debian's chromium; set CHROMIUM to a Chromium binary"));
    };
    let install = Command::new(&apt)
        .args(["install", "-y", "-qq", "chromium"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .output();
    match (install, find()) {
        (_, Some(p)) => Ok(p),
        (Ok(out), None) => Err(format!(
            "no Chromium in PATH (tried {NAMES:?}); `apt-get install -y chromium` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        (Err(e), None) => Err(format!(
            "no Chromium in PATH (tried {NAMES:?}); apt-get: {e}"
        )),
    }
}

/// A running headless Chromium; killed when dropped.
pub struct Browser {
    child: Child,
    /// Its `/json` HTTP endpoint, `127.0.0.1:PORT`.
    devtools: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts `bin` headless on a fresh profile, with the DevTools endpoint on a free port, and
    /// waits for it to say where.
    pub fn launch(bin: &Path) -> Browser {
        let profile = tempfile::tempdir().expect("profile dir");
        let mut child = Command::new(bin)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-extensions",
                "--disable-dev-shm-usage",
                "--window-size=1400,1000",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut said = Vec::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("DevTools listening on ws://").nth(1) {
                    let _ = tx.send(Ok(rest.split('/').next().unwrap_or("").to_string()));
                } else {
                    said.push(line);
                }
            }
            let _ = tx.send(Err(said.join("\n")));
        });
        let devtools = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(addr)) => addr,
            Ok(Err(said)) => panic!("Chromium exited without a DevTools endpoint: {said}"),
            Err(_) => panic!("Chromium gave no DevTools endpoint within 60 s"),
        };
        Browser {
            child,
            devtools,
            _profile: profile,
        }
    }

    /// A new tab on `about:blank`, its domains enabled (Page, Runtime, Log).
    pub async fn new_page(&self) -> Page {
        let client = change_streamer_test_support::client::http_client();
        let mut resp = client
            .put(format!("http://{}/json/new?about:blank", self.devtools))
            .send()
            .await
            .expect("DevTools /json/new");
        let target: Value = resp.json().await.expect("target JSON");
        let url = target["webSocketDebuggerUrl"]
            .as_str()
            .unwrap_or_else(|| panic!("no webSocketDebuggerUrl: {target}"))
            .to_string();
        let (_, framed) = client
            .ws(&url)
            .max_frame_size(64 << 20)
            .connect()
            .await
            .unwrap_or_else(|e| panic!("connect {url}: {e}"));
        let mut page = Page {
            framed,
            next_id: 0,
            events: Vec::new(),
        };
        for domain in ["Page", "Runtime", "Log"] {
            page.call(&format!("{domain}.enable"), json!({})).await;
        }
        page
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One tab, spoken to over CDP.
pub struct Page {
    framed: Framed<BoxedSocket, Codec>,
    next_id: u64,
    /// Every event received so far.
    pub events: Vec<Value>,
}

impl Page {
    /// Sends `method` and returns its `result`, keeping the events that arrive meanwhile;
    /// panics on an error answer or when nothing answers within 30 s.
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let msg = json!({"id": id, "method": method, "params": params}).to_string();
        self.framed
            .send(Message::Text(msg.into()))
            .await
            .expect("send to DevTools");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let mut text = Vec::new();
        loop {
            let frame = tokio::time::timeout_at(deadline, self.framed.next())
                .await
                .unwrap_or_else(|_| panic!("{method}: no answer within 30 s"))
                .unwrap_or_else(|| panic!("{method}: DevTools closed"))
                .expect("DevTools frame");
            let v: Value = match frame {
                Frame::Text(t) => serde_json::from_slice(&t).expect("DevTools JSON"),
                Frame::Continuation(actix_http::ws::Item::FirstText(b))
                | Frame::Continuation(actix_http::ws::Item::Continue(b)) => {
                    text.extend_from_slice(&b);
                    continue;
                }
                Frame::Continuation(actix_http::ws::Item::Last(b)) => {
                    text.extend_from_slice(&b);
                    let v = serde_json::from_slice(&text).expect("DevTools JSON");
                    text.clear();
                    v
                }
                _ => continue,
            };
            if v["id"] == id {
                if let Some(e) = v.get("error") {
                    panic!("{method}: {e}");
                }
                return v["result"].clone();
            }
            self.events.push(v);
        }
    }

    pub async fn navigate(&mut self, url: &str) {
        let r = self.call("Page.navigate", json!({"url": url})).await;
        assert!(r.get("errorText").is_none(), "navigate {url}: {r}");
    }

    /// The value of `expr` in the page (a promise is awaited); panics on an exception.
    pub async fn eval(&mut self, expr: &str) -> Value {
        let r = self
            .call(
                "Runtime.evaluate",
                json!({"expression": expr, "returnByValue": true, "awaitPromise": true}),
            )
            .await;
        if let Some(e) = r.get("exceptionDetails") {
            panic!("{expr}: {e}");
        }
        r["result"]["value"].clone()
    }

    /// Every console error, uncaught exception and error log entry (a failed load included)
    /// seen so far, one line each.
    pub fn errors(&self) -> Vec<String> {
        self.events
            .iter()
            .filter_map(|e| {
                let p = &e["params"];
                match e["method"].as_str()? {
                    "Runtime.exceptionThrown" => {
                        Some(format!("exception: {}", p["exceptionDetails"]))
                    }
                    "Runtime.consoleAPICalled"
                        if matches!(p["type"].as_str(), Some("error" | "assert")) =>
                    {
                        Some(format!("console.{}: {}", p["type"], p["args"]))
                    }
                    "Log.entryAdded" if p["entry"]["level"] == "error" => {
                        Some(format!("log: {}", p["entry"]))
                    }
                    _ => None,
                }
            })
            .collect()
    }

    /// A PNG of the whole page, `width` pixels wide.
    pub async fn screenshot(&mut self, width: u64, path: &Path) {
        let height = self
            .eval("Math.ceil(document.documentElement.scrollHeight)")
            .await
            .as_u64()
            .unwrap_or(1000);
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false}),
        )
        .await;
        let shot = self
            .call("Page.captureScreenshot", json!({"format": "png"}))
            .await;
        let data = shot["data"].as_str().expect("screenshot data");
        let png = base64_decode(data);
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        std::fs::write(path, png).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

/// Standard base64 (CDP's screenshot encoding), without a crate for one call.
fn base64_decode(s: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let bytes: Vec<u8> = s
        .bytes()
        .filter(|c| *c != b'=' && !c.is_ascii_whitespace())
        .collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= value(*c) << (18 - 6 * i);
        }
        let take = chunk.len() - 1;
        out.extend_from_slice(&n.to_be_bytes()[1..1 + take]);
    }
    out
}
