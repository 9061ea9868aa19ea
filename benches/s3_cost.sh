#!/usr/bin/env bash
# What each backup source costs in requests to the object store (BENCHMARKS.md, "Backups on S3:
# requests per source"): examples/s3_cost.rs runs the service with the `none` (litestream
# alone), `vfs`, `control` and `control+audit` sources at once, each with its own moto S3 server,
# at the default intervals and one commit a second, and reads the requests per bucket from each
# server's own log. moto and litestream install themselves on first use.
#
# Usage: benches/s3_cost.sh [SECONDS]   (300 by default; a debug build: the requests counted do
#                                        not depend on the build, and it shares the tests' target)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo run --quiet --example s3_cost -- --seconds "${1:-300}"
