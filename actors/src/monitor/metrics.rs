//! The metrics source (PROTOCOL.md §8.1): one GET of litestream's `/metrics` per poll, read for
//! the `litestream_replica_progress` samples that only Zero's litestream fork exports.

use actix::prelude::*;
use log::{debug, warn};

use super::{MonitorActor, Observed, PollOutcome};
use crate::litestream::{parse_progress_page, PROGRESS_METRIC};

/// The most a metrics page may weigh; litestream's is a few KiB per database.
const MAX_PAGE_BYTES: usize = 64 << 20;

#[derive(Debug, thiserror::Error)]
enum FetchError {
    #[error("{0}")]
    Send(String),
    #[error("HTTP {status}: {body}")]
    Status { status: u16, body: String },
    #[error("reading the body: {0}")]
    Body(String),
    #[error("{0}")]
    Page(#[from] crate::litestream::PageError),
    #[error("the page holds no {PROGRESS_METRIC} sample: only Zero's litestream fork exports it; with stock litestream 0.5, read the backup itself with --litestream-vfs")]
    MissingMetric,
}

impl MonitorActor {
    /// PROTOCOL.md §8.1: one GET of the metrics page, bounded by the timeout.
    pub(super) fn poll_metrics(&mut self, url: String) -> ResponseActFuture<Self, Observed> {
        let client = self.client.get_or_insert_with(awc::Client::default).clone();
        let timeout = self.cfg.timeout;
        let fetch = async move {
            let mut resp = client
                .get(&url)
                .timeout(timeout)
                .send()
                .await
                .map_err(|e| FetchError::Send(e.to_string()))?;
            let body = resp
                .body()
                .limit(MAX_PAGE_BYTES)
                .await
                .map_err(|e| FetchError::Body(e.to_string()))?;
            let text = String::from_utf8_lossy(&body).into_owned();
            if !resp.status().is_success() {
                let first_line = text
                    .lines()
                    .next()
                    .unwrap_or("")
                    .chars()
                    .take(200)
                    .collect();
                return Err(FetchError::Status {
                    status: resp.status().as_u16(),
                    body: first_line,
                });
            }
            let page = parse_progress_page(&text)?;
            if page.samples.is_empty() && page.invalid.is_empty() {
                return Err(FetchError::MissingMetric);
            }
            Ok(page)
        };
        Box::pin(fetch.into_actor(self).map(|res, act, _| match res {
            Ok(page) => {
                for reason in &page.invalid {
                    warn!("ignoring litestream sample: {reason}");
                }
                act.stats.invalid_watermarks_total += page.invalid.len() as u64;
                act.stats.last_poll_ok = Some(true);
                debug!("metrics poll read {} sample(s)", page.samples.len());
                let outcome = PollOutcome::Read {
                    samples: page.samples.len(),
                    invalid: page.invalid.len(),
                };
                (page.samples, outcome)
            }
            Err(e) => act.failed(e.to_string()),
        }))
    }
}
