//! A stand-in for the custom change source: a websocket server on an ephemeral loopback port
//! that records each connection's query and the acks it receives, and sends whatever frames
//! the test gives it. It serves one connection at a time (the service keeps one). Started with
//! [`UpstreamOptions`] it demands a bearer secret, refuses the first handshakes with 401, or
//! speaks TLS (PROTOCOL.md §4, §15).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use actix_web_actors::ws;
use change_streamer_actors::watermark::Watermark;

use crate::wait::wait_until;

#[derive(Default)]
struct State {
    queries: Vec<String>,
    acks: Vec<String>,
    /// The close frames the service sent: code and reason.
    closes: Vec<(u16, String)>,
    conn: Option<Addr<Conn>>,
    /// Every connection still open, oldest first (a connection ends when its actor stops).
    open: Vec<Addr<Conn>>,
    options: UpstreamOptions,
    /// Pings the service sent, and pongs it answered to ours (PROTOCOL.md §4).
    pings: usize,
    pongs: usize,
    refused: usize,
}

/// How the fake change source answers handshakes; the default takes every one over plain ws.
#[derive(Clone, Default)]
pub struct UpstreamOptions {
    /// Answer 401 to a handshake without `Authorization: Bearer <secret>`.
    pub secret: Option<String>,
    /// Answer 401 to this many handshakes first, whatever they carry.
    pub refuse_first: usize,
    /// Serve `wss://` with this configuration.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl UpstreamOptions {
    /// `wss://` with `tls`, wanting `secret`, and refusing the first handshake whatever it
    /// carries (so the service's retry after a 401 is seen).
    pub fn guarded(secret: &str, tls: Arc<rustls::ServerConfig>) -> UpstreamOptions {
        UpstreamOptions {
            secret: Some(secret.to_string()),
            refuse_first: 1,
            tls: Some(tls),
        }
    }
}

/// The fake change source.
#[derive(Clone)]
pub struct FakeUpstream {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    server: actix_web::dev::ServerHandle,
}

struct Conn {
    state: Arc<Mutex<State>>,
}

impl Actor for Conn {
    type Context = ws::WebsocketContext<Self>;

    fn stopped(&mut self, ctx: &mut Self::Context) {
        let me = ctx.address();
        self.state.lock().unwrap().open.retain(|c| *c != me);
    }
}

#[derive(Message)]
#[rtype(result = "()")]
enum Command {
    Send(Vec<String>),
    Ping,
    Drop,
}

impl Handler<Command> for Conn {
    type Result = ();
    fn handle(&mut self, c: Command, ctx: &mut Self::Context) {
        match c {
            Command::Send(frames) => frames.into_iter().for_each(|f| ctx.text(f)),
            Command::Ping => ctx.ping(b"source"),
            Command::Drop => ctx.stop(),
        }
    }
}

impl StreamHandler<Result<ws::Message, ws::ProtocolError>> for Conn {
    fn handle(&mut self, msg: Result<ws::Message, ws::ProtocolError>, ctx: &mut Self::Context) {
        match msg {
            Ok(ws::Message::Text(t)) => self.state.lock().unwrap().acks.push(t.to_string()),
            Ok(ws::Message::Ping(p)) => {
                self.state.lock().unwrap().pings += 1;
                ctx.pong(&p)
            }
            Ok(ws::Message::Pong(_)) => self.state.lock().unwrap().pongs += 1,
            Ok(ws::Message::Close(reason)) => {
                if let Some(r) = &reason {
                    let code = u16::from(r.code);
                    let text = r.description.clone().unwrap_or_default();
                    self.state.lock().unwrap().closes.push((code, text));
                }
                // The closing handshake's answer, as a websocket server gives it.
                ctx.close(reason);
                ctx.stop()
            }
            Err(_) => ctx.stop(),
            _ => {}
        }
    }
}

async fn connect(
    req: HttpRequest,
    stream: web::Payload,
    state: web::Data<Arc<Mutex<State>>>,
) -> Result<HttpResponse, actix_web::Error> {
    let state = state.get_ref().clone();
    {
        let mut s = state.lock().unwrap();
        let presented = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        let wrong = s
            .options
            .secret
            .as_ref()
            .is_some_and(|secret| presented != Some(&format!("Bearer {secret}")));
        if s.refused < s.options.refuse_first || wrong {
            s.refused += 1;
            return Ok(HttpResponse::Unauthorized()
                .insert_header(("www-authenticate", "Bearer"))
                .finish());
        }
    }
    let (addr, resp) = ws::WsResponseBuilder::new(
        Conn {
            state: state.clone(),
        },
        &req,
        stream,
    )
    .start_with_addr()?;
    let mut s = state.lock().unwrap();
    s.queries.push(req.query_string().to_string());
    s.open.push(addr.clone());
    s.conn = Some(addr);
    Ok(resp)
}

impl FakeUpstream {
    pub async fn start() -> FakeUpstream {
        Self::start_with(UpstreamOptions::default()).await
    }

    /// The fake change source answering handshakes as `options` says.
    pub async fn start_with(options: UpstreamOptions) -> FakeUpstream {
        let tls = options.tls.clone();
        let state = Arc::new(Mutex::new(State {
            options,
            ..State::default()
        }));
        let data = web::Data::new(state.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .default_service(web::to(connect))
        })
        .on_connect(|conn, _| {
            if let Some(tcp) = conn.downcast_ref::<actix_web::rt::net::TcpStream>() {
                let _ = tcp.set_nodelay(true);
            }
        })
        .workers(1)
        .disable_signals();
        let server = match tls {
            Some(tls) => server.bind_rustls_0_23("127.0.0.1:0", (*tls).clone()),
            None => server.bind("127.0.0.1:0"),
        }
        .expect("bind fake upstream");
        let addr = server.addrs()[0];
        let server = server.run();
        let handle = server.handle();
        actix_rt::spawn(server);
        FakeUpstream {
            addr,
            state,
            server: handle,
        }
    }

    pub fn url(&self) -> String {
        let tls = self.state.lock().unwrap().options.tls.is_some();
        format!("{}://{}/changes", if tls { "wss" } else { "ws" }, self.addr)
    }

    /// Handshakes answered with 401 so far.
    pub fn refused(&self) -> usize {
        self.state.lock().unwrap().refused
    }

    /// Query strings of the connections made so far.
    pub fn queries(&self) -> Vec<String> {
        self.state.lock().unwrap().queries.clone()
    }

    /// Acks received so far (text frames).
    pub fn acks(&self) -> Vec<String> {
        self.state.lock().unwrap().acks.clone()
    }

    /// How many acks arrived so far and the newest one, without copying them all (a soak that
    /// asks every few milliseconds, after hundreds of thousands of acks).
    pub fn last_ack(&self) -> (usize, Option<String>) {
        let s = self.state.lock().unwrap();
        (s.acks.len(), s.acks.last().cloned())
    }

    /// The close frames the service sent so far (code, reason), in order.
    pub fn closes(&self) -> Vec<(u16, String)> {
        self.state.lock().unwrap().closes.clone()
    }

    /// Waits until at least `n` connections were made.
    pub async fn wait_connections(&self, n: usize) {
        wait_until(
            "connections to the fake change source",
            Duration::from_secs(20),
            || self.queries().len() >= n,
        )
        .await;
        // Let the connection's actor start.
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }

    /// Sends frames on the current connection.
    pub fn send(&self, frames: Vec<String>) {
        let conn = self.state.lock().unwrap().conn.clone();
        conn.expect("no connection").do_send(Command::Send(frames));
    }

    /// How many connections are open now (handshakes accepted, not yet ended).
    pub fn open_connections(&self) -> usize {
        self.state.lock().unwrap().open.len()
    }

    /// Sends frames on the newest connection still open (unlike [`FakeUpstream::send`], which
    /// takes the newest made): a test whose proxy lets stale handshakes through after the
    /// service gave up on them (they end at once) sends on the one the service holds. Whether
    /// one was open.
    pub fn send_open(&self, frames: Vec<String>) -> bool {
        let conn = self.state.lock().unwrap().open.last().cloned();
        conn.map(|c| c.do_send(Command::Send(frames))).is_some()
    }

    /// Pings the service on the current connection.
    pub fn ping(&self) {
        let conn = self.state.lock().unwrap().conn.clone();
        conn.expect("no connection").do_send(Command::Ping);
    }

    /// Pings the service sent so far, and pongs it answered.
    pub fn pings_and_pongs(&self) -> (usize, usize) {
        let s = self.state.lock().unwrap();
        (s.pings, s.pongs)
    }

    /// Sends frames on the current connection if it is still the `connection`-th made (counted
    /// from 1, as [`FakeUpstream::queries`] lists them): a change source that resumes from the
    /// `lastWatermark` a connection asked for sends nothing meant for an older one on it.
    /// Whether it was.
    pub fn send_on(&self, connection: usize, frames: Vec<String>) -> bool {
        let s = self.state.lock().unwrap();
        match &s.conn {
            Some(conn) if s.queries.len() == connection => {
                conn.do_send(Command::Send(frames));
                true
            }
            _ => false,
        }
    }

    /// Drops the current connection.
    pub fn drop_connection(&self) {
        if let Some(c) = self.state.lock().unwrap().conn.take() {
            c.do_send(Command::Drop);
        }
    }

    pub async fn stop(&self) {
        self.server.stop(false).await;
    }
}

/// An insert change zero's client accepts.
pub fn insert(id: u64) -> String {
    format!(
        r#"{{"tag":"insert","relation":{{"schema":"public","name":"items","keyColumns":["id"]}},"new":{{"id":{id},"v":"row {id}"}}}}"#
    )
}

/// The frames of one transaction at watermark `n` with `rows` inserts.
pub fn txn(n: u64, rows: u64) -> Vec<String> {
    let w = Watermark::from_u64(n);
    let mut f = vec![format!(
        r#"["begin",{{"tag":"begin"}},{{"commitWatermark":"{w}"}}]"#
    )];
    for i in 0..rows {
        f.push(format!(r#"["data",{}]"#, insert(n * 1000 + i)));
    }
    f.push(format!(
        r#"["commit",{{"tag":"commit"}},{{"watermark":"{w}"}}]"#
    ));
    f
}
