//! The websocket framing both endpoints share (SPEC §5).
//!
//! The server sends `{"msg": <payload>, "id": n}` with `n` = 1, 2, 3, … per connection; the
//! client answers `{"ack": n}` once it has processed message `n`, always for the oldest message
//! not yet acked. Anything else is a protocol error that ends the connection (close 1002).

use serde::Deserialize;

/// Numbering of sent messages and checking of acks, for one connection.
#[derive(Debug, Default)]
pub struct Framing {
    last_sent: u64,
    last_acked: u64,
}

/// A client frame that breaks the framing rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    #[error("expected {{\"ack\": n}}")]
    NotAnAck,
    #[error("ack {got} out of order (expected {expected})")]
    OutOfOrder { got: u64, expected: u64 },
    #[error("ack {got} for a message not sent (last sent {last_sent})")]
    NotSent { got: u64, last_sent: u64 },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Ack {
    ack: u64,
}

impl Framing {
    /// Wraps a message JSON text in the next frame; returns the frame's id and text.
    pub fn frame(&mut self, message: &str) -> (u64, String) {
        self.last_sent += 1;
        let id = self.last_sent;
        let mut s = String::with_capacity(message.len() + 24);
        s.push_str("{\"msg\":");
        s.push_str(message);
        s.push_str(",\"id\":");
        s.push_str(&id.to_string());
        s.push('}');
        (id, s)
    }

    /// Checks a client text frame; returns the id it acks.
    pub fn ack(&mut self, text: &str) -> Result<u64, FramingError> {
        let Ack { ack } = serde_json::from_str(text).map_err(|_| FramingError::NotAnAck)?;
        if ack > self.last_sent {
            return Err(FramingError::NotSent {
                got: ack,
                last_sent: self.last_sent,
            });
        }
        if ack != self.last_acked + 1 {
            return Err(FramingError::OutOfOrder {
                got: ack,
                expected: self.last_acked + 1,
            });
        }
        self.last_acked = ack;
        Ok(ack)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_frames_and_accepts_acks_in_order() {
        let mut f = Framing::default();
        assert_eq!(
            f.frame(r#"["status",{"tag":"status"}]"#),
            (
                1,
                r#"{"msg":["status",{"tag":"status"}],"id":1}"#.to_string()
            )
        );
        assert_eq!(f.frame("[]").0, 2);
        assert_eq!(f.ack(r#"{"ack":1}"#), Ok(1));
        assert_eq!(f.ack(r#"{"ack": 2}"#), Ok(2));
    }

    #[test]
    fn rejects_bad_acks() {
        let mut f = Framing::default();
        f.frame("[]");
        f.frame("[]");
        assert_eq!(
            f.ack(r#"{"ack":2}"#),
            Err(FramingError::OutOfOrder {
                got: 2,
                expected: 1
            })
        );
        assert_eq!(
            f.ack(r#"{"ack":3}"#),
            Err(FramingError::NotSent {
                got: 3,
                last_sent: 2
            })
        );
        assert_eq!(f.ack("ack 1"), Err(FramingError::NotAnAck));
        assert_eq!(f.ack(r#"{"ack":1,"x":2}"#), Err(FramingError::NotAnAck));
        assert_eq!(f.ack(r#"{"ack":1}"#), Ok(1));
        assert_eq!(
            f.ack(r#"{"ack":1}"#),
            Err(FramingError::OutOfOrder {
                got: 1,
                expected: 2
            })
        );
    }
}
