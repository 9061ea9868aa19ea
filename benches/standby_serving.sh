#!/usr/bin/env bash
# Serving standbys end to end (PROTOCOL.md §14.1; issue 17's "Measure"): one owner and two
# standbys, all three our release binary on ports of their own, sharing one PostgreSQL change
# DB (a fresh database per run, dropped after it), driven by the load generator (crate
# `loadgen`: the change source the owner ingests from, and the websocket subscribers, spread
# round-robin over the addresses each case names). Each instance's process CPU is measured
# apart, and beside them that of the PostgreSQL backends serving the run's change DB (listed
# every second from pg_stat_activity). The cases run alternately, run by run, so every ratio
# is taken in one invocation; then the medians:
#
#   1 spread / owner     SUBS subscribers over owner + both standbys, saturated; the same on
#                        the owner alone: deliveries/s, each instance's CPU per delivery
#   2 ingest-0 / -sb     the owner's ingest (txns/s it acks upstream), saturated, with no
#                        subscriber and with INGEST_SUBS at the standbys: the ratio
#   3 rate               RATE_SUBS subscribers over the three at RATE txns/s: commit → receipt
#                        latency at a standby's subscriber beside the owner's
#   4 catchup-0 / -sb    FILL_S s of saturated ingest with no subscriber, then CATCHUP_SUBS
#                        subscribers at the standbys from the start of the log (watermark =
#                        replicaVersion) while the owner ingests on: its ingest against the
#                        same without them
#   5 tier-alone / -idle / tier / tier-lat
#                        the second tier (issue 31, item 3) at TIER_RATE txns/s: the owner
#                        alone (no standby, no subscriber); the owner with both standbys
#                        following and no subscriber; the owner with TIER_SUBS subscribers
#                        at the standbys, half at each. The owner's CPU per ingested
#                        transaction in each, beside that of the change DB's backends (the
#                        owner's, the standbys'), and the ratios to the owner alone. With
#                        PLACEMENT=hosts these are placed as figures 2 and 4 (the change
#                        source's generator with the owner, the subscribers' with the
#                        standbys), and tier-lat runs the tier once more with one generator
#                        (change source and subscribers, LG_THREADS threads) on TIER_LG
#                        (default subs: STANDBY_CPUS) for commit → receipt at each standby's
#                        subscribers: a generator whose change source shares a busy CPU sends
#                        in bursts, which the owner stores in bigger groups, at less CPU per
#                        transaction, so that case is no measure of the owner's CPU.
#                        TIER_FLAGS: more load generator flags (`--changes 1`: with 10
#                        changes a transaction one CPU cannot read 256 × 2,000 txns/s).
#                        TIER_CASES: which of the four run (all by default);
#                        TIER_BEFORE=path/to/change-streamer runs TIER_BEFORE_CASES (default
#                        tier-idle tier tier-lat) once more each with that build (as
#                        <case>-before, interleaved), against the same tier-alone.
#
#   benches/standby_serving.sh                       # figures 1-4, 3 runs each
#   RUNS=3 FIGURES="1 2 3 4" SUBS=64 INGEST_SUBS=60 RATE=2000 RATE_SUBS=9 CATCHUP_SUBS=100
#   TIER_SUBS=256 TIER_RATE=2000 LG_THREADS=1 (figure 5; FRAMING=batched for it, as a tier
#   of that size would serve; `PLACEMENT=hosts FRAMING=batched RUNS=5 FIGURES=5`)
#   FILL_S=10 WARM_S=3 MEAS_S=10 WINDOW=256 FRAMING=per-frame   # or batched (wsBatched=true)
#   PG=postgres://postgres@127.0.0.1:5432 (trust auth; the run's databases are
#   ${DB_PREFIX}_<pid>_<case>_<run>, DB_PREFIX=cs_bench_standby) BIN=path/to/change-streamer
#   (another build)
#   OWNER_FLAGS=… STANDBY_FLAGS=… (more flags of the owner, of both standbys; for experiments,
#   e.g. STANDBY_FLAGS=--standby-serves=false: standbys that follow nothing)
#   STANDBY_NICE=19 (the standbys run under `nice -n 19`) and SUBS_NICE=19 (the subscribers
#   run in a second load generator process, under `nice -n 19`, the first keeping the change
#   source alone): on this one box, stand-ins for standbys and replicas on hosts of their own,
#   so that what they cost the owner is, as there, mostly what the standbys' reads cost the
#   change DB. The two generators' reports are merged into one line per run: the subscribers'
#   figures from the second, the ingest and the processes' CPU from the first, errors of both.
#   Their measured windows start apart (the second once its subscribers have their status),
#   so CPU per delivery mixes two windows a few ms apart. Not with figure 3: commit → receipt
#   latency needs the change source and the subscribers in one generator.
#   PLACEMENT=hosts: the owner's side and the standbys' side each on a CPU of its own, as on
#   hosts of their own, pinned with `taskset`: the owner and the change source's generator
#   on OWNER_CPUS; both standbys and the subscribers' generator (a second one, as with
#   SUBS_NICE) on STANDBY_CPUS; every PostgreSQL backend of the run's change DB on PG_CPUS
#   (default OWNER_CPUS: the change DB shares the owner's host, so what the standbys' reads
#   and records cost PostgreSQL is taken from the owner; PG_CPUS=side pins each backend beside
#   the instance it serves instead, read off `ss` by its client's port). A backend is pinned
#   once the sampler below sees it, within 0.5 s of its connection; PostgreSQL's own
#   processes (WAL writer, checkpointer, autovacuum) are not pinned. So the owner's ingest
#   measures what the standbys cost it through the design (the change DB's CPU, locks, WAL
#   and disk, what the owner does for them), not through a share of 2 cores. Both cases of a
#   figure run so placed, so the ratio is taken on the same CPUs; its absolute rates are a
#   core's. Not with figure 3.
#   OWNER_CPUS defaults to the CPU that takes the disk's interrupts (/proc/interrupts; CPU 1
#   on this box, `virtio1-req.0`), STANDBY_CPUS to the other of two: the change DB's fsyncs
#   complete where the disk interrupts. With PG_CPUS=side, a standby's backend committing its
#   record on the standbys' busy CPU held PostgreSQL's WAL write lock for up to 2 s
#   (`WALSync` in pg_stat_activity, the disk idle) while the owner's commits queued behind
#   it; PostgreSQL on a host of its own does not run on the standbys' CPU.
#   Figures 2 and 4 then run a third case each, the control (ingest-busy, catchup-busy): no
#   subscriber, and STANDBY_CPUS kept busy by a spinning shell loop per CPU for the whole run.
#   Two CPUs of one machine are not two machines (they share caches, memory and often a
#   physical core), so the control says what the standbys' CPU merely being busy costs the
#   owner, apart from what the standbys do to it through the change DB or the owner.
#   Figure 5 runs with PLACEMENT=hosts (its one generator on STANDBY_CPUS, see above).
#
# With STANDBY_FLAGS=--standby-serves=false only the cases without subscribers at the standbys
# make sense (FIGURES=2 INGEST_SUBS=0: the owner's ingest beside standbys that follow nothing).
#
# Each run's instance logs stay in the folder printed first; their WARN and ERROR lines are
# counted per instance beside the figures (a dropped subscriber or a gap shows as a load
# generator error instead, and makes its exit code 2).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RUNS=${RUNS:-3} FIGURES=${FIGURES:-1 2 3 4} SUBS=${SUBS:-64} INGEST_SUBS=${INGEST_SUBS:-60}
RATE=${RATE:-2000} RATE_SUBS=${RATE_SUBS:-9} CATCHUP_SUBS=${CATCHUP_SUBS:-100}
FILL_S=${FILL_S:-10} WARM_S=${WARM_S:-3} MEAS_S=${MEAS_S:-10} WINDOW=${WINDOW:-256}
FRAMING=${FRAMING:-per-frame} PG=${PG:-postgres://postgres@127.0.0.1:5432}
TIER_SUBS=${TIER_SUBS:-256} TIER_RATE=${TIER_RATE:-2000} LG_THREADS=${LG_THREADS:-1}
TIER_LG=${TIER_LG:-subs} TIER_FLAGS=${TIER_FLAGS:-} TIER_CASES=${TIER_CASES:-tier-alone tier-idle tier tier-lat}
TIER_BEFORE=${TIER_BEFORE:-} TIER_BEFORE_CASES=${TIER_BEFORE_CASES:-tier-idle tier tier-lat}
DB_PREFIX=${DB_PREFIX:-cs_bench_standby}
# The CPU that takes the most interrupts of a block device's request queue (virtio, NVMe,
# SCSI): where the change DB's fsyncs complete.
DISK_CPU=$(awk 'NR == 1 { n = NF } /-req|nvme|blk|scsi|ahci/ {
  for (i = 2; i <= n + 1; i++) t[i - 2] += $i } END { b = 0; for (c in t) if (t[c] > t[b]) b = c; print b }' /proc/interrupts 2>/dev/null || echo 0)
OTHER_CPU=$(( DISK_CPU == 0 ? 1 : 0 ))
PLACEMENT=${PLACEMENT:-shared} OWNER_CPUS=${OWNER_CPUS:-$DISK_CPU} STANDBY_CPUS=${STANDBY_CPUS:-$OTHER_CPU}
PG_CPUS=${PG_CPUS:-$OWNER_CPUS}
case $PLACEMENT in
  shared | hosts) ;;
  *) echo "PLACEMENT: shared or hosts, not '$PLACEMENT'" >&2; exit 2 ;;
esac
# The subscribers in a second generator of their own.
SPLIT=; [[ -n ${SUBS_NICE:-} || $PLACEMENT == hosts ]] && SPLIT=1
if [[ -n $SPLIT && " $FIGURES " == *" 3 "* ]]; then
  echo "SUBS_NICE, PLACEMENT=hosts: not with figure 3 (its latency needs the change source and the subscribers in one load generator); set FIGURES" >&2
  exit 2
fi
# on SIDE: the command words that place a process of SIDE (owner or standby): its CPUs
# (PLACEMENT=hosts) and its niceness (STANDBY_NICE, SUBS_NICE for the subscribers); SIDE
# free: neither (unpinned, at the default niceness).
on() {
  local cpus=$OWNER_CPUS
  [[ $1 == free ]] && return 0
  [[ $1 != owner ]] && cpus=$STANDBY_CPUS
  [[ $PLACEMENT == hosts ]] && printf '%s\n' taskset -c "$cpus"
  [[ $1 == standby && -n ${STANDBY_NICE:-} ]] && printf '%s\n' nice -n "$STANDBY_NICE"
  [[ $1 == subs && -n ${SUBS_NICE:-} ]] && printf '%s\n' nice -n "$SUBS_NICE"
  return 0
}
OUT=$(mktemp -d /tmp/cs-standby.XXXXXX)
echo "logs and results in $OUT" >&2

# shellcheck source=benches/e2e_lib.sh
source "$ROOT/benches/e2e_lib.sh"
e2e_build

# backends DB FILE DIR: every second (half, PLACEMENT=hosts), FILE lists the PIDs of the
# PostgreSQL backends connected to DB (the load generator reads it again at each snapshot);
# with PLACEMENT=hosts each backend not pinned yet is pinned to PG_CPUS, or (PG_CPUS=side)
# beside the instance it serves (DIR/owner.pid; any other client is a standby's), and listed
# in DIR/pinned with the side of its client; until killed. With SIDES set (figure 5) the
# backends are also told apart, placed or not: FILE.owner lists the owner's, FILE.standby the
# standbys' (each rewritten once it lists any).
backends() {
  local pid port client owner line side cpus
  local -A pinned=() clients=()
  while :; do
    psql "$PG/postgres" -AtF' ' -c "SELECT pid, client_port FROM pg_stat_activity WHERE datname = '$1'" \
      > "$2.all" 2>/dev/null || true
    cut -d' ' -f1 "$2.all" > "$2.new"
    [[ -s $2.new ]] && mv "$2.new" "$2"
    if [[ ($PLACEMENT == hosts || -n ${SIDES:-}) && -s $3/owner.pid ]]; then
      owner=$(cat "$3/owner.pid")
      clients=()
      # Local port -> the PID of the process holding it, for connections to PostgreSQL.
      while read -r line; do
        [[ $line =~ :([0-9]+)\ .*pid=([0-9]+), ]] && clients[${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}
      done < <(ss -Htnp state established "( dport = :${PG_PORT} )" | awk '{print $3, $5}')
      while read -r pid port; do
        [[ -n $port && -z ${pinned[$pid]:-} && -n ${clients[$port]:-} ]] || continue
        client=${clients[$port]}
        side=standby cpus=$STANDBY_CPUS
        [[ $client == "$owner" ]] && side=owner cpus=$OWNER_CPUS
        [[ $PG_CPUS != side ]] && cpus=$PG_CPUS
        if [[ $PLACEMENT == hosts ]]; then
          taskset -pc "$cpus" "$pid" > /dev/null || continue
        else
          cpus=-
        fi
        pinned[$pid]=$client && echo "$side $pid $cpus" >> "$3/pinned"
      done < "$2.all"
      if [[ -n ${SIDES:-} ]]; then
        # Those of the sampled backends still connected, by the side of their client.
        for side in owner standby; do
          awk -v side="$side" 'NR == FNR { if ($1 == side) s[$2] = 1; next } ($1 in s) { print $1 }' \
            "$3/pinned" "$2.all" > "$2.$side.new" 2>/dev/null || true
          [[ -s $2.$side.new ]] && mv "$2.$side.new" "$2.$side"
        done
      fi
      sleep 0.5
    else
      sleep 1
    fi
  done
}
PG_PORT=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.urlsplit(sys.argv[1]).port or 5432)' "$PG")

# ready PID PORT BODY: waits (60 s at most) until the instance PID on PORT answers /readyz with
# BODY (`ready`; a standby that does not serve answers `standby`); fails at once if PID ended.
ready() {
  local t
  for t in $(seq 600); do
    [[ $(curl -s "http://127.0.0.1:$2/readyz") == "$3" ]] && return 0
    kill -0 "$1" 2>/dev/null || { echo "the instance on port $2 ended (see its log)" >&2; return 1; }
    sleep 0.1
  done
  echo "the instance on port $2 does not answer /readyz $3 after 60 s" >&2
  return 1
}

# [WARM=S] run CASE SUBS RATE TAG SERVES [LOADGEN FLAG…]: one measured run after WARM s (default
# WARM_S); SERVES names the instances the subscribers go to (of owner sb1 sb2, comma-separated).
# Appends the JSON line to $OUT/results.jsonl and the instances' WARN/ERROR lines to
# $OUT/logs.jsonl: those logged up to 2 s before the load generator's end, but the notice that
# nothing is purged without litestream, and apart those of the teardown (its subscribers stop
# reading and close as it reports, its change source goes, the instances stop).
# Fails, keeping nothing of the run, if an instance was not up in its role when the load
# generator ended (one that could not start leaves another to own the change DB).
# INSTANCES (default `owner sb1 sb2`) names the instances started; ONE_LG=1 keeps the
# subscribers in the change source's generator whatever SPLIT says, and LG_SIDE (owner, or
# subs: STANDBY_CPUS) places that generator; SIDES=1 measures the change DB's backends by side
# (postgres.pids.owner, postgres.pids.standby) instead of together.
run() {
  local case=$1 subs=$2 rate=$3 tag=$4 serves=$5; shift 5
  local up dir db lg lgs='' lg_subs spare rc=0 n urls=() pids=() batched=() place=() spin=() end flags sampler roles
  local -A port pid
  dir=$OUT/$tag; rm -rf "$dir"; mkdir -p "$dir"
  local instances=${INSTANCES:-owner sb1 sb2}
  db=${DB_PREFIX}_$$_${tag//-/_}
  PGOPTIONS=--client-min-messages=warning psql "$PG/postgres" -qc "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null
  read -r up port[owner] port[sb1] port[sb2] spare <<< "$(free_ports 5)"
  for n in $instances; do pids+=("$dir/$n.pid"); done
  if [[ -n ${SIDES:-} ]]; then
    pids+=("$dir/postgres.pids.owner")
    [[ $instances != owner ]] && pids+=("$dir/postgres.pids.standby")
  else
    pids+=("$dir/postgres.pids")
  fi
  backends "$db" "$dir/postgres.pids" "$dir" &
  sampler=$!
  for n in ${serves//,/ }; do urls+=("ws://127.0.0.1:${port[$n]}"); done
  [[ $FRAMING == batched ]] && batched=(--batched)
  lg_subs=$subs
  [[ -n $SPLIT && -z ${ONE_LG:-} && $subs != 0 ]] && lg_subs=0
  if [[ -n ${BUSY:-} ]]; then
    for n in $(seq "$(taskset -c "$STANDBY_CPUS" nproc)"); do
      taskset -c "$STANDBY_CPUS" bash -c 'while :; do :; done' &
      spin+=($!)
    done
  fi
  mapfile -t place < <(on "${LG_SIDE:-owner}")
  "${place[@]}" "$LOADGEN" --label "$case" "${batched[@]}" --listen 127.0.0.1:"$up" \
    --service "$(IFS=,; echo "${urls[*]}")" --service-pid-file "$(IFS=,; echo "${pids[*]}")" \
    --subs "$lg_subs" --rate "$rate" --window "$WINDOW" --warm-s "${WARM:-$WARM_S}" --meas-s "$MEAS_S" "$@" \
    > "$dir/loadgen.out" 2> "$dir/loadgen.err" &
  lg=$!
  if [[ $lg_subs != "$subs" ]]; then
    # The subscribers alone, placed; its change source listens where no service connects.
    mapfile -t place < <(on subs)
    "${place[@]}" "$LOADGEN" --label "$case" "${batched[@]}" --listen 127.0.0.1:"$spare" \
      --service "$(IFS=,; echo "${urls[*]}")" --service-pid-file "$(IFS=,; echo "${pids[*]}")" \
      --subs "$subs" --rate 0 --window "$WINDOW" --warm-s "${WARM:-$WARM_S}" --meas-s "$MEAS_S" "$@" \
      > "$dir/loadgen-subs.out" 2> "$dir/loadgen-subs.err" &
    lgs=$!
  fi
  # The owner first (it takes the change DB's lock), then the standbys once it is ready.
  for n in $instances; do
    if [[ $n == owner ]]; then flags=${OWNER_FLAGS:-}; else flags=${STANDBY_FLAGS:-}; fi
    mapfile -t place < <(on "$([[ $n == owner ]] && echo owner || echo standby)")
    # shellcheck disable=SC2086 # the flags are words
    RUST_LOG=${RUST_LOG:-warn} "${place[@]}" "$BIN" --host 127.0.0.1 --port "${port[$n]}" --data-dir "$dir/$n-data" \
      --change-db "$PG/$db" --upstream ws://127.0.0.1:"$up"/changes $flags > "$dir/$n.log" 2>&1 &
    pid[$n]=$!
    ready "${pid[$n]}" "${port[$n]}" "$([[ $flags == *standby-serves=false* ]] && echo standby || echo ready)" || true
    echo "${pid[$n]}" > "$dir/$n.pid"
  done
  wait "$lg" || rc=$?
  if ((${#spin[@]})); then kill "${spin[@]}"; wait "${spin[@]}" 2>/dev/null || true; fi
  if [[ -n $lgs ]]; then
    wait "$lgs" || rc=$?
    # One line: the subscribers' figures, the owner's ingest and the change source's side
    # from the first generator, both generators' CPU.
    if python3 - "$dir/loadgen.out" "$dir/loadgen-subs.out" > "$dir/loadgen.merged" <<'PY'
import json, sys
lines = [[l for l in open(p) if l.startswith("{")] for p in sys.argv[1:3]]
src, subs = (json.loads(ls[0]) for ls in lines)
for k in ("storedTxnsPerS", "upstreamTxnsPerS", "ackLatencyMs", "targetTxnsPerS", "mode",
          "processes", "serviceCpuS", "serviceCores", "serviceRssAnonPeakMiB"):
    subs[k] = src[k]
subs["errors"] = src["errors"] + subs["errors"]
subs["firstErrors"] = (src["firstErrors"] + subs["firstErrors"])[:10]
subs["loadgenCpuS"] = src["loadgenCpuS"] + subs["loadgenCpuS"]
d = subs["deliveriesPerS"] * subs["seconds"]
subs["serviceCpuUsPerDelivery"] = subs["serviceCpuS"] * 1e6 / d if d else None
subs["deliveriesPerServiceCpuS"] = d / subs["serviceCpuS"] if subs["serviceCpuS"] else 0.0
subs["loadgenCpuUsPerDelivery"] = subs["loadgenCpuS"] * 1e6 / d if d else None
for p in subs["processes"]:
    p["cpuUsPerDelivery"] = p["cpuS"] * 1e6 / d if d else None
print(json.dumps(subs))
PY
    then
      { cat "$dir/loadgen.merged"; grep -hv '^{' "$dir/loadgen.out" "$dir/loadgen-subs.out"; } > "$dir/loadgen.both"
      mv "$dir/loadgen.both" "$dir/loadgen.out"
    else
      echo "$tag: the two load generators' reports could not be merged (see $dir/loadgen*.out)" >&2
      rc=2
    fi
  fi
  end=$(date -u -d @$(($(date +%s) - 2)) +%FT%TZ)
  kill "$sampler" 2>/dev/null || true; wait "$sampler" 2>/dev/null || true
  if [[ $PLACEMENT == hosts ]]; then
    echo "$tag: change DB backends pinned (PG_CPUS=$PG_CPUS): the owner's $(grep -c '^owner' "$dir/pinned" 2>/dev/null || true)," \
      "the standbys' $(grep -c '^standby' "$dir/pinned" 2>/dev/null || true)" >&2
  fi
  roles=$(for n in $instances; do
    curl -s "http://127.0.0.1:${port[$n]}/status" | python3 -c 'import json, sys; print(json.load(sys.stdin)["role"])' 2>/dev/null || echo down
  done | tr '\n' ' ')
  cut -d' ' -f1 /proc/loadavg >> "$OUT/loadavg"
  # The standbys before the owner: none of them takes over the change source.
  for n in sb1 sb2 owner; do
    [[ -n ${pid[$n]:-} ]] || continue
    kill -TERM "${pid[$n]}" 2>/dev/null || true; wait "${pid[$n]}" 2>/dev/null || true
  done
  psql "$PG/postgres" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null || true
  rm -rf "$dir"/*-data
  if [[ $roles != "owner $([[ $instances == *sb* ]] && echo 'standby standby ')" ]]; then
    echo "$tag: $instances were [$roles] at the end (see $dir/*.log); run not kept" >&2
    return 1
  fi
  e2e_collect "$dir" "$tag" "$rc"
  for n in $instances; do
    python3 - "$dir/$n.log" "$tag" "$n" "$end" >> "$OUT/logs.jsonl" <<'PY'
import json, re, sys
run, teardown = [], 0
for l in open(sys.argv[1], errors="replace"):
    w = re.match(r"^\[(\S+) +(WARN|ERROR) ", l)
    if not w or "no --litestream-backup-url" in l: continue
    if w[1] < sys.argv[4]: run.append(l.rstrip())
    else: teardown += 1
print(json.dumps({"tag": sys.argv[2], "instance": sys.argv[3], "count": len(run), "first": run[:3],
                  "teardown": teardown}))
PY
  done
}

# again: a run that failed (run's roles check) is made once more.
again() { run "$@" || run "$@" || echo "${4:-?}: failed twice; left out" >&2; }

for r in $(seq "$RUNS"); do
  for f in $FIGURES; do
    case $f in
      1) again spread "$SUBS" 0 "spread-$r" owner,sb1,sb2
         again owner "$SUBS" 0 "owner-$r" owner ;;
      2) again ingest-0 0 0 "ingest0-$r" sb1,sb2
         again ingest-sb "$INGEST_SUBS" 0 "ingestsb-$r" sb1,sb2
         if [[ $PLACEMENT == hosts ]]; then BUSY=1 again ingest-busy 0 0 "ingestbusy-$r" sb1,sb2; fi ;;
      3) again rate "$RATE_SUBS" "$RATE" "rate-$r" owner,sb1,sb2 ;;
      4) WARM=$FILL_S again catchup-0 0 0 "catchup0-$r" sb1,sb2 --join-late
         WARM=$FILL_S again catchup-sb "$CATCHUP_SUBS" 0 "catchupsb-$r" sb1,sb2 --join-late
         if [[ $PLACEMENT == hosts ]]; then
           WARM=$FILL_S BUSY=1 again catchup-busy 0 0 "catchupbusy-$r" sb1,sb2 --join-late
         fi ;;
      5) export SIDES=1
         for c in $TIER_CASES; do
           for b in "$BIN" ${TIER_BEFORE:+"$TIER_BEFORE"}; do
             k=$c; [[ $b != "$BIN" ]] && k=$c-before
             [[ $b != "$BIN" && " $TIER_BEFORE_CASES " != *" $c "* ]] && continue
             # shellcheck disable=SC2086 # the flags are words
             case $c in
               tier-alone) BIN=$b INSTANCES=owner again "$k" 0 "$TIER_RATE" "${k//-/}-$r" owner --threads "$LG_THREADS" $TIER_FLAGS ;;
               tier-idle) BIN=$b again "$k" 0 "$TIER_RATE" "${k//-/}-$r" sb1,sb2 --threads "$LG_THREADS" $TIER_FLAGS ;;
               tier) BIN=$b again "$k" "$TIER_SUBS" "$TIER_RATE" "${k//-/}-$r" sb1,sb2 --threads "$LG_THREADS" $TIER_FLAGS ;;
               tier-lat) if [[ -n $SPLIT ]]; then
                   BIN=$b ONE_LG=1 LG_SIDE=$TIER_LG again "$k" "$TIER_SUBS" "$TIER_RATE" "${k//-/}-$r" sb1,sb2 --threads "$LG_THREADS" $TIER_FLAGS
                 fi ;;
               *) echo "TIER_CASES: no case $c" >&2; exit 2 ;;
             esac
           done
         done
         unset SIDES ;;
      *) echo "FIGURES: no figure $f (1 to 5)" >&2; exit 2 ;;
    esac
  done
done

python3 - "$OUT/results.jsonl" "$OUT/logs.jsonl" "$OUT/loadavg" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
logs = [json.loads(l) for l in open(sys.argv[2])]
load = [float(l) for l in open(sys.argv[3])]
print(f"\nload average (1 min) at the runs' ends: {min(load):.1f}-{max(load):.1f}, median {statistics.median(load):.1f}")
cases = {}
for r in rows:
    cases.setdefault(r["service"], []).append(r)
# The instances each case's subscribers go to, in --service's order (as `run` is called above);
# the processes are owner, sb1, sb2 and then the change DB's backends, in --service-pid-file's
# order.
SERVES = {"spread": ["owner", "sb1", "sb2"], "owner": ["owner"], "rate": ["owner", "sb1", "sb2"]}
PROCS = ["owner", "sb1", "sb2", "postgres"]
def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None
def m(rs, f): return med([f(r) for r in rs])
def runs(rs, f, fmt="{:.0f}"):
    return "/".join("-" if f(r) is None else fmt.format(f(r)) for r in rs)
def at(r, c, name):   # the `services` entry of the subscribers at instance `name`
    serves = SERVES.get(c, ["sb1", "sb2"])
    return r["services"][serves.index(name)] if name in serves and r["subs"] else None
def own_us(r, c, i):  # µs of instance i's CPU per delivery to its own subscribers
    s = at(r, c, PROCS[i])
    d = s["deliveriesPerS"] * r["seconds"] if s else 0
    return r["processes"][i]["cpuS"] * 1e6 / d if d else None

print("medians (runs):")
for c in ["spread", "owner", "ingest-0", "ingest-sb", "ingest-busy", "rate", "catchup-0", "catchup-sb", "catchup-busy"]:
    rs = cases.get(c)
    if not rs: continue
    print(f"  {c:10} {rs[0]['subs']:3} subs: {m(rs, lambda r: r['deliveriesPerS']):.0f} deliveries/s "
          f"(runs {runs(rs, lambda r: r['deliveriesPerS'])}); owner ingest {m(rs, lambda r: r['storedTxnsPerS']):.0f} txns/s "
          f"(runs {runs(rs, lambda r: r['storedTxnsPerS'])}); service CPU "
          f"{m(rs, lambda r: r['serviceCpuUsPerDelivery']) or float('nan'):.2f} µs/delivery (all processes); "
          f"loadgen {m(rs, lambda r: r['loadgenCpuS'] / r['seconds']):.2f} cores; "
          f"errors {sum(r['errors'] for r in rs)}")
    for i, n in enumerate(PROCS):
        if i >= len(rs[0]["processes"]): continue
        line = f"      {n:8} {m(rs, lambda r: r['processes'][i]['cores']):.2f} cores (runs {runs(rs, lambda r: r['processes'][i]['cores'], '{:.2f}')})"
        own = m(rs, lambda r: own_us(r, c, i))
        if own is not None:
            line += f", {own:.2f} µs per delivery to its own subscribers (runs {runs(rs, lambda r: own_us(r, c, i), '{:.2f}')})"
        if rs[0]["subs"]:
            line += f", {m(rs, lambda r: r['processes'][i]['cpuUsPerDelivery']):.2f} µs per delivery of all"
        s = [at(r, c, n) for r in rs]
        if s[0] is not None:
            line += f"; its subscribers {med([x['deliveriesPerS'] for x in s]):.0f} deliveries/s"
            if c == "rate":
                lat = [x["latencyMs"] for x in s]
                p99s = "/".join(f"{x['p99']:.2f}" for x in lat)
                line += (f", commit → receipt p50 {med([x['p50'] for x in lat]):.2f} ms "
                         f"p99 {med([x['p99'] for x in lat]):.2f} ms (runs p99 {p99s})")
        print(line)
    if c == "rate":
        print(f"      commit → acked upstream (stored durably by the owner): p50 "
              f"{m(rs, lambda r: r['ackLatencyMs']['p50']):.2f} ms, p99 {m(rs, lambda r: r['ackLatencyMs']['p99']):.2f} ms")
        print(f"      kept {m(rs, lambda r: r['upstreamTxnsPerS']):.0f} txns/s upstream; longest gap between commits "
              f"{m(rs, lambda r: r['longestCommitGapMs']):.1f} ms")
def ratio(a, b, what, goal="; goal ≤ 10 %"):
    if a in cases and b in cases:
        x, y = m(cases[a], lambda r: r["storedTxnsPerS"]), m(cases[b], lambda r: r["storedTxnsPerS"])
        # The ratio of each run's pair too (the cases alternate run by run).
        per = "/".join(f"{p['storedTxnsPerS'] / q['storedTxnsPerS']:.2f}" for p, q in zip(cases[a], cases[b]))
        print(f"  {what}: {x:.0f} / {y:.0f} txns/s = {x / y:.3f} ({(1 - x / y) * 100:.1f} % lower{goal}; runs {per})")
print("ratios (same invocation):")
if "spread" in cases and "owner" in cases:
    print(f"  deliveries/s spread over the three / all on the owner: "
          f"{m(cases['spread'], lambda r: r['deliveriesPerS']) / m(cases['owner'], lambda r: r['deliveriesPerS']):.2f}x")
subs = lambda c: cases[c][0]["subs"] if c in cases else "?"
ratio("ingest-sb", "ingest-0", f"owner ingest, {subs('ingest-sb')} subscribers at the standbys / none")
ratio("catchup-sb", "catchup-0", f"owner ingest, {subs('catchup-sb')} subscribers catching up at the standbys / none")
ratio("ingest-busy", "ingest-0", "control: owner ingest, the standbys' CPUs kept busy / not", "")
ratio("ingest-sb", "ingest-busy", f"owner ingest, {subs('ingest-sb')} subscribers at the standbys / the control", "")
ratio("catchup-busy", "catchup-0", "control: owner ingest, the standbys' CPUs kept busy / not (figure 4's)", "")
ratio("catchup-sb", "catchup-busy", f"owner ingest, {subs('catchup-sb')} subscribers catching up / the control", "")
# Figure 5, the second tier: CPU per ingested (stored) transaction, by process (named by its
# PID file: the cases measure different sets), and the standbys' commit -> receipt.
def cpu_of(r, name):
    return next((p["cpuS"] for p in r["processes"] if p["pidFile"].endswith("/" + name)), None)
def per_txn(r, *names):
    t = r["storedTxnsPerS"] * r["seconds"]
    xs = [cpu_of(r, n) for n in names]
    return sum(xs) * 1e6 / t if t and None not in xs else None
OWNER, HOST = ("owner.pid",), ("owner.pid", "postgres.pids.owner", "postgres.pids.standby")
if "tier-alone" in cases:
    print("second tier (figure 5): CPU µs per ingested transaction, medians (runs)")
for c in [x + b for x in ["tier-alone", "tier-idle", "tier", "tier-lat"] for b in ["", "-before"]]:
    rs = cases.get(c)
    if not rs: continue
    print(f"  {c:10} {rs[0]['subs']:3} subs at {rs[0]['targetTxnsPerS']:.0f} txns/s: stored {m(rs, lambda r: r['storedTxnsPerS']):.0f} txns/s "
          f"(runs {runs(rs, lambda r: r['storedTxnsPerS'])}); errors {sum(r['errors'] for r in rs)}; "
          f"generator {m(rs, lambda r: r['loadgenCpuS'] / r['seconds']):.2f} cores")
    for what, names in [("owner", OWNER), ("change DB, owner's backends", ("postgres.pids.owner",)),
                        ("change DB, standbys' backends", ("postgres.pids.standby",)),
                        ("owner + change DB (the owner's host)", HOST if c != "tier-alone" else HOST[:2]),
                        ("sb1", ("sb1.pid",)), ("sb2", ("sb2.pid",))]:
        if m(rs, lambda r: per_txn(r, *names)) is None: continue
        print(f"      {what:38} {m(rs, lambda r: per_txn(r, *names)):7.2f} µs/txn (runs {runs(rs, lambda r: per_txn(r, *names), '{:.2f}')})")
    if rs[0]["subs"] and rs[0]["latencyMs"]["n"]:
        for i, n in enumerate(["sb1", "sb2"]):
            lat = [r["services"][i]["latencyMs"] for r in rs]
            p99s = "/".join(f"{x['p99']:.2f}" for x in lat)
            print(f"      commit → receipt at {n}'s {rs[0]['services'][i]['subs']} subscribers: p50 {med([x['p50'] for x in lat]):.2f} ms, "
                  f"p99 {med([x['p99'] for x in lat]):.2f} ms, p99.9 {med([x['p999'] for x in lat]):.2f} ms "
                  f"(runs p99 {p99s})")
        print(f"      all: p99 {m(rs, lambda r: r['latencyMs']['p99']):.2f} ms; longest gap between commits "
              f"{m(rs, lambda r: r['longestCommitGapMs']):.1f} ms; {m(rs, lambda r: r['deliveriesPerS']):.0f} deliveries/s")
    print(f"      commit → acked upstream (stored durably by the owner) p50 {m(rs, lambda r: r['ackLatencyMs']['p50']):.2f} ms, "
          f"p99 {m(rs, lambda r: r['ackLatencyMs']['p99']):.2f} ms")
def tier_ratio(a, what, names_a, names_b, goal=""):
    if a in cases and "tier-alone" in cases:
        x = m(cases[a], lambda r: per_txn(r, *names_a))
        y = m(cases["tier-alone"], lambda r: per_txn(r, *names_b))
        per = "/".join("-" if per_txn(p, *names_a) is None else f"{per_txn(p, *names_a) / per_txn(q, *names_b):.3f}"
                       for p, q in zip(cases[a], cases["tier-alone"]))
        print(f"  {what}: {x:.2f} / {y:.2f} µs = {x / y:.3f} (median of the runs' ratios "
              f"{med([per_txn(p, *names_a) / per_txn(q, *names_b) for p, q in zip(cases[a], cases['tier-alone'])]):.3f}; runs {per}){goal}")
if "tier-alone" in cases:
    print("ratios to the owner alone (same invocation):")
    tier_ratio("tier", f"owner CPU per txn, {subs('tier')} subscribers at the standbys / the owner alone", OWNER, OWNER, "; goal ≤ 1.10")
    tier_ratio("tier-idle", "owner CPU per txn, standbys following, no subscriber / the owner alone", OWNER, OWNER)
    tier_ratio("tier", "the owner's host (owner + change DB backends) per txn, with the tier / alone", HOST, HOST[:2])
    tier_ratio("tier-idle", "the owner's host per txn, standbys idle / alone", HOST, HOST[:2])
    tier_ratio("tier-lat", "owner CPU per txn in the latency case (change source beside the subscribers) / alone", OWNER, OWNER)
    for c in ["tier", "tier-idle"]:
        if c + "-before" in cases:
            tier_ratio(c + "-before", f"TIER_BEFORE's build: owner CPU per txn, {c} / alone", OWNER, OWNER)
            tier_ratio(c + "-before", f"TIER_BEFORE's build: the owner's host per txn, {c} / alone", HOST, HOST[:2])
print(f"instance logs, WARN/ERROR lines while measured (and {sum(l['teardown'] for l in logs)} in teardowns):")
for l in logs:
    if l["count"]:
        print(f"  {l['tag']} {l['instance']}: {l['count']}; first: {l['first']}")
if not any(l["count"] for l in logs):
    print("  none")
PY
