//! The workload both services are fed: zero's initial sync (the tables zero validates) and live
//! transactions of `changes` ~100-byte inserts into `public.t`, with LexiVersion watermarks
//! numbered from `FIRST_SEQ`. A transaction is a function of its sequence number, so a
//! reconnecting service can be replayed from any watermark without keeping what was sent.

/// Sequence number of the initial-sync transaction; its watermark (`1rs`) is the replicaVersion.
pub const FIRST_SEQ: u64 = 1000;

/// LexiVersion (zero's `shared/src/lexi-version.js`): base-36 digits prefixed by their count - 1.
pub fn lexi(n: u64) -> String {
    let mut digits = Vec::with_capacity(14);
    let mut v = n;
    loop {
        digits.push(std::char::from_digit((v % 36) as u32, 36).unwrap_or('0'));
        v /= 36;
        if v == 0 {
            break;
        }
    }
    let mut s = String::with_capacity(digits.len() + 1);
    s.push(std::char::from_digit((digits.len() - 1) as u32, 36).unwrap_or('0'));
    s.extend(digits.iter().rev());
    s
}

/// The number a LexiVersion stands for; `None` when it is not one.
pub fn parse_lexi(s: &str) -> Option<u64> {
    let mut chars = s.chars();
    let len = chars.next()?.to_digit(36)? as usize + 1;
    let rest = chars.as_str();
    if rest.len() != len {
        return None;
    }
    u64::from_str_radix(rest, 36).ok()
}

/// The initial sync: `create-table` and a unique `create-index` for `<app>_<shard>.clients`,
/// `<app>_<shard>.mutations`, `<app>.permissions` (what zero's `validateInitiallySyncedData`
/// checks) and `public.t`, then one row. Our service stores it like any other transaction.
pub fn initial_sync(app: &str, shard: &str) -> Vec<String> {
    let sh = format!("{app}_{shard}");
    let w = lexi(FIRST_SEQ);
    let col = |pos: u32, ty: &str, not_null: bool| {
        format!(r#"{{"pos":{pos},"dataType":"{ty}","notNull":{not_null}}}"#)
    };
    let table = |schema: &str, name: &str, cols: &[(&str, String)], key: &[&str]| {
        let columns: Vec<String> = cols.iter().map(|(n, c)| format!(r#""{n}":{c}"#)).collect();
        let key_list: Vec<String> = key.iter().map(|k| format!(r#""{k}""#)).collect();
        let key_cols: Vec<String> = key.iter().map(|k| format!(r#""{k}":"ASC""#)).collect();
        [
            format!(
                r#"["data",{{"tag":"create-table","spec":{{"schema":"{schema}","name":"{name}","columns":{{{}}},"primaryKey":[{}]}}}}]"#,
                columns.join(","),
                key_list.join(",")
            ),
            format!(
                r#"["data",{{"tag":"create-index","spec":{{"schema":"{schema}","tableName":"{name}","name":"{name}_pkey","unique":true,"columns":{{{}}}}}}}]"#,
                key_cols.join(",")
            ),
        ]
    };
    let mut frames = vec![begin(&w)];
    frames.extend(table(
        &sh,
        "clients",
        &[
            ("clientGroupID", col(1, "text", true)),
            ("clientID", col(2, "text", true)),
            ("lastMutationID", col(3, "int8", false)),
            ("userID", col(4, "text", false)),
        ],
        &["clientGroupID", "clientID"],
    ));
    frames.extend(table(
        &sh,
        "mutations",
        &[
            ("clientGroupID", col(1, "text", true)),
            ("clientID", col(2, "text", true)),
            ("mutationID", col(3, "int8", true)),
            ("mutation", col(4, "json", false)),
        ],
        &["clientGroupID", "clientID", "mutationID"],
    ));
    frames.extend(table(
        app,
        "permissions",
        &[
            ("lock", col(1, "bool", true)),
            ("permissions", col(2, "json", false)),
            ("hash", col(3, "text", false)),
        ],
        &["lock"],
    ));
    frames.extend(table(
        "public",
        "t",
        &[
            ("id", col(1, "text", true)),
            ("n", col(2, "int8", false)),
            ("s", col(3, "text", false)),
        ],
        &["id"],
    ));
    frames.push(format!(
        r#"["data",{{"tag":"insert","relation":{REL},"new":{{"id":"seed","n":1,"s":"seed"}}}}]"#
    ));
    frames.push(commit(&w));
    frames
}

const REL: &str = r#"{"schema":"public","name":"t","rowKey":{"columns":["id"]}}"#;

fn begin(w: &str) -> String {
    format!(r#"["begin",{{"tag":"begin"}},{{"commitWatermark":"{w}"}}]"#)
}

fn commit(w: &str) -> String {
    format!(r#"["commit",{{"tag":"commit"}},{{"watermark":"{w}"}}]"#)
}

/// The text column of the live rows.
#[derive(Clone, Debug)]
pub enum Filler {
    /// The same text in every row (`x`s): what compresses best.
    Same(String),
    /// Letters and digits drawn anew for every row, this many of them: nothing a compressor
    /// finds twice but the payload's structure (`--row-noise`).
    Noise(usize),
}

/// The text column of every live row: 32 characters, or `row_bytes` minus the rest of the
/// insert's payload (so that each `data` payload is about `row_bytes` long); drawn anew for
/// every row with `noise`.
pub fn filler(row_bytes: usize, noise: bool) -> Filler {
    // The payload around the text column, for a watermark of ~5 characters and a small `i`.
    const AROUND: usize = 130;
    let len = row_bytes.saturating_sub(AROUND).max(32);
    if noise {
        Filler::Noise(len)
    } else {
        Filler::Same("x".repeat(len))
    }
}

/// `len` letters and digits, a function of `seed` (xorshift64*): a transaction is the same
/// whenever it is sent again.
fn noise(seed: u64, len: usize) -> String {
    const CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let r = x.wrapping_mul(0x2545_f491_4f6c_dd1d);
            char::from(CHARS[(r >> 58) as usize % CHARS.len()])
        })
        .collect()
}

/// Appends the frames of live transaction `seq`: begin, `changes` inserts of a fresh row each
/// (id `<watermark>-<i>`, as zero's peer source does, text column `s` from `fill`), commit.
pub fn live_tx(seq: u64, changes: usize, fill: &Filler, out: &mut Vec<String>) {
    let w = lexi(seq);
    out.push(begin(&w));
    for i in 0..changes {
        let drawn;
        let s = match fill {
            Filler::Same(s) => s.as_str(),
            Filler::Noise(len) => {
                drawn = noise(seq.wrapping_mul(1 << 20).wrapping_add(i as u64), *len);
                drawn.as_str()
            }
        };
        out.push(format!(
            r#"["data",{{"tag":"insert","relation":{REL},"new":{{"id":"{w}-{i}","n":{i},"s":"{s}"}}}}]"#
        ));
    }
    out.push(commit(&w));
}

/// The watermark of a `begin`, `commit` or `status` frame: the string value of the last
/// `...atermark"` key (`commitWatermark` or `watermark`), read without parsing the whole frame.
/// The key is looked for from the end a window at a time: it sits a few bytes before the end,
/// and `str::rfind` would first build a searcher (twice per transaction per subscriber).
pub fn frame_watermark(frame: &str) -> Option<&str> {
    const KEY: &[u8] = b"atermark\":\"";
    let at = frame
        .as_bytes()
        .windows(KEY.len())
        .rposition(|w| w == KEY)?
        + KEY.len();
    let rest = frame.get(at..)?;
    rest.get(..rest.find('"')?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lexi_matches_zero_encoding_and_round_trips() {
        assert_eq!(lexi(1000), "1rs");
        assert_eq!(lexi(0), "00");
        assert_eq!(lexi(35), "0z");
        assert_eq!(lexi(36), "110");
        for n in [0, 1, 35, 36, 1000, 123_456_789] {
            assert_eq!(parse_lexi(&lexi(n)), Some(n));
        }
        assert_eq!(parse_lexi("2rs"), None);
    }

    #[test]
    fn watermark_is_read_from_begin_commit_and_status() {
        let mut out = Vec::new();
        live_tx(1001, 1, &filler(0, false), &mut out);
        assert_eq!(frame_watermark(&out[0]), Some("1rt"));
        assert_eq!(frame_watermark(&out[2]), Some("1rt"));
        assert_eq!(
            frame_watermark(r#"["status",{"tag":"commit"},{"watermark":"1rs"}]"#),
            Some("1rs")
        );
        assert_eq!(frame_watermark(r#"["status",{"tag":"status"}]"#), None);
    }

    #[test]
    fn frames_are_json_arrays() {
        let mut out = Vec::new();
        live_tx(1001, 10, &filler(1024, false), &mut out);
        live_tx(1002, 10, &filler(1024, true), &mut out);
        out.extend(initial_sync("zero", "0"));
        for f in out {
            let v: serde_json::Value = serde_json::from_str(&f).expect(&f);
            assert!(v.is_array());
        }
    }

    #[test]
    fn noise_rows_differ_from_each_other_and_are_the_same_when_sent_again() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        live_tx(1001, 3, &filler(0, true), &mut a);
        live_tx(1001, 3, &filler(0, true), &mut b);
        assert_eq!(a, b);
        let s = |f: &str| f.rsplit_once(r#""s":""#).unwrap().1.to_string();
        assert_ne!(s(&a[1]), s(&a[2]));
        assert_eq!(
            s(&a[1]).len(),
            32 + 4,
            "32 characters, the closing quote and braces"
        );
        assert!(s(&a[1])[..32].chars().all(|c| c.is_ascii_alphanumeric()));
    }
}
