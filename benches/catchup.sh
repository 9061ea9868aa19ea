#!/usr/bin/env bash
# A fresh subscriber catching up ~1 M stored changes (PROTOCOL.md §10.2), acking only the frames
# that hold a commit, at 0 ms and at 20 ms RTT, for one or two builds of the service in the same
# invocation (runs interleaved, so that the machine's noise falls on both alike). Prints each
# run and the median changes/s of each (build, RTT), and the ratio after/before.
#
# The service runs in a network namespace of its own and the subscriber in another, joined by
# a veth pair with addresses made here (10.231.<n>.1 and .2, traffic only on this machine).
# At an RTT above 0, each side's egress is delayed by half of it with `tc netem` when the
# kernel has it; this project's VM's kernel is built without sch_netem, so there the client
# goes through benches/delay_proxy.py, in its namespace, which holds every chunk half the RTT
# in each direction (the application's round trip, a frame and its ack, takes the RTT more).
# The namespaces (and so the veth pair, its qdiscs, the proxy's socket) are removed on exit.
# Needs root.
#
#   benches/catchup.sh                       after only: this tree's release build
#   BEFORE=/tmp/before/change-streamer.bin benches/catchup.sh
#                                            before (another build's binary) and after
#
# Knobs (environment):
#   RUNS=5          catch-ups per (build, RTT)
#   RTTS="0 20"     round-trip times in ms
#   CHANGES=1000000 stored changes to catch up at least (filled once, 10 inserts a transaction:
#                   12 changes with its begin and commit)
#   BIN=path        the "after" binary (default: this tree's, built here)
#   BEFORE=path     the "before" binary (none: after only)
#   CLIENT="cmd"    the subscriber, run in the client namespace with CATCHUP_URL (the
#                   subscription URL, wsBatched=true) and CATCHUP_UNTIL (the last commit's
#                   watermark) set; it must ack only at commits and print one line
#                   {"changes":N,"seconds":S,...} once it has the last commit (default:
#                   loadgen's catchup-client); CLIENT=python: the Python replica client of
#                   examples/python (benches/catchup_python.sh, its interpreter found or
#                   made by scripts/install-python-websockets.sh)
#   KEEP=1          keep the run's folder (logs, the filled change log)
#   FILLED=dir      catch up the change log of a kept folder (dir/data) instead of filling one
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$(mktemp -d /tmp/catchup-bench.XXXXXX)
RUNS=${RUNS:-5}
RTTS=${RTTS:-"0 20"}
CHANGES=${CHANGES:-1000000}
# shellcheck source=benches/e2e_lib.sh
source "$ROOT/benches/e2e_lib.sh"

if [[ $(id -u) != 0 ]]; then
  echo "catchup.sh: needs root (network namespaces, tc netem)" >&2
  exit 1
fi

e2e_build
CLIENT=${CLIENT:-"$ROOT/target/release/catchup-client"}
if [[ $CLIENT == python ]]; then
  CLIENT="$ROOT/benches/catchup_python.sh $("$ROOT/scripts/install-python-websockets.sh")"
fi
if [[ -n ${BEFORE:-} ]]; then BUILDS="before after"; else BUILDS="after"; fi
bin_of() { if [[ $1 == before ]]; then echo "$BEFORE"; else echo "$BIN"; fi; }

# Namespaces and the veth pair: names unique to this run (all begin with csc).
TAG=$$
NS_S=csc-bench-s-$TAG
NS_C=csc-bench-c-$TAG
SUBNET=10.231.$((TAG % 250)).
SERVICE_IP=${SUBNET}1
SERVICE_PID=
LOADGEN_PID=
cleanup() {
  [[ -n $LOADGEN_PID ]] && kill "$LOADGEN_PID" 2>/dev/null && wait "$LOADGEN_PID" 2>/dev/null
  [[ -n $SERVICE_PID ]] && kill "$SERVICE_PID" 2>/dev/null && wait "$SERVICE_PID" 2>/dev/null
  ip netns del "$NS_S" 2>/dev/null || true
  ip netns del "$NS_C" 2>/dev/null || true
  if [[ -z ${KEEP:-} ]]; then rm -rf "$OUT"; else echo "kept $OUT" >&2; fi
}
trap cleanup EXIT
# A signal exits through the EXIT trap too, so nothing is left behind.
trap 'exit 143' TERM INT
ip netns add "$NS_S"
ip netns add "$NS_C"
ip link add "cscs$TAG" type veth peer name "cscc$TAG"
ip link set "cscs$TAG" netns "$NS_S"
ip link set "cscc$TAG" netns "$NS_C"
ip -n "$NS_S" addr add "${SUBNET}1/24" dev "cscs$TAG"
ip -n "$NS_C" addr add "${SUBNET}2/24" dev "cscc$TAG"
for ns in "$NS_S" "$NS_C"; do ip -n "$ns" link set lo up; done
ip -n "$NS_S" link set "cscs$TAG" up
ip -n "$NS_C" link set "cscc$TAG" up

# RTT in ms: half of it on each side's egress with netem, if the kernel has it; else
# PROXY_MS is set for the delay proxy.
if tc -n "$NS_S" qdisc replace dev "cscs$TAG" root netem delay 0ms 2>/dev/null; then
  NETEM=1
  tc -n "$NS_S" qdisc del dev "cscs$TAG" root
else
  NETEM=
  echo "no sch_netem in this kernel: the client goes through benches/delay_proxy.py" >&2
fi
PROXY_MS=0
set_rtt() {
  local half
  half=$(python3 -c "print($1 / 2)")
  PROXY_MS=0
  if [[ $1 == 0 ]]; then
    tc -n "$NS_S" qdisc del dev "cscs$TAG" root 2>/dev/null || true
    tc -n "$NS_C" qdisc del dev "cscc$TAG" root 2>/dev/null || true
  elif [[ -n $NETEM ]]; then
    tc -n "$NS_S" qdisc replace dev "cscs$TAG" root netem delay "${half}ms" limit 100000
    tc -n "$NS_C" qdisc replace dev "cscc$TAG" root netem delay "${half}ms" limit 100000
  else
    PROXY_MS=$half
  fi
}

status() { curl -sf "http://$1/status"; }
json_field() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

# Fill: the "after" build on loopback, fed by the load generator with no subscriber, until the
# change log holds CHANGES changes.
if [[ -n ${FILLED:-} ]]; then
  # A change log kept by an earlier run (KEEP=1): its replicaVersion and last commit.
  DATA=$FILLED/data
  PORT=$(free_port)
  "$BIN" --host 127.0.0.1 --port "$PORT" --data-dir "$DATA" > "$OUT/filled-service.log" 2>&1 &
  SERVICE_PID=$!
  STORED=None
  while [[ $STORED == None ]]; do
    sleep 0.2
    kill -0 "$SERVICE_PID" 2>/dev/null || { cat "$OUT/filled-service.log" >&2; exit 1; }
    STORED=$(status "127.0.0.1:$PORT" 2>/dev/null | json_field 'd["changeLog"]["maxWatermark"]' 2>/dev/null || echo None)
  done
  RV=$(status "127.0.0.1:$PORT" | json_field 'd["replicaVersion"]')
  kill "$SERVICE_PID"; wait "$SERVICE_PID" 2>/dev/null || true; SERVICE_PID=
else
  DATA=$OUT/data
  mkdir -p "$DATA"
  read -r PORT LPORT < <(free_ports 2)
  "$BIN" --host 127.0.0.1 --port "$PORT" --data-dir "$DATA" \
    --upstream "ws://127.0.0.1:$LPORT" > "$OUT/fill-service.log" 2>&1 &
  SERVICE_PID=$!
  echo "$SERVICE_PID" > "$OUT/fill.pid"
  TXNS=$(( (CHANGES + 11) / 12 ))
  echo "filling $TXNS transactions ($((TXNS * 12)) changes)..." >&2
  "$LOADGEN" --listen "127.0.0.1:$LPORT" --service "ws://127.0.0.1:$PORT" \
    --service-pid-file "$OUT/fill.pid" --subs 0 --warm-s 0 --meas-s 3600 \
    > "$OUT/fill-loadgen.log" 2>&1 &
  LOADGEN_PID=$!
  # Transactions are counted by watermark: the load generator's are consecutive LexiVersions (a
  # length digit, then base-36 digits).
  lexi() { python3 -c "import sys; print(int(sys.argv[1][1:], 36))" "$1"; }
  RV=None
  while [[ $RV == None ]]; do
    sleep 0.2
    # Either may have failed to start (a port taken meanwhile, say): say so rather than wait.
    for pid in "$SERVICE_PID" "$LOADGEN_PID"; do
      kill -0 "$pid" 2>/dev/null || { cat "$OUT/fill-service.log" "$OUT/fill-loadgen.log" >&2; exit 1; }
    done
    RV=$(status "127.0.0.1:$PORT" 2>/dev/null | json_field 'd["replicaVersion"]' 2>/dev/null || echo None)
  done
  while :; do
    sleep 0.2
    kill -0 "$LOADGEN_PID" 2>/dev/null || { cat "$OUT/fill-loadgen.log" >&2; exit 1; }
    STORED=$(status "127.0.0.1:$PORT" | json_field 'd["changeLog"]["maxWatermark"]' 2>/dev/null || echo None)
    [[ $STORED == None ]] && continue
    (( $(lexi "$STORED") - $(lexi "$RV") >= TXNS )) && break
  done
  kill "$LOADGEN_PID"; wait "$LOADGEN_PID" 2>/dev/null || true; LOADGEN_PID=
  sleep 1
  STORED=$(status "127.0.0.1:$PORT" | json_field 'd["changeLog"]["maxWatermark"]')
  kill "$SERVICE_PID"; wait "$SERVICE_PID" 2>/dev/null || true; SERVICE_PID=
fi
echo "stored: replicaVersion $RV, last commit $STORED" >&2

# One catch-up: start `bin` in the service namespace on the filled change log (no change
# source: it serves what it has; the client is not on its loopback, hence
# --allow-unauthenticated, PROTOCOL.md §15), run the client from the other namespace, stop the
# service.
catchup() {
  local build=$1 rtt=$2 run=$3 port url line proxy= target
  port=$(free_port)
  ip netns exec "$NS_S" "$(bin_of "$build")" --host "$SERVICE_IP" --port "$port" \
    --data-dir "$DATA" --allow-unauthenticated > "$OUT/service-$build-$rtt-$run.log" 2>&1 &
  SERVICE_PID=$!
  until ip netns exec "$NS_C" curl -sf "http://$SERVICE_IP:$port/status" > /dev/null; do
    sleep 0.1
  done
  target=$SERVICE_IP:$port
  if [[ $PROXY_MS != 0 ]]; then
    ip netns exec "$NS_C" python3 "$ROOT/benches/delay_proxy.py" "$PROXY_MS" \
      "127.0.0.1:$port" "$SERVICE_IP:$port" &
    proxy=$!
    until ip netns exec "$NS_C" curl -sf "http://127.0.0.1:$port/status" > /dev/null; do
      sleep 0.1
    done
    target=127.0.0.1:$port
  fi
  url="ws://$target/replication/v6/changes?id=catchup-$run&replicaVersion=$RV&watermark=$RV&wsBatched=true"
  line=$(ip netns exec "$NS_C" env CATCHUP_URL="$url" CATCHUP_UNTIL="$STORED" $CLIENT | tail -1)
  [[ -n $proxy ]] && { kill "$proxy"; wait "$proxy" 2>/dev/null || true; }
  kill "$SERVICE_PID"; wait "$SERVICE_PID" 2>/dev/null || true; SERVICE_PID=
  echo "{\"build\":\"$build\",\"rtt_ms\":$rtt,\"run\":$run,\"result\":$line}" | tee -a "$OUT/results.jsonl"
}

for run in $(seq 1 "$RUNS"); do
  for rtt in $RTTS; do
    set_rtt "$rtt"
    for build in $BUILDS; do catchup "$build" "$rtt" "$run"; done
  done
done

python3 - "$OUT/results.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = {}
for key in sorted({(r["build"], r["rtt_ms"]) for r in rows}):
    rates = [r["result"]["changes_per_s"] for r in rows if (r["build"], r["rtt_ms"]) == key]
    changes = {r["result"]["changes"] for r in rows if (r["build"], r["rtt_ms"]) == key}
    med[key] = statistics.median(rates)
    print(f"{key[0]:>6} at {key[1]:>3} ms RTT: median {med[key]:>10,.0f} changes/s over {len(rates)} runs "
          f"(changes {sorted(changes)}; runs {', '.join(f'{x:,.0f}' for x in rates)})")
for rtt in sorted({k[1] for k in med}):
    if ("before", rtt) in med and ("after", rtt) in med:
        print(f"after/before at {rtt} ms RTT: {med[('after', rtt)] / med[('before', rtt)]:.1f}x")
EOF
