//! A run of a transaction's changes as one stored value, as both engines store a transaction
//! row (SQLite: `sqlite/txn_rows.rs`; PostgreSQL: `postgres/schema.rs`).
//!
//! ### Why a row per transaction
//! A store's cost is per *row*: SQLite's writer cost ~1.34 µs per row and ~2.6 µs per
//! transaction at 10,000 transactions/s, PostgreSQL's backend ~4 µs per row and ~1.5 µs per
//! transaction (BENCHMARKS.md): binding, encoding the record, finding its place in the index.
//! A transaction is stored, read back and purged whole or from a position inside it, so its
//! changes are stored together: a row holds a run of them, its commit watermark, the position
//! of its first change, how many it holds, and one value holding them all ([`encode`]). A
//! transaction of ordinary size is one row. A large one is several, each of about
//! [`CHUNK_BYTES`] ([`chunks`]): no row comes near a store's limit on a value (1 GB in both),
//! and a read from a position inside a large transaction skips the rows before it by their
//! columns alone, loading only the row it starts in.
//!
//! ### The value
//! For each change, in order: its kind (one byte: 0 begin, 1 data, 2 commit), the length of its
//! JSON text (4 bytes, little-endian) and the text. Reading checks every length and the UTF-8
//! of every text: a value that does not decode is a corrupt change log, never a short read.
//!
//! ### Packed values
//! What both engines write now: the value led by one byte saying how the rest holds it:
//! [`PLAIN`], as above, or [`LZ4`], its uncompressed length (4 bytes, little-endian) and the
//! value compressed by LZ4 (block format). The writer compresses a value when that saves at
//! least an eighth of it ([`pack`]).
//!
//! Why: a store's CPU is much of it the bytes it writes. SQLite writes a committed page twice
//! (into the write-ahead log, then into the database at the checkpoint) and fsyncs it, and that
//! was ~75 % of its writer thread in `perf` at 20,000 transactions/s. The changes of one
//! transaction repeat themselves (each `insert` carries its table's `relation` and the same
//! column names), so LZ4 makes a transaction row several times smaller for ~1 µs of CPU, and
//! the rows read back cost a decompression that runs at several GB/s. Incompressible values
//! are stored as they are: LZ4 gives up on them fast.

use std::sync::Arc;

use super::commands::ReadRows;
use super::types::{ChangeKind, ChangeLogError, StoredChange};
use crate::watermark::Watermark;

fn kind_byte(kind: ChangeKind) -> u8 {
    match kind {
        ChangeKind::Begin => 0,
        ChangeKind::Data => 1,
        ChangeKind::Commit => 2,
    }
}

/// About the most of a transaction's changes one row holds, in bytes of its value; a change
/// larger than this is a row of its own.
pub(in crate::changelog) const CHUNK_BYTES: usize = 64 * 1024;

/// The bytes a change takes in a value.
fn encoded_len(json: &str) -> usize {
    5 + json.len()
}

/// A transaction's changes cut into runs of about [`CHUNK_BYTES`], each with the position of
/// its first change: one run for a transaction of ordinary size.
pub(in crate::changelog) fn chunks(
    changes: &[(ChangeKind, String)],
) -> impl Iterator<Item = (i64, &[(ChangeKind, String)])> + '_ {
    let mut start = 0usize;
    std::iter::from_fn(move || {
        if start >= changes.len() {
            return None;
        }
        let mut end = start;
        let mut bytes = 0usize;
        while end < changes.len() {
            let len = encoded_len(&changes[end].1);
            if end > start && bytes + len > CHUNK_BYTES {
                break;
            }
            bytes += len;
            end += 1;
        }
        let run = (start as i64, &changes[start..end]);
        start = end;
        Some(run)
    })
}

/// Writes `changes` into `out` (cleared first) as one row's value. A change's text longer than
/// a length field holds (4 GiB) is refused; the change source's frames are far smaller.
pub(in crate::changelog) fn encode(
    changes: &[(ChangeKind, String)],
    out: &mut Vec<u8>,
) -> Result<(), ChangeLogError> {
    out.clear();
    out.reserve(changes.iter().map(|(_, j)| encoded_len(j)).sum());
    for (kind, json) in changes {
        let len = u32::try_from(json.len())
            .map_err(|_| ChangeLogError::Corrupt(format!("a change of {} bytes", json.len())))?;
        out.push(kind_byte(*kind));
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(json.as_bytes());
    }
    Ok(())
}

/// A packed value's first byte: the encoded changes follow as they are.
pub(in crate::changelog) const PLAIN: u8 = 0;
/// A packed value's first byte: the length of the encoded changes (4 bytes, little-endian)
/// and their LZ4 block follow.
pub(in crate::changelog) const LZ4: u8 = 1;

/// LZ4 cannot expand a block's input by more than this factor (its longest match run costs a
/// byte per 255 bytes), so a stated length above it is a corrupt value, not an allocation.
const LZ4_MAX_RATIO: usize = 255;

/// Packs the encoded changes `plain` into `out` (cleared first) as a packed value (both
/// engines' current layout): compressed by LZ4 when that saves at least an eighth, else as
/// they are.
pub(in crate::changelog) fn pack(plain: &[u8], out: &mut Vec<u8>) {
    out.clear();
    // A length field holds it: `encode` refuses any change over 4 GiB, and a row's changes are
    // about `CHUNK_BYTES` but for a single larger change.
    if let Ok(len) = u32::try_from(plain.len()) {
        out.resize(5 + lz4_flex::block::get_maximum_output_size(plain.len()), 0);
        out[0] = LZ4;
        out[1..5].copy_from_slice(&len.to_le_bytes());
        if let Ok(n) = lz4_flex::block::compress_into(plain, &mut out[5..]) {
            if 5 + n <= plain.len() - plain.len() / 8 {
                out.truncate(5 + n);
                return;
            }
        }
        out.clear();
    }
    out.reserve(1 + plain.len());
    out.push(PLAIN);
    out.extend_from_slice(plain);
}

/// The encoded changes of the packed value `value` ([`pack`]): borrowed when stored as they
/// are, else decompressed into `scratch`. `watermark` names the transaction in the error of a
/// value that does not unpack.
pub(in crate::changelog) fn unpack<'a>(
    value: &'a [u8],
    scratch: &'a mut Vec<u8>,
    watermark: &str,
) -> Result<&'a [u8], ChangeLogError> {
    let corrupt = |what: &str| ChangeLogError::Corrupt(format!("transaction {watermark}: {what}"));
    match value.first() {
        Some(&PLAIN) => Ok(&value[1..]),
        Some(&LZ4) => {
            let len_bytes: [u8; 4] = value
                .get(1..5)
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| corrupt("cut short in a packed length"))?;
            let len = u32::from_le_bytes(len_bytes) as usize;
            let block = &value[5..];
            if len > block.len().saturating_mul(LZ4_MAX_RATIO) + 16 {
                return Err(corrupt(&format!(
                    "a packed length of {len} bytes from {} bytes",
                    block.len()
                )));
            }
            scratch.clear();
            scratch.resize(len, 0);
            match lz4_flex::block::decompress_into(block, scratch) {
                Ok(n) if n == len => Ok(&scratch[..]),
                Ok(n) => Err(corrupt(&format!("{n} of {len} packed bytes"))),
                Err(e) => Err(corrupt(&format!(
                    "a packed value that does not unpack ({e})"
                ))),
            }
        }
        Some(b) => Err(corrupt(&format!("packing {b}"))),
        None => Err(corrupt("an empty value")),
    }
}

/// The changes of a row's value, in order, as `(pos, kind, text)`, the first at `first_pos`;
/// `watermark` names the transaction in the error of a value that does not decode.
pub(in crate::changelog) fn decode<'a>(
    body: &'a [u8],
    first_pos: i64,
    watermark: &'a str,
) -> impl Iterator<Item = Result<(i64, ChangeKind, Arc<str>), ChangeLogError>> + 'a {
    let corrupt =
        move |what: &str| ChangeLogError::Corrupt(format!("transaction {watermark}: {what}"));
    let mut at = 0usize;
    let mut pos = first_pos;
    std::iter::from_fn(move || {
        if at >= body.len() {
            return None;
        }
        let item = (|| {
            let kind = match body[at] {
                0 => ChangeKind::Begin,
                1 => ChangeKind::Data,
                2 => ChangeKind::Commit,
                k => return Err(corrupt(&format!("change kind {k}"))),
            };
            let len_bytes: [u8; 4] = body
                .get(at + 1..at + 5)
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| corrupt("cut short in a length"))?;
            let len = u32::from_le_bytes(len_bytes) as usize;
            let text = body
                .get(at + 5..at + 5 + len)
                .ok_or_else(|| corrupt("cut short in a change"))?;
            let text = std::str::from_utf8(text).map_err(|_| corrupt("a change not UTF-8"))?;
            at += 5 + len;
            Ok((pos, kind, Arc::from(text)))
        })();
        match item {
            Ok(_) => pos += 1,
            // Nothing after a change that does not decode.
            Err(_) => at = body.len(),
        }
        Some(item)
    })
}

/// A transaction row read back: its commit watermark (`w` as stored), the position of its
/// first change, how many it holds, and its value's encoded changes (unpacked).
pub(in crate::changelog) struct TxnRow<'a> {
    pub watermark: &'a Watermark,
    pub w: &'a str,
    pub first_pos: i64,
    pub count: i64,
    pub body: &'a [u8],
}

/// Appends to `out` the changes of `row` after `after`, until `out` is full: what both
/// engines' readers do with each transaction row. A row read whole must decode to as many
/// changes as it says it holds, or the change log is corrupt.
pub(in crate::changelog) fn append_row(
    row: TxnRow<'_>,
    after: &(Watermark, i64),
    out: &mut ReadRows,
) -> Result<(), ChangeLogError> {
    let mut decoded = 0i64;
    for change in decode(row.body, row.first_pos, row.w) {
        let (pos, kind, json) = change?;
        decoded += 1;
        if *row.watermark == after.0 && pos <= after.1 {
            continue;
        }
        if out.full() {
            return Ok(());
        }
        out.push(StoredChange {
            watermark: row.watermark.clone(),
            pos,
            kind,
            json,
        });
    }
    if decoded != row.count {
        return Err(ChangeLogError::Corrupt(format!(
            "transaction {}: {decoded} of its {} changes stored",
            row.w, row.count
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn changes() -> Vec<(ChangeKind, String)> {
        vec![
            (ChangeKind::Begin, r#"{"tag":"begin"}"#.into()),
            (ChangeKind::Data, r#"{"tag":"insert","s":"é\"x"}"#.into()),
            (ChangeKind::Data, String::new()),
            (ChangeKind::Commit, r#"{"tag":"commit"}"#.into()),
        ]
    }

    #[test]
    fn a_transaction_value_decodes_to_its_changes_in_order() {
        let mut body = vec![9; 3];
        encode(&changes(), &mut body).unwrap();
        let got: Vec<_> = decode(&body, 0, "0a").map(|c| c.unwrap()).collect();
        let want: Vec<_> = changes()
            .into_iter()
            .enumerate()
            .map(|(i, (k, j))| (i as i64, k, Arc::from(j.as_str())))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_large_transaction_is_cut_into_runs_of_about_chunk_bytes_in_order() {
        let big = "x".repeat(CHUNK_BYTES / 3);
        let mut txn = vec![(ChangeKind::Begin, "{}".to_string())];
        txn.extend((0..10).map(|_| (ChangeKind::Data, big.clone())));
        txn.push((ChangeKind::Data, "y".repeat(2 * CHUNK_BYTES)));
        txn.push((ChangeKind::Commit, "{}".to_string()));
        let runs: Vec<_> = chunks(&txn).collect();
        // Runs cover every change once, in order, each within the bound or a single change.
        let mut next = 0;
        for (first, run) in &runs {
            assert_eq!(*first, next);
            let bytes: usize = run.iter().map(|(_, j)| encoded_len(j)).sum();
            assert!(
                bytes <= CHUNK_BYTES || run.len() == 1,
                "{bytes} in {}",
                run.len()
            );
            next += run.len() as i64;
        }
        assert_eq!(next, txn.len() as i64);
        assert!(runs.len() >= 5, "{} runs", runs.len());
        // Decoded from their first positions, they give the transaction back.
        let mut body = Vec::new();
        let mut back = Vec::new();
        for (first, run) in runs {
            encode(run, &mut body).unwrap();
            back.extend(decode(&body, first, "0a").map(|c| c.unwrap()));
        }
        let want: Vec<_> = txn
            .iter()
            .enumerate()
            .map(|(i, (k, j))| (i as i64, *k, Arc::from(j.as_str())))
            .collect();
        assert_eq!(back, want);
        // An ordinary transaction is one run.
        assert_eq!(chunks(&changes()).count(), 1);
    }

    #[test]
    fn a_value_that_does_not_decode_is_corrupt_never_short() {
        let mut body = Vec::new();
        encode(&changes(), &mut body).unwrap();
        // Cut between two changes it decodes to fewer: the reader checks the row's count.
        let boundaries: Vec<usize> = changes()
            .iter()
            .scan(0, |at, (_, j)| {
                *at += 5 + j.len();
                Some(*at)
            })
            .collect();
        for cut in (1..body.len()).filter(|c| !boundaries.contains(c)) {
            let got: Vec<_> = decode(&body[..cut], 0, "0a").collect();
            assert!(
                got.last().is_some_and(|r| r.is_err()),
                "cut at {cut} of {}: {got:?}",
                body.len()
            );
        }
        let mut bad_kind = body.clone();
        bad_kind[0] = 7;
        assert!(matches!(
            decode(&bad_kind, 0, "0a").next(),
            Some(Err(ChangeLogError::Corrupt(_)))
        ));
        let mut bad_text = Vec::new();
        encode(&[(ChangeKind::Data, "ab".into())], &mut bad_text).unwrap();
        bad_text[5] = 0xff;
        assert!(matches!(
            decode(&bad_text, 0, "0a").next(),
            Some(Err(ChangeLogError::Corrupt(_)))
        ));
    }

    /// A transaction as the load generator's: ten inserts into one table.
    fn inserts() -> Vec<(ChangeKind, String)> {
        inserts_of(|_| "x".repeat(32))
    }

    /// The same, the text column of insert `i` being `text(i)`.
    fn inserts_of(text: impl Fn(usize) -> String) -> Vec<(ChangeKind, String)> {
        let mut txn = vec![(ChangeKind::Begin, r#"{"tag":"begin"}"#.to_string())];
        txn.extend((0..10).map(|i| {
            let row = format!(
                r#"{{"tag":"insert","relation":{{"schema":"public","name":"t","rowKey":{{"columns":["id"]}}}},"new":{{"id":"4abcd-{i}","n":{i},"s":"{}"}}}}"#,
                text(i)
            );
            (ChangeKind::Data, row)
        }));
        txn.push((ChangeKind::Commit, r#"{"tag":"commit"}"#.to_string()));
        txn
    }

    /// How much packing shrinks the load generator's transaction (`benches/`), with its text
    /// column of `x`s and with letters and digits drawn anew for every row (`--row-noise`).
    #[test]
    #[ignore = "a measurement: cargo test -p change-streamer-actors --lib -- --ignored packed_sizes --nocapture"]
    fn packed_sizes() {
        const CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        let drawn = |i: usize| -> String {
            let mut x = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            (0..32)
                .map(|_| {
                    x ^= x >> 12;
                    x ^= x << 25;
                    x ^= x >> 27;
                    char::from(CHARS[(x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 58) as usize % 62])
                })
                .collect()
        };
        for (name, txn) in [("x text", inserts()), ("drawn text", inserts_of(drawn))] {
            let (mut plain, mut packed) = (Vec::new(), Vec::new());
            encode(&txn, &mut plain).unwrap();
            pack(&plain, &mut packed);
            println!("{name}: {} bytes, packed {}", plain.len(), packed.len());
        }
    }

    /// Bytes no compressor shrinks (a xorshift stream), as text of a change.
    fn noise(len: usize) -> String {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                char::from(b'!' + (x % 90) as u8)
            })
            .collect()
    }

    fn round_trip(changes: &[(ChangeKind, String)]) -> Vec<u8> {
        let (mut plain, mut packed, mut scratch) = (Vec::new(), vec![7; 9], Vec::new());
        encode(changes, &mut plain).unwrap();
        pack(&plain, &mut packed);
        assert_eq!(unpack(&packed, &mut scratch, "0a").unwrap(), &plain[..]);
        packed
    }

    #[test]
    fn a_value_that_compresses_is_stored_packed_and_unpacks_to_its_changes() {
        let packed = round_trip(&inserts());
        let mut plain = Vec::new();
        encode(&inserts(), &mut plain).unwrap();
        assert_eq!(packed[0], LZ4);
        assert!(
            packed.len() * 3 < plain.len(),
            "{} packed of {}",
            packed.len(),
            plain.len()
        );
        let mut scratch = Vec::new();
        let body = unpack(&packed, &mut scratch, "0a").unwrap();
        let got: Vec<_> = decode(body, 0, "0a").map(|c| c.unwrap().2).collect();
        let want: Vec<Arc<str>> = inserts().iter().map(|(_, j)| j.as_str().into()).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_value_that_does_not_compress_is_stored_as_it_is() {
        let changes = vec![(ChangeKind::Data, noise(4000))];
        let packed = round_trip(&changes);
        assert_eq!(packed[0], PLAIN);
        let mut plain = Vec::new();
        encode(&changes, &mut plain).unwrap();
        assert_eq!(&packed[1..], &plain[..]);
        // Empty and tiny values too.
        assert_eq!(round_trip(&[]), [PLAIN]);
        assert_eq!(round_trip(&[(ChangeKind::Data, String::new())])[0], PLAIN);
    }

    #[test]
    fn a_packed_value_that_does_not_unpack_is_corrupt() {
        let packed = round_trip(&inserts());
        let mut scratch = Vec::new();
        let mut corrupt = |value: &[u8]| {
            assert!(
                matches!(
                    unpack(value, &mut scratch, "0a"),
                    Err(ChangeLogError::Corrupt(_))
                ),
                "{value:?}"
            );
        };
        corrupt(&[]);
        corrupt(&[9, 1, 2, 3]);
        corrupt(&packed[..3]);
        // Cut anywhere inside its block, or with a length that does not match it.
        for cut in 5..packed.len() {
            corrupt(&packed[..cut]);
        }
        let mut longer = packed.clone();
        longer[1..5].copy_from_slice(
            &(u32::from_le_bytes(packed[1..5].try_into().unwrap()) + 1).to_le_bytes(),
        );
        corrupt(&longer);
        // A length no block of this size can hold is refused before anything is allocated.
        let mut huge = packed.clone();
        huge[1..5].copy_from_slice(&u32::MAX.to_le_bytes());
        corrupt(&huge);
    }
}
