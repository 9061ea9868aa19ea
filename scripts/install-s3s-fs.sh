#!/usr/bin/env bash
# Installs s3s-fs 0.14.1 (crates.io, `--features binary`), a local S3-compatible server that
# CHECKS SigV4 signatures, for the one S3 test moto cannot serve: a wrong secret answered with a
# real 403 `SignatureDoesNotMatch` (tests/s3_settings.rs). moto (scripts/install-moto.sh) serves
# every other S3 test: it installs in seconds and logs each request, but accepts any key.
# s3s-fs 0.14.1 is the newest that builds with this machine's rustc 1.95 (0.17 needs 1.96); the
# build takes ~2.5 minutes of both cores, once: the binary is cached in the install folder and
# the build's target folder removed. Idempotent. Prints `export S3S_FS='…'`.
#
# Usage: scripts/install-s3s-fs.sh [DIR]   (DIR defaults to $CHANGE_STREAMER_S3S_DIR,
#                                           then <repo>/.tools/s3s-fs)
set -euo pipefail

VERSION=0.14.1
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-${CHANGE_STREAMER_S3S_DIR:-$ROOT/.tools/s3s-fs}}"
BIN="$DIR/bin/s3s-fs"
STAMP="$DIR/.installed-$VERSION"

if [[ ! -f "$STAMP" || ! -x "$BIN" ]]; then
  echo "installing s3s-fs $VERSION into $DIR (a build of ~2.5 minutes)" >&2
  rm -rf "$DIR"
  mkdir -p "$DIR"
  cargo install --quiet --root "$DIR" --target-dir "$DIR/target" \
    "s3s-fs@$VERSION" --features binary >&2
  rm -rf "$DIR/target"
  "$BIN" --help >/dev/null
  touch "$STAMP"
fi

echo "export S3S_FS='$BIN'"
