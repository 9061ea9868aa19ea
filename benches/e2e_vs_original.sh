#!/usr/bin/env bash
# End to end over loopback: our change-streamer and the ORIGINAL zero-cache 0.26.2
# replication-manager, driven one after the other by the same load generator (crate `loadgen`:
# change source + websocket subscribers in its own process), same workload, same subscribers.
# Prints each run's JSON + human line, then medians per case and the ratios ours / original.
# Ours runs in both framings (FRAMINGS): one ack per message (`per-frame`, zero 0.26.2's client)
# and batched frames with cumulative acks (`batched`, `wsBatched=true`); the original speaks
# the first only.
#
#   benches/e2e_vs_original.sh                       # 3 saturated runs at 8 and 64 subs, then
#                                                    # 2,000 txns/s at 8 and 64 subs, both services
#   RUNS=3 SUBS="8 64" RATE=2000 RATE_SUBS="8 64" WARM_S=3 MEAS_S=10 WINDOW=256 SERVICES="ours zero"
#   FRAMINGS="per-frame batched" LG_THREADS=1 LG_FLAGS=
#
# LG_THREADS: threads the load generator spreads its subscribers over (its --threads; default 1,
# all on one thread). 64 batched subscribers at 2,000 txns/s are ~1.5 M messages/s, about what
# one thread reads: on a busy machine its own lag is measured as latency, which LG_THREADS=2
# avoids. Every service's runs get the same value, so the comparison stays fair.
#
# LG_FLAGS: further flags for the load generator, the same for every service, e.g.
# LG_FLAGS=--row-noise (each row's text drawn anew: nothing to compress but the payloads'
# structure) or LG_FLAGS="--row-bytes 1024".
#
# SERVICES may also name ours-tls: our binary serving its subscribers over TLS (wss://, a
# self-signed P-256 certificate made here with openssl); then ours and ours-tls both run with a
# secret (--secret-file; the load generator presents it) and the ratios TLS / plain are printed:
#   SERVICES="ours ours-tls" RUNS=3 SUBS="8 64" RATE=0 benches/e2e_vs_original.sh
#
# zero: installed once by ../shared/peer/whole-service/setup.sh into $ZW_DIR (a temporary copy,
# default /tmp/cs-e2e-zero; ~3 min the first time); needs PostgreSQL at 127.0.0.1:5432 (user
# postgres, trust), where it (re)creates the databases cs_e2e_change and cs_e2e_cvr.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PEER=${PEER:-$ROOT/../shared/peer/whole-service}
ZW_DIR=${ZW_DIR:-/tmp/cs-e2e-zero}
RUNS=${RUNS:-3} SUBS=${SUBS:-8 64} RATE=${RATE:-2000} RATE_SUBS=${RATE_SUBS:-8 64}
WARM_S=${WARM_S:-3} MEAS_S=${MEAS_S:-10} WINDOW=${WINDOW:-256} SERVICES=${SERVICES:-ours zero}
FRAMINGS=${FRAMINGS:-per-frame batched} LG_THREADS=${LG_THREADS:-1}
read -r -a LG_EXTRA <<< "${LG_FLAGS:-}"
OUT=$(mktemp -d /tmp/cs-e2e.XXXXXX)
echo "logs and results in $OUT" >&2

# shellcheck source=benches/e2e_lib.sh
source "$ROOT/benches/e2e_lib.sh"
# BIN=path/to/change-streamer measures another build of ours (e.g. main's, before and after).
e2e_build
if [[ " $SERVICES " == *" zero "* && ! -d $ZW_DIR/node_modules/@rocicorp/zero ]]; then
  if [[ ! -x $PEER/setup.sh ]]; then
    echo "e2e: the original's whole service cannot be installed: $PEER/setup.sh is missing." >&2
    echo "e2e: put the project's shared/ folder beside the repository, set PEER=…/shared/peer/whole-service," >&2
    echo "e2e: or measure ours alone with SERVICES=ours." >&2
    exit 2
  fi
  "$PEER/setup.sh" "$ZW_DIR" >&2
fi

if [[ " $SERVICES " == *" ours-tls "* ]]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
    -subj /CN=localhost -addext subjectAltName=IP:127.0.0.1 -addext basicConstraints=critical,CA:FALSE \
    -keyout "$OUT/key.pem" -out "$OUT/cert.pem" 2>/dev/null
  openssl rand -hex 32 > "$OUT/secret"
fi

# run SERVICE SUBS RATE TAG [FRAMING]: one measured run; appends the JSON line to
# $OUT/results.jsonl
run() {
  local svc=$1 subs=$2 rate=$3 tag=$4 framing=${5:-per-frame} up sp dir pid lg rc=0 batched=()
  local scheme=ws access=() served=()
  read -r up sp <<< "$(free_ports 2)"; dir=$OUT/$tag; mkdir -p "$dir"
  [[ $framing == batched ]] && batched=(--batched)
  if [[ -f $OUT/secret && $svc != zero ]]; then
    access=(--secret "$(cat "$OUT/secret")" --ca-file "$OUT/cert.pem")
    served=(--secret-file "$OUT/secret")
  fi
  if [[ $svc == ours-tls ]]; then
    scheme=wss; served+=(--tls-cert "$OUT/cert.pem" --tls-key "$OUT/key.pem")
  fi
  "$LOADGEN" --label "$svc" "${batched[@]}" --listen 127.0.0.1:"$up" --service "$scheme://127.0.0.1:$sp" "${access[@]}" \
    --service-pid-file "$dir/pid" --subs "$subs" --rate "$rate" --window "$WINDOW" \
    --warm-s "$WARM_S" --meas-s "$MEAS_S" --threads "$LG_THREADS" "${LG_EXTRA[@]}" > "$dir/loadgen.out" 2> "$dir/loadgen.err" &
  lg=$!
  if [[ $svc == ours* ]]; then
    RUST_LOG=${RUST_LOG:-warn} "$BIN" --host 127.0.0.1 --port "$sp" --data-dir "$dir/data" \
      "${served[@]}" --upstream ws://127.0.0.1:"$up"/changes > "$dir/service.log" 2>&1 &
  else
    ZERO_UPSTREAM_DB=ws://127.0.0.1:$up/changes ZERO_CHANGE_STREAMER_PORT=$sp ZERO_PORT=$(free_port) \
      ZW_CHANGE_DBNAME=cs_e2e_change ZW_CVR_DBNAME=cs_e2e_cvr ZERO_REPLICA_FILE=$dir/replica.db \
      ZERO_LOG_LEVEL=${ZERO_LOG_LEVEL:-warn} "$ZW_DIR/run-zero.sh" --fresh > "$dir/service.log" 2>&1 &
  fi
  pid=$!; echo "$pid" > "$dir/pid"
  wait "$lg" || rc=$?
  kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
  rm -rf "$dir/data" "$dir/replica.db"*   # the change log: only the figures are kept
  e2e_collect "$dir" "$tag" "$rc"
}

# each SUBS RATE TAG: one run of every service, ours in each framing.
each() {
  local svc f
  for svc in $SERVICES; do
    if [[ $svc == ours ]]; then
      for f in $FRAMINGS; do run ours "$1" "$2" "ours-$f-$3" "$f"; done
    else
      run "$svc" "$1" "$2" "$svc-$3"
    fi
  done
}
for r in $(seq "$RUNS"); do
  for s in $SUBS; do each "$s" 0 "sat-$s-$r"; done
done
if [[ -n $RATE && $RATE != 0 ]]; then
  for s in $RATE_SUBS; do each "$s" "$RATE" "rate$RATE-$s"; done
fi

python3 - "$OUT/results.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
cases = {}
for r in rows:
    svc = r["service"] + ("-batched" if r.get("framing") == "batched" else "")
    cases.setdefault((r["mode"], r["subs"], svc), []).append(r)
def med(rs, k): return statistics.median(r[k] for r in rs)
print("\nmedians (runs):")
for (mode, subs, svc), rs in sorted(cases.items()):
    lat = rs[0]["latencyMs"]
    print(f"  {mode:8} {subs:3} subs {svc:12}: {med(rs,'deliveriesPerS'):>10.0f} deliveries/s "
          f"{med(rs,'serviceCpuUsPerDelivery'):8.2f} µs service CPU/delivery ({med(rs,'serviceCores'):.2f} cores), "
          f"loadgen {med(rs,'loadgenCpuUsPerDelivery'):.2f} µs/delivery, upstream {med(rs,'upstreamTxnsPerS'):.0f} txns/s, "
          f"errors {sum(r['errors'] for r in rs)}; runs {[round(r['deliveriesPerS']) for r in rs]}"
          + (f"; latency p50 {lat['p50']} p99 {lat['p99']} p99.9 {lat['p999']} ms, longest gap {rs[0]['longestCommitGapMs']} ms" if mode == "rate" else ""))
print("ratios ours / zero:")
for (mode, subs, svc), rs in sorted(cases.items()):
    z = cases.get((mode, subs, "zero"))
    if not svc.startswith("ours") or not z: continue
    print(f"  {mode:8} {subs:3} subs {svc:12}: deliveries/s {med(rs,'deliveriesPerS')/med(z,'deliveriesPerS'):.1f}x, "
          f"deliveries per service CPU-second {med(rs,'deliveriesPerServiceCpuS')/med(z,'deliveriesPerServiceCpuS'):.1f}x")
tls = [(k, rs) for k, rs in sorted(cases.items()) if k[2] == "ours-tls" and (k[0], k[1], "ours") in cases]
if tls: print("ratios ours-tls / ours (TLS / plain, both with a secret):")
for (mode, subs, _), rs in tls:
    p = cases[(mode, subs, "ours")]
    print(f"  {mode:8} {subs:3} subs: deliveries/s {med(rs,'deliveriesPerS')/med(p,'deliveriesPerS'):.2f}x, "
          f"service CPU per delivery {med(rs,'serviceCpuUsPerDelivery')/med(p,'serviceCpuUsPerDelivery'):.2f}x")
PY
