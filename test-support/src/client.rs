//! A websocket client speaking the service's framing (PROTOCOL.md §5), on awc: reads messages and
//! closes, answers pings, acks; and reading frames of either shape (batched frames, §5).

use std::time::Duration;

use actix_codec::Framed;
use awc::ws::{Codec, Frame, Message};
use awc::BoxedSocket;
use change_streamer_actors::watermark::Watermark;
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;

use crate::access::Credentials;

/// What a test sees on a socket.
#[derive(Debug, Clone, PartialEq)]
pub enum Seen {
    Msg { id: u64, msg: Value },
    Closed { code: u16, reason: String },
}

/// An awc client without awc's default 5 s limit on a request: on a busy machine an answer (a
/// `/status`, a websocket handshake) can take longer, and a test waits for the answer itself
/// (its own limits, where it has them, say what was awaited).
pub fn http_client() -> awc::Client {
    awc::Client::builder().disable_timeout().finish()
}

/// How long [`WsClient::msg`] and [`WsClient::closed`] wait before they fail the test: a safety
/// net against a test that would hang, never what a test waits for (it waits for the message
/// itself), so generous enough for a machine whose cores are both busy.
const SAFETY_NET: Duration = Duration::from_secs(60);

pub struct WsClient {
    framed: Framed<BoxedSocket, Codec>,
    pub closed: Option<(u16, String)>,
    /// How many of the server's pings this client has answered (PROTOCOL.md §5): lets a test
    /// check that liveness really ran while it waited for something else.
    pub pings_answered: u64,
}

impl WsClient {
    pub async fn connect(url: &str) -> WsClient {
        Self::connect_with(url, &Credentials::default()).await
    }

    /// [`connect`](Self::connect), presenting `credentials`' secret and trusting its roots.
    pub async fn connect_with(url: &str, credentials: &Credentials) -> WsClient {
        let (_, framed) = credentials
            .client()
            .ws(url)
            .max_frame_size(64 << 20)
            .connect()
            .await
            .unwrap_or_else(|e| panic!("connect {url}: {e}"));
        WsClient {
            framed,
            closed: None,
            pings_answered: 0,
        }
    }

    /// The next message or close, answering pings; `None` on timeout.
    pub async fn next(&mut self, limit: Duration) -> Option<Seen> {
        match self.next_frame(limit).await? {
            Ok(v) => {
                let id = v["id"].as_u64().expect("frame has an id");
                Some(Seen::Msg {
                    id,
                    msg: v["msg"].clone(),
                })
            }
            Err((code, reason)) => Some(Seen::Closed { code, reason }),
        }
    }

    /// The next text frame as JSON, whatever its shape (`{"msg":…}` or `{"batch":[…]}`,
    /// PROTOCOL.md §5), or the close (code, reason), answering pings; `None` on timeout.
    pub async fn next_frame(&mut self, limit: Duration) -> Option<Result<Value, (u16, String)>> {
        if let Some(closed) = &self.closed {
            return Some(Err(closed.clone()));
        }
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let frame = match tokio::time::timeout_at(deadline, self.framed.next()).await {
                Err(_) => return None,
                Ok(None) => {
                    self.closed = Some((1006, String::new()));
                    return Some(Err((1006, String::new())));
                }
                Ok(Some(Err(e))) => panic!("websocket error: {e}"),
                Ok(Some(Ok(f))) => f,
            };
            match frame {
                Frame::Text(t) => {
                    return Some(Ok(serde_json::from_slice(&t).expect("frame is JSON")));
                }
                Frame::Ping(p) => {
                    let _ = self.framed.send(Message::Pong(p)).await;
                    self.pings_answered += 1;
                }
                Frame::Close(r) => {
                    let (code, reason) = r
                        .map(|r| (u16::from(r.code), r.description.unwrap_or_default()))
                        .unwrap_or((1005, String::new()));
                    self.closed = Some((code, reason.clone()));
                    let _ = self.framed.send(Message::Close(None)).await;
                    return Some(Err((code, reason)));
                }
                _ => {}
            }
        }
    }

    /// The next message (panics on close, or after the [`SAFETY_NET`]).
    pub async fn msg(&mut self) -> (u64, Value) {
        match self.next(SAFETY_NET).await {
            Some(Seen::Msg { id, msg }) => (id, msg),
            other => panic!("expected a message, got {other:?}"),
        }
    }

    /// Waits for the close (panics on a message, or after the [`SAFETY_NET`]).
    pub async fn closed(&mut self) -> (u16, String) {
        match self.next(SAFETY_NET).await {
            Some(Seen::Closed { code, reason }) => (code, reason),
            other => panic!("expected a close, got {other:?}"),
        }
    }

    pub async fn ack(&mut self, id: u64) {
        self.send_text(format!(r#"{{"ack":{id}}}"#)).await;
    }

    pub async fn send_text(&mut self, text: String) {
        self.framed
            .send(Message::Text(text.into()))
            .await
            .expect("send");
    }

    /// Closes from the client side.
    pub async fn close(mut self) {
        let _ = self.framed.send(Message::Close(None)).await;
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while let Some(Ok(f)) = self.framed.next().await {
                if matches!(f, Frame::Close(_)) {
                    break;
                }
            }
        })
        .await;
    }
}

/// The next frame (panics on a close or a timeout).
pub async fn frame(c: &mut WsClient) -> Value {
    match c.next_frame(Duration::from_secs(10)).await {
        Some(Ok(v)) => v,
        other => panic!("expected a frame, got {other:?}"),
    }
}

/// The payloads of a frame of either shape, and its id.
pub fn payloads(f: &Value) -> (u64, Vec<Value>) {
    let id = f["id"].as_u64().expect("id");
    match (&f["msg"], &f["batch"]) {
        (Value::Null, Value::Array(batch)) => (id, batch.clone()),
        (msg, Value::Null) => (id, vec![msg.clone()]),
        _ => panic!("neither msg nor batch: {f}"),
    }
}

/// The commit watermark of a `commit` payload, as a number.
pub fn commit_of(p: &Value) -> Option<u64> {
    (p[0] == "commit").then(|| {
        Watermark::parse(p[2]["watermark"].as_str().unwrap_or_default())
            .unwrap()
            .to_u64()
            .unwrap()
    })
}

/// Follows a batched stream from the commit of `next` to the commit of `last` as a client that
/// acks only at commits (PROTOCOL.md §5 "When to ack"): it acks each frame that holds a
/// `commit`, and no other. Checks that transactions come whole and in order, each once;
/// returns how many frames ended inside a transaction.
pub async fn follow_acking_commits(c: &mut WsClient, next: u64, last: u64) -> usize {
    let (mut txns, mut ending_inside) = (InOrder::at(next), 0);
    while txns.next <= last {
        let (id, ps) = payloads(&frame(c).await);
        let mut has_commit = false;
        for p in &ps {
            match txns.payload(p) {
                Step::Commit(_) => has_commit = true,
                Step::Rollback => panic!("unexpected {p}"),
                Step::Within | Step::Other => {}
            }
        }
        if txns.open {
            ending_inside += 1;
        }
        if has_commit {
            c.ack(id).await;
        }
    }
    ending_inside
}

/// Reads (without acking) until a frame holds the commit of `last`; checks that transactions
/// come whole and in order, each once; returns the last frame's id.
pub async fn read_until(c: &mut WsClient, next: u64, last: u64) -> (u64, u64) {
    let mut txns = InOrder::at(next);
    loop {
        let (id, ps) = payloads(&frame(c).await);
        for p in ps {
            match txns.payload(&p) {
                Step::Commit(n) if n == last => return (id, n),
                Step::Commit(_) | Step::Within => {}
                Step::Rollback | Step::Other => panic!("unexpected {p}"),
            }
        }
    }
}

/// What a payload was to [`InOrder`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A `begin` or a `data` of the open transaction.
    Within,
    /// The commit of transaction `n`, the one expected.
    Commit(u64),
    /// A `rollback`: the open transaction cut off (the change source's connection ended,
    /// PROTOCOL.md §7); it comes again, whole, after the resume.
    Rollback,
    /// Any other message; nothing checked.
    Other,
}

/// The order rule of a subscriber's stream: transactions whole (`begin`, its `data`, then its
/// `commit` or a `rollback`), in order, each once, from commit `next`.
#[derive(Debug, Clone, Copy)]
pub struct InOrder {
    /// A transaction has begun and not ended.
    pub open: bool,
    /// The commit expected next.
    pub next: u64,
}

impl InOrder {
    pub fn at(next: u64) -> InOrder {
        InOrder { open: false, next }
    }

    /// Checks one payload against the rule (panicking where it is broken).
    pub fn payload(&mut self, p: &Value) -> Step {
        match p[0].as_str() {
            Some("begin") => {
                assert!(!self.open, "begin inside a transaction: {p}");
                self.open = true;
                Step::Within
            }
            Some("data") => {
                assert!(self.open, "data outside a transaction: {p}");
                Step::Within
            }
            Some("commit") => {
                assert!(
                    self.open && commit_of(p) == Some(self.next),
                    "expected the commit of {}: {p}",
                    self.next
                );
                self.open = false;
                self.next += 1;
                Step::Commit(self.next - 1)
            }
            Some("rollback") => {
                assert!(self.open, "rollback outside a transaction: {p}");
                self.open = false;
                Step::Rollback
            }
            _ => Step::Other,
        }
    }
}
