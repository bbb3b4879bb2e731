#!/usr/bin/env bash
# Issue 33's three reproductions of a restart that SIGKILLed its own new workers, each run
# RUNS times with --max-restarts 1; prints how many runs exited 0. Every run must: exit 0
# means the restarted group ran whole.
#   bash tests/repro/restart_repros.sh CRUN [RUNS] [CASE...]
# CASE: shell (one node, a shell worker with a child), ddp (stock PyTorch 1.13 DDP with
# DataLoader workers), service (two agents on one host, crun's rendezvous service), etcd (two
# agents on a real etcd on loopback). Default: all four. PYTHON: the interpreter for ddp
# (/usr/bin/python3, Debian's PyTorch 1.13).
set -uo pipefail
CRUN="$(realpath "$1")"
RUNS="${2:-100}"
shift $(($# < 2 ? $# : 2))
CASES=("$@")
[ ${#CASES[@]} -eq 0 ] && CASES=(shell ddp service etcd)
HERE="$(cd "$(dirname "$0")" && pwd)"
PYTHON="${PYTHON:-/usr/bin/python3}"
TMP="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$TMP"' EXIT

free_port() { "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Runs one crun command once, its output to $1; its exit status.
one_run() {
  local log="$1"; shift
  timeout -s KILL 120 "$@" >"$log" 2>&1
}

two_agents() {  # backend-specific arguments follow
  local log="$1"; shift
  timeout -s KILL 120 "$CRUN" --nnodes 2 --nproc-per-node 2 --max-restarts 1 "$@" \
    --rdzv-conf node_id=a,is_host=1 --no-python "$HERE/flaky_child.sh" >"$log.a" 2>&1 &
  local a=$!
  timeout -s KILL 120 "$CRUN" --nnodes 2 --nproc-per-node 2 --max-restarts 1 "$@" \
    --rdzv-conf node_id=b,is_host=0 --no-python "$HERE/flaky_child.sh" >"$log.b" 2>&1
  local rb=$?
  wait $a
  local ra=$?
  [ $ra -eq 0 ] && [ $rb -eq 0 ]
}

for c in "${CASES[@]}"; do
  ok=0
  etcd_pid=""
  if [ "$c" = etcd ]; then
    cp=$(free_port); pp=$(free_port)
    etcd --name e --data-dir "$TMP/etcd" --listen-client-urls "http://127.0.0.1:$cp" \
      --advertise-client-urls "http://127.0.0.1:$cp" --listen-peer-urls "http://127.0.0.1:$pp" \
      --initial-advertise-peer-urls "http://127.0.0.1:$pp" --initial-cluster "e=http://127.0.0.1:$pp" \
      --log-level warn >"$TMP/etcd.log" 2>&1 &
    etcd_pid=$!
    for _ in $(seq 1 100); do
      etcdctl --endpoints "127.0.0.1:$cp" endpoint health >/dev/null 2>&1 && break
      sleep 0.1
    done
  fi
  for i in $(seq 1 "$RUNS"); do
    log="$TMP/$c.$i.log"
    case "$c" in
      shell) one_run "$log" "$CRUN" --standalone --nproc-per-node 2 --max-restarts 1 \
               --no-python "$HERE/flaky_child.sh" ;;
      ddp) one_run "$log" "$CRUN" --standalone --nproc-per-node 2 --max-restarts 1 \
             --no-python "$PYTHON" "$HERE/ddp_dataloader_crash.py" ;;
      service) two_agents "$log" --rdzv-endpoint "127.0.0.1:$(free_port)" --rdzv-id "r$i" ;;
      etcd) two_agents "$log" --rdzv-backend etcd-v3 --rdzv-endpoint "127.0.0.1:$cp" \
              --rdzv-id "r$i" ;;
      *) echo "unknown case $c" >&2; exit 2 ;;
    esac
    if [ $? -eq 0 ]; then
      ok=$((ok + 1))
    else
      echo "$c run $i failed:" >&2
      tail -5 "$log"* >&2
    fi
  done
  [ -n "$etcd_pid" ] && kill "$etcd_pid" && wait "$etcd_pid" 2>/dev/null
  echo "$c: $ok of $RUNS runs exited 0"
done
