//! The change log's reader thread: catch-up reads on a connection of their own, so that a
//! subscriber reading far behind never holds up ingest (WAL mode lets the two run at once).

use std::sync::mpsc;

use rusqlite::{params, Connection};

use super::commands::ReadCommand;
use super::segments::{load_segments, segment_table};
use super::{ChangeKind, ChangeLogError, StoredChange};
use crate::watermark::Watermark;

pub(super) fn run_reader(mut conn: Connection, rx: mpsc::Receiver<ReadCommand>) {
    conn.set_prepared_statement_cache_capacity(64);
    while let Ok(cmd) = rx.recv() {
        let result = read_range(&mut conn, &cmd);
        let _ = cmd.reply.send(result);
    }
}

/// Reads in one read transaction, so the segment list and the rows are one snapshot.
fn read_range(
    conn: &mut Connection,
    cmd: &ReadCommand,
) -> Result<Vec<StoredChange>, ChangeLogError> {
    let tx = conn.transaction()?;
    let segments = load_segments(&tx)?;
    let mut out = Vec::with_capacity(cmd.limit.min(4096));
    for seg in segments
        .iter()
        .filter(|s| s.max >= cmd.after.0 && s.min <= cmd.up_to)
    {
        if out.len() >= cmd.limit {
            break;
        }
        let mut stmt = tx.prepare_cached(&format!(
            "SELECT watermark, pos, kind, change FROM {}
             WHERE (watermark, pos) > (?1, ?2) AND watermark <= ?3
             ORDER BY watermark, pos LIMIT ?4",
            segment_table(seg.id)
        ))?;
        let rows = stmt.query_map(
            params![
                cmd.after.0.as_str(),
                cmd.after.1,
                cmd.up_to.as_str(),
                (cmd.limit - out.len()) as i64
            ],
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                ))
            },
        )?;
        for row in rows {
            let (w, pos, kind, json) = row?;
            let watermark = Watermark::parse(&w).map_err(|_| ChangeLogError::Corrupt(w.clone()))?;
            let kind = ChangeKind::parse(&kind).ok_or(ChangeLogError::Corrupt(kind))?;
            out.push(StoredChange {
                watermark,
                pos,
                kind,
                json,
            });
        }
    }
    tx.commit()?;
    Ok(out)
}
