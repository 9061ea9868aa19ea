//! The query string of a websocket request, read strictly (PROTOCOL.md §12): a repeated parameter, a
//! bad percent-encoding or a parameter over 1 KiB is refused with a reason naming it, rather
//! than served with a guess (the lenient `form_urlencoded` keeps `%zz` as text and the first
//! of two values).

use std::collections::HashMap;

/// The longest parameter value accepted, in bytes once decoded.
pub const MAX_PARAMETER: usize = 1024;

/// `name=value&…` as a map; the error is the close reason.
pub fn parse_query(query: &str) -> Result<HashMap<String, String>, String> {
    let mut map = HashMap::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (raw_name, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
        let name = decode(raw_name).map_err(|e| format!("Invalid query parameter name: {e}"))?;
        if name.len() > MAX_PARAMETER {
            return Err("A query parameter name is longer than 1 KiB".into());
        }
        let value = decode(raw_value).map_err(|e| format!("Invalid {name}: {e}"))?;
        if value.len() > MAX_PARAMETER {
            return Err(format!(
                "Invalid {name}: longer than 1 KiB ({} bytes)",
                value.len()
            ));
        }
        if map.insert(name.clone(), value).is_some() {
            return Err(format!("Invalid {name}: the parameter is repeated"));
        }
    }
    Ok(map)
}

/// `application/x-www-form-urlencoded` decoding: `+` is a space, `%` takes two hex digits,
/// and the result must be UTF-8.
fn decode(raw: &str) -> Result<String, String> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or("bad percent-encoding (% must be followed by two hex digits)")?;
                out.push(hex);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| "percent-encoding that is not UTF-8".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_pairs() {
        let q = parse_query("id=a%20b+c&taskID=&flag").unwrap();
        assert_eq!(q["id"], "a b c");
        assert_eq!(q["taskID"], "");
        assert_eq!(q["flag"], "");
    }

    #[test]
    fn refusals_name_the_parameter() {
        for (query, name) in [
            ("watermark=0a&watermark=zz", "watermark"),
            ("id=%zz", "id"),
            ("id=%4", "id"),
            ("id=%ff", "id"),
        ] {
            let e = parse_query(query).unwrap_err();
            assert!(e.contains(name), "{query}: {e}");
        }
        let long = format!("id={}", "x".repeat(MAX_PARAMETER + 1));
        assert!(parse_query(&long).unwrap_err().contains("id"));
        let fits = format!("id={}", "x".repeat(MAX_PARAMETER));
        assert!(parse_query(&fits).is_ok());
    }
}
