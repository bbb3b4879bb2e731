#!/usr/bin/env bash
# The main job, end to end: installs, builds, starts `crun store`, and runs two stock PyTorch
# (Debian 1.13) gloo workers that find each other through it, the way workers launched by crun
# will (MASTER_ADDR/MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE=True). Until the launcher lands
# (issue 3) this script starts the two workers itself.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
CRUN=build/launcher/crun
WORLD=2
OUT="$(mktemp -d)"
trap 'kill "$STORE_PID" 2>/dev/null || true; rm -rf "$OUT"' EXIT
"$CRUN" store --host 127.0.0.1 --port 0 >"$OUT/store.out" 2>"$OUT/store.err" &
STORE_PID=$!
for _ in $(seq 1 300); do
  grep -q "listening on" "$OUT/store.out" 2>/dev/null && break
  kill -0 "$STORE_PID" 2>/dev/null || { cat "$OUT/store.err"; exit 1; }
  sleep 0.01
done
PORT="$(sed -n 's/.*listening on .*:\([0-9]*\)$/\1/p' "$OUT/store.out")"
[ -n "$PORT" ] || { echo "demo: crun store did not report its port" >&2; exit 1; }
echo "demo: crun store on 127.0.0.1:$PORT"
PIDS=()
for RANK in $(seq 0 $((WORLD - 1))); do
  MASTER_ADDR=127.0.0.1 MASTER_PORT="$PORT" RANK="$RANK" LOCAL_RANK="$RANK" WORLD_SIZE="$WORLD" \
    TORCHELASTIC_USE_AGENT_STORE=True TORCHELASTIC_RESTART_COUNT=0 \
    timeout 300 /usr/bin/python3 tests/workers/allreduce_worker.py &
  PIDS+=($!)
done
STATUS=0
for PID in "${PIDS[@]}"; do wait "$PID" || STATUS=1; done
kill -TERM "$STORE_PID"
wait "$STORE_PID" || STATUS=1
cat "$OUT/store.err"
if [ "$STATUS" -ne 0 ]; then echo "demo: FAILED" >&2; exit 1; fi
echo "demo: OK"
