//! A standby's `/status` (PROTOCOL.md §11, §14.1): its role and instance id, the change DB's
//! state as the owner last stored it (`replicaVersion`, `changeLog`, `backup`), read through
//! the instance's record connection, and the subscribers it serves (none with
//! `--standby-serves=false`). It holds no reservation, and knows nothing of the owner's upstream
//! or purges beyond what is stored, so `upstream` and `purge` are null.

use std::sync::Arc;

use actix::Addr;
use actix_web::{web, HttpResponse};
use change_streamer_actors::changelog::{ChangeDbView, ChangeLog};
use change_streamer_actors::cleanup::PendingWatermark;
use change_streamer_actors::instance::recorder::{GetChangeDbView, InstanceRecorder};
use change_streamer_actors::instance::InstanceId;
use change_streamer_actors::ownership::Role;
use change_streamer_actors::streamer::{GetStreamerState, Streamer, SubscriberInfo};
use log::warn;
use serde_json::{json, Value};

use crate::config::Config;
use crate::shutdown::Guards;

/// What the standby server's handlers reach.
#[derive(Clone)]
pub struct StandbyState {
    pub config: Arc<Config>,
    pub instance: InstanceId,
    pub recorder: Addr<InstanceRecorder>,
    /// What a serving standby serves `/changes` with (`--standby-serves`).
    pub serving: Option<Serving>,
}

/// A serving standby's streamer, its handle on the change DB and its sessions' guards.
#[derive(Clone)]
pub struct Serving {
    pub streamer: Addr<Streamer>,
    pub log: ChangeLog,
    pub guards: Guards,
}

/// `state` is `None` on the standby of [`Service::start`](crate::Service::start), which keeps
/// no record: it shows its role only.
pub async fn standby_status(state: Option<web::Data<StandbyState>>) -> HttpResponse {
    let Some(state) = state else {
        return HttpResponse::Ok().json(json!({ "role": Role::Standby }));
    };
    let subscribers = async {
        match &state.serving {
            Some(s) => s
                .streamer
                .send(GetStreamerState)
                .await
                .map(|s| s.subscribers)
                .unwrap_or_default(), // stopped: it serves nobody
            None => Vec::new(),
        }
    };
    let (view, subscribers) =
        futures_util::future::join(state.recorder.send(GetChangeDbView), subscribers).await;
    let view = match view {
        Ok(Ok(view)) => Some(view),
        Ok(Err(e)) => {
            warn!("standby /status: reading the change DB failed: {e}");
            None
        }
        Err(_) => None, // the recorder stopped: the standby is stopping
    };
    HttpResponse::Ok().json(standby_json(&state, view.as_ref(), &subscribers))
}

fn standby_json(
    state: &StandbyState,
    view: Option<&ChangeDbView>,
    subscribers: &[SubscriberInfo],
) -> Value {
    let cfg = &state.config;
    let stored = view.map(|v| {
        let log = &v.log;
        let safety = &v.safety;
        let pending: Vec<PendingWatermark> = safety
            .recorded
            .iter()
            .map(|r| PendingWatermark::new(r.watermark.clone(), r.replica.clone(), r.backed_up_ms))
            .collect();
        let delay = safety
            .cleanup_delay
            .unwrap_or_default()
            .max(cfg.starting_cleanup_delay());
        (
            json!(log.replica_version),
            json!({
                "minWatermark": log.min_watermark,
                "maxWatermark": log.max_watermark,
                "rows": log.rows,
            }),
            json!({
                "backupURL": cfg.litestream_backup_url,
                "metricsURL": cfg.litestream_metrics_url,
                "cleanupDelayMs": delay.as_millis() as u64,
                "paused": !safety.reservations.is_empty(),
                "lastScheduledWatermark": safety.last_scheduled,
                "pendingWatermarks": pending,
                "source": if cfg.litestream_vfs.is_some() { "vfs" } else { "metrics" },
            }),
        )
    });
    let (replica_version, change_log, backup) = stored.unwrap_or_default();
    json!({
        "role": Role::Standby,
        "instance": state.instance,
        "replicaVersion": replica_version,
        "changeLog": change_log,
        "backup": backup,
        "upstream": null,
        "purge": null,
        "reservations": [],
        "subscribers": subscribers,
    })
}
