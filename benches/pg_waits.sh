#!/usr/bin/env bash
# What the change DB's backends wait for, sampled beside a bench (BENCHMARKS.md, the `PG_CPUS=side`
# row; benches/HISTORY.md, "At e0e0bc7: each side on a CPU of its own"): every INTERVAL s until
# stopped, one line per backend of the databases
# named like PATTERN that is not idle and not waiting for its client, with its wait event, the
# start of its statement and how long its transaction has been open; and per sample one
# `disk` line: the write requests and flushes the disk holding PostgreSQL's data completed
# since the sample before (`/sys/block/<dev>/stat`), so that a wait on `WALSync` can be told
# from a busy disk.
#
#   benches/pg_waits.sh 'cs_bench_standby%' > waits.log &   # then the bench; kill it after
#   INTERVAL=0.25 PG=postgres://postgres@127.0.0.1:5432 DEV=vda (default: the disk of /)
set -euo pipefail
PATTERN=${1:?usage: benches/pg_waits.sh DATABASE-PATTERN (e.g. cs_bench_standby%)}
INTERVAL=${INTERVAL:-0.25} PG=${PG:-postgres://postgres@127.0.0.1:5432}
DEV=${DEV:-$(lsblk -no PKNAME "$(findmnt -no SOURCE /)" 2>/dev/null | head -1)}
[[ -n $DEV ]] || DEV=$(basename "$(findmnt -no SOURCE /)")
[[ -r /sys/block/$DEV/stat ]] || { echo "no /sys/block/$DEV/stat: set DEV" >&2; exit 2; }
# Fields of /sys/block/<dev>/stat: 5 write requests completed, 15 flush requests completed.
read -r -a was < "/sys/block/$DEV/stat"
while sleep "$INTERVAL"; do
  ts=$(date +%T.%3N)
  psql "$PG/postgres" -AtF'|' -v pattern="$PATTERN" 2>/dev/null <<'SQL' | sed "s/^/$ts /" || true
SELECT pid, wait_event_type, wait_event, state, left(regexp_replace(query, '\s+', ' ', 'g'), 60),
       now() - xact_start
FROM pg_stat_activity
WHERE datname LIKE :'pattern' AND pid <> pg_backend_pid() AND state <> 'idle' AND wait_event_type IS DISTINCT FROM 'Client'
SQL
  read -r -a now < "/sys/block/$DEV/stat"
  echo "$ts disk $DEV: $((now[4] - was[4])) writes, $((now[14] - was[14])) flushes completed"
  was=("${now[@]}")
done
