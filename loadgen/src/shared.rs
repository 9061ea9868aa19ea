//! State shared by the change source and the subscribers inside the generator's one thread:
//! the run's phase, what was sent when, and the running counters the report is taken from
//! (over all subscribers, and per service address of `--service`).

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::workload::FIRST_SEQ;

/// Everything one run's tasks share (`Rc`, one thread: no locks).
pub struct Shared {
    pub t0: Instant,
    /// Live transactions flow once every subscriber has its `status`.
    pub go: Cell<bool>,
    pub go_changed: Notify,
    /// Latencies and gaps are recorded only inside the measured window.
    pub recording: Cell<bool>,
    pub stop: Cell<bool>,
    pub stop_changed: Notify,
    /// Nanoseconds after `t0` at which transaction `FIRST_SEQ + i` left for the service.
    sent_at: RefCell<Vec<u64>>,
    /// Highest sequence number the service acked upstream (durably stored).
    pub acked: Cell<u64>,
    /// Transactions written upstream.
    pub txns_sent: Cell<u64>,
    /// Over all subscribers: frames, messages (payloads), `data` changes and commits received.
    pub frames: Cell<u64>,
    pub msgs: Cell<u64>,
    pub changes: Cell<u64>,
    pub commits: Cell<u64>,
    pub subs_ready: Cell<usize>,
    pub subs_ready_changed: Notify,
    /// Commit-to-receipt latencies (µs) and longest receipt gap (µs) inside the window.
    pub latencies_us: RefCell<Vec<u32>>,
    pub longest_gap_us: Cell<u64>,
    /// Sent-to-acked latencies (µs) of the transactions acked inside the window.
    pub ack_latencies_us: RefCell<Vec<u32>>,
    pub errors: RefCell<Vec<String>>,
    pub error_count: Cell<u64>,
    /// Highest RssAnon of the service process seen so far (KiB), sampled every 100 ms.
    pub service_rss_anon_peak_kib: Cell<u64>,
    /// The same `data` changes and latencies, split by the service address the subscriber
    /// reads from (the index in `--service`'s list).
    pub per_service: Vec<PerService>,
}

/// What the subscribers of one service address received.
#[derive(Default)]
pub struct PerService {
    pub changes: Cell<u64>,
    pub latencies_us: RefCell<Vec<u32>>,
}

impl Shared {
    /// The state of a run whose subscribers read from `services` service addresses.
    pub fn new(services: usize) -> Self {
        Shared {
            t0: Instant::now(),
            go: Cell::new(false),
            go_changed: Notify::new(),
            recording: Cell::new(false),
            stop: Cell::new(false),
            stop_changed: Notify::new(),
            sent_at: RefCell::new(Vec::new()),
            acked: Cell::new(FIRST_SEQ),
            txns_sent: Cell::new(0),
            frames: Cell::new(0),
            msgs: Cell::new(0),
            changes: Cell::new(0),
            commits: Cell::new(0),
            subs_ready: Cell::new(0),
            subs_ready_changed: Notify::new(),
            latencies_us: RefCell::new(Vec::new()),
            longest_gap_us: Cell::new(0),
            ack_latencies_us: RefCell::new(Vec::new()),
            errors: RefCell::new(Vec::new()),
            error_count: Cell::new(0),
            service_rss_anon_peak_kib: Cell::new(0),
            per_service: (0..services).map(|_| PerService::default()).collect(),
        }
    }

    pub fn since_t0(&self) -> Duration {
        self.t0.elapsed()
    }

    /// Notes that transactions `from..=to` were flushed to the service's socket now.
    pub fn mark_sent(&self, from: u64, to: u64) {
        let now = self.since_t0().as_nanos() as u64;
        let mut sent = self.sent_at.borrow_mut();
        for seq in from..=to {
            let i = (seq - FIRST_SEQ) as usize;
            if sent.len() <= i {
                sent.resize(i + 1, 0);
            }
            sent[i] = now;
        }
    }

    /// The service acked every transaction up to `seq` now (above [`Shared::acked`]).
    pub fn acked_now(&self, seq: u64) {
        if self.recording.get() {
            let now = self.since_t0();
            let mut lat = self.ack_latencies_us.borrow_mut();
            for s in self.acked.get() + 1..=seq {
                if let Some(sent) = self.sent_at(s) {
                    let us = now.saturating_sub(sent).as_micros();
                    lat.push(us.min(u32::MAX as u128) as u32);
                }
            }
        }
        self.acked.set(seq);
    }

    /// When transaction `seq` left for the service, if it did.
    pub fn sent_at(&self, seq: u64) -> Option<Duration> {
        let i = seq.checked_sub(FIRST_SEQ)? as usize;
        self.sent_at
            .borrow()
            .get(i)
            .filter(|&&t| t > 0)
            .map(|&t| Duration::from_nanos(t))
    }

    /// A broken rule seen by the change source or a subscriber; the first few are kept verbatim.
    pub fn error(&self, e: String) {
        self.error_count.set(self.error_count.get() + 1);
        let mut errs = self.errors.borrow_mut();
        if errs.len() < 10 {
            eprintln!("loadgen: error: {e}");
            errs.push(e);
        }
    }
}

/// How the subscribers reach the service: the secret they present (`--secret`) and, for a
/// `wss://` `--service`, the roots they trust (`--ca-file`).
pub struct ServiceAccess {
    pub secret: Option<String>,
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

impl ServiceAccess {
    /// The TLS configuration trusting the PEM certificates of `ca_file`.
    pub fn trusting(ca_file: &str) -> Result<std::sync::Arc<rustls::ClientConfig>, String> {
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls::pki_types::CertificateDer::pem_file_iter(ca_file)
            .map_err(|e| format!("--ca-file {ca_file}: {e}"))?
        {
            let cert = cert.map_err(|e| format!("--ca-file {ca_file}: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("--ca-file {ca_file}: {e}"))?;
        }
        let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
        Ok(std::sync::Arc::new(config))
    }
}
