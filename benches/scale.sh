#!/usr/bin/env bash
# How our service scales with its subscribers (issue 31), end to end over loopback: the release
# binary driven by the load generator (crate `loadgen`, --threads sized to the machine, batched
# frames), for each subscriber count N of NS:
#
#   rate-N   N subscribers at the fixed rate of RATES (txns/s), after measuring the service's
#            RssAnon with them connected, caught up and idle (`--idle-s`)
#   sat-N    N subscribers, saturated (as many transactions as the window allows)
#
# then the churn pair, at CHURN_TXNS txns/s to CHURN_STEADY steady subscribers:
#
#   steady   no churn
#   churn    CHURN_SUBS more subscribers joining and leaving, CHURN_RATE joins a second (as
#            many leave), each from a commit the service stored; every joiner's stream is
#            checked for gaps (ids, whole transactions, watermarks: an error of the run)
#
# and the CPU fit's own runs (FIT=1), designed so that each cost has a column of its own
# (benches/scale_cpu.py says why; the rate-N and sat-N runs are held out of it and predicted):
#
#   fit-n0-rR-kK    no subscriber, R txns/s of K inserts each (FIT_INGEST, R:K pairs; R=1 is
#                   the service idle): the service's own cost, per transaction and per change
#   fit-nN-rR-kK    N subscribers (FIT_NS) at FIT_RATE txns/s of K inserts (FIT_KS), every pair:
#                   at one N, frames stay and deliveries grow with K; at one K, both grow with N;
#                   and FIT_WIDE (N:R:K): many subscribers at a low rate, as many frames a
#                   second as the largest N above in fewer fan-outs, up to the N the sizing is for
#   hold-nN-rR-kK   FIT_HOLD (N:R:K): a run the fit does not see, to check its prediction
#   mem-N           N idle subscribers (MEM_NS): RssAnon only, for the memory fit over N
#
# and, beside the churn pair, the churn's own cost with the extra subscribers held apart:
#
#   steady2x CHURN_STEADY + CHURN_SUBS steady subscribers, none joining or leaving: the load
#            of as many connected subscribers as the churn run has, without the churn
#
# Checking: each run's load generator checks CHECK_SUBS of its subscribers fully (ids, whole
# transactions, watermarks, per-commit latency; spread over its threads and the connecting
# order) and reads the others light (frame ids checked, acked, every delivery counted, no
# message parsed: loadgen's --check-subs), so that at hundreds of subscribers the generator
# does not take the CPU the service needs. Latency figures are over the checked ones; joiners
# (churn) are always checked. CHECK_SUBS=all checks every subscriber, as before stop 39.
#
# Cases run alternately, round by round (RUNS rounds; the fit's runs in reverse order every
# other round, so a drift of the machine's load does not line up with one column), so every
# ratio is taken in one invocation. Each run prints its human line; then, per case, the
# medians of service CPU per delivery, RssAnon (peak, and idle per subscriber), commit→receipt
# p50/p99/p99.9 and the longest gap; the CPU fit (non-negative least squares, per round and
# pooled: its coefficients' median and range, residuals, and its predictions of the held-out
# runs with their errors); the fits of memory over N (KiB per subscriber); the goals of issue
# 31 met or not; and a sizing table (Markdown) derived from the fits.
#
#   benches/scale.sh                                  # ~10.5 min on 2 cores: 3 rounds
#   FIT_ONLY=1 benches/scale.sh                       # ~5.5 min: the fit's runs alone
#   NS="64 256 1024" RATES="64:2000 256:2000 1024:200" RATE=2000 (for an N not in RATES)
#   SAT=1 (0: no saturated runs) CHURN=1 (0: no churn pair) CHURN_STEADY=64 CHURN_TXNS=2000
#   CHURN_SUBS=64 CHURN_RATE=50 RUNS=3 WARM_S=3 MEAS_S=8 IDLE_S=2 WINDOW=256
#   FIT=1 (0: no fit runs) FIT_ONLY=0 (1: only the fit's runs) FIT_RATE=400 FIT_NS="8 64"
#   FIT_KS="1 16 64" FIT_WIDE="256:100:1 256:100:16 1024:25:1" FIT_INGEST="1:1 400:1 400:64 2000:1"
#   FIT_HOLD="64:1000:10" MEM_NS="512"
#   FIT_WARM_S=2 FIT_MEAS_S=4
#   CHECK_SUBS=32 (all: every subscriber checked)
#   LG_THREADS=$(nproc) LG_FLAGS= (more load-generator flags, e.g. --check-subs K; not --changes,
#   which the fit runs set) SERVICE_FLAGS= (more service
#   flags) BIN=path/to/change-streamer (another build: the load generator is still built)
#   Its folder (/tmp/cs-scale.*, printed first) keeps every run's log and results.jsonl: fit
#   again with `python3 benches/scale_fit.py /tmp/cs-scale.*/results.jsonl`.
#
# It runs from a clean checkout: it builds the release service and load generator (through
# benches/e2e_lib.sh). Each subscriber is a socket on both sides of loopback, in one process
# each: the script raises its own open-file limit (ulimit -n, inherited by both) to what the
# largest N needs and says so; it stops if the hard limit is lower.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
NS=${NS:-64 256 1024} RATES=${RATES:-64:2000 256:2000 1024:200} RATE=${RATE:-2000}
SAT=${SAT:-1} CHURN=${CHURN:-1} CHURN_STEADY=${CHURN_STEADY:-64} CHURN_TXNS=${CHURN_TXNS:-2000}
CHURN_SUBS=${CHURN_SUBS:-64} CHURN_RATE=${CHURN_RATE:-50}
RUNS=${RUNS:-3} WARM_S=${WARM_S:-3} MEAS_S=${MEAS_S:-8} IDLE_S=${IDLE_S:-2} WINDOW=${WINDOW:-256}
FIT=${FIT:-1} FIT_ONLY=${FIT_ONLY:-0} FIT_RATE=${FIT_RATE:-400} FIT_NS=${FIT_NS:-8 64}
FIT_KS=${FIT_KS:-1 16 64} FIT_WIDE=${FIT_WIDE:-256:100:1 256:100:16 1024:25:1}
FIT_INGEST=${FIT_INGEST:-1:1 400:1 400:64 2000:1}
FIT_HOLD=${FIT_HOLD:-64:1000:10} MEM_NS=${MEM_NS:-512}
FIT_WARM_S=${FIT_WARM_S:-2} FIT_MEAS_S=${FIT_MEAS_S:-4}
if ((FIT_ONLY)); then NS="" CHURN=0 FIT=1; fi
LG_THREADS=${LG_THREADS:-$(nproc)}
CHECK_SUBS=${CHECK_SUBS:-32}
read -r -a LG_EXTRA <<< "${LG_FLAGS:-}"
if [[ $CHECK_SUBS != all ]]; then LG_EXTRA+=(--check-subs "$CHECK_SUBS"); fi
OUT=$(mktemp -d /tmp/cs-scale.XXXXXX)
echo "logs and results in $OUT" >&2

# Open files: per subscriber one socket in the service and one in the generator; the change
# log, the upstream and the runtime a few hundred more.
max_n=0
((CHURN)) && max_n=$CHURN_STEADY
for n in $NS; do ((n > max_n)) && max_n=$n; done
if ((FIT)); then
  for n in $FIT_NS $MEM_NS $FIT_HOLD $FIT_WIDE; do n=${n%%:*}; ((n > max_n)) && max_n=$n; done
fi
need=$((max_n + CHURN_SUBS + 512))
soft=$(ulimit -Sn) hard=$(ulimit -Hn)
if [[ $soft != unlimited ]] && ((soft < need)); then
  if [[ $hard != unlimited ]] && ((hard < need)); then
    echo "scale: $max_n subscribers need ~$need open files per process; the hard limit is $hard (raise it, e.g. in /etc/security/limits.conf)" >&2
    exit 2
  fi
  ulimit -n "$need"
  echo "scale: raised the open-file limit (ulimit -n) from $soft to $need for $max_n subscribers" >&2
else
  echo "scale: open-file limit $soft is enough for $max_n subscribers (~$need needed)" >&2
fi

# shellcheck source=benches/e2e_lib.sh
source "$ROOT/benches/e2e_lib.sh"
e2e_build

rate_of() { # the fixed rate of N
  local kv
  for kv in $RATES; do [[ ${kv%%:*} == "$1" ]] && { echo "${kv#*:}"; return; }; done
  echo "$RATE"
}
lg() { # TAG LOADGEN_FLAGS...: one run; a failed run is reported and the script goes on
  local tag=$1
  shift
  e2e_ours "$tag-r$r" --label "$tag" --batched --threads "$LG_THREADS" --window "$WINDOW" \
    --warm-s "$WARM_S" --meas-s "$MEAS_S" "${LG_EXTRA[@]}" "$@" || true
}

# The fit's cases, one a line: TAG then its load-generator flags (see the header).
fit_cases() {
  local kv n k rate hold
  for kv in $FIT_INGEST; do
    rate=${kv%%:*} k=${kv#*:}
    echo "fit-n0-r$rate-k$k --subs 0 --rate $rate --changes $k"
  done
  for n in $FIT_NS; do
    for k in $FIT_KS; do
      echo "fit-n$n-r$FIT_RATE-k$k --subs $n --rate $FIT_RATE --changes $k --idle-s $IDLE_S"
    done
  done
  for kv in $FIT_WIDE; do
    IFS=: read -r n rate k <<< "$kv"
    echo "fit-n$n-r$rate-k$k --subs $n --rate $rate --changes $k --idle-s $IDLE_S"
  done
  for hold in $FIT_HOLD; do
    IFS=: read -r n rate k <<< "$hold"
    echo "hold-n$n-r$rate-k$k --subs $n --rate $rate --changes $k"
  done
}
fit_round() { # the fit's runs, forwards in odd rounds and backwards in even ones
  local line cases=()
  mapfile -t cases < <(fit_cases)
  ((r % 2)) || mapfile -t cases < <(printf '%s\n' "${cases[@]}" | tac)
  for line in "${cases[@]}"; do
    # shellcheck disable=SC2086 # the flags are words
    WARM_S=$FIT_WARM_S MEAS_S=$FIT_MEAS_S lg $line
  done
  for n in $MEM_NS; do
    WARM_S=0.5 MEAS_S=1 lg "mem-$n" --subs "$n" --rate 1 --idle-s "$IDLE_S"
  done
}

echo "machine: $(nproc) CPUs; checked subscribers per run: $CHECK_SUBS; load before: $(cut -d' ' -f1-3 /proc/loadavg); commit $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?')"
for r in $(seq "$RUNS"); do
  for n in $NS; do
    lg "rate-$n" --subs "$n" --rate "$(rate_of "$n")" --idle-s "$IDLE_S"
    ((SAT)) && lg "sat-$n" --subs "$n" --rate 0
  done
  ((FIT)) && fit_round
  if ((CHURN)); then
    lg steady --subs "$CHURN_STEADY" --rate "$CHURN_TXNS"
    lg steady2x --subs "$((CHURN_STEADY + CHURN_SUBS))" --rate "$CHURN_TXNS"
    lg churn --subs "$CHURN_STEADY" --rate "$CHURN_TXNS" --churn-subs "$CHURN_SUBS" --churn-rate "$CHURN_RATE"
  fi
  echo "round $r done; load $(cut -d' ' -f1-3 /proc/loadavg)"
done

python3 "$ROOT/benches/scale_fit.py" "$OUT/results.jsonl"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
