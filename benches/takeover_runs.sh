#!/usr/bin/env bash
# Takeover with subscribers at every instance, RUNS times (PROTOCOL.md §14.1): each run is the
# demo's PostgreSQL mode on a fresh database (three service processes A, B, C, two subscribers
# at each, a stand-in change source), the owner killed with kill -9 after KILL_AFTER seconds,
# the run ended after SECONDS. One line per run (the demo's summary counters), then the totals:
# gaps and repeats of every subscriber, drops of the subscribers of the instances that were
# not killed (goal: all 0), and the takeover times.
#
#   benches/takeover_runs.sh                        # 10 runs, kill after 6 s, 12 s each
#   RUNS=10 KILL_AFTER=6 SECONDS_EACH=12 PGURL=postgres://postgres@127.0.0.1:5432 benches/takeover_runs.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RUNS=${RUNS:-10} KILL_AFTER=${KILL_AFTER:-6} SECONDS_EACH=${SECONDS_EACH:-12}
PGURL=${PGURL:-postgres://postgres@127.0.0.1:5432}
export PGOPTIONS="--client-min-messages=warning"
(cd "$ROOT" && nice cargo build --release --locked --example demo >&2)
DEMO=$ROOT/target/release/examples/demo
OUT=$(mktemp -d /tmp/cs-takeover.XXXXXX)
echo "logs in $OUT" >&2
for run in $(seq "$RUNS"); do
  db="cs_takeover_runs_$$_$run"
  psql "$PGURL/postgres" -qc "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null
  "$DEMO" --change-db "$PGURL/$db" --kill-after "$KILL_AFTER" --seconds "$SECONDS_EACH" \
    < /dev/null > "$OUT/run$run.out" 2>&1 || { echo "run $run failed: $OUT/run$run.out" >&2; exit 1; }
  psql "$PGURL/postgres" -qc "DROP DATABASE IF EXISTS $db" >/dev/null
  sed -n 's/^summary: //p' "$OUT/run$run.out" > "$OUT/run$run.json"
  python3 - "$OUT/run$run.json" "$run" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
killed = set(s["killed"])
survivors = [x for x in s["subscribers"] if not killed & set(x["on"][:1])]
print(f"run {sys.argv[2]}: killed {','.join(s['killed'])}, owner after {s['owner']}, takeover {s['takeoverMs']} ms;"
      f" gaps {s['gaps']}, repeats {s['repeats']}, survivors' drops {sum(x['drops'] for x in survivors)}"
      f" ({len(survivors)} subscribers), the killed owner's drops {s['drops'] - sum(x['drops'] for x in survivors)},"
      f" commits after the takeover min {min((x['afterTakeover'] or 0) for x in s['subscribers'])}")
PY
done
python3 - "$OUT" <<'PY'
import glob, json, statistics, sys
runs = [json.load(open(f)) for f in sorted(glob.glob(sys.argv[1] + "/run*.json"))]
gaps = sum(r["gaps"] for r in runs); repeats = sum(r["repeats"] for r in runs)
surv = sum(x["drops"] for r in runs for x in r["subscribers"] if not set(r["killed"]) & set(x["on"][:1]))
ms = sorted(t for r in runs for t in r["takeoverMs"])
print(f"totals over {len(runs)} kill -9 runs: gaps {gaps}, repeats {repeats}, drops of the surviving"
      f" instances' subscribers {surv}; takeover ms median {statistics.median(ms)}, max {ms[-1]}")
PY
