#!/usr/bin/env bash
# Transactions of any size in bounded memory (PROTOCOL.md §3.0 "an open transaction is stored as
# it arrives"): the release service on one engine, fed saturated by the load generator with
# transactions of CHANGES inserts of ~ROW_BYTES each (the default: 1,000,000 changes of 1 KiB, a
# 1 GiB transaction, one in flight at a time), delivered to SUBS reading subscribers. Prints, per
# run, the changes stored and delivered per second (and MB/s of rows), and the service's RssAnon
# peak over the whole run (sampled every 100 ms from /proc by the generator).
#
#   benches/large_txn.sh                                    # SQLite, 1 GiB transactions, 3 runs
#   ENGINE=postgres benches/large_txn.sh                    # the same on a fresh change DB
#   CHANGES=10000 WINDOW=256 benches/large_txn.sh           # the same bytes in 10,000-change txns
#   RUNS=3 MEAS_S=60 WARM_S=1 SUBS=2 ROW_BYTES=1024 PG=postgres://postgres@127.0.0.1:5432
#
# The change log lives under OUT (a fresh /tmp folder; removed after each run), a PostgreSQL run
# in its own database cs_big_<pid>_<run>, dropped after.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ENGINE=${ENGINE:-sqlite} CHANGES=${CHANGES:-1000000} ROW_BYTES=${ROW_BYTES:-1024}
SUBS=${SUBS:-2} RUNS=${RUNS:-3} WARM_S=${WARM_S:-1} MEAS_S=${MEAS_S:-60} WINDOW=${WINDOW:-1}
PG=${PG:-postgres://postgres@127.0.0.1:5432}
OUT=${OUT:-$(mktemp -d /tmp/cs-big.XXXXXX)}
echo "logs and results in $OUT" >&2
# shellcheck source=benches/e2e_lib.sh
source "$ROOT/benches/e2e_lib.sh"
e2e_build

for r in $(seq "$RUNS"); do
  db=cs_big_$$_$r
  SERVICE_FLAGS=
  if [[ $ENGINE == postgres ]]; then
    psql "$PG/postgres" -qc "CREATE DATABASE $db" >/dev/null
    SERVICE_FLAGS="--change-db $PG/$db"
  fi
  export SERVICE_FLAGS
  e2e_ours "$ENGINE-$CHANGES-run$r" --subs "$SUBS" --rate 0 --changes "$CHANGES" \
    --row-bytes "$ROW_BYTES" --window "$WINDOW" --warm-s "$WARM_S" --meas-s "$MEAS_S" \
    --setup-timeout-s 300 || true
  if [[ $ENGINE == postgres ]]; then
    psql "$PG/postgres" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null || true
  fi
done

python3 - "$OUT/results.jsonl" "$SUBS" "$ROW_BYTES" "$ENGINE" <<'PY'
import json, statistics, sys
path, subs, row, engine = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
runs = [json.loads(l) for l in open(path)]
stored, delivered, rss = [], [], []
for d in runs:
    s = d["storedTxnsPerS"] * d["changesPerTxn"]
    per_sub = d["deliveriesPerS"] / max(subs, 1)
    stored.append(s); delivered.append(per_sub); rss.append(d["serviceRssAnonPeakMiB"])
    print(f"{engine} {d['changesPerTxn']} changes/txn: stored {s:,.0f} changes/s, delivered "
          f"{per_sub:,.0f} changes/s per subscriber ({per_sub * row / 1e6:.1f} MB/s), "
          f"RssAnon peak {d['serviceRssAnonPeakMiB']:.0f} MiB, {d['errors']} errors")
if runs:
    print(f"median of {len(runs)}: stored {statistics.median(stored):,.0f} changes/s, delivered "
          f"{statistics.median(delivered):,.0f} per subscriber "
          f"({statistics.median(delivered) * row / 1e6:.1f} MB/s), RssAnon peak "
          f"{statistics.median(rss):.0f} MiB (max {max(rss):.0f})")
PY
