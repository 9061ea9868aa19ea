//! The frame shapes subscribers read and write, without a JSON parser for the usual ones:
//! `{"msg":P,"id":n}` and `{"batch":[P1,…],"id":n}` split as both services write them (key
//! first, no spaces), their payloads found by quotes and brackets, and `{"ack":n}`. Parsing
//! every frame with serde_json was a third of the generator's CPU, which shares the machine
//! with the service it measures; any other shape goes through serde_json ([`Frame`]).

use serde::Deserialize;
use serde_json::value::RawValue;

/// Either frame shape, for frames the fast paths do not read.
#[derive(Deserialize)]
pub struct Frame<'a> {
    #[serde(borrow, default)]
    pub msg: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub batch: Option<Vec<&'a RawValue>>,
    pub id: u64,
}

/// `{"batch":[P1,…],"id":N}` split into the payloads' list text `P1,…` and `N`, without a JSON
/// parser, for batches written the way our service writes them (`batch` first, no spaces);
/// [`payloads`] then splits the list.
pub fn split_batch(text: &str) -> Option<(&str, u64)> {
    let rest = text.strip_prefix(r#"{"batch":["#)?.strip_suffix('}')?;
    let at = rest.rfind(r#"],"id":"#)?;
    let digits = &rest[at + r#"],"id":"#.len()..];
    let plain =
        !digits.is_empty() && digits.len() < 20 && digits.bytes().all(|b| b.is_ascii_digit());
    if !plain {
        return None;
    }
    Some((&rest[..at], digits.parse().ok()?))
}

/// The top-level elements of a JSON list's inner text (`P1,P2,…`), found by tracking string
/// quotes and bracket depth: each payload is a JSON array or object, so a comma at depth 0
/// outside a string separates two of them.
pub fn payloads(list: &str) -> impl Iterator<Item = &str> {
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= list.len() {
            return None;
        }
        let end = payload_end(list.as_bytes(), start);
        // `end` is a comma or the end: a char boundary.
        let p = list.get(start..end)?;
        start = end + 1;
        Some(p)
    })
}

/// Where the payload starting at `i` ends: the index of the comma after it, or the length.
fn payload_end(b: &[u8], mut i: usize) -> usize {
    let mut depth = 0i32;
    while let Some(&c) = b.get(i) {
        i += 1;
        match c {
            b'"' => match string_end(b, i) {
                Some(after) => i = after,
                None => return b.len(),
            },
            b'[' | b'{' => depth += 1,
            b']' | b'}' => depth -= 1,
            b',' if depth == 0 => return i - 1,
            _ => {}
        }
    }
    b.len()
}

/// Bytes of a string read one by one before [`string_end`] reads 8 at a time: most of a
/// payload's strings are keys and tags shorter than that, where the word tests cost more than
/// they save; a long value (a row's text) is skipped a word at a time. Byte by byte, the scan
/// cost ~1 ns a byte, a third of the generator's CPU at 1.5 M messages/s.
const SHORT_STRING: usize = 8;

/// The index just after the closing quote of the string whose contents start at `i`; `None`
/// when it is not closed.
fn string_end(b: &[u8], mut i: usize) -> Option<usize> {
    let short = (i + SHORT_STRING).min(b.len());
    while i < short {
        match b[i] {
            b'"' => return Some(i + 1),
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
    loop {
        i += quote_or_backslash(b.get(i..)?)?;
        match b.get(i)? {
            b'"' => return Some(i + 1),
            _ => i += 2,
        }
    }
}

/// The index of the first `"` or `\` in `b`, 8 bytes at a time (SWAR: a byte of `w ^ c` is 0
/// where `w` holds `c`, and the lowest byte flagged by `(v - 0x01…) & !v & 0x80…` is the first
/// zero byte of `v`).
fn quote_or_backslash(b: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let zero_byte = |v: u64| v.wrapping_sub(ONES) & !v & HIGHS;
    let mut at = 0;
    let mut words = b.chunks_exact(8);
    for w in &mut words {
        let mut word = [0; 8];
        word.copy_from_slice(w);
        let w = u64::from_le_bytes(word);
        let hits =
            zero_byte(w ^ (ONES * u64::from(b'"'))) | zero_byte(w ^ (ONES * u64::from(b'\\')));
        if hits != 0 {
            return Some(at + hits.trailing_zeros() as usize / 8);
        }
        at += 8;
    }
    let tail = words.remainder();
    tail.iter()
        .position(|&c| c == b'"' || c == b'\\')
        .map(|j| at + j)
}

/// `{"msg":M,"id":N}` split into `M` and `N` without a JSON parser, for frames written the way
/// both services write them (`msg` first, no spaces). Parsing every frame with serde_json was a
/// third of the generator's CPU, which shares the machine with the service it measures. `M`
/// is not checked as JSON here: what the checks need of it is its first word and watermark
/// (below). Any other shape goes through serde_json.
pub fn split_frame(text: &str) -> Option<(&str, u64)> {
    let rest = text.strip_prefix(r#"{"msg":"#)?.strip_suffix('}')?;
    let at = rest.rfind(r#","id":"#)?;
    let digits = &rest[at + r#","id":"#.len()..];
    let plain =
        !digits.is_empty() && digits.len() < 20 && digits.bytes().all(|b| b.is_ascii_digit());
    if !plain {
        return None;
    }
    Some((&rest[..at], digits.parse().ok()?))
}

/// `{"ack":n}`, built without the formatting machinery (one per message read).
pub fn ack_text(id: u64) -> String {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut n = id;
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let mut s = String::with_capacity(8 + digits.len() - i);
    s.push_str(r#"{"ack":"#);
    s.extend(digits[i..].iter().map(|&d| char::from(d)));
    s.push('}');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_as_serde_json_reads_them() {
        for text in [
            r#"{"msg":["data",{"tag":"insert","id":3}],"id":12}"#,
            r#"{"msg":["commit",{"tag":"commit"},{"watermark":"0b"}],"id":1}"#,
            r#"{"msg":["data",{"x":",\"id\":5"}],"id":18446744073709551}"#,
        ] {
            let f: Frame = serde_json::from_str(text).unwrap();
            let msg = f.msg.map(|m| m.get());
            assert_eq!(
                split_frame(text).map(|(m, id)| (Some(m), id)),
                Some((msg, f.id)),
                "{text}"
            );
        }
        for text in [
            r#"{"id":1,"msg":[]}"#,
            r#"{"msg":[],"id":}"#,
            r#"{"msg":[],"id":-1}"#,
        ] {
            assert_eq!(split_frame(text), None, "{text}");
        }
    }

    #[test]
    fn batches_split_as_serde_json_reads_them() {
        for text in [
            r#"{"batch":[["data",{"tag":"insert","id":3}]],"id":12}"#,
            r#"{"batch":[["begin",{"tag":"begin"},{"commitWatermark":"0b"}],["data",{"x":"],[\"\\","y":[1,{"z":"}"}]}],["commit",{"tag":"commit"},{"watermark":"0b"}]],"id":7}"#,
        ] {
            let f: Frame = serde_json::from_str(text).unwrap();
            let want: Vec<&str> = f.batch.unwrap().iter().map(|p| p.get()).collect();
            let (list, id) = split_batch(text).unwrap();
            assert_eq!(payloads(list).collect::<Vec<_>>(), want, "{text}");
            assert_eq!(id, f.id);
        }
        assert_eq!(split_batch(r#"{"id":1,"batch":[[]]}"#), None);
    }

    #[test]
    fn long_strings_and_escapes_split_as_serde_json_reads_them() {
        let long = "y".repeat(40);
        for list in [
            format!(r#"["data",{{"s":"{long}\"],[{long}\\"}}],["commit",{{"w":"0b"}}]"#),
            format!(r#"["data",{{"s":"{long}\\"}}],["a\"","{long}"]"#),
            format!(r#"["data",{{"s":"abc\"],[\"def{long}\\\""}}],[1]"#),
        ] {
            let text = format!(r#"{{"batch":[{list}],"id":3}}"#);
            let f: Frame = serde_json::from_str(&text).expect(&text);
            let want: Vec<&str> = f.batch.unwrap().iter().map(|p| p.get()).collect();
            assert_eq!(payloads(&list).collect::<Vec<_>>(), want, "{list}");
        }
        // Not closed: the rest is one payload, and nothing panics.
        for list in [r#"["a","bc"#, r#"["a\"#, r#"["a\""#, r#"[""#] {
            assert_eq!(payloads(list).collect::<Vec<_>>(), vec![list]);
        }
        let open = format!(r#"["{long}\"#);
        assert_eq!(payloads(&open).collect::<Vec<_>>(), vec![open.as_str()]);
    }

    #[test]
    fn quotes_and_backslashes_are_found_at_every_offset() {
        for len in 0..20 {
            for at in 0..len {
                for c in [b'"', b'\\'] {
                    // Multi-byte UTF-8 around (bytes ≥ 0x80) must not be taken for either.
                    let mut b: Vec<u8> = "é".repeat(len).into_bytes()[..len].to_vec();
                    b[at] = c;
                    assert_eq!(quote_or_backslash(&b), Some(at), "{len} {at}");
                }
            }
            assert_eq!(quote_or_backslash(&vec![b'y'; len]), None);
        }
    }

    #[test]
    fn acks_are_written_as_json() {
        for id in [0, 9, 10, 123456, u64::MAX] {
            assert_eq!(ack_text(id), format!(r#"{{"ack":{id}}}"#));
        }
    }
}
