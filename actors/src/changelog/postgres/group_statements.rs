//! The statements the owner's writer stores a commit group with ([`super::writer`]), prepared
//! once on its connection.

use tokio_postgres::{Client, Statement};

use super::types::ChangeLogError;
use crate::ownership;

/// What storing a commit group runs, prepared once on the writer's connection: each is parsed
/// and planned once, not per group, and a group needs two round trips (see `PgWriter::store`).
pub(super) struct GroupStatements {
    /// [`ownership::HOLDS_LOCK`]: the fence.
    pub(super) fence: Statement,
    /// The group's rows (a row per transaction of ordinary size, its value packed), its
    /// segments' counts, the replication state and the commit notice, in one statement (each
    /// data-modifying `WITH` part runs whether read or not).
    pub(super) group: Statement,
    /// A segment's row in the catalogue, with its layout, as a group opens it.
    pub(super) open_segment: Statement,
}

impl GroupStatements {
    pub(super) async fn prepare(c: &Client) -> Result<GroupStatements, ChangeLogError> {
        Ok(GroupStatements {
            fence: c.prepare(ownership::HOLDS_LOCK).await?,
            group: c
                .prepare(
                    r#"WITH stored AS (
                        INSERT INTO change_streamer.txn_log
                            (segment, watermark, first_pos, changes, body, stored_ms)
                        SELECT s, w, p, n, b, $6
                        FROM unnest($1::int8[], $2::text[], $3::int8[], $4::int8[], $5::bytea[])
                            AS t(s, w, p, n, b)
                        ON CONFLICT (watermark, first_pos, segment) DO UPDATE
                        SET changes = excluded.changes, body = excluded.body,
                            stored_ms = excluded.stored_ms
                    ), counted AS (
                        UPDATE change_streamer.segments AS g
                        SET max_watermark = u.max_w, rows = u.n, max_stored_ms = u.ms
                        FROM unnest($7::int8[], $8::text[], $9::int8[], $10::int8[])
                            AS u(id, max_w, n, ms)
                        WHERE g.id = u.id
                    ), state AS (
                        UPDATE change_streamer.replication_state
                        SET replica_version = COALESCE(replica_version, $11::text),
                            last_watermark = $12::text
                        WHERE id = 0
                    )
                    SELECT pg_notify($13::text, $14::text) WHERE $14::text IS NOT NULL"#,
                )
                .await?,
            open_segment: c
                .prepare(
                    "INSERT INTO change_streamer.segments
                         (id, min_watermark, max_watermark, rows, max_stored_ms, layout)
                     VALUES ($1, $2, $2, 0, $3, $4)",
                )
                .await?,
        })
    }
}
