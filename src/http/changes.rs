//! `GET /replication/v{N}/changes?id=&taskID=&mode=&backup=&replicaVersion=&watermark=&initial=&wsBatched=`
//! (PROTOCOL.md §7, §5): checks the parameters and starts a [`SubscriberSession`], at the owner
//! ([`changes`]) or at a serving standby ([`subscribe`], PROTOCOL.md §14.1).

use std::collections::HashMap;
use std::time::Duration;

use actix::{Addr, Recipient};
use actix_web::{web, HttpRequest, HttpResponse};
use change_streamer_actors::reservation::EndBySubscription;
use change_streamer_actors::streamer::{Mode, Streamer};
use change_streamer_actors::watermark::Watermark;

use super::{open_websocket, query_map, refuse, start_session, AppState, Opening};
use crate::shutdown::Guards;
use crate::websocket::raw_frames::with_raw_frames;
use crate::websocket::subscriber_socket::{SubscriberSession, SubscriptionParams};

/// Checks the query of a subscription; the error is the close reason.
pub fn parse_params(
    protocol: u32,
    q: &HashMap<String, String>,
) -> Result<SubscriptionParams, String> {
    let required = |name: &str| -> Result<String, String> {
        match q.get(name) {
            Some(v) if !v.is_empty() => Ok(v.clone()),
            _ => Err(format!("Missing {name} in subscription request")),
        }
    };
    let id = required("id")?;
    let replica_version = required("replicaVersion")?;
    let watermark = required("watermark")?;
    let watermark = Watermark::parse(&watermark).map_err(|_| {
        format!("Invalid watermark in subscription request: {watermark:?} is not a LexiVersion")
    })?;
    let initial = boolean(q, "initial", true)?;
    let batched = boolean(q, "wsBatched", false)?;
    let mode = Mode::parse(q.get("mode").map(String::as_str));
    let backup = q.get("backup").filter(|b| !b.is_empty()).cloned();
    if backup.is_some() && mode != Mode::Backup {
        return Err("Invalid backup in subscription request: only with mode=backup".into());
    }
    Ok(SubscriptionParams {
        protocol,
        id,
        task_id: q.get("taskID").filter(|t| !t.is_empty()).cloned(),
        mode,
        backup,
        replica_version,
        watermark,
        initial,
        batched,
    })
}

/// A boolean parameter: `true`, `false`, absent (false) or, when `empty_is_false`, empty.
fn boolean(q: &HashMap<String, String>, name: &str, empty_is_false: bool) -> Result<bool, String> {
    match q.get(name).map(String::as_str) {
        None | Some("false") => Ok(false),
        Some("") if empty_is_false => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(format!(
            "Invalid {name} in subscription request: {other:?} (true or false)"
        )),
    }
}

pub fn changes(
    req: &HttpRequest,
    stream: web::Payload,
    version: &str,
    state: &AppState,
) -> Result<HttpResponse, actix_web::Error> {
    let subscribing = Subscribing {
        streamer: state.streamer.clone(),
        reservations: state
            .backup
            .as_ref()
            .map(|b| b.reservations.clone().recipient()),
        ping_interval: state.config.ping_interval(),
        guards: &state.guards,
    };
    subscribe(req, stream, version, subscribing)
}

/// What a subscription is served with: the owner's actors, or a serving standby's streamer
/// and reservations.
pub struct Subscribing<'a> {
    pub streamer: Addr<Streamer>,
    /// Told of an accepted `initial=true` subscription of a task.
    pub reservations: Option<Recipient<EndBySubscription>>,
    pub ping_interval: Duration,
    pub guards: &'a Guards,
}

/// Checks a subscription request and starts its [`SubscriberSession`].
pub fn subscribe(
    req: &HttpRequest,
    stream: web::Payload,
    version: &str,
    with: Subscribing<'_>,
) -> Result<HttpResponse, actix_web::Error> {
    let req = req.clone();
    let v = match open_websocket(&req, version) {
        Opening::Proceed(v) => v,
        Opening::Answer(response) => return Ok(response),
        Opening::Refuse(reason) => return refuse(&req, stream, reason),
    };
    let params = match query_map(&req).and_then(|q| parse_params(v, &q)) {
        Ok(p) => p,
        Err(reason) => return refuse(&req, stream, reason),
    };
    let session =
        SubscriberSession::new(params, with.streamer, with.reservations, with.ping_interval);
    let raw = session.raw_frames();
    let response = start_session(session, &req, stream, with.guards)?;
    Ok(with_raw_frames(response, raw))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_a_subscription() {
        let p = parse_params(
            6,
            &q(&[
                ("id", "vs1"),
                ("taskID", "t1"),
                ("mode", "backup"),
                ("replicaVersion", "123"),
                ("watermark", "0a"),
                ("initial", "true"),
            ]),
        )
        .unwrap();
        assert_eq!((p.mode, p.backup), (Mode::Backup, None));
        assert!(p.initial);
        assert_eq!(p.task_id.as_deref(), Some("t1"));
        let p = parse_params(
            6,
            &q(&[
                ("id", "vs1"),
                ("taskID", ""),
                ("replicaVersion", "123"),
                ("watermark", "0a"),
            ]),
        )
        .unwrap();
        assert_eq!((p.mode, p.initial, p.task_id), (Mode::Serving, false, None));
        assert!(!p.batched);
        for (v, want) in [("true", true), ("false", false)] {
            let p = parse_params(
                6,
                &q(&[
                    ("id", "a"),
                    ("replicaVersion", "1"),
                    ("watermark", "0a"),
                    ("wsBatched", v),
                ]),
            )
            .unwrap();
            assert_eq!(p.batched, want);
        }
    }

    #[test]
    fn the_backup_parameter_names_the_backup_of_a_backup_replicator_only() {
        let base = [("id", "r"), ("replicaVersion", "1"), ("watermark", "0a")];
        let with = |extra: &[(&'static str, &'static str)]| {
            let pairs: Vec<_> = base.iter().chain(extra).copied().collect();
            parse_params(6, &q(&pairs))
        };
        let p = with(&[("mode", "backup"), ("backup", "s3-east")]).unwrap();
        assert_eq!(p.backup.as_deref(), Some("s3-east"));
        let p = with(&[("mode", "backup"), ("backup", "")]).unwrap();
        assert_eq!(p.backup, None, "empty is the only backup");
        assert_eq!(with(&[("backup", "")]).unwrap().backup, None);
        for mode in [None, Some("serving"), Some("Backup")] {
            let mut extra = vec![("backup", "s3-east")];
            extra.extend(mode.map(|m| ("mode", m)));
            let e = with(&extra).unwrap_err();
            assert_eq!(
                e, "Invalid backup in subscription request: only with mode=backup",
                "{mode:?}"
            );
        }
    }

    #[test]
    fn names_the_bad_parameter() {
        let base = [
            ("id", "vs1"),
            ("replicaVersion", "123"),
            ("watermark", "0a"),
        ];
        for missing in ["id", "replicaVersion", "watermark"] {
            let pairs: Vec<_> = base
                .iter()
                .copied()
                .filter(|(k, _)| *k != missing)
                .collect();
            let e = parse_params(6, &q(&pairs)).unwrap_err();
            assert!(e.contains(missing), "{e}");
        }
        let e = parse_params(
            6,
            &q(&[("id", "a"), ("replicaVersion", "1"), ("watermark", "0A")]),
        )
        .unwrap_err();
        assert!(e.contains("watermark"), "{e}");
        let e = parse_params(
            6,
            &q(&[
                ("id", "a"),
                ("replicaVersion", "1"),
                ("watermark", "0a"),
                ("initial", "yes"),
            ]),
        )
        .unwrap_err();
        assert!(e.contains("initial"), "{e}");
        for bad in ["yes", "", "TRUE", "1"] {
            let e = parse_params(
                6,
                &q(&[
                    ("id", "a"),
                    ("replicaVersion", "1"),
                    ("watermark", "0a"),
                    ("wsBatched", bad),
                ]),
            )
            .unwrap_err();
            assert!(e.starts_with("Invalid wsBatched"), "{e}");
        }
    }
}
