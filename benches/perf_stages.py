#!/usr/bin/env python3
"""Where the service's CPU goes, by thread and stage: reads `perf script -F comm,ip,sym` of a
profile taken with call stacks and prints each thread group's share of the samples, split into
the stages named below (the first stage whose function is on a sample's stack, leaf first).

    cargo build --profile profiling --bin change-streamer
    BIN=target/profiling/change-streamer FRAMINGS=batched SERVICES=ours RUNS=1 SUBS=8 RATE=0 \\
        MEAS_S=12 benches/e2e_vs_original.sh &          # then, once its measured window began:
    perf record -e cpu-clock -F 499 --call-graph dwarf,16384 -p <service pid> -o s.data -- sleep 5
    perf script -i s.data -F comm,ip,sym | benches/perf_stages.py [µs of CPU per delivery]

The service's pid is in the run's folder (`/tmp/cs-e2e.*/<tag>/pid`). With the CPU per delivery
of the same run, each share is also printed in µs per delivery.
"""
import collections
import sys

# Per thread group, (stage, a function name on the stack that marks it), first match wins.
STAGES = {
    "writer": [("fsync", "fsync"), ("checkpoint", "Checkpoint"), ("wal frames", "pagerWalFrames"),
               ("btree insert", "sqlite3BtreeInsert"), ("pack (lz4)", "txn_value::pack"),
               ("free txn", "drop_in_place<change_streamer_actors::changelog::types::Transaction"),
               ("encode", "txn_value::encode"), ("park", "park_timeout"), ("sqlite other", "sqlite3")],
    "main": [("parse_frame", "parse_frame"), ("upstream read", "SplitStream"),
             ("upstream ack send", "SplitSink"), ("Change::new", "Change::new"),
             ("forward", "::forward"), ("flush_all (to sessions)", "flush_all"),
             ("commit/append", "ChangeLog::append"), ("streamer other", "Streamer"),
             ("park/epoll", "park"), ("upstream other", "upstream::session")],
    "worker": [("session write", "SubscriberSession::write"), ("ws encode", "Encoder<actix_http::ws"),
               ("socket write", "sendto"), ("ack handle", "StreamHandler"),
               ("ack decode", "Decoder>::decode"), ("socket read", "recvfrom"),
               ("h1 encode", "encode_chunk"), ("park/epoll", "epoll_wait"),
               ("mailbox other", "Mailbox"), ("dispatcher other", "Dispatcher")],
}


def group(comm):
    """The thread group of a thread name (the kernel keeps 15 bytes of it)."""
    if comm.startswith("change-log-writ"):
        return "writer"
    if comm.startswith("actix-rt"):
        return "worker"
    if comm.startswith("change-streamer"):
        return "main"
    return comm


def main():
    per_delivery = float(sys.argv[1]) if len(sys.argv) > 1 else None
    counts = collections.defaultdict(collections.Counter)
    comm, stack = None, []

    def flush():
        if comm is None:
            return
        g = group(comm)
        stage = next((name for name, mark in STAGES.get(g, [])
                      if any(mark in frame for frame in stack)), "other")
        counts[g][stage] += 1

    for line in sys.stdin:
        if not line.strip():
            flush()
            comm, stack = None, []
        elif line[0] in " \t":
            stack.append(line.strip())
        else:
            comm = line.split()[0]
    flush()
    total = sum(sum(c.values()) for c in counts.values()) or 1

    def share(n):
        text = f"{100 * n / total:5.1f} %"
        return text + (f"  {per_delivery * n / total:.3f} µs/delivery" if per_delivery else "")

    for g, c in sorted(counts.items(), key=lambda kv: -sum(kv[1].values())):
        print(f"{g}: {share(sum(c.values()))}")
        for stage, n in c.most_common():
            print(f"   {stage:26} {share(n)}")


if __name__ == "__main__":
    main()
