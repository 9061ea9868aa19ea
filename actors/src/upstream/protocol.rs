//! The custom change source's wire format (PROTOCOL.md §4): the messages it sends, parsed from text
//! frames, and the acks we send back.
//!
//! Each frame is one JSON array. Payloads stay text (`RawValue`), so what is stored and
//! forwarded is byte-for-byte what arrived; only the small third elements are decoded. Frame-level
//! rules live here (shape, kinds, LexiVersions); ordering rules (begin before data, matching
//! watermarks) belong to the streamer, which knows where a transaction stands.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::watermark::Watermark;

/// One message from the change source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamMessage {
    Begin {
        payload: String,
        commit_watermark: Watermark,
        skip_ack: bool,
    },
    Data {
        payload: String,
    },
    Commit {
        payload: String,
        watermark: Watermark,
    },
    Rollback {
        payload: String,
    },
    /// A position without changes; echoed back once everything before it is durable.
    Status {
        ack: bool,
        watermark: Watermark,
    },
    /// `["control", {"tag":"reset-required", ...}]`.
    ResetRequired {
        message: String,
    },
}

/// The ack of a stored commit: `["status",{"tag":"commit"},{"watermark":W}]`.
pub fn commit_ack(w: &Watermark) -> String {
    format!(r#"["status",{{"tag":"commit"}},{{"watermark":"{w}"}}]"#)
}

/// The echo of a `status` message that asked for an ack: `["status",{"ack":true},{"watermark":W}]`.
pub fn status_ack(w: &Watermark) -> String {
    format!(r#"["status",{{"ack":true}},{{"watermark":"{w}"}}]"#)
}

/// A frame that breaks the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame is not JSON: {0}")]
    NotJson(String),
    #[error("frame is not an array of [kind, payload, ...]")]
    NotAnArray,
    #[error("unknown message kind {0:?}")]
    UnknownKind(String),
    #[error("{kind} message lacks its {field}")]
    Missing {
        kind: &'static str,
        field: &'static str,
    },
    #[error("{kind} message has an invalid watermark: {source}")]
    BadWatermark {
        kind: &'static str,
        source: crate::watermark::InvalidWatermark,
    },
    #[error("unknown control message {0:?}")]
    UnknownControl(String),
}

#[derive(Deserialize)]
struct BeginExtra {
    #[serde(rename = "commitWatermark")]
    commit_watermark: Option<String>,
}

#[derive(Deserialize)]
struct WatermarkExtra {
    watermark: Option<String>,
}

#[derive(Deserialize)]
struct Flags {
    #[serde(rename = "skipAck", default)]
    skip_ack: bool,
    #[serde(default = "yes")]
    ack: bool,
    tag: Option<String>,
    message: Option<String>,
}

fn yes() -> bool {
    true
}

fn watermark(
    kind: &'static str,
    extra: Option<&RawValue>,
    begin: bool,
) -> Result<Watermark, FrameError> {
    let field = if begin {
        "commitWatermark"
    } else {
        "watermark"
    };
    let missing = FrameError::Missing { kind, field };
    let raw = extra.ok_or(missing.clone())?.get();
    let w = if begin {
        serde_json::from_str::<BeginExtra>(raw)
            .ok()
            .and_then(|e| e.commit_watermark)
    } else {
        serde_json::from_str::<WatermarkExtra>(raw)
            .ok()
            .and_then(|e| e.watermark)
    }
    .ok_or(missing)?;
    Watermark::parse(&w).map_err(|source| FrameError::BadWatermark { kind, source })
}

fn flags(payload: &RawValue) -> Flags {
    serde_json::from_str(payload.get()).unwrap_or(Flags {
        skip_ack: false,
        ack: true,
        tag: None,
        message: None,
    })
}

/// The first three elements of a frame's array, borrowed from its text. Any further elements
/// are checked as JSON and ignored. Read without collecting the elements, since a frame is
/// parsed for every change: no allocation but the payload's own copy.
struct Parts<'a>([Option<&'a RawValue>; 3]);

impl<'de> Deserialize<'de> for Parts<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Elements;
        impl<'de> Visitor<'de> for Elements {
            type Value = Parts<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array of [kind, payload, ...]")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Parts<'de>, A::Error> {
                let mut parts = [None; 3];
                for part in &mut parts {
                    *part = seq.next_element()?;
                    if part.is_none() {
                        return Ok(Parts(parts));
                    }
                }
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Parts(parts))
            }
        }
        d.deserialize_seq(Elements)
    }
}

/// The text of a JSON string, borrowed when it has no escapes (every kind the protocol has).
fn string(raw: &RawValue) -> Option<Cow<'_, str>> {
    let text = raw.get();
    match text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
        Some(plain) if !plain.contains('\\') => Some(Cow::Borrowed(plain)),
        _ => serde_json::from_str::<String>(text).ok().map(Cow::Owned),
    }
}

/// Parses one text frame.
pub fn parse_frame(text: &str) -> Result<UpstreamMessage, FrameError> {
    let Parts([kind, payload, extra]) = match serde_json::from_str(text) {
        Ok(p) => p,
        Err(e) if e.classify() == serde_json::error::Category::Data => {
            return Err(FrameError::NotAnArray)
        }
        Err(e) => return Err(FrameError::NotJson(e.to_string())),
    };
    let kind = kind.and_then(string).ok_or(FrameError::NotAnArray)?;
    let payload = payload.ok_or(FrameError::NotAnArray)?;
    if !payload.get().starts_with('{') {
        return Err(FrameError::NotAnArray);
    }
    Ok(match kind.as_ref() {
        "begin" => UpstreamMessage::Begin {
            commit_watermark: watermark("begin", extra, true)?,
            skip_ack: flags(payload).skip_ack,
            payload: payload.get().to_string(),
        },
        "data" => UpstreamMessage::Data {
            payload: payload.get().to_string(),
        },
        "commit" => UpstreamMessage::Commit {
            watermark: watermark("commit", extra, false)?,
            payload: payload.get().to_string(),
        },
        "rollback" => UpstreamMessage::Rollback {
            payload: payload.get().to_string(),
        },
        "status" => UpstreamMessage::Status {
            ack: flags(payload).ack,
            watermark: watermark("status", extra, false)?,
        },
        "control" => {
            let f = flags(payload);
            match f.tag.as_deref() {
                Some("reset-required") => UpstreamMessage::ResetRequired {
                    message: f.message.unwrap_or_default(),
                },
                other => return Err(FrameError::UnknownControl(other.unwrap_or("").to_string())),
            }
        }
        _ => return Err(FrameError::UnknownKind(kind.into_owned())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(s: &str) -> Watermark {
        Watermark::parse(s).unwrap()
    }

    #[test]
    fn parses_every_kind() {
        assert_eq!(
            parse_frame(r#"["begin",{"tag":"begin","skipAck":true},{"commitWatermark":"0a"}]"#),
            Ok(UpstreamMessage::Begin {
                payload: r#"{"tag":"begin","skipAck":true}"#.into(),
                commit_watermark: w("0a"),
                skip_ack: true
            })
        );
        assert_eq!(
            parse_frame(r#"["data", {"tag":"insert","v":123456789012345678901234567890}]"#),
            Ok(UpstreamMessage::Data {
                payload: r#"{"tag":"insert","v":123456789012345678901234567890}"#.into()
            })
        );
        assert_eq!(
            parse_frame(r#"["commit",{"tag":"commit"},{"watermark":"0a"}]"#),
            Ok(UpstreamMessage::Commit {
                payload: r#"{"tag":"commit"}"#.into(),
                watermark: w("0a")
            })
        );
        assert_eq!(
            parse_frame(r#"["status",{},{"watermark":"0b"}]"#),
            Ok(UpstreamMessage::Status {
                ack: true,
                watermark: w("0b")
            })
        );
        assert_eq!(
            parse_frame(r#"["status",{"ack":false},{"watermark":"0b"}]"#),
            Ok(UpstreamMessage::Status {
                ack: false,
                watermark: w("0b")
            })
        );
        assert_eq!(
            parse_frame(r#"["control",{"tag":"reset-required","message":"slot lost"}]"#),
            Ok(UpstreamMessage::ResetRequired {
                message: "slot lost".into()
            })
        );
    }

    #[test]
    fn builds_acks() {
        assert_eq!(
            commit_ack(&w("0a")),
            r#"["status",{"tag":"commit"},{"watermark":"0a"}]"#
        );
        assert_eq!(
            status_ack(&w("0b")),
            r#"["status",{"ack":true},{"watermark":"0b"}]"#
        );
    }

    #[test]
    fn reads_kinds_with_escapes_and_ignores_elements_past_the_third() {
        assert_eq!(
            parse_frame(r#"["d\u0061ta",{"tag":"insert"}]"#),
            Ok(UpstreamMessage::Data {
                payload: r#"{"tag":"insert"}"#.into()
            })
        );
        assert_eq!(
            parse_frame(r#"["commit",{"tag":"commit"},{"watermark":"0a"},[1,{"x":2}],"more"]"#),
            Ok(UpstreamMessage::Commit {
                payload: r#"{"tag":"commit"}"#.into(),
                watermark: w("0a")
            })
        );
        assert!(matches!(
            parse_frame(r#"["data",{"tag":"insert"},{},[1,]]"#),
            Err(FrameError::NotJson(_))
        ));
        assert_eq!(
            parse_frame(r#"["x\"y",{}]"#),
            Err(FrameError::UnknownKind("x\"y".into()))
        );
    }

    #[test]
    fn rejects_broken_frames() {
        assert!(matches!(parse_frame("nope"), Err(FrameError::NotJson(_))));
        assert_eq!(parse_frame(r#"{"a":1}"#), Err(FrameError::NotAnArray));
        assert_eq!(parse_frame(r#"["data"]"#), Err(FrameError::NotAnArray));
        assert_eq!(parse_frame(r#"[]"#), Err(FrameError::NotAnArray));
        assert_eq!(parse_frame(r#"[7,{}]"#), Err(FrameError::NotAnArray));
        assert_eq!(parse_frame(r#"["data",[1]]"#), Err(FrameError::NotAnArray));
        assert_eq!(
            parse_frame(r#"["nope",{}]"#),
            Err(FrameError::UnknownKind("nope".into()))
        );
        assert!(matches!(
            parse_frame(r#"["commit",{"tag":"commit"},{"watermark":"0A"}]"#),
            Err(FrameError::BadWatermark { .. })
        ));
        assert!(matches!(
            parse_frame(r#"["begin",{"tag":"begin"}]"#),
            Err(FrameError::Missing { .. })
        ));
    }
}
