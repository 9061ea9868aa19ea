//! Who may reach the change stream (PROTOCOL.md §15): the one access rule, checked on every
//! request before anything else is done for it (routing, the websocket upgrade, any actor).
//!
//! Three modes, chosen at start from the flags:
//! - **secret** (`--secret-file` or `--secret`): a request must carry
//!   `Authorization: Bearer <secret>`, one of the one or two secrets configured (PROTOCOL.md
//!   §15.1); otherwise 401 with `WWW-Authenticate: Bearer`. The secrets are the reloader's
//!   latest snapshot ([`crate::reload`]), read through a `watch` receiver: the rule never
//!   waits for a reload, and a reload never sees a request half-checked;
//! - **protected** (no secret): only loopback peers are served; others get 403 naming the two
//!   flags that change it;
//! - **open** (`--allow-unauthenticated`, no secret): everyone is served.
//!
//! Why the open paths are a list and not the guarded ones: `/healthz`, `/readyz` and `/metrics`
//! stay open for probes and scrapers, and every other path is guarded, so no spelling of a
//! path that the router would still match (percent-encoding, a future route) can slip past.
//! The path compared is the router's own (percent-decoded) one.
//!
//! Each refusal is counted (`change_streamer_auth_failures_total{reason}`) and logged with the
//! peer's address, never with anything the client presented; each admission with a secret is
//! counted by which one (`change_streamer_auth_success_total{secret}`).

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use actix_web::dev::{Service, ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderMap, AUTHORIZATION, WWW_AUTHENTICATE};
use actix_web::HttpResponse;
use change_streamer_actors::secret::{Secrets, MAX_SECRETS};
use futures_util::future::{ready, Either, Ready};
use tokio::sync::watch;

use crate::config::Config;

/// Paths served to anyone, whatever the mode.
/// `/` is the live page (PROTOCOL.md §11.2), which holds no data: what it shows it reads from
/// `/status`, guarded, with the secret the operator types in.
pub const OPEN_PATHS: &[&str] = &["/", "/healthz", "/readyz", "/metrics"];

/// The access mode of the service.
#[derive(Debug)]
pub enum Mode {
    /// The secrets as last loaded (PROTOCOL.md §15.1).
    Secret(watch::Receiver<Arc<Secrets>>),
    Protected,
    Open,
}

impl Mode {
    /// Secret mode with `secrets` for good (nothing reloads them).
    pub fn fixed(secrets: Secrets) -> Mode {
        Mode::Secret(watch::channel(Arc::new(secrets)).1)
    }
}

/// Why a request was refused; the `reason` label of its metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization` header.
    Missing,
    /// An `Authorization` header that is not `Bearer <the secret>`.
    Wrong,
    /// No secret is set and the peer is not on loopback.
    NotLoopback,
}

impl Refusal {
    pub const ALL: [Refusal; 3] = [Refusal::Missing, Refusal::Wrong, Refusal::NotLoopback];

    pub fn reason(self) -> &'static str {
        match self {
            Refusal::Missing => "missing",
            Refusal::Wrong => "wrong",
            Refusal::NotLoopback => "not-loopback",
        }
    }

    /// The answer, in one line, before any upgrade.
    pub fn response(self) -> HttpResponse {
        match self {
            Refusal::Missing | Refusal::Wrong => HttpResponse::Unauthorized()
                .insert_header((WWW_AUTHENTICATE, "Bearer"))
                .content_type("text/plain")
                .body(match self {
                    Refusal::Missing => "this endpoint needs Authorization: Bearer <secret>\n",
                    _ => "wrong secret\n",
                }),
            Refusal::NotLoopback => HttpResponse::Forbidden().content_type("text/plain").body(
                "no secret is set, so only loopback clients are served: \
                 set one with --secret-file, or serve everyone with --allow-unauthenticated\n",
            ),
        }
    }
}

/// The access rule and its refusal and admission counts (atomics: every HTTP worker thread
/// counts here, and `/metrics` reads them; nothing else is shared).
#[derive(Debug)]
pub struct Access {
    mode: Mode,
    refused: [AtomicU64; 3],
    /// Admissions by the secret presented (1 and 2, PROTOCOL.md §15.1).
    admitted: [AtomicU64; MAX_SECRETS],
}

/// Refusals since start, by reason, and admissions with a secret, by which.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AuthFailures {
    pub missing: u64,
    pub wrong: u64,
    pub not_loopback: u64,
    /// Admitted with secret 1, and with secret 2.
    pub successes: [u64; MAX_SECRETS],
}

impl Access {
    pub fn new(mode: Mode) -> Access {
        Access {
            mode,
            refused: Default::default(),
            admitted: Default::default(),
        }
    }

    /// The mode the flags ask for: `secrets` as the reloader publishes them, if any.
    pub fn from_config(config: &Config, secrets: Option<watch::Receiver<Arc<Secrets>>>) -> Access {
        Access::new(match secrets {
            Some(s) => Mode::Secret(s),
            None if config.allow_unauthenticated => Mode::Open,
            None => Mode::Protected,
        })
    }

    pub fn mode(&self) -> &Mode {
        &self.mode
    }

    /// Logs which mode is on (once, at start), for the service on `addr`.
    pub fn log_mode(&self, addr: &str, allow_unauthenticated: bool) {
        match &self.mode {
            Mode::Secret(_) => {
                log::info!("access: a secret is required on /replication/* and /status");
                if allow_unauthenticated {
                    log::warn!("access: --allow-unauthenticated is ignored: a secret is set");
                }
            }
            Mode::Protected => log::info!(
                "access: protected mode: no secret is set, so /replication/* and /status \
                 serve loopback clients only (--secret-file sets one)"
            ),
            Mode::Open => log::warn!(
                "access: --allow-unauthenticated: anyone who reaches {addr} can read the change \
                 stream and hold off its cleanup"
            ),
        }
    }

    /// The rule itself: whether a request for `path` with `headers` from `peer` is served.
    pub fn check(
        &self,
        path: &str,
        headers: &HeaderMap,
        peer: Option<IpAddr>,
    ) -> Result<(), Refusal> {
        self.check_which(path, headers, peer).map(|_| ())
    }

    /// [`check`](Self::check), answering which secret (1 or 2) was presented, if one was.
    fn check_which(
        &self,
        path: &str,
        headers: &HeaderMap,
        peer: Option<IpAddr>,
    ) -> Result<Option<usize>, Refusal> {
        if OPEN_PATHS.contains(&path) {
            return Ok(None);
        }
        match &self.mode {
            Mode::Open => Ok(None),
            Mode::Protected => match peer {
                Some(ip) if is_loopback(ip) => Ok(None),
                _ => Err(Refusal::NotLoopback),
            },
            Mode::Secret(secrets) => {
                let mut values = headers.get_all(AUTHORIZATION);
                let Some(first) = values.next() else {
                    return Err(Refusal::Missing);
                };
                // Two headers are one too many: which one counts would be a guess.
                let token = match (values.next(), bearer_token(first.as_bytes())) {
                    (None, Some(token)) => token,
                    _ => return Err(Refusal::Wrong),
                };
                // The snapshot is taken (an `Arc`) and the lock let go before comparing.
                let secrets = secrets.borrow().clone();
                secrets.which(token).map(Some).ok_or(Refusal::Wrong)
            }
        }
    }

    /// [`check`](Self::check) on a request, counting an admission with a secret, and counting
    /// and logging a refusal.
    pub fn admit(&self, req: &ServiceRequest) -> Result<(), Refusal> {
        let path = req.match_info().as_str();
        let peer = req.peer_addr();
        self.check_which(path, req.headers(), peer.map(|a| a.ip()))
            .map(|which| {
                if let Some(n) = which {
                    self.admitted[n - 1].fetch_add(1, Ordering::Relaxed);
                }
            })
            .inspect_err(|refusal| {
                self.refused[*refusal as usize].fetch_add(1, Ordering::Relaxed);
                let peer = peer.map_or_else(|| "an unknown peer".into(), |a| a.to_string());
                let shown: String = path.chars().take(64).collect();
                log::warn!(
                    "access: refused {shown} from {peer}: {}",
                    match refusal {
                        Refusal::Missing => "no secret presented",
                        Refusal::Wrong => "wrong secret",
                        Refusal::NotLoopback => "not on loopback and no secret set",
                    }
                );
            })
    }

    pub fn failures(&self) -> AuthFailures {
        let n = |r: Refusal| self.refused[r as usize].load(Ordering::Relaxed);
        AuthFailures {
            missing: n(Refusal::Missing),
            wrong: n(Refusal::Wrong),
            not_loopback: n(Refusal::NotLoopback),
            successes: self.admitted.each_ref().map(|a| a.load(Ordering::Relaxed)),
        }
    }
}

impl AuthFailures {
    pub fn get(&self, r: Refusal) -> u64 {
        match r {
            Refusal::Missing => self.missing,
            Refusal::Wrong => self.wrong,
            Refusal::NotLoopback => self.not_loopback,
        }
    }
}

/// The token of `Bearer <token>` (the scheme in any case, RFC 7235), or `None`.
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer ";
    let scheme = value.get(..SCHEME.len())?;
    if !scheme.eq_ignore_ascii_case(SCHEME) {
        return None;
    }
    Some(value[SCHEME.len()..].trim_ascii())
}

/// Loopback, as protected mode means it: 127.0.0.0/8, `::1`, and `::ffff:127.x.y.z` (an IPv4
/// client of a dual-stack socket).
pub fn is_loopback(ip: IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

/// The middleware that applies the rule first, for `App::wrap_fn`.
pub fn guard<S>(
    access: &Arc<Access>,
) -> impl Fn(ServiceRequest, &S) -> Either<Ready<Result<ServiceResponse, actix_web::Error>>, S::Future>
       + Clone
where
    S: Service<ServiceRequest, Response = ServiceResponse, Error = actix_web::Error>,
{
    let access = access.clone();
    move |req: ServiceRequest, srv: &S| match access.admit(&req) {
        Ok(()) => Either::Right(srv.call(req)),
        Err(refusal) => Either::Left(ready(Ok(req.into_response(refusal.response())))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    #[test]
    fn the_peer_rule_admits_loopback_only() {
        for ip in [
            "127.0.0.1",
            "127.1.2.3",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:127.9.9.9",
        ] {
            assert!(is_loopback(ip.parse().unwrap()), "{ip}");
        }
        for ip in [
            "10.213.0.1",
            "0.0.0.0",
            "::",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "192.168.1.1",
            "fe80::1",
            "2001:db8::1",
        ] {
            assert!(!is_loopback(ip.parse().unwrap()), "{ip}");
        }
        let access = Access::new(Mode::Protected);
        let none = HeaderMap::new();
        let mapped = IpAddr::V6(Ipv4Addr::LOCALHOST.to_ipv6_mapped());
        assert_eq!(access.check("/status", &none, Some(mapped)), Ok(()));
        assert_eq!(
            access.check("/status", &none, Some(IpAddr::V6(Ipv6Addr::UNSPECIFIED))),
            Err(Refusal::NotLoopback)
        );
        assert_eq!(
            access.check("/status", &none, None),
            Err(Refusal::NotLoopback)
        );
        let outside: IpAddr = "10.213.0.2".parse().unwrap();
        assert_eq!(access.check("/metrics", &none, Some(outside)), Ok(()));
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer_token(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"bEaReR  abc "), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"Basic abc"), None);
        assert_eq!(bearer_token(b"Bearer"), None);
    }
}
