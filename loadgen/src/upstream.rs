//! The custom change source (PROTOCOL.md §4) the service connects to: answers the initial sync, then
//! streams live transactions (as fast as the service acks them, or at a fixed rate), never more
//! than `window` transactions ahead of the service's `["status",{"tag":"commit"},...]` acks.
//! Inside the measured window it records each transaction's ack latency (sent → acked: stored
//! durably), the part of a standby subscriber's latency that comes before the standby.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::Message;

use crate::shared::Run;
use crate::workload::{frame_watermark, initial_sync, live_tx, parse_lexi, FIRST_SEQ};

/// How transactions are paced.
#[derive(Clone, Copy, Debug)]
pub enum Pace {
    /// As many as the window allows.
    Saturate,
    /// This many transactions per second, counted from the start of the flood.
    Rate(f64),
}

/// What the change source sends.
#[derive(Clone, Debug)]
pub struct SourceConfig {
    pub app: String,
    pub shard: String,
    pub changes: usize,
    /// The text column of every inserted row ([`crate::workload::filler`]).
    pub filler: crate::workload::Filler,
    pub window: u64,
    pub pace: Pace,
}

/// Transactions written per socket flush at most (one write for many frames).
const MAX_BATCH: u64 = 32;

/// The change source's figures (main thread only: `Rc`, `Cell`).
pub struct SourceStats {
    /// Highest sequence number the service acked upstream (durably stored).
    pub acked: Cell<u64>,
    /// Transactions written upstream.
    pub txns_sent: Cell<u64>,
    /// Sent-to-acked latencies (µs) of the transactions acked inside the window.
    pub ack_latencies_us: RefCell<Vec<u32>>,
}

impl SourceStats {
    pub fn new() -> Self {
        SourceStats {
            acked: Cell::new(FIRST_SEQ),
            txns_sent: Cell::new(0),
            ack_latencies_us: RefCell::new(Vec::new()),
        }
    }

    /// The service acked every transaction up to `seq` now (above [`SourceStats::acked`]).
    fn acked_now(&self, run: &Run, seq: u64) {
        if run.phases.recording() {
            let now = run.since_t0();
            let mut lat = self.ack_latencies_us.borrow_mut();
            for s in self.acked.get() + 1..=seq {
                if let Some(sent) = run.sent_at(s) {
                    let us = now.saturating_sub(sent).as_micros();
                    lat.push(us.min(u32::MAX as u128) as u32);
                }
            }
        }
        self.acked.set(seq);
        run.set_stored(seq);
    }
}

/// Accepts the service's connections; a new one replaces the previous (a reconnect).
pub async fn serve(
    listener: TcpListener,
    run: Arc<Run>,
    stats: Rc<SourceStats>,
    cfg: SourceConfig,
    go_at: Rc<Cell<Option<Instant>>>,
) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let (run, stats, cfg, go_at) = (run.clone(), stats.clone(), cfg.clone(), go_at.clone());
        tokio::task::spawn_local(async move {
            if let Err(e) = connection(tcp, &run, &stats, &cfg, &go_at).await {
                eprintln!("loadgen: upstream connection ended: {e}");
            }
        });
    }
}

type Ws = tokio_tungstenite::WebSocketStream<TcpStream>;
type WsError = tokio_tungstenite::tungstenite::Error;

/// What the ack reader tells the sender: the connection closed, or an ack made room (`wake`).
#[derive(Clone)]
struct Link {
    closed: Rc<Cell<bool>>,
    wake: Rc<Notify>,
}

/// One connection of the service: the handshake, the initial sync unless it resumes from a
/// `lastWatermark`, then the flood once the run starts, while its acks are read beside.
async fn connection(
    tcp: TcpStream,
    run: &Arc<Run>,
    stats: &Rc<SourceStats>,
    cfg: &SourceConfig,
    go_at: &Rc<Cell<Option<Instant>>>,
) -> Result<(), WsError> {
    let (ws, last) = accept(tcp).await?;
    let (mut sink, stream) = ws.split();
    let resume = match &last {
        Some(w) => match parse_lexi(w) {
            Some(seq) => seq,
            None => {
                run.error(format!("upstream: lastWatermark {w} is not a LexiVersion"));
                return Ok(());
            }
        },
        None => FIRST_SEQ - 1,
    };
    stats.acked.set(resume);
    run.set_stored(resume);
    let link = Link {
        closed: Rc::new(Cell::new(false)),
        wake: Rc::new(Notify::new()),
    };
    let acks = read_acks(stream, run.clone(), stats.clone(), link.clone());
    tokio::task::spawn_local(acks);

    let mut next = resume + 1;
    if last.is_none() {
        for f in initial_sync(&cfg.app, &cfg.shard) {
            sink.feed(Message::text(f)).await?;
        }
        sink.flush().await?;
        run.mark_sent(FIRST_SEQ, FIRST_SEQ);
        next = FIRST_SEQ + 1;
    }
    let mut phase_changed = run.phases.watch();
    while !run.phases.go() {
        if link.closed.get() {
            return Ok(());
        }
        tokio::select! {
            _ = phase_changed.changed() => {}
            _ = link.wake.notified() => {}
        }
    }
    let start = go_at.get().unwrap_or_else(Instant::now);
    flood(&mut sink, run, stats, cfg, &link, start, next).await
}

/// Accepts the websocket handshake; the socket and the `lastWatermark` it resumes from, if any.
// The handshake callback's `Result<Response, ErrorResponse>` is tungstenite's signature.
#[allow(clippy::result_large_err)]
async fn accept(tcp: TcpStream) -> Result<(Ws, Option<String>), WsError> {
    tcp.set_nodelay(true)?;
    let uri = Rc::new(RefCell::new(String::new()));
    let seen = uri.clone();
    let ws = tokio_tungstenite::accept_hdr_async(tcp, move |req: &Request, resp: Response| {
        *seen.borrow_mut() = req.uri().to_string();
        Ok(resp)
    })
    .await?;
    let uri = uri.borrow().clone();
    let last = uri
        .split(['?', '&'])
        .find_map(|kv| kv.strip_prefix("lastWatermark="))
        .map(str::to_owned);
    eprintln!("loadgen: upstream connect {uri}");
    Ok((ws, last))
}

/// Reads the service's commit acks until the connection closes, waking the sender at each.
async fn read_acks(mut stream: SplitStream<Ws>, run: Arc<Run>, stats: Rc<SourceStats>, link: Link) {
    while let Some(Ok(m)) = stream.next().await {
        let Message::Text(t) = m else { continue };
        if !t.as_str().starts_with(r#"["status",{"tag":"commit"}"#) {
            continue;
        }
        match frame_watermark(t.as_str()).and_then(parse_lexi) {
            Some(seq) if seq > stats.acked.get() => {
                stats.acked_now(&run, seq);
                link.wake.notify_one();
            }
            Some(_) => {}
            None => run.error(format!("upstream: ack without a LexiVersion: {t}")),
        }
    }
    link.closed.set(true);
    link.wake.notify_one();
}

/// Sends live transactions from `next` until the run stops or the connection closes: at most
/// `window` ahead of the acks, paced from `start` (the flood's start), `MAX_BATCH` a write.
async fn flood(
    sink: &mut SplitSink<Ws, Message>,
    run: &Run,
    stats: &SourceStats,
    cfg: &SourceConfig,
    link: &Link,
    start: Instant,
    mut next: u64,
) -> Result<(), WsError> {
    let mut frames = Vec::with_capacity((cfg.changes + 2) * MAX_BATCH as usize);
    while !run.phases.stopped() && !link.closed.get() {
        let in_flight = (next - 1).saturating_sub(stats.acked.get());
        let room = cfg.window.saturating_sub(in_flight);
        let due = match cfg.pace {
            Pace::Saturate => room,
            Pace::Rate(r) => {
                ((r * start.elapsed().as_secs_f64()) as u64).saturating_sub(stats.txns_sent.get())
            }
        };
        let n = room.min(due).min(MAX_BATCH);
        if n == 0 {
            match cfg.pace {
                Pace::Rate(r) if room > 0 => {
                    let at =
                        start + Duration::from_secs_f64((stats.txns_sent.get() + 1) as f64 / r);
                    tokio::time::sleep_until(at.into()).await;
                }
                _ => {
                    tokio::select! {
                        _ = link.wake.notified() => {}
                        _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    }
                }
            }
            continue;
        }
        for seq in next..next + n {
            live_tx(seq, cfg.changes, &cfg.filler, &mut frames);
        }
        // Timed once the frames are made, before their first byte is written: a subscriber on
        // another thread may read a commit before this thread runs again after the write.
        run.mark_sent(next, next + n - 1);
        for f in frames.drain(..) {
            sink.feed(Message::text(f)).await?;
        }
        sink.flush().await?;
        stats.txns_sent.set(stats.txns_sent.get() + n);
        next += n;
    }
    Ok(())
}
