#!/usr/bin/env bash
# The owner alone on a fresh PostgreSQL change DB: saturated ingest, no subscriber. Prints the
# txns/s it acks upstream and the CPU per transaction of the service and of the PostgreSQL
# backends serving the run's database (listed every second from pg_stat_activity, as
# benches/standby_serving.sh does).
#
#   benches/pg_ingest.sh                 # 10 inserts a transaction, 3 runs
#   CHANGES=1 RUNS=3 BIN=path/to/change-streamer PG=postgres://postgres@127.0.0.1:5432 \
#     WARM_S=3 MEAS_S=8 benches/pg_ingest.sh
#
# Needs PostgreSQL (trust auth); each run creates and drops its database cs_pgi_<pid>_<run>.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CHANGES=${CHANGES:-10} RUNS=${RUNS:-3} WARM_S=${WARM_S:-3} MEAS_S=${MEAS_S:-8}
PG=${PG:-postgres://postgres@127.0.0.1:5432}
OUT=$(mktemp -d /tmp/cs-pgi.XXXXXX)
echo "logs and results in $OUT" >&2
# shellcheck source=benches/e2e_lib.sh
source "$ROOT/benches/e2e_lib.sh"
e2e_build

for r in $(seq "$RUNS"); do
  db=cs_pgi_$$_$r dir=$OUT/run$r
  mkdir -p "$dir"
  psql "$PG/postgres" -qc "CREATE DATABASE $db" >/dev/null
  read -r up sp <<< "$(free_ports 2)"
  ( while :; do
      psql "$PG/postgres" -Atc "SELECT pid FROM pg_stat_activity WHERE datname = '$db'" \
        > "$dir/postgres.new" 2>/dev/null && [[ -s $dir/postgres.new ]] && mv "$dir/postgres.new" "$dir/postgres.pids"
      sleep 1
    done ) &
  sampler=$!
  "$LOADGEN" --listen 127.0.0.1:"$up" --service ws://127.0.0.1:"$sp" \
    --service-pid-file "$dir/owner.pid,$dir/postgres.pids" --subs 0 --rate 0 --changes "$CHANGES" \
    --warm-s "$WARM_S" --meas-s "$MEAS_S" > "$dir/loadgen.out" 2> "$dir/loadgen.err" &
  lg=$!
  RUST_LOG=${RUST_LOG:-warn} "$BIN" --host 127.0.0.1 --port "$sp" --data-dir "$dir/data" \
    --change-db "$PG/$db" --upstream ws://127.0.0.1:"$up"/changes > "$dir/owner.log" 2>&1 &
  pid=$!; echo "$pid" > "$dir/owner.pid"
  rc=0; wait "$lg" || rc=$?
  kill "$sampler" 2>/dev/null || true; wait "$sampler" 2>/dev/null || true
  kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
  psql "$PG/postgres" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null || true
  ((rc == 0)) || echo "run $r: loadgen exit $rc (see $dir/loadgen.err)" >&2
  python3 - "$dir/loadgen.out" "$CHANGES" <<'PY'
import json, sys
d = json.loads(next(l for l in open(sys.argv[1]) if l.startswith("{")))
t = d["upstreamTxnsPerS"]
parts = []
for p in d["processes"]:
    name = p["pidFile"].rsplit("/", 1)[-1].split(".")[0]
    cores = p["cpuS"] / d["seconds"]
    parts.append(f"{name} {cores:.2f} cores, {cores / t * 1e6:.1f} µs per transaction")
print(f"{sys.argv[2]} inserts a transaction: {t:.0f} txns/s; " + "; ".join(parts))
PY
done
