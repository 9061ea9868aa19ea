#!/usr/bin/env bash
# The Python replica client (examples/python/replica_client.py) as benches/catchup.sh's CLIENT
# (CLIENT=python there runs this): it takes the subscription from CATCHUP_URL (its base, its
# replicaVersion and watermark) and CATCHUP_UNTIL, runs the client with its defaults (acks at
# commits, and after 100 ms of quiet inside a transaction, PROTOCOL.md §7), and turns its
# summary line into the bench's {"changes":N,"seconds":S,"changes_per_s":R}. N counts every
# payload after the status, as the bench's own client does: the client's applied changes plus
# a begin and a commit per transaction.
#
# Usage: CATCHUP_URL=… CATCHUP_UNTIL=… benches/catchup_python.sh PYTHON
#   PYTHON: an interpreter with `websockets` 15 or later (scripts/install-python-websockets.sh)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${1:?usage: catchup_python.sh PYTHON}
query=${CATCHUP_URL#*\?}
param() { tr '&' '\n' <<<"$query" | sed -n "s/^$1=//p"; }
"$PY" "$ROOT/examples/python/replica_client.py" --url "${CATCHUP_URL%%/replication/*}" \
  --id "$(param id)" --replica-version "$(param replicaVersion)" \
  --watermark "$(param watermark)" --exit-at "$CATCHUP_UNTIL" 2>/dev/null |
  tail -1 |
  "$PY" -c '
import json, sys
s = json.load(sys.stdin)["summary"]
n = s["changes"] + 2 * s["transactions"]
print(json.dumps({"changes": n, "seconds": s["seconds"], "changes_per_s": round(n / s["seconds"]),
                  "idle_acks": s["idle_acks"], "drops": s["drops"]}))'
