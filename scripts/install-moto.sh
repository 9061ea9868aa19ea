#!/usr/bin/env bash
# Installs a local S3-compatible server for the S3 tests, the demo and benches/s3_cost.sh:
# moto's server (`moto_server`, moto 5.2.5 from PyPI) in a Python venv in a project-local folder,
# cached as scripts/install-litestream.sh caches litestream. Idempotent: a complete install is
# left as it is. Prints the server's path as a shell assignment, so that
#     eval "$(scripts/install-moto.sh)"
# exports MOTO_SERVER. Tests find the folder through CHANGE_STREAMER_MOTO_DIR, or `.tools/moto`
# under the repository root by default.
#
# Why moto and not s3s-fs (issue 44): both serve what litestream 0.5.17 needs (replicate,
# restore, the VFS, the control socket's sync). s3s-fs checks SigV4 signatures, but it must be
# compiled (`cargo install s3s-fs --features binary`: minutes of both cores of a shared machine,
# and hundreds of MB of target), while moto installs from wheels in seconds. moto serves
# `/moto-api/data.json` and logs one line per request (werkzeug's access log), which is what
# the tests and the cost benchmark count requests per bucket with. moto does not check
# signatures: the one test of a wrong secret (a real 403 `SignatureDoesNotMatch`) runs s3s-fs
# instead (scripts/install-s3s-fs.sh, test-support/src/s3s_fs.rs).
#
# Usage: scripts/install-moto.sh [DIR]   (DIR defaults to $CHANGE_STREAMER_MOTO_DIR,
#                                         then <repo>/.tools/moto)
set -euo pipefail

VERSION=5.2.5
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-${CHANGE_STREAMER_MOTO_DIR:-$ROOT/.tools/moto}}"
BIN="$DIR/venv/bin/moto_server"
STAMP="$DIR/.installed-$VERSION"

if [[ ! -f "$STAMP" || ! -x "$BIN" ]]; then
  echo "installing moto $VERSION's S3 server into $DIR" >&2
  rm -rf "$DIR"
  mkdir -p "$DIR"
  python3 -m venv "$DIR/venv" >&2
  PIP_ROOT_USER_ACTION=ignore "$DIR/venv/bin/python" -m pip install --quiet \
    --disable-pip-version-check --no-compile "moto[server]==$VERSION" >&2
  "$BIN" --help >/dev/null
  touch "$STAMP"
fi

echo "export MOTO_SERVER='$BIN'"
