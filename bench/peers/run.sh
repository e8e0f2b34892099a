#!/usr/bin/env bash
# Peers table: runs ../shared/peerbench (raw INSERT+PUBLISH, centrifuge,
# watermill, weft) on its own private servers, with weft's adapter taken
# from this tree (weft.go.in: peerbench's weft.go, ported to fabric.Writer).
#
#   bench/peers/run.sh [start|all|stop|...]   # from the project root
#   SET=headline bench/peers/run.sh all       # the lines every peer runs alike
#
# SCRATCH (default bench/peers/.scratch) holds the copy, the servers and
# the results ($SCRATCH/summary.md). PEERBENCH names peerbench's folder.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PEERBENCH=${PEERBENCH:-$ROOT/../shared/peerbench}
export SCRATCH=${SCRATCH:-$ROOT/bench/peers/.scratch}
if [ ! -f "$PEERBENCH/run.sh" ]; then
  echo "peers: no peerbench at $PEERBENCH (set PEERBENCH)" >&2
  exit 1
fi
mkdir -p "$SCRATCH/pb"
cp "$PEERBENCH"/*.go "$PEERBENCH"/go.mod "$PEERBENCH"/go.sum "$PEERBENCH"/run.sh "$SCRATCH/pb/"
cp "$ROOT/bench/peers/weft.go.in" "$SCRATCH/pb/weft.go"
cd "$ROOT"
WEFT_DIR=$ROOT exec "$SCRATCH/pb/run.sh" "$@"
