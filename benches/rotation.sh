#!/usr/bin/env bash
# Rotation under load (PROTOCOL.md §15.1): the load generator (crate `loadgen`) runs SUBS
# subscribers presenting the old secret at RATE txns/s; in the measured window the secret file
# gains the next secret (both configured), the service gets a SIGHUP, and the old secret is
# removed. Meanwhile new requests present each secret every 100 ms. One JSON line per run: the
# load generator's errors (a subscriber closed by the service, a gap, a duplicate), requests
# refused while they presented a configured secret, and change_streamer_auth_success_total by
# secret. The script fails if the service is not running after the SIGHUP.
#
#   benches/rotation.sh                      # 3 runs, 64 batched subscribers, 2,000 txns/s
#   RUNS=3 RATE=2000 SUBS=64 THREADS=4 BIN=target/release/change-streamer benches/rotation.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RUNS=${RUNS:-3} RATE=${RATE:-2000} SUBS=${SUBS:-64} THREADS=${THREADS:-4} WARM_S=3 MEAS_S=12
(cd "$ROOT" && nice cargo build --release --locked -p change-streamer -p change-streamer-loadgen >&2)
BIN=${BIN:-$ROOT/target/release/change-streamer}
LOADGEN=$ROOT/target/release/change-streamer-loadgen
OLD=$(openssl rand -hex 32) NEW=$(openssl rand -hex 32)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
put() { printf '%s' "$2" > "$1.tmp" && mv "$1.tmp" "$1"; } # whole, as deployment tools do
# Requests /status with secret $2 until file $1 exists; prints "<presented> <code>" lines.
probe() {
  while [[ ! -e $1 ]]; do
    echo "$2 $(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $3" "http://127.0.0.1:$sp/status")"
    sleep 0.1
  done
}

pids=() # whatever a failed run leaves running is stopped on the way out
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
for _ in $(seq "$RUNS"); do
  up=$(free_port); sp=$(free_port); dir=$(mktemp -d /tmp/cs-rotation.XXXXXX)
  put "$dir/secret" "$OLD"
  "$LOADGEN" --label ours --listen 127.0.0.1:"$up" --service ws://127.0.0.1:"$sp" \
    --service-pid-file "$dir/pid" --subs "$SUBS" --threads "$THREADS" --batched \
    --secret "$OLD" --rate "$RATE" --window 256 \
    --warm-s $WARM_S --meas-s $MEAS_S > "$dir/loadgen.out" 2> "$dir/loadgen.err" &
  lg=$!; pids+=("$lg")
  RUST_LOG=info "$BIN" --host 127.0.0.1 --port "$sp" --data-dir "$dir/data" \
    --secret-file "$dir/secret" --upstream ws://127.0.0.1:"$up"/changes > "$dir/service.log" 2>&1 &
  pid=$!; echo "$pid" > "$dir/pid"; pids+=("$pid")
  # The subscribers' setup, then into the measured window.
  until grep -q "change source connected\|listening on" "$dir/service.log"; do sleep 0.2; done
  sleep $((WARM_S + 4))
  put "$dir/secret" "$OLD"$'\n'"$NEW"            # both configured
  until [[ $(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $NEW" "http://127.0.0.1:$sp/status") == 200 ]]; do sleep 0.1; done
  probe "$dir/both.done" old "$OLD" > "$dir/probe.old" & p1=$!
  probe "$dir/new.done" new "$NEW" > "$dir/probe.new" & p2=$!
  sleep 2; kill -HUP "$pid"; sleep 2
  touch "$dir/both.done"; wait $p1
  put "$dir/secret" "$NEW"                       # the old one removed
  until [[ $(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $OLD" "http://127.0.0.1:$sp/status") == 401 ]]; do sleep 0.1; done
  sleep 1; touch "$dir/new.done"; wait $p2
  wait "$lg" || true
  curl -s "http://127.0.0.1:$sp/metrics" | grep '^change_streamer_auth_success_total' > "$dir/metrics" || true
  kill -0 "$pid" # still running after the SIGHUP
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  python3 - "$dir" "$RATE" <<'PY'
import json, sys
d = sys.argv[1]
r = next(json.loads(l) for l in open(d + "/loadgen.out") if l.startswith("{"))
probes = [l.split() for f in ("probe.old", "probe.new") for l in open(f"{d}/{f}")]
success = {l.split('"')[1]: int(float(l.split()[-1])) for l in open(d + "/metrics")}
print(json.dumps({"bench": "rotation", "rate": float(sys.argv[2]), "subs": r["subs"],
                  "upstream_txns_per_s": round(r["upstreamTxnsPerS"]),
                  "loadgen_errors": r["errors"],
                  "probes": len(probes), "refused": sum(1 for p in probes if p[1] != "200"),
                  "auth_success_by_secret": success, "latency_ms": r["latencyMs"]}))
PY
  rm -rf "$dir"
done
