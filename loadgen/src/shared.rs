//! State every thread of the generator shares (`Arc`, atomics): the run's phases, when each
//! transaction was sent, how many subscribers have their `status`, and the errors seen. What
//! one thread alone writes stays in that thread ([`crate::tally`], [`crate::upstream`]'s
//! figures): only what truly crosses threads is here.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::{watch, Notify};

use crate::sent::SentTimes;
use crate::workload::FIRST_SEQ;

/// Everything one run's threads share.
pub struct Run {
    pub t0: Instant,
    pub phases: Phases,
    /// When each transaction left for the service, written by the change source and read by
    /// every subscriber thread on each commit (lock-free).
    sent: SentTimes,
    subs_ready: AtomicUsize,
    pub subs_ready_changed: Notify,
    /// Highest sequence number the service acked upstream (stored durably): where a churning
    /// joiner (`--churn-subs`) subscribes from, a commit every replica could hold.
    stored: AtomicU64,
    /// Rare (a broken rule ends a subscription), so a lock is cheap here; kept in the order seen.
    errors: Mutex<Vec<String>>,
    error_count: AtomicU64,
}

impl Run {
    pub fn new() -> Self {
        Run {
            t0: Instant::now(),
            phases: Phases::new(),
            sent: SentTimes::new(),
            subs_ready: AtomicUsize::new(0),
            subs_ready_changed: Notify::new(),
            stored: AtomicU64::new(0),
            errors: Mutex::new(Vec::new()),
            error_count: AtomicU64::new(0),
        }
    }

    pub fn since_t0(&self) -> Duration {
        self.t0.elapsed()
    }

    /// Notes that transactions `from..=to` are written to the service's socket now (just
    /// before the write, so that no subscriber thread can receive one still untimed).
    pub fn mark_sent(&self, from: u64, to: u64) {
        let now = self.since_t0().as_nanos() as u64;
        for seq in from.max(FIRST_SEQ)..=to {
            self.sent.set((seq - FIRST_SEQ) as usize, now);
        }
    }

    /// When transaction `seq` left for the service, if it did.
    pub fn sent_at(&self, seq: u64) -> Option<Duration> {
        let i = seq.checked_sub(FIRST_SEQ)? as usize;
        self.sent.get(i).map(Duration::from_nanos)
    }

    /// One more subscriber has its `status` (on whichever thread).
    pub fn sub_ready(&self) {
        self.subs_ready.fetch_add(1, Ordering::AcqRel);
        self.subs_ready_changed.notify_one();
    }

    pub fn subs_ready(&self) -> usize {
        self.subs_ready.load(Ordering::Acquire)
    }

    /// The service acked (stored) every transaction up to `seq`.
    pub fn set_stored(&self, seq: u64) {
        self.stored.store(seq, Ordering::Release);
    }

    /// The highest transaction the service acked as stored; 0 before its first ack.
    pub fn stored(&self) -> u64 {
        self.stored.load(Ordering::Acquire)
    }

    /// A broken rule seen by the change source or a subscriber; the first few are kept verbatim.
    pub fn error(&self, e: String) {
        self.error_count.fetch_add(1, Ordering::AcqRel);
        let mut errs = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        if errs.len() < 10 {
            eprintln!("loadgen: error: {e}");
            errs.push(e);
        }
    }

    pub fn error_count(&self) -> u64 {
        self.error_count.load(Ordering::Acquire)
    }

    /// The first errors, verbatim.
    pub fn first_errors(&self) -> Vec<String> {
        self.errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The run's phases, set by the main thread and seen by every thread: flags cheap enough to
/// read on each message, and a watch to wait on (no wake-up lost between reading a flag and
/// starting to wait, as a `Notify` woken from another thread could).
pub struct Phases {
    /// Live transactions flow once every subscriber has its `status`.
    go: AtomicBool,
    /// Latencies and gaps are recorded only inside the measured window.
    recording: AtomicBool,
    stop: AtomicBool,
    changed: watch::Sender<()>,
}

impl Phases {
    fn new() -> Self {
        Phases {
            go: AtomicBool::new(false),
            recording: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            changed: watch::Sender::new(()),
        }
    }

    pub fn go(&self) -> bool {
        self.go.load(Ordering::Acquire)
    }

    pub fn recording(&self) -> bool {
        self.recording.load(Ordering::Acquire)
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    pub fn start(&self) {
        self.set(&self.go, true);
    }

    pub fn record(&self, on: bool) {
        self.set(&self.recording, on);
    }

    pub fn stop(&self) {
        self.set(&self.stop, true);
    }

    fn set(&self, flag: &AtomicBool, on: bool) {
        flag.store(on, Ordering::Release);
        self.changed.send_replace(());
    }

    /// A receiver that sees every phase change made after this call.
    pub fn watch(&self) -> watch::Receiver<()> {
        self.changed.subscribe()
    }

    /// Waits until `done` holds of the phases.
    pub async fn until(&self, done: impl Fn(&Phases) -> bool) {
        let mut changed = self.watch();
        while !done(self) {
            if changed.changed().await.is_err() {
                return;
            }
        }
    }
}

/// How the subscribers reach the service: the secret they present (`--secret`) and, for a
/// `wss://` `--service`, the roots they trust (`--ca-file`). Each thread has its copy.
#[derive(Clone)]
pub struct ServiceAccess {
    pub secret: Option<String>,
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// Bytes of each subscriber's websocket read buffer (`--ws-read-buffer`).
    pub read_buffer: usize,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_set_on_another_thread_wakes_a_waiter() {
        let run = std::sync::Arc::new(Run::new());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let setter = {
            let run = run.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                run.phases.start();
                run.phases.stop();
            })
        };
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(5), run.phases.until(Phases::stopped))
                .await
                .unwrap();
        });
        setter.join().unwrap();
        assert!(run.phases.go() && !run.phases.recording());
    }

    #[test]
    fn sent_times_are_read_back_by_sequence_number() {
        let run = Run::new();
        assert_eq!(run.sent_at(FIRST_SEQ), None);
        run.mark_sent(FIRST_SEQ, FIRST_SEQ + 2);
        let t = run.sent_at(FIRST_SEQ + 1).unwrap();
        assert_eq!(run.sent_at(FIRST_SEQ), Some(t));
        assert_eq!(run.sent_at(FIRST_SEQ + 3), None);
        assert_eq!(run.sent_at(FIRST_SEQ - 1), None);
    }
}
