//! Watermarks: LexiVersion strings (PROTOCOL.md §1).
//!
//! A LexiVersion encodes a non-negative integer so that comparing the strings compares the
//! numbers: one base-36 character giving the number of digits minus one, then the base-36
//! digits with no leading zero (`"00"` is zero). Because of that, [`Watermark`] orders by its
//! text, and every component compares watermarks without decoding them. Only text that passes
//! [`Watermark::parse`] ever becomes a `Watermark`, so nothing unvalidated is recorded, stored
//! or purged by.

use std::fmt;
use std::sync::Arc;

use serde::{Serialize, Serializer};

/// Why a string is not a LexiVersion.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidWatermark {
    #[error("empty watermark")]
    Empty,
    #[error("watermark {0:?} has a character outside [0-9a-z]")]
    BadCharacter(String),
    #[error("watermark {0:?} has the wrong length for its length prefix")]
    BadLength(String),
    #[error("watermark {0:?} has a leading zero")]
    LeadingZero(String),
}

/// A validated LexiVersion. Cheap to clone (shared text).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Watermark(Arc<str>);

fn digit(c: u8) -> Option<u32> {
    match c {
        b'0'..=b'9' => Some((c - b'0') as u32),
        b'a'..=b'z' => Some((c - b'a') as u32 + 10),
        _ => None,
    }
}

impl Watermark {
    /// Validates `s` as a LexiVersion.
    pub fn parse(s: &str) -> Result<Watermark, InvalidWatermark> {
        let b = s.as_bytes();
        if b.is_empty() {
            return Err(InvalidWatermark::Empty);
        }
        if b.iter().any(|&c| digit(c).is_none()) {
            return Err(InvalidWatermark::BadCharacter(s.to_string()));
        }
        let len = digit(b[0]).unwrap_or(0) as usize + 1;
        if b.len() != len + 1 {
            return Err(InvalidWatermark::BadLength(s.to_string()));
        }
        if b[1] == b'0' && s != "00" {
            return Err(InvalidWatermark::LeadingZero(s.to_string()));
        }
        Ok(Watermark(Arc::from(s)))
    }

    /// The LexiVersion of `n`.
    pub fn from_u64(n: u64) -> Watermark {
        let mut digits = Vec::with_capacity(14);
        let mut v = n;
        loop {
            let d = (v % 36) as u8;
            digits.push(if d < 10 { b'0' + d } else { b'a' + d - 10 });
            v /= 36;
            if v == 0 {
                break;
            }
        }
        let prefix = (digits.len() - 1) as u8;
        digits.push(if prefix < 10 {
            b'0' + prefix
        } else {
            b'a' + prefix - 10
        });
        digits.reverse();
        // Only ASCII digits and letters were pushed.
        Watermark(Arc::from(String::from_utf8_lossy(&digits).as_ref()))
    }

    /// The number this LexiVersion encodes, if it fits in a `u64`.
    pub fn to_u64(&self) -> Option<u64> {
        self.0.as_bytes()[1..].iter().try_fold(0u64, |acc, &c| {
            acc.checked_mul(36)?.checked_add(digit(c)? as u64)
        })
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Watermark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Watermark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}

impl Serialize for Watermark {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_lexi_versions() {
        for s in [
            "00", "0a", "0z", "110", "618ocqq8", "618p0bw8", "123", "1ab",
        ] {
            assert!(Watermark::parse(s).is_ok(), "{s}");
        }
    }

    #[test]
    fn rejects_everything_else() {
        for s in [
            "",
            "0",
            "01x",
            "zz",
            "0A",
            "10a",
            "428e018b-c417-47b5-bcf3-91c94558b962",
            "618ocqq",
            "618ocqq89",
            "1.5",
        ] {
            assert!(Watermark::parse(s).is_err(), "{s}");
        }
    }

    #[test]
    fn encodes_and_orders_numerically() {
        assert_eq!(Watermark::from_u64(0).as_str(), "00");
        assert_eq!(Watermark::from_u64(10).as_str(), "0a");
        assert_eq!(Watermark::from_u64(36).as_str(), "110");
        let mut prev = Watermark::from_u64(0);
        for n in [1u64, 35, 36, 1295, 1296, 99_999, u64::MAX] {
            let w = Watermark::from_u64(n);
            assert!(Watermark::parse(w.as_str()).is_ok());
            assert!(w > prev, "{w} > {prev}");
            assert_eq!(w.to_u64(), Some(n));
            prev = w;
        }
    }
}
