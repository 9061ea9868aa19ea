//! The PostgreSQL statements of the service's safety state (what it is and why:
//! `changelog/safety.rs`), with the same semantics as the SQLite engine's: apply one
//! [`StateChange`] inside the writer's fenced transaction, read the [`SafetyState`] back.

use tokio_postgres::{GenericClient, Transaction as PgTransaction};

use super::safety::{
    delay_from_stored, delay_to_stored, RecordedWatermark, SafetyState, StateChange,
    StoredReservation, CLEANUP_DELAY, LAST_SCHEDULED,
};
use super::schema::parse_watermark;
use super::types::ChangeLogError;

/// Applies `change` inside the writer's transaction (see [`StateChange`] for what each does).
pub(super) async fn apply(
    tx: &PgTransaction<'_>,
    change: &StateChange,
) -> Result<(), ChangeLogError> {
    const SET: &str = "INSERT INTO change_streamer.service_state (key, value) VALUES ($1, $2)
                       ON CONFLICT (key) DO UPDATE SET value = excluded.value";
    match change {
        StateChange::CleanupDelay(delay) => {
            tx.execute(SET, &[&CLEANUP_DELAY, &delay_to_stored(*delay)])
                .await?;
        }
        StateChange::Recorded(list) => {
            let ws: Vec<&str> = list.iter().map(|r| r.watermark.as_str()).collect();
            let replicas: Vec<&str> = list.iter().map(|r| r.replica.as_str()).collect();
            let ats: Vec<i64> = list.iter().map(|r| r.backed_up_ms).collect();
            tx.execute(
                "INSERT INTO change_streamer.backup_watermarks (watermark, replica, backed_up_ms)
                 SELECT * FROM unnest($1::text[], $2::text[], $3::int8[])
                 ON CONFLICT (watermark) DO NOTHING",
                &[&ws, &replicas, &ats],
            )
            .await?;
        }
        StateChange::Scheduled(w) => {
            tx.execute(SET, &[&LAST_SCHEDULED, &w.as_str()]).await?;
            tx.execute(
                "INSERT INTO change_streamer.scheduled_purges (watermark) VALUES ($1)
                 ON CONFLICT DO NOTHING",
                &[&w.as_str()],
            )
            .await?;
            tx.execute(
                "DELETE FROM change_streamer.backup_watermarks WHERE watermark <= $1",
                &[&w.as_str()],
            )
            .await?;
        }
        StateChange::Purged(w) => {
            tx.execute(
                "DELETE FROM change_streamer.scheduled_purges WHERE watermark = $1",
                &[&w.as_str()],
            )
            .await?;
        }
        StateChange::ReservationOpened(r) => {
            tx.execute(
                "INSERT INTO change_streamer.reservations (task_id, started_ms) VALUES ($1, $2)
                 ON CONFLICT (task_id) DO UPDATE SET started_ms = excluded.started_ms",
                &[&r.task_id, &r.started_ms],
            )
            .await?;
        }
        StateChange::ReservationEnded(task) => {
            tx.execute(
                "DELETE FROM change_streamer.reservations WHERE task_id = $1",
                &[task],
            )
            .await?;
        }
    }
    Ok(())
}

/// Reads the whole safety state.
pub(super) async fn load(c: &impl GenericClient) -> Result<SafetyState, ChangeLogError> {
    let value = |key: &'static str| async move {
        let row = c
            .query_opt(
                "SELECT value FROM change_streamer.service_state WHERE key = $1",
                &[&key],
            )
            .await?;
        Ok::<_, ChangeLogError>(row.map(|r| r.get::<_, String>(0)))
    };
    let cleanup_delay = value(CLEANUP_DELAY)
        .await?
        .map(delay_from_stored)
        .transpose()?;
    let last_scheduled = value(LAST_SCHEDULED)
        .await?
        .map(parse_watermark)
        .transpose()?;
    let recorded = c
        .query(
            "SELECT watermark, replica, backed_up_ms FROM change_streamer.backup_watermarks
             ORDER BY watermark",
            &[],
        )
        .await?
        .into_iter()
        .map(|r| {
            Ok(RecordedWatermark {
                watermark: parse_watermark(r.get(0))?,
                replica: r.get(1),
                backed_up_ms: r.get(2),
            })
        })
        .collect::<Result<_, ChangeLogError>>()?;
    let scheduled = c
        .query(
            "SELECT watermark FROM change_streamer.scheduled_purges ORDER BY watermark",
            &[],
        )
        .await?
        .into_iter()
        .map(|r| parse_watermark(r.get(0)))
        .collect::<Result<_, _>>()?;
    let reservations = c
        .query(
            "SELECT task_id, started_ms FROM change_streamer.reservations ORDER BY started_ms",
            &[],
        )
        .await?
        .into_iter()
        .map(|r| StoredReservation {
            task_id: r.get(0),
            started_ms: r.get(1),
        })
        .collect();
    Ok(SafetyState {
        cleanup_delay,
        last_scheduled,
        recorded,
        scheduled,
        reservations,
    })
}
