//! One websocket subscriber (PROTOCOL.md §5, §7): subscribes from the replicaVersion, acks every
//! message (all acks read in one go leave in one write), and checks as it reads that ids run
//! 1, 2, 3…, that the first message is `status`, and that transactions arrive whole
//! (`begin`, `changes` × `data`, `commit` of the same watermark) with no watermark skipped.
//! Inside the measured window it records commit-to-receipt latency and the gap between commits.
//!
//! With `--batched` it subscribes with `wsBatched=true`, reads both frame shapes
//! (`{"msg":P,"id":n}` and `{"batch":[P1,…],"id":n}`) and sends one cumulative ack for all the
//! frames read in one go: the id of the last. A never-reading subscriber ([`hold`]) subscribes,
//! acks its `status` and then never reads its socket again. A churning joiner ([`join`],
//! `--churn-subs`) subscribes from a given watermark, is checked the same way from there (its
//! first `begin` must be the one right after it), and leaves when told; its figures are kept
//! apart from the steady subscribers'.
//!
//! With `--check-subs K` only K steady subscribers ([`crate::sample`]) read this way; the
//! others read light ([`crate::light`]: ids, acks and counts, no message parsed). Both are a
//! [`Reader`] driven by the same read loop, so they read and ack alike.

use std::future::Future;
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_util::{FutureExt, SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{Connector, MaybeTlsStream, WebSocketStream};

use crate::ctx::{Ctx, Framing};
use crate::frames::{ack_text, payloads, split_batch, split_frame, Frame};
use crate::light::Light;
use crate::reader::Reader;
use crate::shared::{Phases, Run, ServiceAccess};
use crate::workload::{frame_watermark, lexi, parse_lexi, FIRST_SEQ};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Whose figures a subscriber's receipts go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// A steady subscriber (`--subs`): deliveries, latencies and gaps.
    Steady,
    /// A churning joiner (`--churn-subs`): its own counters only.
    Joiner,
}

/// Where a subscriber is in the stream it checks.
pub(crate) struct Check {
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
    role: Role,
}

impl Check {
    pub(crate) fn new(ctx: &Ctx, name: String, service: usize, from: u64, role: Role) -> Self {
        Check {
            name,
            last_id: 1,
            last_commit: from,
            open: None,
            changes: ctx.changes,
            last_commit_at: None,
            service,
            role,
        }
    }
}

/// Connects to `base`, service address number `service` (retrying while the service is not up
/// or not initialised), waits for `status`, reports ready, then reads until the run stops:
/// with every check when `checked`, else light (`--check-subs`).
pub async fn run(ctx: Rc<Ctx>, base: String, service: usize, name: String, checked: bool) {
    let (shared, framing) = (&*ctx.run, ctx.framing);
    let subscribed = subscribe(
        shared,
        &ctx.access,
        &base,
        &name,
        framing,
        ctx.deadline,
        FIRST_SEQ,
    );
    let Some(mut ws) = subscribed.await else {
        return;
    };
    shared.sub_ready();
    if checked {
        let mut check = Check::new(&ctx, name, service, FIRST_SEQ, Role::Steady);
        read(&ctx, &mut ws, &mut check).await;
    } else {
        read(&ctx, &mut ws, &mut Light::new(name, service)).await;
    }
}

/// A churning joiner: subscribes once from watermark `from` (a commit the service stored),
/// checks its stream from there and reads until `leave` completes (or the run stops), then
/// closes. A failed subscription is an error: a joiner is never refused.
pub async fn join(
    ctx: Rc<Ctx>,
    base: String,
    service: usize,
    name: String,
    from: u64,
    leave: impl Future<Output = ()>,
) {
    let (shared, framing) = (&*ctx.run, ctx.framing);
    let at_once = Instant::now();
    let subscribed = subscribe(shared, &ctx.access, &base, &name, framing, at_once, from);
    let Some(mut ws) = subscribed.await else {
        return;
    };
    let counters = &ctx.tally.counters;
    counters.churn_joins.add(1);
    let mut check = Check::new(&ctx, name, service, from, Role::Joiner);
    let left = tokio::select! {
        _ = read(&ctx, &mut ws, &mut check) => false,
        _ = leave => true,
    };
    if left {
        counters.churn_leaves.add(1);
        if check.last_commit == from {
            counters.churn_empty.add(1);
        }
        // Leaving: a close frame, then the socket is dropped (the reply is not awaited).
        let _ = ws.close(None).await;
    }
}

/// Reads, checks and acks until the stream ends or the run stops.
async fn read(ctx: &Ctx, ws: &mut Ws, check: &mut impl Reader) {
    let (shared, framing) = (&*ctx.run, ctx.framing);
    while !shared.phases.stopped() {
        let Some(first) = ws.next().await else { break };
        let mut next = Some(first);
        let mut last_read = None;
        while let Some(m) = next {
            match m {
                Ok(Message::Text(t)) => match check.frame(ctx, t.as_str()) {
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
                        shared.error(format!("{}: closed by the service: {c:?}", check.name()));
                    }
                    return;
                }
                Ok(_) => {}
                Err(e) => {
                    if !shared.phases.stopped() {
                        shared.error(format!("{}: {e}", check.name()));
                    }
                    return;
                }
            }
            next = ws.next().now_or_never().flatten();
        }
        if let Some(id) = last_read {
            if ws.feed(Message::text(ack_text(id))).await.is_err() && !shared.phases.stopped() {
                shared.error(format!("{}: ack write failed", check.name()));
                return;
            }
        }
        if ws.flush().await.is_err() && !shared.phases.stopped() {
            shared.error(format!("{}: ack write failed", check.name()));
            return;
        }
    }
}

/// Subscribes from watermark `from` (retrying while the service is not up or not initialised,
/// until `deadline`) and hands back the socket once it has its `status`.
async fn subscribe(
    shared: &Run,
    access: &ServiceAccess,
    base: &str,
    name: &str,
    framing: Framing,
    deadline: Instant,
    from: u64,
) -> Option<Ws> {
    let (rv, wm) = (lexi(FIRST_SEQ), lexi(from));
    let batched = if framing == Framing::Batched {
        "&wsBatched=true"
    } else {
        ""
    };
    let url = format!(
        "{base}/replication/v6/changes?id={name}&taskID=&mode=serving&replicaVersion={rv}&watermark={wm}&initial=false{batched}"
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
        FIRST_SEQ,
    );
    let Some(ws) = subscribed.await else {
        return;
    };
    shared.sub_ready();
    shared.phases.until(Phases::stopped).await;
    drop(ws);
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
    let config = WebSocketConfig::default().read_buffer_size(access.read_buffer);
    let connector = match &access.tls {
        Some(tls) if url.starts_with("wss://") => Connector::Rustls(tls.clone()),
        _ => Connector::Plain,
    };
    let (mut ws, _) = tokio_tungstenite::client_async_tls_with_config(
        request,
        tcp,
        Some(config),
        Some(connector),
    )
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

impl Reader for Check {
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
        if self.role == Role::Steady {
            ctx.tally.counters.frames.add(1);
        }
        Some(id)
    }

    fn name(&self) -> &str {
        &self.name
    }
}

impl Check {
    /// Checks one payload; `None` when the subscription cannot go on.
    fn message(&mut self, ctx: &Ctx, msg: &str) -> Option<()> {
        let (shared, counters) = (&*ctx.run, &ctx.tally.counters);
        if self.role == Role::Steady {
            counters.msgs.add(1);
        }
        if msg.starts_with(r#"["data""#) {
            match self.role {
                Role::Steady => ctx.tally.change(self.service),
                Role::Joiner => counters.churn_changes.add(1),
            }
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
            match self.role {
                Role::Steady => {
                    counters.commits.add(1);
                    self.commit_received(ctx, seq);
                }
                Role::Joiner => counters.churn_commits.add(1),
            }
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
mod measure {
    use super::*;
    use crate::ctx::Setup;
    use crate::workload::{filler, live_tx};

    /// The checks' cost per message on batches of 4 transactions of 10 inserts (what each of 64
    /// subscribers gets at 2,000 txns/s), the frames already read: the part of the hot path
    /// that is the generator's own code, best of 200 passes over 100 frames.
    #[test]
    #[ignore = "a measurement: cargo test --release -p change-streamer-loadgen -- --ignored checks_cost --nocapture"]
    fn checks_cost_per_message() {
        for row_bytes in [0, 1024] {
            let ctx = Setup::batched_for_tests();
            ctx.run.phases.record(true);
            let frames = 100;
            let texts: Vec<String> = (0..frames)
                .map(|f| {
                    let mut payloads = Vec::new();
                    for seq in FIRST_SEQ + 1 + 4 * f..FIRST_SEQ + 5 + 4 * f {
                        live_tx(seq, 10, &filler(row_bytes, false), &mut payloads);
                    }
                    format!(r#"{{"batch":[{}],"id":{}}}"#, payloads.join(","), f + 2)
                })
                .collect();
            ctx.run.mark_sent(FIRST_SEQ, FIRST_SEQ + 4 * frames);
            let mut check = Check::new(&ctx, "measure".into(), 0, FIRST_SEQ, Role::Steady);
            let mut best = f64::MAX;
            for _ in 0..200 {
                (check.last_id, check.last_commit) = (1, FIRST_SEQ);
                let t = Instant::now();
                for text in &texts {
                    assert!(check.frame(&ctx, text).is_some());
                }
                best = best.min(t.elapsed().as_nanos() as f64 / (frames * 48) as f64);
            }
            assert_eq!(ctx.run.error_count(), 0);
            println!("--row-bytes {row_bytes}: {best:.1} ns per message");
        }
    }
}
