#!/usr/bin/env python3
"""A small replica client for change-streamer, written from docs/PROTOCOL.md alone.

It subscribes to /replication/v6/changes with batched frames (PROTOCOL.md §5, §7), follows the
stream (single `msg` frames and `batch` frames alike), applies each transaction once its `commit`
arrives, acks cumulatively at commits, and after a drop resubscribes from the last commit it
applied, so that it sees every transaction once: no gap, no duplicate. When the stream goes
quiet inside a transaction it acks what it received (--idle-ack-ms): a catch-up may be waiting
for an ack inside a transaction larger than its window (§10.2), and would wait for ever for a
commit-only ack.

Its "replica" is a list in memory; --print writes each applied transaction as a JSON line
{"watermark": W, "changes": [payload, ...]} on stdout. It exits after --exit-after changes or
once it applied --exit-at's watermark, printing a summary line {"summary": {...}} on stdout
(and on stderr); an error message from the service (a replica of another version, or too old: §7)
exits with status 2.

Needs Python 3.9+ and `websockets` 15 or later (pip install 'websockets>=15').

    python3 examples/python/replica_client.py --url ws://127.0.0.1:4849 \\
        --replica-version 0a --watermark 0a --exit-at 0z --print
"""

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.parse

import websockets
from websockets.asyncio.client import connect


class Fatal(Exception):
    """The service refused this replica (PROTOCOL.md §7, error types 1 and 2)."""


class Replica:
    """What the client has applied: the last commit, and the changes counted."""

    def __init__(self, watermark, out):
        self.watermark = watermark  # the last commit applied (LexiVersions compare as text, §1)
        self.open = None  # the transaction in progress: [watermark, [payloads]]
        self.changes = 0
        self.transactions = 0
        self.out = out

    def apply(self, payload):
        """Applies one payload; True when it committed a transaction."""
        kind = payload[0]
        if kind == "status":
            return False
        if kind == "error":
            raise Fatal(json.dumps(payload[1]))
        if kind == "begin":
            self.open = [payload[2]["commitWatermark"], []]
        elif kind == "data":
            if self.open is None:
                raise RuntimeError(f"data outside a transaction: {payload}")
            self.open[1].append(payload[1])
        elif kind == "rollback":
            self.open = None
        elif kind == "commit":
            watermark, changes = self.open
            if payload[2]["watermark"] != watermark or watermark <= self.watermark:
                raise RuntimeError(f"commit {payload} after {self.watermark} does not follow")
            self.open = None
            self.watermark = watermark
            self.changes += len(changes)
            self.transactions += 1
            if self.out:
                self.out.write(json.dumps({"watermark": watermark, "changes": changes}) + "\n")
            return True
        return False


def changes_url(args, watermark):
    query = urllib.parse.urlencode({
        "id": args.id,
        "replicaVersion": args.replica_version,
        "watermark": watermark,
        "wsBatched": "true",
    })
    return f"{args.url.rstrip('/')}/replication/v6/changes?{query}"


def done(args, replica):
    return (args.exit_after is not None and replica.changes >= args.exit_after) or (
        args.exit_at is not None and replica.watermark >= args.exit_at
    )


async def follow(args, replica, stats, headers):
    """One connection, until it ends or the exit condition holds. Returns True when done."""
    async with connect(
        changes_url(args, replica.watermark),
        additional_headers=headers,
        compression=None,  # the service negotiates none (§5)
        max_size=None,  # frames over 1 MiB happen: a single large payload travels alone (§5)
        proxy=None,
        ping_interval=None,  # the service pings; websockets answers its pings (§5)
    ) as ws:
        stats["connections"] += 1
        received = acked = 0  # frame ids
        while True:
            try:
                # Acks go at commits. When the stream goes quiet inside a transaction, ack what was
                # received: a catch-up's window may be waiting for an ack to go on (§10.2).
                quiet = args.idle_ack_ms / 1000 if replica.open and received > acked else None
                if quiet == 0:
                    quiet = None
                text = await asyncio.wait_for(ws.recv(), timeout=quiet)
            except asyncio.TimeoutError:
                await ws.send(json.dumps({"ack": received}))
                acked = received
                stats["idle_acks"] += 1
                continue
            frame = json.loads(text)
            received = frame["id"]
            payloads = frame["batch"] if "batch" in frame else [frame["msg"]]
            committed = False
            for payload in payloads:
                committed = replica.apply(payload) or committed
                if done(args, replica):
                    break
            if committed or args.ack == "frame":
                await ws.send(json.dumps({"ack": received}))  # cumulative (§5)
                acked = received
            if done(args, replica):
                await ws.close()
                return True


async def run(args):
    out = sys.stdout if args.print else None
    replica = Replica(args.watermark, out)
    stats = {"connections": 0, "drops": 0, "idle_acks": 0}
    headers = {}
    secret = os.environ.get("CHANGE_STREAMER_SECRET")
    if args.secret_file:
        with open(args.secret_file) as f:
            secret = f.read().removesuffix("\n")
    if secret:
        headers["Authorization"] = f"Bearer {secret}"
    start = time.monotonic()
    backoff = 0.1
    while not done(args, replica):
        connections = stats["connections"]
        try:
            if await follow(args, replica, stats, headers):
                break
        except (OSError, asyncio.TimeoutError, websockets.ConnectionClosed,
                websockets.InvalidHandshake) as e:
            status = getattr(getattr(e, "response", None), "status_code", None)
            if status in (401, 403):  # the secret (§15): retrying will not help
                raise Fatal(f"HTTP {status}: {e.response.body!r}") from e
            # A drop: the transaction in progress is discarded; resubscribe from the last commit.
            replica.open = None
            if stats["connections"] > connections:
                backoff = 0.1  # it had connected: start the backoff over
            stats["drops"] += 1
            print(f"connection ended ({e!r}); resuming after {replica.watermark} "
                  f"in {backoff:.1f} s", file=sys.stderr)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)
    seconds = time.monotonic() - start
    summary = {
        "changes": replica.changes,
        "transactions": replica.transactions,
        "watermark": replica.watermark,
        "seconds": round(seconds, 3),
        "changesPerSecond": round(replica.changes / seconds) if seconds > 0 else None,
        **stats,
    }
    line = json.dumps({"summary": summary})
    print(line, flush=True)
    print(line, file=sys.stderr)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the service, ws://host:port or wss://host:port")
    p.add_argument("--id", default="python-replica", help="subscriber id shown in /status")
    p.add_argument("--replica-version", required=True, help="the replicaVersion (§1)")
    p.add_argument("--watermark", required=True, help="the last commit this replica has")
    p.add_argument("--exit-after", type=int, help="exit once this many changes were applied")
    p.add_argument("--exit-at", help="exit once this watermark's commit (or a later one) applied")
    p.add_argument("--print", action="store_true", help="print each applied transaction")
    p.add_argument("--ack", choices=["commit", "frame"], default="commit",
                   help="ack at commits (default) or every frame on receipt")
    p.add_argument("--idle-ack-ms", type=int, default=100,
                   help="inside a transaction, ack what was received after this much quiet; 0: never")
    p.add_argument("--secret-file", help="file with the service's secret (or $CHANGE_STREAMER_SECRET)")
    args = p.parse_args()
    try:
        asyncio.run(run(args))
    except Fatal as e:
        print(f"the service refused this replica: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
