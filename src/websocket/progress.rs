//! The one message a snapshot client sends besides its acks: `["progress", {"bytes": n}]`
//! (PROTOCOL.md §6.8), read here.
//!
//! A text frame that is a JSON array (its first character after whitespace is `[`) is taken for
//! a progress message and must be exactly that; any other text is an ack (§5) and is checked by
//! the framing. So each bad frame gets the reason of what it tried to be.

use serde_json::Value;

/// The largest `bytes` accepted: 2^63 − 1.
pub const MAX_BYTES: u64 = i64::MAX as u64;

/// A progress message that breaks PROTOCOL.md §6.8 (the session closes with 1002 and this).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProgressError {
    #[error("bad progress message: expected [\"progress\", {{\"bytes\": n}}]")]
    Shape,
    #[error(
        "bad progress message: bytes must be an integer from 0 to 9223372036854775807, got {0}"
    )]
    Bytes(String),
    #[error("progress before the status message")]
    BeforeStatus,
}

/// The close reason of a snapshot client's text frame that is neither an ack nor an array.
pub const NEITHER: &str = "expected {\"ack\": n} or [\"progress\", {\"bytes\": n}]";

/// `None` when `text` is not an array (an ack, for the framing to check); else the bytes of a
/// well-formed progress message, or what is wrong with it.
pub fn parse(text: &str) -> Option<Result<u64, ProgressError>> {
    if !text.trim_start().starts_with('[') {
        return None;
    }
    Some(bytes_of(text))
}

fn bytes_of(text: &str) -> Result<u64, ProgressError> {
    let value: Value = serde_json::from_str(text).map_err(|_| ProgressError::Shape)?;
    let body = match value.as_array().map(Vec::as_slice) {
        Some([Value::String(kind), Value::Object(body)]) if kind == "progress" => body,
        _ => return Err(ProgressError::Shape),
    };
    let bytes = match body.get("bytes") {
        Some(b) if body.len() == 1 => b,
        _ => return Err(ProgressError::Shape),
    };
    bytes
        .as_u64()
        .filter(|&b| b <= MAX_BYTES)
        .ok_or_else(|| ProgressError::Bytes(bytes.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_progress_message_gives_its_bytes() {
        assert_eq!(parse(r#"["progress",{"bytes":229376}]"#), Some(Ok(229376)));
        assert_eq!(parse(r#" [ "progress" , { "bytes" : 0 } ] "#), Some(Ok(0)));
        assert_eq!(
            parse(r#"["progress",{"bytes":9223372036854775807}]"#),
            Some(Ok(MAX_BYTES))
        );
    }

    #[test]
    fn an_ack_or_other_text_is_left_to_the_framing() {
        assert_eq!(parse(r#"{"ack":1}"#), None);
        assert_eq!(parse("hello"), None);
        assert_eq!(parse(""), None);
    }

    #[test]
    fn bad_progress_messages_say_what_is_wrong() {
        let shape = Some(Err(ProgressError::Shape));
        for text in [
            "[progress",
            "[]",
            r#"["progress"]"#,
            r#"["progress",{}]"#,
            r#"["progress",{"bytes":1,"pages":2}]"#,
            r#"["progres",{"bytes":1}]"#,
            r#"["progress",[1]]"#,
            r#"["progress",{"bytes":1},3]"#,
        ] {
            assert_eq!(parse(text), shape, "{text}");
        }
        for (text, got) in [
            (r#"["progress",{"bytes":-5}]"#, "-5"),
            (r#"["progress",{"bytes":1.5}]"#, "1.5"),
            (r#"["progress",{"bytes":1e3}]"#, "1000.0"),
            (r#"["progress",{"bytes":"7"}]"#, "\"7\""),
            (r#"["progress",{"bytes":null}]"#, "null"),
            (
                r#"["progress",{"bytes":9223372036854775808}]"#,
                "9223372036854775808",
            ),
        ] {
            assert_eq!(
                parse(text),
                Some(Err(ProgressError::Bytes(got.into()))),
                "{text}"
            );
        }
    }
}
