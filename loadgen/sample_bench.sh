#!/usr/bin/env bash
# What checking only a sample of subscribers (`--check-subs`) buys, end to end over loopback: the
# release service driven by the load generator (batched frames, --threads sized to the machine,
# as benches/scale.sh runs it), for each load of LOADS (subscribers:txns/s) with every subscriber
# checked and with K = CHECK of them checked (the rest light), the two alternated run by run
# (RUNS rounds) so that every ratio is taken in one invocation. Prints each run's human lines,
# then per case the medians of: transactions/s held upstream, deliveries/s, the generator's CPU
# per delivery and cores, the service's cores, commit→receipt p99 (over the checked
# subscribers) and the light subscribers' newest-commit p99.
#
#   loadgen/sample_bench.sh        # ~4 min on 2 cores: 3 rounds of 4 runs of 3 + 8 s
#   LOADS="256:2000 1024:200" CHECK=32 RUNS=3 WARM_S=3 MEAS_S=8 WINDOW=256
#   LG_THREADS=$(nproc) LG_FLAGS= (more load-generator flags) SERVICE_FLAGS= (more service flags)
#   BASE_LOADGEN=path/to/change-streamer-loadgen: a third case, `base`, run by that build (e.g.
#   one from before --check-subs, which checks every subscriber), alternated with the others
#
# Results (one JSON line a run) and logs go to a new /tmp/smp-sample.* folder.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LOADS=${LOADS:-256:2000 1024:200} CHECK=${CHECK:-32} RUNS=${RUNS:-3}
WARM_S=${WARM_S:-3} MEAS_S=${MEAS_S:-8} WINDOW=${WINDOW:-256} LG_THREADS=${LG_THREADS:-$(nproc)}
read -r -a LG_EXTRA <<< "${LG_FLAGS:-}"
OUT=$(mktemp -d /tmp/smp-sample.XXXXXX)
echo "logs and results in $OUT" >&2

max_n=0
for kv in $LOADS; do ((${kv%%:*} > max_n)) && max_n=${kv%%:*}; done
need=$((max_n + 512))
if [[ $(ulimit -Sn) != unlimited ]] && (($(ulimit -Sn) < need)); then ulimit -n "$need"; fi

# shellcheck source=benches/e2e_lib.sh
source "$ROOT/benches/e2e_lib.sh"
e2e_build

echo "machine: $(nproc) CPUs; load before: $(cut -d' ' -f1-3 /proc/loadavg); commit $(cd "$ROOT" && git rev-parse --short HEAD)"
for r in $(seq "$RUNS"); do
  for kv in $LOADS; do
    n=${kv%%:*} rate=${kv#*:}
    for k in ${BASE_LOADGEN:+base} all "$CHECK"; do
      check=() built=$LOADGEN
      [[ $k == all || $k == base ]] || check=(--check-subs "$k")
      [[ $k == base ]] && LOADGEN=$BASE_LOADGEN
      e2e_ours "n$n-k$k-r$r" --label "n$n-k$k" --batched --threads "$LG_THREADS" --window "$WINDOW" \
        --warm-s "$WARM_S" --meas-s "$MEAS_S" --subs "$n" --rate "$rate" "${check[@]}" \
        "${LG_EXTRA[@]}" || true
      LOADGEN=$built
    done
  done
  echo "round $r done; load $(cut -d' ' -f1-3 /proc/loadavg)"
done

python3 - "$OUT/results.jsonl" <<'EOF'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    j = json.loads(line)
    runs.setdefault(j["service"], []).append(j)
def med(js, f):
    xs = [f(j) for j in js]
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")
print(f"{'case':<12} {'runs':>4} {'txns/s':>8} {'deliv/s':>10} {'lg µs/deliv':>11} {'lg cores':>8} "
      f"{'svc cores':>9} {'p99 ms':>7} {'checked':>7} {'light p99':>9} {'errors':>6}")
for case, js in runs.items():
    secs = lambda j: j["seconds"]
    light = med(js, lambda j: (j.get("lightNewestCommitLatencyMs") or {}).get("p99"))
    print(f"{case:<12} {len(js):>4} {med(js, lambda j: j['upstreamTxnsPerS']):>8.0f} "
          f"{med(js, lambda j: j['deliveriesPerS']):>10.0f} "
          f"{med(js, lambda j: j['loadgenCpuUsPerDelivery']):>11.3f} "
          f"{med(js, lambda j: j['loadgenCpuS'] / secs(j)):>8.2f} {med(js, lambda j: j['serviceCores']):>9.2f} "
          f"{med(js, lambda j: j['latencyMs']['p99']):>7.2f} {js[0].get('checkedSubs', js[0]['subs']):>7} "
          f"{light:>9.2f} {sum(j['errors'] for j in js):>6}")
EOF
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
