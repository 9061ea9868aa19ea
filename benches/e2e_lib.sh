# Shared by the end-to-end scripts (benches/e2e_vs_original.sh, benches/standby_serving.sh,
# benches/scale.sh);
# sourced, not run. Needs ROOT (the repository) and OUT (the run's folder) set.
#
#   e2e_build            builds the release service and load generator; sets BIN (kept if set:
#                        BIN=path/to/change-streamer measures another build) and LOADGEN
#   free_port            prints a free TCP port of 127.0.0.1
#   free_ports N         prints N distinct free ports (held together while chosen: two calls of
#                        free_port may print the same one)
#   e2e_collect DIR TAG RC
#                        after a run whose load generator wrote DIR/loadgen.out and exited RC:
#                        appends its JSON line to $OUT/results.jsonl, prints its human lines,
#                        and says so when RC is not 0
#   e2e_ours TAG LOADGEN_ARGS...
#                        one run of our service ($BIN, plain ws, change log in $OUT/TAG/data,
#                        removed after; SERVICE_FLAGS: more flags of the service) driven by the
#                        load generator with the given flags (it gets --listen, --service and
#                        --service-pid-file here), then e2e_collect; returns its exit code

e2e_build() {
  (cd "$ROOT" && nice cargo build --release --bin change-streamer -p change-streamer >&2 \
    && nice cargo build --release -p change-streamer-loadgen >&2)
  BIN=${BIN:-$ROOT/target/release/change-streamer}
  LOADGEN=$ROOT/target/release/change-streamer-loadgen
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
free_ports() {
  python3 -c 'import socket, sys
ss = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))' "$1"
}

e2e_collect() {
  local dir=$1 tag=$2 rc=$3
  grep '^{' "$dir/loadgen.out" >> "$OUT/results.jsonl" || true
  grep -v '^{' "$dir/loadgen.out" || true
  ((rc == 0)) || echo "$tag: loadgen exit $rc (see $dir/loadgen.err)" >&2
}

e2e_ours() {
  local tag=$1 up sp dir lg pid rc=0 flags=()
  shift
  read -r up sp <<< "$(free_ports 2)"; dir=$OUT/$tag; mkdir -p "$dir"
  read -r -a flags <<< "${SERVICE_FLAGS:-}"
  "$LOADGEN" --listen 127.0.0.1:"$up" --service ws://127.0.0.1:"$sp" --service-pid-file "$dir/pid" \
    "$@" > "$dir/loadgen.out" 2> "$dir/loadgen.err" &
  lg=$!
  RUST_LOG=${RUST_LOG:-warn} "$BIN" --host 127.0.0.1 --port "$sp" --data-dir "$dir/data" \
    "${flags[@]}" --upstream ws://127.0.0.1:"$up"/changes > "$dir/service.log" 2>&1 &
  pid=$!; echo "$pid" > "$dir/pid"
  wait "$lg" || rc=$?
  kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
  rm -rf "$dir/data"   # the change log: only the figures are kept
  e2e_collect "$dir" "$tag" "$rc"
  return "$rc"
}
