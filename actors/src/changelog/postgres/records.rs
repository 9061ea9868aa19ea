//! The PostgreSQL engine's instance records (PROTOCOL.md §14.1): an instance's own connection to
//! the change DB, apart from the owner's fenced writer, through which it keeps its record and
//! reads the others' and the change DB's state.
//!
//! ### Why a connection of its own, never fenced
//! A record is not a change-log write: a standby has no writer and must still refresh its
//! record, and a refresh must never be able to fail or delay an append. So each instance
//! writes its record through this connection, which holds no lock and passes no fence. That
//! cannot break the owner's fence: an instance only ever writes its own rows here (its record
//! and its subscriber rows, keyed by its id) and deletes records that are gone, and nothing
//! of the change log, its catalogue or the safety state is written through it.
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

use std::sync::Arc;

use tokio_postgres::{Client, Config, GenericClient};

use super::connection::{connect, redacted};
use super::safety::SafetyState;
use super::schema::{self, parse_watermark, INSTANCES_SCHEMA};
use super::state;
use super::types::{ChangeLogError, LogStats, PurgeGate, PurgeHold};
use crate::instance::{InstanceId, InstanceRecord, InstanceSeen, Refreshed, GONE_AFTER};
use crate::watermark::Watermark;

/// The transaction advisory lock a purge (exclusive) and a refresh (shared) take ("cs" + 3):
/// see the module documentation.
pub(super) const PURGE_GATE_KEY: i64 = 0x6373_0003;

/// What a standby shows of the change DB on its `/status` (PROTOCOL.md §11): the change log's
/// range and the safety state, as the owner last wrote them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangeDbView {
    pub log: LogStats,
    pub safety: SafetyState,
}

/// An instance's own, unfenced connection to the change DB (see the module documentation).
/// Cheap to clone: the clones share the one connection, driven on the runtime that made it.
#[derive(Clone)]
pub struct InstanceDb {
    client: Arc<Client>,
    location: String,
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
        let client = connect(&config).await?;
        schema::create_missing(&client, INSTANCES_SCHEMA).await?;
        Ok(InstanceDb {
            client: Arc::new(client),
            location: redacted(&config),
        })
    }

    /// The change DB's URL without its password.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// Whether the connection ended (a new one is needed).
    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// Writes `record` (the record, and its subscriber rows anew) and says whether the record
    /// it replaced was live. One statement, so one transaction: the rows of a refresh are
    /// seen together or not at all, and no explicit transaction is open on this shared
    /// connection while other reads use it.
    pub async fn refresh(&self, record: &InstanceRecord) -> Result<Refreshed, ChangeLogError> {
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
                         FROM gate, unnest($5::text[], $6::text[]) AS s(name, acked))
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
                ],
            )
            .await?;
        Ok(if row.get::<_, bool>(0) {
            Refreshed::Continuous
        } else {
            Refreshed::New
        })
    }

    /// Deletes every record that is gone (with its subscriber rows); answers their ids.
    pub async fn sweep_gone(&self) -> Result<Vec<String>, ChangeLogError> {
        let rows = self
            .client
            .query(
                &format!("DELETE FROM change_streamer.instances i WHERE NOT ({LIVE}) RETURNING id"),
                &[&gone_after_ms()],
            )
            .await?;
        Ok(rows.into_iter().map(|r| r.get(0)).collect())
    }

    /// Deletes this instance's own record (a graceful stop: it is gone at once).
    pub async fn remove(&self, id: &InstanceId) -> Result<(), ChangeLogError> {
        self.client
            .execute(
                "DELETE FROM change_streamer.instances WHERE id = $1",
                &[&id.as_str()],
            )
            .await?;
        Ok(())
    }

    /// Every instance that is not gone, by id.
    pub async fn instances(&self) -> Result<Vec<InstanceSeen>, ChangeLogError> {
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
    }

    /// The change log's range and the safety state as stored; empty while no owner has
    /// created the change log's tables yet.
    pub async fn view(&self) -> Result<ChangeDbView, ChangeLogError> {
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
    }
}
