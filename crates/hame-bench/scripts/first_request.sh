#!/usr/bin/env bash
# What the first request of the peer workload carries (system prompt + tool schemas), for
# hame and each peer: every driver runs one turn against the peer benchmark's fake server,
# which records the request bodies. Needs the peers' venvs (`cargo xtask bench-peers` or
# ../shared/bench/peers/setup.sh) and a built bench-peer. Prints one JSON line per harness.
# Usage: crates/hame-bench/scripts/first_request.sh [path/to/bench-peer]
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
PEERS="${PEERS_DIR:-$ROOT/../shared/bench/peers}"
V="${PEERS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/hame-bench-peers/venvs}"
BENCH_PEER="${1:-$ROOT/target/dist/bench-peer}"
OUT="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$OUT"' EXIT
for h in hame deepagents agentscope hermes; do
  PEERS_DIR="$PEERS" REC_DIR="$OUT/$h" python3 "$HERE/record_server.py" >"$OUT/srv-$h.log" 2>&1 &
  srv=$!
  for _ in $(seq 50); do grep -q LISTENING "$OUT/srv-$h.log" 2>/dev/null && break; sleep 0.1; done
  port="$(awk '/LISTENING/ {print $2}' "$OUT/srv-$h.log")"
  args=(--mode http --base-url "http://127.0.0.1:$port/v1" --sessions 1 --turns 1 --workdir "$OUT/w-$h")
  if [ "$h" = hame ]; then
    "$BENCH_PEER" "${args[@]}" >"$OUT/run-$h.log" 2>&1
  else
    (cd "$PEERS" && "$V/$h/bin/python" "peer_$h.py" "${args[@]}") >"$OUT/run-$h.log" 2>&1
  fi
  kill "$srv" 2>/dev/null || true
  wait "$srv" 2>/dev/null || true
  echo "$h $(python3 "$HERE/first_request_size.py" "$OUT/$h")"
done
