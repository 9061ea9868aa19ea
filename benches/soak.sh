#!/usr/bin/env bash
# The soak of issue 30 (item 5), on loopback, bounded in time: DURATION_S seconds (default 1800)
# of ingest with subscribers joining, leaving, stalling and being killed, reservations opening
# and ending, and a kill -9 of the service every KILL_MIN_S..KILL_MAX_S seconds (then a start on
# the same data dir and port). Builds the service and the driver (examples/soak.rs, release) and
# runs it: it checks every stream for gaps and duplicates, acks upstream against what the
# restarted service resumes from and serves (acked-but-lost), RssAnon and open fds over time,
# and prints a one-line verdict (exit 0 on PASS). The samples (CSV), a PNG of them and each
# life's service log go to OUT.
#
#   benches/soak.sh                          30 minutes
#   DURATION_S=400 KILL_MIN_S=160 KILL_MAX_S=200 benches/soak.sh   a short one (2 lives judged)
#
# Knobs (environment):
#   DURATION_S=1800      how long
#   RATE=300             transactions a second offered by the change source (1 to 3 inserts each)
#   SUBSCRIBERS=6        serving subscribers (plus one backup replicator and two restoring tasks)
#   KILL_MIN_S=240 KILL_MAX_S=360   the time between two kill -9 (a life of the service settles
#                        in about 2-3 minutes: SQLite's page cache fills over the change log)
#                        RssAnon and fds are judged on each life of KILL_MIN_S (150 at least)
#                        or more; the last life, which the end of the run cuts, when it is that long
#   OUT=target/soak      where the samples, the plot and the logs go
#   BIN=path             the service binary (default: this tree's release build)
#   SEED=N               the driver's choices
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
DURATION_S=${DURATION_S:-1800}
RATE=${RATE:-300}
SUBSCRIBERS=${SUBSCRIBERS:-6}
KILL_MIN_S=${KILL_MIN_S:-240}
KILL_MAX_S=${KILL_MAX_S:-360}
OUT=${OUT:-target/soak}
SEED=${SEED:-11400714819323198485}

# Builds run niced (the machine is shared); the soak itself at normal priority.
CARGO_INCREMENTAL=0 nice -n 19 cargo build --release --locked --bin change-streamer --example soak
BIN=${BIN:-$ROOT/target/release/change-streamer}
mkdir -p "$OUT"
echo "soak: commit $(git rev-parse --short HEAD), binary $BIN, load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
status=0
CHANGE_STREAMER_BIN=$BIN "$ROOT/target/release/examples/soak" \
  --duration-s "$DURATION_S" --rate "$RATE" --subscribers "$SUBSCRIBERS" \
  --kill-min-s "$KILL_MIN_S" --kill-max-s "$KILL_MAX_S" --seed "$SEED" --out "$OUT" || status=$?
echo "soak: load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
exit "$status"
