//! The websocket framing both endpoints share (PROTOCOL.md §5).
//!
//! The server sends `{"msg": <payload>, "id": n}` with `n` = 1, 2, 3, … per connection; the
//! client answers `{"ack": n}` once it has processed message `n`, always for the oldest message
//! not yet acked. Anything else is a protocol error that ends the connection (close 1002).
//!
//! A subscription with `wsBatched=true` may also get `{"batch": [P1, …], "id": n}` (one frame,
//! one id, several payloads), and its acks are cumulative: `{"ack": n}` with
//! previous ack < n ≤ last id sent acknowledges every frame up to `n`.

use serde::Deserialize;

/// Numbering of sent messages and checking of acks, for one connection.
#[derive(Debug, Default)]
pub struct Framing {
    last_sent: u64,
    last_acked: u64,
    /// Acks are cumulative (`wsBatched=true`).
    cumulative: bool,
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
    /// The framing of a `wsBatched=true` subscription: cumulative acks.
    pub fn cumulative() -> Framing {
        Framing {
            cumulative: true,
            ..Framing::default()
        }
    }

    /// Wraps a message JSON text in the next frame; returns the frame's id and text.
    pub fn frame(&mut self, message: &str) -> (u64, String) {
        let mut s = String::with_capacity(message.len() + 32);
        let id = self.frame_into(message, &mut s);
        (id, s)
    }

    /// Appends the next frame for `message` to `out` and returns its id: a session writes a
    /// whole batch of frames into one buffer (one allocation per batch, not per frame).
    pub fn frame_into(&mut self, message: &str, out: &mut String) -> u64 {
        self.last_sent += 1;
        out.push_str("{\"msg\":");
        out.push_str(message);
        out.push_str(",\"id\":");
        push_decimal(out, self.last_sent);
        out.push('}');
        self.last_sent
    }

    /// Appends the next batched frame, whose payloads joined by commas are `payloads`, to
    /// `out` and returns its id.
    pub fn batch_into(&mut self, payloads: &str, out: &mut String) -> u64 {
        self.last_sent += 1;
        out.push_str("{\"batch\":[");
        out.push_str(payloads);
        out.push_str("],\"id\":");
        push_decimal(out, self.last_sent);
        out.push('}');
        self.last_sent
    }

    /// Numbers the next frame, which the caller writes itself ([`raw_frames`]): its id.
    ///
    /// [`raw_frames`]: super::raw_frames
    pub fn next_id(&mut self) -> u64 {
        self.last_sent += 1;
        self.last_sent
    }

    /// The id of the last frame sent (0 before any).
    pub fn last_sent(&self) -> u64 {
        self.last_sent
    }

    /// Checks a client text frame; returns the id it acks.
    pub fn ack(&mut self, text: &str) -> Result<u64, FramingError> {
        let ack = parse_ack(text).ok_or(FramingError::NotAnAck)?;
        if ack > self.last_sent {
            return Err(FramingError::NotSent {
                got: ack,
                last_sent: self.last_sent,
            });
        }
        let in_order = if self.cumulative {
            ack > self.last_acked
        } else {
            ack == self.last_acked + 1
        };
        if !in_order {
            return Err(FramingError::OutOfOrder {
                got: ack,
                expected: self.last_acked + 1,
            });
        }
        self.last_acked = ack;
        Ok(ack)
    }
}

/// Appends `n` in decimal: one per frame sent, so without the formatting machinery.
fn push_decimal(out: &mut String, n: u64) {
    let mut digits = [0u8; 20];
    for &d in decimal(n, &mut digits) {
        out.push(char::from(d));
    }
}

/// `n` in decimal ASCII digits, written at the end of `digits`.
pub fn decimal(mut n: u64, digits: &mut [u8; 20]) -> &[u8] {
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &digits[i..]
}

/// Reads `{"ack": n}`. Clients send it as `{"ack":n}` with no spaces, which is read here
/// without a JSON parser: it is the one client frame of a busy session, one per message sent.
/// Anything else (spaces, a number with a sign, a fraction or a leading zero, 20 digits or
/// more, other fields) goes through `serde_json` with its strict rules, so both paths accept
/// exactly the same texts.
fn parse_ack(text: &str) -> Option<u64> {
    let digits = text
        .strip_prefix("{\"ack\":")
        .and_then(|rest| rest.strip_suffix('}'));
    if let Some(d) = digits {
        let plain = !d.is_empty()
            && d.len() < 20
            && d.bytes().all(|b| b.is_ascii_digit())
            && (d.len() == 1 || !d.starts_with('0'));
        if plain {
            return d.parse().ok();
        }
    }
    serde_json::from_str::<Ack>(text).ok().map(|a| a.ack)
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
    fn the_fast_ack_path_accepts_exactly_what_json_accepts() {
        let texts = [
            r#"{"ack":7}"#,
            r#"{"ack":0}"#,
            r#"{"ack":07}"#,
            r#"{"ack":-7}"#,
            r#"{"ack":7.0}"#,
            r#"{"ack":1e3}"#,
            r#"{"ack":}"#,
            r#"{"ack":"7"}"#,
            r#"{"ack":7,"x":1}"#,
            r#"{"ack": 7}"#,
            r#"{"ack":7} "#,
            r#"{"ack":18446744073709551615}"#,
            r#"{"ack":18446744073709551616}"#,
            r#"{"ack":1844674407370955161}"#,
            r#"{"ack":7}}"#,
            r#"{"ack":+7}"#,
            r#"{"ack":７}"#,
        ];
        for t in texts {
            let json = serde_json::from_str::<Ack>(t).ok().map(|a| a.ack);
            assert_eq!(parse_ack(t), json, "{t}");
        }
    }

    #[test]
    fn ids_are_written_in_decimal() {
        for n in [0, 7, 10, 99, 1234567890, u64::MAX] {
            let mut s = String::new();
            push_decimal(&mut s, n);
            assert_eq!(s, n.to_string());
        }
    }

    #[test]
    fn frames_written_into_one_buffer_are_numbered_on() {
        let mut f = Framing::default();
        let mut out = String::new();
        assert_eq!(f.frame_into("[1]", &mut out), 1);
        assert_eq!(f.frame_into("[2]", &mut out), 2);
        assert_eq!(out, r#"{"msg":[1],"id":1}{"msg":[2],"id":2}"#);
    }

    #[test]
    fn batched_frames_carry_one_id_for_their_payloads() {
        let mut f = Framing::cumulative();
        let mut out = String::new();
        assert_eq!(f.frame_into("[1]", &mut out), 1);
        assert_eq!(f.batch_into("[2],[3]", &mut out), 2);
        assert_eq!(out, r#"{"msg":[1],"id":1}{"batch":[[2],[3]],"id":2}"#);
    }

    #[test]
    fn cumulative_acks_may_skip_ids_but_not_go_back_or_past_the_last_sent() {
        let mut f = Framing::cumulative();
        for _ in 0..5 {
            f.frame("[]");
        }
        assert_eq!(f.ack(r#"{"ack":3}"#), Ok(3));
        assert_eq!(
            f.ack(r#"{"ack":3}"#),
            Err(FramingError::OutOfOrder {
                got: 3,
                expected: 4
            })
        );
        assert_eq!(
            f.ack(r#"{"ack":6}"#),
            Err(FramingError::NotSent {
                got: 6,
                last_sent: 5
            })
        );
        assert_eq!(f.ack(r#"{"ack":5}"#), Ok(5));
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
