//! One connect to the change source: TCP, TLS and the websocket upgrade, over the configured
//! roots and with the secret, bounded as a whole by the connect timeout (PROTOCOL.md §4,
//! "Connect timeout": two ping intervals). awc's own timeouts (5 s for each part by default)
//! are set past it, so that the documented one is the one that holds.

use std::time::Duration;

use super::{ConnectionEnd, UpstreamConfig, MAX_FRAME};

/// A websocket connection to the change source.
pub(super) type Framed = actix_codec::Framed<awc::BoxedSocket, awc::ws::Codec>;

/// Why a connect failed.
pub(super) enum ConnectError {
    /// It did not complete within the limit (the wait is the limit).
    TimedOut(Duration),
    Failed(awc::error::WsClientError),
}

impl From<ConnectError> for ConnectionEnd {
    fn from(e: ConnectError) -> ConnectionEnd {
        use awc::error::WsClientError::InvalidResponseStatus;
        use awc::http::StatusCode;
        match e {
            ConnectError::TimedOut(limit) => ConnectionEnd::ConnectTimeout(limit),
            ConnectError::Failed(InvalidResponseStatus(code))
                if code == StatusCode::UNAUTHORIZED || code == StatusCode::FORBIDDEN =>
            {
                ConnectionEnd::Refused(code)
            }
            ConnectError::Failed(e) => ConnectionEnd::Ws(format!("connecting: {e}")),
        }
    }
}

/// Connects to `url`, giving up after `limit`.
pub(super) async fn connect_within(
    cfg: &UpstreamConfig,
    url: &str,
    limit: Duration,
) -> Result<(awc::ClientResponse, Framed), ConnectError> {
    match tokio::time::timeout(limit, connect(cfg, url, limit)).await {
        Err(_) => Err(ConnectError::TimedOut(limit)),
        Ok(res) => res.map_err(ConnectError::Failed),
    }
}

/// One websocket handshake with the change source at `url`, over `cfg`'s TLS roots and with
/// its secret. (An error of awc names the URL and the status, never a header.)
async fn connect(
    cfg: &UpstreamConfig,
    url: &str,
    limit: Duration,
) -> Result<(awc::ClientResponse, Framed), awc::error::WsClientError> {
    // Past the limit: the outer timeout is the one that fires.
    let inner = limit + Duration::from_secs(1);
    // With TLS, the roots and the ALPN (http/1.1 only) are the given configuration's: the
    // builder's `max_http_version` would replace it with awc's own.
    let client = match &cfg.tls {
        Some(tls) => awc::Client::builder()
            .connector(
                awc::Connector::new()
                    .rustls_0_23(tls.clone())
                    .timeout(inner)
                    .handshake_timeout(inner),
            )
            .timeout(inner)
            .finish(),
        None => awc::Client::builder()
            .connector(
                awc::Connector::new()
                    .timeout(inner)
                    .handshake_timeout(inner),
            )
            .max_http_version(awc::http::Version::HTTP_11)
            .timeout(inner)
            .finish(),
    };
    let mut request = client.ws(url).max_frame_size(MAX_FRAME);
    if let Some(secret) = &cfg.secret {
        let header = secret.borrow().bearer_header();
        request = request.header(awc::http::header::AUTHORIZATION, header);
    }
    request.connect().await
}
