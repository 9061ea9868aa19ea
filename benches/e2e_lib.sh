# Shared by the end-to-end scripts (benches/e2e_vs_original.sh, benches/standby_serving.sh);
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
