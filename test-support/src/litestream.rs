//! A stand-in for litestream's `/metrics` endpoint, on an ephemeral loopback port, for tests
//! and the replay driver. It is a plain HTTP/1.1 responder written on a TCP listener so that it
//! can misbehave exactly as needed: answer any status and body, hold the answer (`hang`) until
//! released, or drop the connection without answering (`reset`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// What the endpoint answers from now on.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: String,
    pub reset: bool,
    pub hang: bool,
}

impl Default for Answer {
    fn default() -> Self {
        Answer {
            status: 200,
            body: String::new(),
            reset: false,
            hang: false,
        }
    }
}

#[derive(Default)]
struct Shared {
    answer: Mutex<Answer>,
    requests: AtomicU64,
    release: Notify,
    request_seen: Notify,
}

/// The running endpoint. Dropping it does not stop the listener task; it ends with the runtime.
#[derive(Clone)]
pub struct FakeLitestream {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

impl FakeLitestream {
    /// The flags of a service with the backup monitor on this page, quick to react: polls and
    /// purge checks every 20 ms, a cleanup delay floor of `floor_ms`, no retention floor.
    pub fn service_flags(&self, floor_ms: u64) -> Vec<String> {
        [
            "--litestream-backup-url",
            "s3://bucket/replica",
            "--litestream-metrics-url",
            &self.url(),
            "--backup-check-interval-ms",
            "20",
            "--min-cleanup-delay-ms",
            &floor_ms.to_string(),
            "--purge-delay-ms",
            "20",
            "--change-log-retention-ms",
            "0",
        ]
        .map(String::from)
        .to_vec()
    }

    /// Starts listening on 127.0.0.1 with `answer`. Must run inside a tokio/actix runtime.
    pub async fn start(answer: Answer) -> FakeLitestream {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake litestream");
        let addr = listener.local_addr().expect("local addr");
        let shared = Arc::new(Shared {
            answer: Mutex::new(answer),
            ..Default::default()
        });
        let s = shared.clone();
        tokio::task::spawn_local(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let s = s.clone();
                tokio::task::spawn_local(async move { serve(conn, s).await });
            }
        });
        FakeLitestream { addr, shared }
    }

    pub fn url(&self) -> String {
        format!("http://{}/metrics", self.addr)
    }

    pub fn set(&self, answer: Answer) {
        *self.shared.answer.lock().unwrap() = answer;
    }

    pub fn set_body(&self, body: impl Into<String>) {
        self.set(Answer {
            body: body.into(),
            ..Answer::default()
        });
    }

    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// Answers every held request with the current answer.
    pub fn release(&self) {
        self.shared.release.notify_waiters();
    }

    /// Waits (at most `limit`) until more than `seen` requests arrived.
    pub async fn wait_for_request(&self, seen: u64, limit: std::time::Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        while self.requests() <= seen {
            let notified = self.shared.request_seen.notified();
            if self.requests() > seen {
                break;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                break;
            }
        }
    }
}

async fn serve(mut conn: tokio::net::TcpStream, s: Arc<Shared>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if buf.windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    let hang = s.answer.lock().unwrap().hang;
    let released = s.release.notified();
    s.requests.fetch_add(1, Ordering::SeqCst);
    s.request_seen.notify_waiters();
    if hang {
        released.await;
    }
    let a = s.answer.lock().unwrap().clone();
    if a.reset {
        return; // dropped without an answer
    }
    let head = format!(
        "HTTP/1.1 {} X\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        a.status,
        a.body.len()
    );
    let _ = conn.write_all(head.as_bytes()).await;
    let _ = conn.write_all(a.body.as_bytes()).await;
    let _ = conn.shutdown().await;
}

/// A litestream page like the one the peer harness renders: the progress samples between a
/// size gauge and a validation counter, no trailing newline.
pub fn render_page(db: &str, samples: &[(Option<&str>, &str, String)]) -> String {
    let mut lines = vec![
        "# HELP litestream_db_size The current size of the real DB".to_string(),
        "# TYPE litestream_db_size gauge".to_string(),
        format!("litestream_db_size{{db=\"{db}\"}} 3.183935488e+09"),
        "# HELP litestream_replica_progress The last replicated watermark and time of replication"
            .to_string(),
        "# TYPE litestream_replica_progress gauge".to_string(),
    ];
    for (watermark, name, value) in samples {
        let mut labels = vec![format!("db=\"{db}\""), format!("name=\"{name}\"")];
        if let Some(w) = watermark {
            labels.push(format!("watermark=\"{w}\""));
        }
        lines.push(format!(
            "litestream_replica_progress{{{}}} {value}",
            labels.join(",")
        ));
    }
    lines.push(
        "# HELP litestream_replica_validation_total The number of validations performed".into(),
    );
    lines.push("# TYPE litestream_replica_validation_total counter".into());
    lines.push(format!(
        "litestream_replica_validation_total{{db=\"{db}\",name=\"file\",status=\"error\"}} 0"
    ));
    lines.push(format!(
        "litestream_replica_validation_total{{db=\"{db}\",name=\"file\",status=\"ok\"}} 0"
    ));
    lines.join("\n")
}
