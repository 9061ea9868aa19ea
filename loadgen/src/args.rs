//! The command line (`--help`): every flag of a run, parsed by clap. What each does is said at
//! the flag; `main.rs` runs what they ask for.

use clap::Parser;

// A run's flags (no doc comment: clap would take it for `--help`'s text).
#[derive(Parser, Debug)]
#[command(about = "End-to-end load generator for a change-streamer (ours or zero's).")]
pub struct Args {
    /// Address the change source listens on; the service's `--upstream` points here.
    #[arg(long, default_value = "127.0.0.1:7001")]
    pub listen: String,
    /// Base URL of the service's websocket endpoints (`ws://` or `wss://`); a comma-separated
    /// list spreads the subscribers over several, round-robin.
    #[arg(long, default_value = "ws://127.0.0.1:4849")]
    pub service: String,
    /// Secret the subscribers present (`Authorization: Bearer …`), as the service's --secret.
    #[arg(long)]
    pub secret: Option<String>,
    /// PEM certificate(s) the subscribers trust for a `wss://` --service.
    #[arg(long)]
    pub ca_file: Option<String>,
    /// File holding the service's PID (read once it exists); its process tree's CPU is measured.
    /// A comma-separated list measures each file's processes apart (the memory peak is the
    /// first's); a file may list several PIDs, and is read again at each snapshot.
    #[arg(long)]
    pub service_pid_file: String,
    /// Label of the service in the report.
    #[arg(long, default_value = "ours")]
    pub label: String,
    #[arg(long, default_value_t = 8)]
    pub subs: usize,
    /// Subscribers (of --subs) that check every message and measure latency: K of them,
    /// spread evenly over the --service addresses, the --threads and the connecting order.
    /// The others are light: they check that frame ids run 1, 2, 3…, ack as the checked ones
    /// do and count every delivery (deliveries/s stay exact), but parse no message (no
    /// transaction, watermark or gap check). Commit→receipt percentiles and the longest gap
    /// are then over the K checked subscribers only (`checkedSubs` in the JSON); the light
    /// ones' newest commit per frame is a separate figure (`lightNewestCommitLatencyMs`).
    /// Default: all checked.
    #[arg(long, value_name = "K")]
    pub check_subs: Option<usize>,
    /// OS threads the subscribers are spread over, round-robin (subscriber k on thread k mod
    /// N), each with its own single-threaded runtime; thread 0 is the main thread, which also
    /// runs the change source. One thread reads ~1.3 M messages/s at most: 64 batched
    /// subscribers at 2,000 txns/s need more, or the generator's own delay is measured as the
    /// service's latency.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: u16,
    /// Bytes each subscriber reads from its socket at most per read (tungstenite's
    /// `read_buffer_size`, 128 KiB there). tungstenite zero-fills that much before every read,
    /// one that finds nothing included: at 128 KiB that memset was 16-21 % of the generator's
    /// CPU with 256 subscribers; at 4 KiB the extra reads cost more than it saved.
    #[arg(long, default_value_t = 16 * 1024)]
    pub ws_read_buffer: usize,
    /// Inserts per transaction.
    #[arg(long, default_value_t = 10)]
    pub changes: usize,
    /// Bytes of each insert's payload (about); 0 keeps the ~160-byte rows.
    #[arg(long, default_value_t = 0)]
    pub row_bytes: usize,
    /// Fill each insert's text column with letters and digits drawn anew for every row
    /// (nothing to compress but the payload's structure) instead of the same `x`s.
    #[arg(long)]
    pub row_noise: bool,
    /// Subscribe with `wsBatched=true`: read both frame shapes, ack cumulatively (PROTOCOL.md §5).
    #[arg(long)]
    pub batched: bool,
    /// More subscribers that ack their `status` and then never read their socket (PROTOCOL.md
    /// §10.2); not counted in the deliveries.
    #[arg(long, default_value_t = 0)]
    pub never_reading: usize,
    /// Transactions per second; 0 = saturate (as many as the window allows).
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Transactions sent ahead of the service's upstream acks at most.
    #[arg(long, default_value_t = 256)]
    pub window: u64,
    #[arg(long, default_value_t = 3.0)]
    pub warm_s: f64,
    #[arg(long, default_value_t = 10.0)]
    pub meas_s: f64,
    /// Start the flood at once and subscribe at the start of the measured window (after
    /// `--warm-s` of ingest with no subscriber), from the replicaVersion: the measured window
    /// is the subscribers' catch-up (their commit-to-receipt latencies are the catch-up's age).
    #[arg(long)]
    pub join_late: bool,
    /// Churning subscribers: a pool of this many joins and leaves while the flood runs (from a
    /// commit the service stored; each must get every transaction after it), not counted in
    /// the deliveries or latencies.
    #[arg(long, default_value_t = 0)]
    pub churn_subs: usize,
    /// Joins per second of the churning pool (as many leave once it is full).
    #[arg(long, default_value_t = 50.0)]
    pub churn_rate: f64,
    /// Measure the service's RssAnon with every subscriber connected and idle: before they
    /// subscribe (once the initial sync is stored) and this many seconds after the last has
    /// its `status`, before the flood; 0 = not measured.
    #[arg(long, default_value_t = 0.0)]
    pub idle_s: f64,
    /// Seconds to wait for the service and every subscriber's `status`.
    #[arg(long, default_value_t = 120.0)]
    pub setup_timeout_s: f64,
    #[arg(long, default_value = "zero")]
    pub app: String,
    #[arg(long, default_value = "0")]
    pub shard: String,
}
