#!/usr/bin/env bash
# The change-log writer thread's CPU per upstream transaction inside the whole service, driven
# end to end by the load generator (crate `loadgen`) at a steady rate: reads the schedstat of
# the service's thread named `change-log-writ` (the writer) over 8 s of the measured window.
# One line per run: the writer's µs per transaction, then the load generator's own summary.
#
#   benches/writer_cpu.sh                    # 3 runs each at 200 and 2,000 txns/s, 8 subscribers
#   RUNS=3 RATES="200 2000" SUBS=8 BIN=target/release/change-streamer benches/writer_cpu.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RUNS=${RUNS:-3} RATES=${RATES:-200 2000} SUBS=${SUBS:-8} WARM_S=3 MEAS_S=10
(cd "$ROOT" && nice cargo build --release --locked -p change-streamer -p change-streamer-loadgen >&2)
BIN=${BIN:-$ROOT/target/release/change-streamer}
LOADGEN=$ROOT/target/release/change-streamer-loadgen

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
writer_ns() { # CPU nanoseconds of the writer thread of process $1
  for t in /proc/"$1"/task/*; do
    if [[ $(cat "$t/comm") == change-log-writ ]]; then cut -d' ' -f1 "$t/schedstat"; fi
  done
}

for rate in $RATES; do for _ in $(seq "$RUNS"); do
  up=$(free_port); sp=$(free_port); dir=$(mktemp -d /tmp/cs-writer.XXXXXX)
  "$LOADGEN" --label ours --listen 127.0.0.1:"$up" --service ws://127.0.0.1:"$sp" \
    --service-pid-file "$dir/pid" --subs "$SUBS" --rate "$rate" --window 256 \
    --warm-s $WARM_S --meas-s $MEAS_S > "$dir/loadgen.out" 2> "$dir/loadgen.err" &
  lg=$!
  RUST_LOG=warn "$BIN" --host 127.0.0.1 --port "$sp" --data-dir "$dir/data" \
    --upstream ws://127.0.0.1:"$up"/changes > "$dir/service.log" 2>&1 &
  pid=$!; echo "$pid" > "$dir/pid"
  sleep $((WARM_S + 1)); a=$(writer_ns "$pid"); sleep 8; b=$(writer_ns "$pid")
  wait "$lg" || true
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  python3 - "$dir/loadgen.out" "$rate" "$a" "$b" <<'PY'
import json, sys
r = next(json.loads(l) for l in open(sys.argv[1]) if l.startswith("{"))
txns = r["upstreamTxnsPerS"]
print(json.dumps({"bench": "writer_cpu", "rate": float(sys.argv[2]), "subs": r["subs"],
                  "upstream_txns_per_s": round(txns),
                  "writer_cpu_us_per_txn": round((int(sys.argv[4]) - int(sys.argv[3])) / 1000 / 8 / txns, 1),
                  "service_cpu_us_per_delivery": r["serviceCpuUsPerDelivery"],
                  "latency_ms": r["latencyMs"], "errors": r["errors"]}))
PY
  rm -rf "$dir"
done; done
