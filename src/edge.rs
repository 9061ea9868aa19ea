//! What the service loads at start for its edges, before it binds or opens anything: the access
//! rule of its port ([`crate::http::access`]), TLS for that port and for a `wss://` change
//! source ([`crate::tls`]), and the secret it presents upstream. Loaded and checked once, before
//! the instance's one HTTP server starts, so that every phase (owner, standby) applies the same
//! rule on the same port; the secrets, the TLS pair and the upstream secret are then re-read by
//! the [`Reloader`] (PROTOCOL.md §15.1), whose snapshots the edge's readers follow.

use std::any::Any;
use std::sync::Arc;

use actix_web::body::MessageBody;
use actix_web::dev::{AppConfig, Extensions, Response, Service, ServiceFactory};
use actix_web::rt::net::TcpStream;
use actix_web::HttpServer;
use change_streamer_actors::secret::LiveSecret;

use crate::config::Config;
use crate::http::access::Access;
use crate::reload::Reloader;
use crate::start_error::StartError;
use crate::tls;

/// The loaded edge configuration (see the module documentation).
#[derive(Clone)]
pub struct Edge {
    pub access: Arc<Access>,
    /// `Some` with `--tls-cert`/`--tls-key`.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// `Some` for a `wss://` `--upstream` or with `--upstream-ca-file`.
    pub upstream_tls: Option<Arc<rustls::ClientConfig>>,
    pub upstream_secret: Option<LiveSecret>,
}

impl Edge {
    /// Reads and checks every file and secret the flags name, and starts their [`Reloader`]
    /// (from now on `SIGHUP` reloads, never stops the service).
    pub fn load(config: &Config) -> Result<Edge, StartError> {
        let secrets = config.secret()?;
        let pair = match tls::server_files(config.tls_cert.as_deref(), config.tls_key.as_deref())? {
            Some((cert, key)) => Some((tls::certified_key(cert, key)?, cert.into(), key.into())),
            None => None,
        };
        let wss = config
            .upstream
            .as_deref()
            .is_some_and(|u| u.starts_with("wss:"));
        let upstream_tls = if wss || config.upstream_ca_file.is_some() {
            Some(tls::upstream_config(config.upstream_ca_file.as_deref())?)
        } else {
            None
        };
        let upstream_secret = config
            .upstream_secret()?
            .zip(config.upstream_secret_file.clone());
        let (reloader, loaded) = Reloader::new(
            secrets.map(|s| (s, config.secret_file.clone())),
            pair,
            upstream_secret,
        );
        let edge = Edge {
            access: Arc::new(Access::from_config(config, loaded.secrets)),
            tls: loaded.certificate.map(tls::server_config).transpose()?,
            upstream_tls,
            upstream_secret: loaded.upstream_secret,
        };
        reloader.start();
        Ok(edge)
    }

    /// `http` or `https`, as the port speaks.
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// `server` listening on `listener`, over TLS when it is on.
    pub fn listen<F, I, S, B>(
        &self,
        server: HttpServer<F, I, S, B>,
        listener: std::net::TcpListener,
    ) -> std::io::Result<HttpServer<F, I, S, B>>
    where
        F: Fn() -> I + Send + Clone + 'static,
        I: actix_service::IntoServiceFactory<S, actix_http::Request>,
        S: ServiceFactory<actix_http::Request, Config = AppConfig> + 'static,
        S::Error: Into<actix_web::Error> + 'static,
        S::InitError: std::fmt::Debug,
        S::Response: Into<Response<B>> + 'static,
        <S::Service as Service<actix_http::Request>>::Future: 'static,
        S::Service: 'static,
        B: MessageBody + 'static,
    {
        match &self.tls {
            Some(tls) => server.listen_rustls_0_23(listener, (**tls).clone()),
            None => server.listen(listener),
        }
    }
}

/// For `HttpServer::on_connect`: no Nagle delay on an accepted connection, plain or TLS
/// (replication frames are small and latency matters).
pub fn no_delay(conn: &dyn Any, _: &mut Extensions) {
    let tcp = conn.downcast_ref::<TcpStream>().or_else(|| {
        conn.downcast_ref::<actix_tls::accept::rustls_0_23::TlsStream<TcpStream>>()
            .map(|tls| tls.get_ref().0)
    });
    if let Some(tcp) = tcp {
        let _ = tcp.set_nodelay(true);
    }
}
