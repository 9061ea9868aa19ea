#!/usr/bin/env bash
# End to end over loopback: our change-streamer serving its subscribers over TLS (wss://) beside
# the same binary over plain ws://, both with a secret, driven one after the other by the same
# load generator (crate `loadgen`), alternating, same workload. Prints each run's human line,
# then medians per case and the ratios TLS / plain.
#
#   benches/e2e_tls.sh                 # 3 saturated runs of each at 8 and 64 subscribers
#   RUNS=3 SUBS="8 64" RATE=0 WARM_S=3 MEAS_S=10 WINDOW=256 benches/e2e_tls.sh
#
# The certificate is self-signed, made here with openssl (P-256, for 127.0.0.1); the change
# source (the load generator) stays on plain ws://, as only the subscribers' side is measured.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RUNS=${RUNS:-3} SUBS=${SUBS:-8 64} RATE=${RATE:-0}
WARM_S=${WARM_S:-3} MEAS_S=${MEAS_S:-10} WINDOW=${WINDOW:-256}
OUT=$(mktemp -d /tmp/cs-e2e-tls.XXXXXX)
echo "logs and results in $OUT" >&2

(cd "$ROOT" && nice cargo build --release --bin change-streamer -p change-streamer >&2 \
  && nice cargo build --release -p change-streamer-loadgen >&2)
BIN=${BIN:-$ROOT/target/release/change-streamer}
LOADGEN=$ROOT/target/release/change-streamer-loadgen

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
  -subj /CN=localhost -addext subjectAltName=IP:127.0.0.1 \
  -keyout "$OUT/key.pem" -out "$OUT/cert.pem" 2>/dev/null
openssl rand -hex 32 > "$OUT/secret"
SECRET=$(cat "$OUT/secret")

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# run CASE SUBS TAG: one measured run (CASE = plain | tls); appends its JSON line to results.jsonl
run() {
  local case=$1 subs=$2 tag=$3 up sp dir pid lg rc=0 scheme=ws tls=()
  up=$(free_port); sp=$(free_port); dir=$OUT/$tag; mkdir -p "$dir"
  if [[ $case == tls ]]; then
    scheme=wss; tls=(--tls-cert "$OUT/cert.pem" --tls-key "$OUT/key.pem")
  fi
  "$LOADGEN" --label "$case" --listen 127.0.0.1:"$up" --service "$scheme://127.0.0.1:$sp" \
    --ca-file "$OUT/cert.pem" --secret "$SECRET" \
    --service-pid-file "$dir/pid" --subs "$subs" --rate "$RATE" --window "$WINDOW" \
    --warm-s "$WARM_S" --meas-s "$MEAS_S" > "$dir/loadgen.out" 2> "$dir/loadgen.err" &
  lg=$!
  RUST_LOG=${RUST_LOG:-warn} "$BIN" --host 127.0.0.1 --port "$sp" --data-dir "$dir/data" \
    --secret-file "$OUT/secret" "${tls[@]}" \
    --upstream ws://127.0.0.1:"$up"/changes > "$dir/service.log" 2>&1 &
  pid=$!; echo "$pid" > "$dir/pid"
  wait "$lg" || rc=$?
  kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
  grep '^{' "$dir/loadgen.out" >> "$OUT/results.jsonl" || true
  grep -v '^{' "$dir/loadgen.out" || true
  ((rc == 0)) || echo "$tag: loadgen exit $rc (see $dir/loadgen.err)" >&2
}

for r in $(seq "$RUNS"); do
  for s in $SUBS; do for c in plain tls; do run "$c" "$s" "$c-$s-$r"; done; done
done

python3 - "$OUT/results.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
cases = {}
for r in rows:
    cases.setdefault((r["subs"], r["service"]), []).append(r)
def med(rs, k): return statistics.median(r[k] for r in rs)
print("\nmedians (runs):")
for (subs, svc), rs in sorted(cases.items()):
    print(f"  {subs:3} subs {svc:5}: {med(rs,'deliveriesPerS'):>10.0f} deliveries/s "
          f"{med(rs,'serviceCpuUsPerDelivery'):8.2f} µs service CPU/delivery ({med(rs,'serviceCores'):.2f} cores), "
          f"errors {sum(r['errors'] for r in rs)}; runs {[round(r['deliveriesPerS']) for r in rs]}")
print("ratios TLS / plain:")
for (subs, svc), rs in sorted(cases.items()):
    p = cases.get((subs, "plain"))
    if svc != "tls" or not p: continue
    print(f"  {subs:3} subs: deliveries/s {med(rs,'deliveriesPerS')/med(p,'deliveriesPerS'):.2f}x, "
          f"service CPU per delivery {med(rs,'serviceCpuUsPerDelivery')/med(p,'serviceCpuUsPerDelivery'):.2f}x")
PY
