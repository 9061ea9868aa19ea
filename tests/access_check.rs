//! Property tests of the access rule on the request path (PROTOCOL.md §15): whatever headers,
//! path and query string a request carries, the check never panics, and never lets a request
//! through to a guarded path without the secret; with it (one `Authorization` header) the
//! request is let through whatever else it carries. Protected mode never serves a peer off
//! loopback.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::test::TestRequest;
use change_streamer::http::access::{is_loopback, Access, Mode, Refusal, OPEN_PATHS};
use change_streamer_actors::secret::{Secret, Secrets};
use proptest::prelude::*;

const SECRET: &str = "proptest-secret-0123456789";

/// A path: one of ours (guarded or open), or anything.
fn path() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("/status".to_string()),
        Just("/replication/v6/changes".to_string()),
        Just("/replication/v6/snapshot".to_string()),
        Just("/%72eplication/v6/changes".to_string()),
        Just("/healthz".to_string()),
        Just("/metrics".to_string()),
        "/[ -~]{0,40}",
    ]
}

/// Header values, some of them shaped like an attempt.
fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64),
        "[ -~]{0,40}".prop_map(|s| format!("Bearer {s}").into_bytes()),
        "[ -~]{0,40}".prop_map(|s| format!("bearer {}{s}", &SECRET[..10]).into_bytes()),
    ]
}

fn headers() -> impl Strategy<Value = Vec<(String, Vec<u8>)>> {
    let name = prop_oneof![
        Just("authorization".to_string()),
        Just("Authorization".to_string()),
        "[a-zA-Z0-9-]{1,20}",
        "[ -~]{0,20}",
    ];
    proptest::collection::vec((name, value()), 0..8)
}

/// The request, or `None` when its parts cannot make one (an invalid URI, header name or
/// value: the HTTP parser would have refused it before any check).
fn request(
    path: &str,
    query: &str,
    headers: &[(String, Vec<u8>)],
    peer: IpAddr,
) -> Option<actix_web::dev::ServiceRequest> {
    let uri = format!("{path}?{query}");
    uri.parse::<actix_web::http::Uri>().ok()?;
    let mut req = TestRequest::get()
        .uri(&uri)
        .peer_addr(SocketAddr::new(peer, 40000));
    for (name, value) in headers {
        let name = HeaderName::from_bytes(name.as_bytes()).ok()?;
        let value = HeaderValue::from_bytes(value).ok()?;
        req = req.append_header((name, value));
    }
    Some(req.to_srv_request())
}

fn is_open(req: &actix_web::dev::ServiceRequest) -> bool {
    OPEN_PATHS.contains(&req.match_info().as_str())
}

proptest! {
    #[test]
    fn arbitrary_requests_never_authenticate_without_the_secret(
        path in path(), query in "[ -~]{0,60}", headers in headers(),
    ) {
        let access = Access::new(Mode::fixed(Secrets::one(Secret::new(SECRET).unwrap())));
        let Some(req) = request(&path, &query, &headers, Ipv4Addr::LOCALHOST.into()) else {
            return Ok(());
        };
        let verdict = access.admit(&req);
        prop_assert!(verdict.is_err() || is_open(&req), "{path}?{query} {headers:?}: {verdict:?}");
    }

    #[test]
    fn the_secret_authenticates_whatever_else_the_request_carries(
        path in path(), query in "[ -~]{0,60}", headers in headers(),
    ) {
        let access = Access::new(Mode::fixed(Secrets::one(Secret::new(SECRET).unwrap())));
        let mut headers: Vec<_> = headers
            .into_iter()
            .filter(|(n, _)| !n.eq_ignore_ascii_case("authorization"))
            .collect();
        headers.push(("Authorization".into(), format!("Bearer {SECRET}").into_bytes()));
        let Some(req) = request(&path, &query, &headers, Ipv4Addr::LOCALHOST.into()) else {
            return Ok(());
        };
        prop_assert_eq!(access.admit(&req), Ok(()));
    }

    #[test]
    fn protected_mode_never_serves_a_peer_off_loopback(
        path in path(), query in "[ -~]{0,60}", headers in headers(), peer in any::<IpAddr>(),
    ) {
        let access = Access::new(Mode::Protected);
        let Some(req) = request(&path, &query, &headers, peer) else {
            return Ok(());
        };
        let verdict = access.admit(&req);
        if is_open(&req) || is_loopback(peer) {
            prop_assert_eq!(verdict, Ok(()));
        } else {
            prop_assert_eq!(verdict, Err(Refusal::NotLoopback));
        }
    }
}
