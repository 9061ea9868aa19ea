//! The real service started in-process on 127.0.0.1:0 with a fresh data directory, and how a
//! test reads it: plain HTTP requests, its `/status`, and waiting for `/status` to show a state.

use std::time::Instant;

use change_streamer::{Config, Instance};
use change_streamer_actors::clock::Clock;
use clap::Parser;
use serde_json::Value;

use crate::access::Credentials;
use crate::upstream::{txn, FakeUpstream};
use crate::wait::{POLL, STATUS_LIMIT};

/// The service with `extra` flags on a fake change source whose initial sync (watermark 100,
/// one row) it has stored: the replicaVersion is 100.
pub async fn service_with_upstream(extra: &[&str]) -> (TestService, FakeUpstream) {
    let up = FakeUpstream::start().await;
    let url = up.url();
    let mut args = vec!["--upstream", url.as_str()];
    args.extend_from_slice(extra);
    let svc = TestService::start(&args).await;
    up.wait_connections(1).await;
    up.send(txn(100, 1));
    let rv = change_streamer_actors::watermark::Watermark::from_u64(100).to_string();
    svc.wait_status("initial sync", |s| {
        s["replicaVersion"] == serde_json::json!(rv)
    })
    .await;
    (svc, up)
}

/// The service on 127.0.0.1:0 with `args`, a temporary data dir unless one is given.
pub struct TestService {
    pub service: Option<Instance>,
    pub dir: tempfile::TempDir,
    /// What [`get`](Self::get), [`status`](Self::status) and [`ws`](Self::ws) present: the
    /// `--secret` it was started with, if any; a TLS test sets the roots it trusts.
    pub credentials: Credentials,
}

impl TestService {
    pub async fn start(args: &[&str]) -> TestService {
        let dir = tempfile::tempdir().expect("tempdir");
        Self::start_in(dir, args).await
    }

    pub async fn start_in(dir: tempfile::TempDir, args: &[&str]) -> TestService {
        Self::launch(dir, "127.0.0.1", args)
            .await
            .unwrap_or_else(|e| panic!("start service: {e}"))
    }

    /// The service on `host` (an address the test made, say), port 0.
    pub async fn start_on(host: &str, args: &[&str]) -> TestService {
        let dir = tempfile::tempdir().expect("tempdir");
        Self::launch(dir, host, args)
            .await
            .unwrap_or_else(|e| panic!("start service: {e}"))
    }

    /// The message of the start error that `args` cause (panics if the service starts).
    pub async fn start_error(args: &[&str]) -> String {
        let dir = tempfile::tempdir().expect("tempdir");
        match Self::launch(dir, "127.0.0.1", args).await {
            Ok(_) => panic!("{args:?} started"),
            Err(e) => e,
        }
    }

    async fn launch(
        dir: tempfile::TempDir,
        host: &str,
        args: &[&str],
    ) -> Result<TestService, String> {
        let data = dir.path().to_string_lossy().to_string();
        let mut all = vec![
            "change-streamer",
            "--host",
            host,
            "--port",
            "0",
            "--data-dir",
            &data,
        ];
        all.extend_from_slice(args);
        let config = Config::try_parse_from(all).expect("config");
        let service = Instance::start(config, Clock::System)
            .await
            .map_err(|e| e.to_string())?;
        Ok(TestService {
            service: Some(service),
            dir,
            credentials: Credentials::for_args(args),
        })
    }

    /// `host:port` it listens on.
    pub fn base(&self) -> String {
        self.service.as_ref().expect("running").addr().to_string()
    }

    pub fn ws(&self, path: &str) -> String {
        format!("{}://{}{}", self.credentials.ws(), self.base(), path)
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        let mut resp = self
            .credentials
            .client()
            .get(format!(
                "{}://{}{}",
                self.credentials.http(),
                self.base(),
                path
            ))
            .send()
            .await
            .expect("http get");
        let body = resp.body().limit(16 << 20).await.expect("body");
        (
            resp.status().as_u16(),
            String::from_utf8_lossy(&body).into_owned(),
        )
    }

    pub async fn status(&self) -> Value {
        let (code, body) = self.get("/status").await;
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).expect("status JSON")
    }

    /// Stops the service; returns its data directory for a restart.
    pub async fn stop(mut self) -> tempfile::TempDir {
        if let Some(s) = self.service.take() {
            if let Err(e) = s.stop(change_streamer::shutdown::StopMode::Graceful).await {
                panic!("the service's life ended with an error: {e}");
            }
        }
        self.dir
    }

    /// Polls `/status` until `cond` holds and returns that status; panics, naming `what` and
    /// showing the last status, when it does not hold within [`STATUS_LIMIT`].
    pub async fn wait_status(&self, what: &str, mut cond: impl FnMut(&Value) -> bool) -> Value {
        let deadline = Instant::now() + STATUS_LIMIT;
        loop {
            let st = self.status().await;
            if cond(&st) {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "{what} never happened within {STATUS_LIMIT:?}: {st}"
            );
            actix_rt::time::sleep(POLL).await;
        }
    }
}
