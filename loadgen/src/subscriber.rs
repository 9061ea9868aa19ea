//! One websocket subscriber (PROTOCOL.md §5, §7): subscribes from the replicaVersion, acks every
//! message (all acks read in one go leave in one write), and checks as it reads that ids run
//! 1, 2, 3…, that the first message is `status`, and that transactions arrive whole
//! (`begin`, `changes` × `data`, `commit` of the same watermark) with no watermark skipped.
//! Inside the measured window it records commit-to-receipt latency and the gap between commits.
//!
//! With `--batched` it subscribes with `wsBatched=true`, reads both frame shapes
//! (`{"msg":P,"id":n}` and `{"batch":[P1,…],"id":n}`) and sends one cumulative ack for all the
//! frames read in one go: the id of the last. A never-reading subscriber ([`hold`]) subscribes,
//! acks its `status` and then never reads its socket again.

use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_util::{FutureExt, SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{Connector, MaybeTlsStream, WebSocketStream};

use crate::crew::Ctx;
use crate::shared::{Phases, Run, ServiceAccess};
use crate::workload::{frame_watermark, lexi, parse_lexi, FIRST_SEQ};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Either frame shape, for frames the fast paths do not read.
#[derive(Deserialize)]
struct Frame<'a> {
    #[serde(borrow, default)]
    msg: Option<&'a RawValue>,
    #[serde(borrow, default)]
    batch: Option<Vec<&'a RawValue>>,
    id: u64,
}

/// How a subscriber subscribes and acks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// One ack per frame, in order (zero 0.26.2's client).
    PerFrame,
    /// `wsBatched=true`: both shapes, one cumulative ack per read.
    Batched,
}

/// Where a subscriber is in the stream it checks.
struct Check {
    name: String,
    last_id: u64,
    /// Sequence number of the last whole transaction received.
    last_commit: u64,
    /// `(seq, data seen)` of the transaction open since its `begin`.
    open: Option<(u64, usize)>,
    changes: usize,
    last_commit_at: Option<Instant>,
    /// Index of the service address read from (in `--service`'s list).
    service: usize,
}

/// Connects to `base`, service address number `service` (retrying while the service is not up
/// or not initialised), waits for `status`, reports ready, then reads until the run stops.
pub async fn run(ctx: Rc<Ctx>, base: String, service: usize, name: String) {
    let (shared, framing) = (&*ctx.run, ctx.framing);
    let Some(mut ws) = subscribe(shared, &ctx.access, &base, &name, framing, ctx.deadline).await
    else {
        return;
    };
    let mut check = Check {
        name,
        last_id: 1,
        last_commit: FIRST_SEQ,
        open: None,
        changes: ctx.changes,
        last_commit_at: None,
        service,
    };
    while !shared.phases.stopped() {
        let Some(first) = ws.next().await else { break };
        let mut next = Some(first);
        let mut last_read = None;
        while let Some(m) = next {
            match m {
                Ok(Message::Text(t)) => match check.frame(&ctx, t.as_str()) {
                    Some(id) if framing == Framing::Batched => last_read = Some(id),
                    Some(id) => {
                        if ws.feed(Message::text(ack_text(id))).await.is_err() {
                            break;
                        }
                    }
                    None => return,
                },
                Ok(Message::Close(c)) => {
                    if !shared.phases.stopped() {
                        shared.error(format!("{}: closed by the service: {c:?}", check.name));
                    }
                    return;
                }
                Ok(_) => {}
                Err(e) => {
                    if !shared.phases.stopped() {
                        shared.error(format!("{}: {e}", check.name));
                    }
                    return;
                }
            }
            next = ws.next().now_or_never().flatten();
        }
        if let Some(id) = last_read {
            if ws.feed(Message::text(ack_text(id))).await.is_err() && !shared.phases.stopped() {
                shared.error(format!("{}: ack write failed", check.name));
                return;
            }
        }
        if ws.flush().await.is_err() && !shared.phases.stopped() {
            shared.error(format!("{}: ack write failed", check.name));
            return;
        }
    }
}

/// Subscribes (retrying while the service is not up or not initialised) and reports the
/// subscriber ready once it has its `status`.
async fn subscribe(
    shared: &Run,
    access: &ServiceAccess,
    base: &str,
    name: &str,
    framing: Framing,
    deadline: Instant,
) -> Option<Ws> {
    let rv = lexi(FIRST_SEQ);
    let batched = if framing == Framing::Batched {
        "&wsBatched=true"
    } else {
        ""
    };
    let url = format!(
        "{base}/replication/v6/changes?id={name}&taskID=&mode=serving&replicaVersion={rv}&watermark={rv}&initial=false{batched}"
    );
    let ws = loop {
        match connect(&url, access).await {
            Ok(ws) => break ws,
            Err(e) if Instant::now() < deadline => {
                log_retry(name, &e);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => {
                shared.error(format!("{name}: could not subscribe: {e}"));
                return None;
            }
        }
    };
    shared.sub_ready();
    Some(ws)
}

/// A subscriber that never reads: subscribes, acks its `status`, then holds the socket open
/// unread until the run stops (the memory case of PROTOCOL.md §10.2).
pub async fn hold(ctx: Rc<Ctx>, base: String, name: String) {
    let shared = &*ctx.run;
    let subscribed = subscribe(
        shared,
        &ctx.access,
        &base,
        &name,
        Framing::PerFrame,
        ctx.deadline,
    );
    let Some(ws) = subscribed.await else {
        return;
    };
    shared.phases.until(Phases::stopped).await;
    drop(ws);
}

/// `{"batch":[P1,…],"id":N}` split into the payloads' list text `P1,…` and `N`, without a JSON
/// parser, for batches written the way our service writes them (`batch` first, no spaces);
/// [`payloads`] then splits the list.
fn split_batch(text: &str) -> Option<(&str, u64)> {
    let rest = text.strip_prefix(r#"{"batch":["#)?.strip_suffix('}')?;
    let at = rest.rfind(r#"],"id":"#)?;
    let digits = &rest[at + r#"],"id":"#.len()..];
    let plain =
        !digits.is_empty() && digits.len() < 20 && digits.bytes().all(|b| b.is_ascii_digit());
    if !plain {
        return None;
    }
    Some((&rest[..at], digits.parse().ok()?))
}

/// The top-level elements of a JSON list's inner text (`P1,P2,…`), found by tracking string
/// quotes and bracket depth: each payload is a JSON array or object, so a comma at depth 0
/// outside a string separates two of them.
fn payloads(list: &str) -> impl Iterator<Item = &str> {
    let bytes = list.as_bytes();
    let (mut start, mut i, mut depth, mut in_str) = (0, 0, 0i32, false);
    std::iter::from_fn(move || {
        if start >= bytes.len() {
            return None;
        }
        while i < bytes.len() {
            let b = bytes[i];
            i += 1;
            if in_str {
                match b {
                    b'\\' => i += 1,
                    b'"' => in_str = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => in_str = true,
                b'[' | b'{' => depth += 1,
                b']' | b'}' => depth -= 1,
                b',' if depth == 0 => {
                    let p = &list[start..i - 1];
                    start = i;
                    return Some(p);
                }
                _ => {}
            }
        }
        let p = &list[start..];
        start = bytes.len();
        Some(p)
    })
}

/// `{"msg":M,"id":N}` split into `M` and `N` without a JSON parser, for frames written the way
/// both services write them (`msg` first, no spaces). Parsing every frame with serde_json was a
/// third of the generator's CPU, which shares the machine with the service it measures. `M`
/// is not checked as JSON here: what the checks need of it is its first word and watermark
/// (below). Any other shape goes through serde_json.
fn split_frame(text: &str) -> Option<(&str, u64)> {
    let rest = text.strip_prefix(r#"{"msg":"#)?.strip_suffix('}')?;
    let at = rest.rfind(r#","id":"#)?;
    let digits = &rest[at + r#","id":"#.len()..];
    let plain =
        !digits.is_empty() && digits.len() < 20 && digits.bytes().all(|b| b.is_ascii_digit());
    if !plain {
        return None;
    }
    Some((&rest[..at], digits.parse().ok()?))
}

/// `{"ack":n}`, built without the formatting machinery (one per message read).
fn ack_text(id: u64) -> String {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut n = id;
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let mut s = String::with_capacity(8 + digits.len() - i);
    s.push_str(r#"{"ack":"#);
    s.extend(digits[i..].iter().map(|&d| char::from(d)));
    s.push('}');
    s
}

fn log_retry(name: &str, e: &str) {
    if name.ends_with("-0") {
        eprintln!("loadgen: {name}: not subscribed yet ({e}); retrying");
    }
}

/// Opens the socket (TCP_NODELAY; TLS for `wss://`, presenting the secret when there is one)
/// and reads the first message, which must be `status`.
async fn connect(url: &str, access: &ServiceAccess) -> Result<Ws, String> {
    let addr = url
        .trim_start_matches("ws://")
        .trim_start_matches("wss://")
        .split('/')
        .next()
        .unwrap_or_default();
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut request = url.into_client_request().map_err(|e| e.to_string())?;
    if let Some(secret) = &access.secret {
        let value = format!("Bearer {secret}")
            .parse()
            .map_err(|_| "the secret cannot be a header value".to_string())?;
        request.headers_mut().insert("authorization", value);
    }
    let connector = match &access.tls {
        Some(tls) if url.starts_with("wss://") => Connector::Rustls(tls.clone()),
        _ => Connector::Plain,
    };
    let (mut ws, _) =
        tokio_tungstenite::client_async_tls_with_config(request, tcp, None, Some(connector))
            .await
            .map_err(|e| e.to_string())?;
    match ws.next().await {
        Some(Ok(Message::Text(t))) => {
            let f: Frame = serde_json::from_str(t.as_str()).map_err(|e| format!("{e}: {t}"))?;
            let first = f.msg.or(f.batch.and_then(|b| b.first().copied()));
            if f.id != 1 || !first.is_some_and(|m| m.get().starts_with(r#"["status""#)) {
                return Err(format!("first message is not status #1: {t}"));
            }
            ws.send(Message::text(r#"{"ack":1}"#))
                .await
                .map_err(|e| e.to_string())?;
            Ok(ws)
        }
        other => Err(format!("no status: {other:?}")),
    }
}

impl Check {
    /// Checks one frame, of either shape; the id to ack, or `None` when the subscription
    /// cannot go on.
    fn frame(&mut self, ctx: &Ctx, text: &str) -> Option<u64> {
        let shared = &*ctx.run;
        let id = if let Some((msg, id)) = split_frame(text) {
            self.message(ctx, msg)?;
            id
        } else if let Some((list, id)) = split_batch(text) {
            for msg in payloads(list) {
                self.message(ctx, msg)?;
            }
            id
        } else {
            let f = match serde_json::from_str::<Frame>(text) {
                Ok(f) => f,
                Err(e) => {
                    shared.error(format!("{}: not a frame ({e}): {text}", self.name));
                    return None;
                }
            };
            match (f.msg, f.batch) {
                (Some(msg), None) => self.message(ctx, msg.get())?,
                (None, Some(batch)) if !batch.is_empty() => {
                    for msg in batch {
                        self.message(ctx, msg.get())?;
                    }
                }
                _ => {
                    shared.error(format!("{}: neither msg nor batch: {text}", self.name));
                    return None;
                }
            }
            f.id
        };
        if id != self.last_id + 1 {
            shared.error(format!("{}: id {} after {}", self.name, id, self.last_id));
        }
        self.last_id = id;
        ctx.tally.counters.frames.add(1);
        Some(id)
    }

    /// Checks one payload; `None` when the subscription cannot go on.
    fn message(&mut self, ctx: &Ctx, msg: &str) -> Option<()> {
        let shared = &*ctx.run;
        ctx.tally.counters.msgs.add(1);
        if msg.starts_with(r#"["data""#) {
            ctx.tally.change(self.service);
            match &mut self.open {
                Some((_, n)) => *n += 1,
                None => shared.error(format!("{}: data outside a transaction", self.name)),
            }
        } else if msg.starts_with(r#"["begin""#) {
            let seq = self.seq(shared, msg)?;
            if self.open.is_some() {
                shared.error(format!(
                    "{}: begin {} inside a transaction",
                    self.name,
                    lexi(seq)
                ));
            }
            if seq != self.last_commit + 1 {
                shared.error(format!(
                    "{}: gap: begin {} after commit {}",
                    self.name,
                    lexi(seq),
                    lexi(self.last_commit)
                ));
            }
            self.open = Some((seq, 0));
        } else if msg.starts_with(r#"["commit""#) {
            let seq = self.seq(shared, msg)?;
            match self.open.take() {
                Some((s, n)) if s == seq && n == self.changes => {}
                other => shared.error(format!(
                    "{}: commit {} closes {other:?}",
                    self.name,
                    lexi(seq)
                )),
            }
            self.last_commit = seq;
            ctx.tally.counters.commits.add(1);
            self.commit_received(ctx, seq);
        } else {
            shared.error(format!("{}: unexpected message {msg}", self.name));
        }
        Some(())
    }

    fn seq(&self, shared: &Run, msg: &str) -> Option<u64> {
        let seq = frame_watermark(msg).and_then(parse_lexi);
        if seq.is_none() {
            shared.error(format!("{}: no LexiVersion watermark in {msg}", self.name));
        }
        seq
    }

    /// Latency since the transaction left the change source, and the gap since the last commit.
    fn commit_received(&mut self, ctx: &Ctx, seq: u64) {
        let (shared, now) = (&*ctx.run, Instant::now());
        if shared.phases.recording() {
            if let Some(sent) = shared.sent_at(seq) {
                let lat = (now - shared.t0).saturating_sub(sent);
                let lat = lat.as_micros().min(u32::MAX as u128) as u32;
                ctx.tally.latency(self.service, lat);
            }
            if let Some(prev) = self.last_commit_at {
                ctx.tally.gap((now - prev).as_micros() as u64);
            }
        }
        self.last_commit_at = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_as_serde_json_reads_them() {
        for text in [
            r#"{"msg":["data",{"tag":"insert","id":3}],"id":12}"#,
            r#"{"msg":["commit",{"tag":"commit"},{"watermark":"0b"}],"id":1}"#,
            r#"{"msg":["data",{"x":",\"id\":5"}],"id":18446744073709551}"#,
        ] {
            let f: Frame = serde_json::from_str(text).unwrap();
            let msg = f.msg.map(|m| m.get());
            assert_eq!(
                split_frame(text).map(|(m, id)| (Some(m), id)),
                Some((msg, f.id)),
                "{text}"
            );
        }
        for text in [
            r#"{"id":1,"msg":[]}"#,
            r#"{"msg":[],"id":}"#,
            r#"{"msg":[],"id":-1}"#,
        ] {
            assert_eq!(split_frame(text), None, "{text}");
        }
    }

    #[test]
    fn batches_split_as_serde_json_reads_them() {
        for text in [
            r#"{"batch":[["data",{"tag":"insert","id":3}]],"id":12}"#,
            r#"{"batch":[["begin",{"tag":"begin"},{"commitWatermark":"0b"}],["data",{"x":"],[\"\\","y":[1,{"z":"}"}]}],["commit",{"tag":"commit"},{"watermark":"0b"}]],"id":7}"#,
        ] {
            let f: Frame = serde_json::from_str(text).unwrap();
            let want: Vec<&str> = f.batch.unwrap().iter().map(|p| p.get()).collect();
            let (list, id) = split_batch(text).unwrap();
            assert_eq!(payloads(list).collect::<Vec<_>>(), want, "{text}");
            assert_eq!(id, f.id);
        }
        assert_eq!(split_batch(r#"{"id":1,"batch":[[]]}"#), None);
    }

    #[test]
    fn acks_are_written_as_json() {
        for id in [0, 9, 10, 123456, u64::MAX] {
            assert_eq!(ack_text(id), format!(r#"{{"ack":{id}}}"#));
        }
    }
}
