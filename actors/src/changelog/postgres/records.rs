//! The PostgreSQL engine's instance records (PROTOCOL.md §14.1): an instance's own connection to
//! the change DB, apart from the owner's fenced writer, through which it keeps its record and
//! reads the others' and the change DB's state.
//!
//! ### Why a connection of its own, never fenced
//! A record is not a change-log write: a standby has no writer and must still refresh its
//! record, and a refresh must never be able to fail or delay an append. So each instance
//! writes its record through this connection, which holds no lock and passes no fence. That
//! cannot break the owner's fence: an instance only ever writes its own rows here (its record,
//! its subscriber and reservation rows, keyed by its id, and the ends by subscription its
//! subscribers made) and deletes records that are gone; the owner also forgets, here, the
//! reservation rows it wrote down as orphans and the ends it applied (`reservation/records.rs`).
//! Nothing of the change log, its catalogue or the safety state is written through it.
//!
//! ### A purge never passes a subscriber being recorded
//! The owner's purge reads the other instances' subscriber rows in the transaction that purges
//! ([`purge_hold`]), under the transaction advisory lock [`PURGE_GATE_KEY`]; every refresh
//! writes its rows under the same lock, shared. So a refresh's rows are either committed
//! before the purge reads (and hold it back), or written after the purge committed. A standby
//! checks a joining subscriber's watermark against the change log only after a refresh that
//! recorded it ended, so it either holds the purge back from its first `status` on or sees
//! the rows the purge removed, and refuses it (PROTOCOL.md §14.1).
//!
//! Ages are the change DB's clock (`now()` at the refresh, `clock_timestamp()` at the read),
//! so instances on machines whose clocks disagree still agree on which record is 10 s old.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio_postgres::{Client, Config, GenericClient};

use super::connection::{connect, named, redacted, within, Bounds, Session};
use super::safety::ChangeDbView;
use super::schema::{self, parse_watermark, INSTANCES_SCHEMA};
use super::state;
use super::types::{ChangeLogError, PurgeGate, PurgeHold};
use crate::instance::{InstanceId, InstanceRecord, InstanceSeen, Refreshed, GONE_AFTER};
use crate::reservation::records::{
    HeldReservation, RecordedEnd, RecordedReservation, ReservationRecords,
};
use crate::watermark::Watermark;

/// The transaction advisory lock a purge (exclusive) and a refresh (shared) take ("cs" + 3):
/// see the module documentation.
pub(super) const PURGE_GATE_KEY: i64 = 0x6373_0003;

/// An instance's own, unfenced connection to the change DB (see the module documentation).
/// Cheap to clone: the clones share the one connection, driven on the runtime that made it.
#[derive(Clone)]
pub struct InstanceDb {
    client: Arc<Client>,
    location: String,
    /// Set once a call went unanswered (PROTOCOL.md §14.2, a silent change DB): the connection
    /// counts as ended, and the next refresh makes a new one.
    given_up: Arc<AtomicBool>,
}

/// A record is live while this holds (`$1`: [`GONE_AFTER`] in ms): younger than 10 s, and
/// written by a session PostgreSQL still shows.
const LIVE: &str = "clock_timestamp() - i.refreshed_at <= $1::int8 * interval '1 millisecond'
     AND EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = i.backend_pid)";

fn gone_after_ms() -> i64 {
    GONE_AFTER.as_millis() as i64
}

/// What holds back a purge below `before` among the subscribers of the instances not gone
/// other than `own` (the purging instance, whose subscribers its streamer checked), given how
/// many subscribers the purging instance has (PROTOCOL.md §9, §14.1). Run in the purging
/// transaction: it takes [`PURGE_GATE_KEY`] first, which that transaction then holds until it
/// commits (see the module documentation).
pub(super) async fn purge_hold(
    tx: &impl GenericClient,
    before: &Watermark,
    gate: PurgeGate,
    own: Option<&str>,
) -> Result<Option<PurgeHold>, ChangeLogError> {
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&PURGE_GATE_KEY])
        .await?;
    let lowest = tx
        .query_opt(
            &format!(
                "SELECT s.instance, s.subscriber, s.acked
                 FROM change_streamer.instance_subscribers s
                 JOIN change_streamer.instances i ON i.id = s.instance
                 WHERE {LIVE} AND i.id IS DISTINCT FROM $2
                 ORDER BY s.acked LIMIT 1"
            ),
            &[&gone_after_ms(), &own],
        )
        .await?;
    let Some(row) = lowest else {
        return Ok((gate.local_subscribers == 0).then_some(PurgeHold::NoSubscribers));
    };
    let acked = parse_watermark(row.get(2))?;
    Ok((acked < *before).then(|| PurgeHold::Subscriber {
        instance: row.get(0),
        subscriber: row.get(1),
        acked,
    }))
}

impl InstanceDb {
    /// Connects to the change DB at `url` on the current runtime and creates the records'
    /// tables if they are missing.
    pub async fn connect(url: &str) -> Result<InstanceDb, ChangeLogError> {
        let config: Config = url.parse()?;
        let client = connect(&named(&config, "records"), Session::Other).await?;
        within(
            Bounds::current().call(),
            schema::create_missing(&client, INSTANCES_SCHEMA),
        )
        .await?;
        Ok(InstanceDb {
            client: Arc::new(client),
            location: redacted(&config),
            given_up: Arc::new(AtomicBool::new(false)),
        })
    }

    /// `f` within the bound of a call; given up, the connection counts as ended.
    async fn bounded<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, ChangeLogError>>,
    ) -> Result<T, ChangeLogError> {
        let r = within(Bounds::current().call(), f).await;
        if matches!(r, Err(ChangeLogError::Silent(_))) {
            self.given_up.store(true, Ordering::Relaxed);
        }
        r
    }

    /// The change DB's URL without its password.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// Whether the connection ended, or was given up (a new one is needed).
    pub fn is_closed(&self) -> bool {
        self.client.is_closed() || self.given_up.load(Ordering::Relaxed)
    }

    /// Writes `record` (the record, and its subscriber rows anew) and says whether the record
    /// it replaced was live. One statement, so one transaction: the rows of a refresh are
    /// seen together or not at all, and no explicit transaction is open on this shared
    /// connection while other reads use it.
    ///
    /// With `held`, this instance's reservation rows are replaced by it in the same statement
    /// (a serving standby's; `None` leaves them as they are: see `reservation/records.rs`).
    pub async fn refresh_with(
        &self,
        record: &InstanceRecord,
        held: Option<&[HeldReservation]>,
    ) -> Result<Refreshed, ChangeLogError> {
        self.bounded(async {
            let write_held = held.is_some();
            let held = held.unwrap_or_default();
            let tasks: Vec<&str> = held.iter().map(|r| r.task_id.as_str()).collect();
            let starts: Vec<i64> = held.iter().map(|r| r.started_ms).collect();
            let names: Vec<&str> = record.subscribers.iter().map(|s| s.0.as_str()).collect();
            let acked: Vec<&str> = record.subscribers.iter().map(|s| s.1.as_str()).collect();
            let row = self
                .client
                .query_one(
                    &format!(
                        "WITH prev AS (SELECT 1 FROM change_streamer.instances i WHERE i.id = $2 AND {LIVE}),
                         up AS (
                             INSERT INTO change_streamer.instances
                                 (id, role, backend_pid, refreshed_at, reservations)
                             VALUES ($2, $3, pg_backend_pid(), now(), $4)
                             ON CONFLICT (id) DO UPDATE SET role = excluded.role,
                                 backend_pid = excluded.backend_pid,
                                 refreshed_at = excluded.refreshed_at,
                                 reservations = excluded.reservations
                             RETURNING id),
                         old AS (DELETE FROM change_streamer.instance_subscribers WHERE instance = $2),
                         gate AS (SELECT pg_advisory_xact_lock_shared($7)),
                         new AS (
                             INSERT INTO change_streamer.instance_subscribers (instance, subscriber, acked)
                             SELECT $2, s.name, s.acked
                             FROM gate, unnest($5::text[], $6::text[]) AS s(name, acked)),
                         old_held AS (DELETE FROM change_streamer.instance_reservations
                             WHERE instance = $2 AND $10),
                         new_held AS (
                             INSERT INTO change_streamer.instance_reservations (instance, task_id, started_ms)
                             SELECT $2, r.task, r.started
                             FROM unnest($8::text[], $9::int8[]) AS r(task, started) WHERE $10)
                         SELECT EXISTS (SELECT 1 FROM prev)"
                    ),
                    &[
                        &gone_after_ms(),
                        &record.id.as_str(),
                        &record.role.as_str(),
                        &(record.reservations as i32),
                        &names,
                        &acked,
                        &PURGE_GATE_KEY,
                        &tasks,
                        &starts,
                        &write_held,
                    ],
                )
                .await?;
            Ok(if row.get::<_, bool>(0) {
                Refreshed::Continuous
            } else {
                Refreshed::New
            })
        })
        .await
    }

    /// Deletes every record that is gone (with its subscriber rows); answers their ids.
    pub async fn sweep_gone(&self) -> Result<Vec<String>, ChangeLogError> {
        self.bounded(async {
            let rows = self
                .client
                .query(
                    &format!(
                        "DELETE FROM change_streamer.instances i WHERE NOT ({LIVE}) RETURNING id"
                    ),
                    &[&gone_after_ms()],
                )
                .await?;
            Ok(rows.into_iter().map(|r| r.get(0)).collect())
        })
        .await
    }

    /// Deletes this instance's own record (a graceful stop: it is gone at once).
    pub async fn remove(&self, id: &InstanceId) -> Result<(), ChangeLogError> {
        self.bounded(async {
            self.client
                .execute(
                    "DELETE FROM change_streamer.instances WHERE id = $1",
                    &[&id.as_str()],
                )
                .await?;
            Ok(())
        })
        .await
    }

    /// Every instance that is not gone, by id.
    pub async fn instances(&self) -> Result<Vec<InstanceSeen>, ChangeLogError> {
        self.bounded(async {
            let rows = self
                .client
                .query(
                    &format!(
                        "SELECT i.id, i.role,
                             (SELECT count(*) FROM change_streamer.instance_subscribers s
                              WHERE s.instance = i.id)::int8,
                             i.reservations::int8,
                             GREATEST(0, (extract(epoch FROM clock_timestamp() - i.refreshed_at)
                                          * 1000))::int8
                         FROM change_streamer.instances i WHERE {LIVE} ORDER BY i.id"
                    ),
                    &[&gone_after_ms()],
                )
                .await?;
            Ok(rows
                .into_iter()
                .map(|r| InstanceSeen {
                    id: r.get(0),
                    role: r.get(1),
                    subscribers: r.get::<_, i64>(2).max(0) as u32,
                    reservations: r.get::<_, i64>(3).max(0) as u32,
                    last_seen_ms: r.get::<_, i64>(4).max(0) as u64,
                })
                .collect())
        })
        .await
    }

    /// Every recorded held reservation, live or not (`own`, the reading owner's id, counts as
    /// not live: what it recorded as a standby it no longer serves), and every end.
    pub async fn reservation_records(
        &self,
        own: &str,
    ) -> Result<ReservationRecords, ChangeLogError> {
        self.bounded(async {
            let c = &*self.client;
            let held = c
                .query(
                    &format!(
                        "SELECT r.instance, r.task_id, r.started_ms,
                             COALESCE((SELECT {LIVE} FROM change_streamer.instances i
                                       WHERE i.id = r.instance), false) AND r.instance <> $2
                         FROM change_streamer.instance_reservations r
                         ORDER BY r.instance, r.task_id"
                    ),
                    &[&gone_after_ms(), &own],
                )
                .await?
                .into_iter()
                .map(|r| RecordedReservation {
                    instance: r.get(0),
                    task_id: r.get(1),
                    started_ms: r.get(2),
                    live: r.get(3),
                })
                .collect();
            let ends = c
                .query(
                    "SELECT task_id, ended_ms, started_ms FROM change_streamer.reservation_ends
                     ORDER BY ended_ms, task_id",
                    &[],
                )
                .await?
                .into_iter()
                .map(end_row)
                .collect();
            Ok(ReservationRecords { held, ends })
        })
        .await
    }

    /// The ends recorded for any of `tasks` (a holder's refresh: what it must close).
    pub async fn ends_for(&self, tasks: &[&str]) -> Result<Vec<RecordedEnd>, ChangeLogError> {
        self.bounded(async {
            Ok(self
                .client
                .query(
                    "SELECT task_id, ended_ms, started_ms FROM change_streamer.reservation_ends
                     WHERE task_id = ANY($1) ORDER BY ended_ms",
                    &[&tasks],
                )
                .await?
                .into_iter()
                .map(end_row)
                .collect())
        })
        .await
    }

    /// Records an end by subscription (a second one of the same task and time is the same).
    pub async fn record_end(&self, end: &RecordedEnd) -> Result<(), ChangeLogError> {
        self.bounded(async {
            self.client
                .execute(
                    "INSERT INTO change_streamer.reservation_ends (task_id, ended_ms, started_ms)
                     VALUES ($1, $2, $3)
                     ON CONFLICT (task_id, ended_ms) DO UPDATE
                         SET started_ms = COALESCE(reservation_ends.started_ms, excluded.started_ms)",
                    &[&end.task_id, &end.ended_ms, &end.started_ms],
                )
                .await?;
            Ok(())
        })
        .await
    }

    /// Forgets held reservations the owner wrote down as its orphans (each as read: a row
    /// written anew since, with another start, stays) and ends it applied.
    pub async fn forget(
        &self,
        held: &[RecordedReservation],
        ends: &[RecordedEnd],
    ) -> Result<(), ChangeLogError> {
        self.bounded(async {
            let instances: Vec<&str> = held.iter().map(|r| r.instance.as_str()).collect();
            let tasks: Vec<&str> = held.iter().map(|r| r.task_id.as_str()).collect();
            let starts: Vec<i64> = held.iter().map(|r| r.started_ms).collect();
            let end_tasks: Vec<&str> = ends.iter().map(|e| e.task_id.as_str()).collect();
            let end_times: Vec<i64> = ends.iter().map(|e| e.ended_ms).collect();
            self.client
                .execute(
                    "WITH h AS (
                         DELETE FROM change_streamer.instance_reservations r
                         USING unnest($1::text[], $2::text[], $3::int8[]) AS f(instance, task, started)
                         WHERE r.instance = f.instance AND r.task_id = f.task
                           AND r.started_ms = f.started)
                     DELETE FROM change_streamer.reservation_ends e
                     USING unnest($4::text[], $5::int8[]) AS f(task, ended)
                     WHERE e.task_id = f.task AND e.ended_ms = f.ended",
                    &[&instances, &tasks, &starts, &end_tasks, &end_times],
                )
                .await?;
            Ok(())
        })
        .await
    }

    /// The change log's range and the safety state as stored; empty while no owner has
    /// created the change log's tables yet.
    pub async fn view(&self) -> Result<ChangeDbView, ChangeLogError> {
        self.bounded(async {
            let c = &*self.client;
            let created: bool = c
                .query_one(
                    "SELECT to_regclass('change_streamer.reservations') IS NOT NULL",
                    &[],
                )
                .await?
                .get(0);
            if !created {
                return Ok(ChangeDbView::default());
            }
            let ((log, _), safety) =
                futures_util::future::try_join(schema::read_stats(c), state::load(c)).await?;
            Ok(ChangeDbView { log, safety })
        })
        .await
    }
}

fn end_row(r: tokio_postgres::Row) -> RecordedEnd {
    RecordedEnd {
        task_id: r.get(0),
        ended_ms: r.get(1),
        started_ms: r.get(2),
    }
}
