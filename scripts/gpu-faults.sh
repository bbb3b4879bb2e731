# shellcheck shell=bash
# `scripts/gpu-check.sh faults OUT`: sourced by gpu-check.sh once crun is unpacked and build-gpu
# configured (with train). One pass over everything issue 51 asks of a GPU, each step bounded
# by a timeout and ending in a verdict line in OUT/faults.log (PASS, FAIL or INFO), so that a
# step that fails or hangs costs its own time only and the rest still runs.

# The GPU holds no process and no memory of one: polled (a dead context is reclaimed by the
# driver shortly after its process ends), at most 15 s.
_gpu_idle() {
  local apps used i
  # Without nvidia-smi (the rehearsal on a machine without a GPU) there is nothing to poll:
  # the same verdict, not idle, at once rather than after 15 s.
  if ! command -v nvidia-smi > /dev/null; then
    echo "compute apps: [unknown: no nvidia-smi], memory.used unknown"
    return 1
  fi
  for ((i = 0; i < 30; i++)); do
    apps=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>&1)
    used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>&1 | head -1)
    [[ -z "$apps" ]] && break
    sleep 0.5
  done
  echo "compute apps: [${apps}], memory.used ${used} MiB"
  [[ -z "$apps" ]]
}

_verdict() {  # _verdict PASS|FAIL|INFO NAME DETAIL
  echo "gpu-faults: $1 $2: $3" | tee -a "$FAULTS_LOG"
}

# _expect NAME LOG CONDITION...: PASS when every grep -E pattern is in LOG.
_expect() {
  local name=$1 log=$2 missing=()
  shift 2
  for pattern in "$@"; do grep -Eq -- "$pattern" "$log" || missing+=("$pattern"); done
  if ((${#missing[@]} == 0)); then
    _verdict PASS "$name" "found ${#@} expected line(s) in $(basename "$log")"
  else
    _verdict FAIL "$name" "not in $(basename "$log"): ${missing[*]}"
  fi
}

# A hang under crun (--hang-timeout 8, no restarts): exit 143, the report names the rank, and
# the GPU is left empty.
_hang() {
  local name=$1 rank=$2 where=$3
  shift 3
  local log="$OUT/$name.log"
  timeout 150 "$@" > "$log" 2>&1
  local rc=$?
  _expect "$name" "$log" "crun: .* hung" "^  rank $rank on .*no progress for" "$where"
  [[ $rc == 143 ]] && _verdict PASS "$name exit" "143" || _verdict FAIL "$name exit" "$rc (want 143)"
  local idle
  idle=$(_gpu_idle) && _verdict PASS "$name GPU left empty" "$idle" ||
    _verdict FAIL "$name GPU left empty" "$idle"
}

# A probe of device selection: the worker's GPU, LOCAL_RANK, CPUs and memory policy.
_probe() {
  local name=$1
  shift
  mkdir -p "$OUT/$name"
  timeout 120 "$@" tests/workers/cuda_worker.py probe "$OUT/$name" > "$OUT/$name.log" 2>&1
  local rc=$?
  if [[ $rc == 0 ]] && ls "$OUT/$name"/probe_*.json > /dev/null 2>&1; then
    _verdict PASS "$name" "$(cat "$OUT/$name"/probe_*.json | tr '\n' ' ')"
  else
    _verdict FAIL "$name" "exit $rc: $(tail -3 "$OUT/$name.log" | tr '\n' ' ')"
  fi
}

# The health gate's `gpu` check against a real driver (tests/integration/test_health.py has
# only a stand-in nvidia-smi): what the driver answers to crun's three queries; a DDP job over
# NCCL whose worker is SIGKILLed and whose restart passes the gate (the dead worker's memory
# released first); and a node whose GPU another process holds, refused before any worker runs.
# Callable on its own (`gpu-check.sh health OUT`: nothing to build) and part of `faults`.
gpu_health() {
  local crun=$1 py=$3
  OUT=$2
  FAULTS_LOG=${FAULTS_LOG:-"$OUT/faults.log"}
  set +e +o pipefail
  local q
  for q in "--query-gpu=index,uuid,ecc.errors.uncorrected.volatile.total,retired_pages.pending" \
    "--query-gpu=index,uuid,remapped_rows.pending,remapped_rows.failure" \
    "--query-compute-apps=pid,gpu_uuid,used_memory"; do
    _verdict INFO "nvidia-smi ${q%%=*}" "${q#*=}: [$(nvidia-smi "$q" --format=csv,noheader,nounits 2>&1 |
      tr '\n' ';')]"
  done

  local dir log="$OUT/health_ddp.log"
  dir=$(mktemp -d)
  timeout 180 "$crun" --standalone --nproc-per-node gpu --health-check gpu --max-restarts 1 \
    tests/workers/ddp_train.py "$dir" --nccl --die-once > "$log" 2>&1
  local rc=$?
  rm -rf "$dir"
  [[ $rc == 0 ]] && _verdict PASS "health_ddp exit" "0 (a worker SIGKILLed, the restart passed the gate)" ||
    _verdict FAIL "health_ddp exit" "$rc: $(tail -5 "$log" | tr '\n' ' ')"
  _expect health_ddp "$log" "SIGKILL to myself" "restart"
  _verdict INFO "health_ddp memory wait" "$(grep -m1 "waiting up to" "$log" || echo "none: memory was free at the rejoin")"

  # Another process holds memory on the GPU: the node is refused at its first join.
  log="$OUT/health_held.log"
  "$py" -c 'import time, torch; x = torch.empty(256 << 20, device="cuda"); print("holding", flush=True); time.sleep(120)' \
    > "$OUT/health_holder.log" 2>&1 &
  local holder=$! i
  for ((i = 0; i < 120; i++)); do
    [[ -n $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null) ]] && break
    kill -0 "$holder" 2>/dev/null || break
    sleep 0.25
  done
  timeout 120 "$crun" --standalone --nproc-per-node 1 --health-check gpu --health-check-timeout 10 \
    --no-python /bin/echo "worker ran" > "$log" 2>&1
  rc=$?
  kill "$holder" 2>/dev/null
  wait "$holder" 2>/dev/null
  [[ $rc != 0 ]] && ! grep -q "worker ran" "$log" &&
    _verdict PASS "health_held" "exit $rc, no worker ran: $(grep -m1 "health check" "$log")" ||
    _verdict FAIL "health_held" "exit $rc: $(tail -5 "$log" | tr '\n' ' ')"
  _expect health_held_names "$log" "failed its health check" "process $holder"
  local idle
  idle=$(_gpu_idle) && _verdict PASS "health GPU left empty" "$idle" ||
    _verdict FAIL "health GPU left empty" "$idle"
}

gpu_faults() {
  local crun=$1 py=$3
  OUT=$2
  FAULTS_LOG="$OUT/faults.log"
  : > "$FAULTS_LOG"
  set +e +o pipefail
  export PYTHONUNBUFFERED=1
  local started=$SECONDS
  local w=tests/workers/cuda_worker.py
  local c=("$crun" --standalone)

  # train and the SDK's tests build while the faults run (they need no build).
  (cmake --build build-gpu -j "$(nproc)" --target train nccl_unit_tests > "$OUT/build.log" 2>&1
    echo $? > "$OUT/build.rc") &
  local build=$!

  nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
  local bus uuid node cpus
  bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | head -1)
  uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)
  bus=$(echo "${bus: -12}" | tr 'A-F' 'a-f')
  node=$(cat "/sys/bus/pci/devices/$bus/numa_node" 2>/dev/null || echo "?")
  [[ $node == -1 ]] && node=0  # no affinity known: the only node, as crun reads it
  cpus=$(cat "/sys/devices/system/node/node$node/cpulist" 2>/dev/null || echo "?")
  _verdict INFO topology "GPU $uuid at $bus, NUMA node $node (CPUs $cpus); $(nproc) CPUs; $(
    ls -d /sys/devices/system/node/node* 2>/dev/null | wc -l) node(s); py-spy: $(
    command -v py-spy || echo none); nsys: $(command -v nsys || echo none)"

  # 1. Hangs.
  _hang hang_spin 0 "synchronize|spin" "${c[@]}" --log-dir "$OUT/logs/spin" --hang-timeout 8 \
    --nproc-per-node 1 "$w" spin
  _hang hang_gloo 1 "sleep|gloo_block" "${c[@]}" --log-dir "$OUT/logs/gloo" --hang-timeout 8 \
    --nproc-per-node 2 "$w" gloo-block
  mkdir -p "$OUT/fr"
  _hang hang_nccl 0 "NCCL flight recorder: every trace written" env TORCH_NCCL_TRACE_BUFFER_SIZE=2000 \
    TORCH_NCCL_DEBUG_INFO_PIPE_FILE="$OUT/fr/pipe_" TORCH_NCCL_DEBUG_INFO_TEMP_FILE="$OUT/fr/trace_" \
    "${c[@]}" --log-dir "$OUT/logs/nccl" --hang-timeout 8 --nproc-per-node 1 "$w" nccl-stuck
  if [[ -s "$OUT/fr/trace_0" ]]; then
    local fr
    fr=$("$py" - "$OUT/fr/trace_0" <<'PY' 2>&1
import pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
entries = d.get("entries", [])
last = ["%s %s" % (e.get("profiling_name"), e.get("state")) for e in entries[-3:]]
print("%d entries, version %s; last: %s" % (len(entries), d.get("version"), "; ".join(last)))
PY
    )
    [[ $fr == *"entries"* ]] && _verdict PASS "flight recorder dump" "$fr" ||
      _verdict FAIL "flight recorder dump" "$fr"
  else
    _verdict FAIL "flight recorder dump" "no $OUT/fr/trace_0: $(ls "$OUT/fr" | tr '\n' ' ')"
  fi

  # 2. CUDA out of memory.
  timeout 120 "${c[@]}" --nproc-per-node 1 "$w" oom > "$OUT/oom.log" 2>&1
  local rc=$?
  _expect oom "$OUT/oom.log" "^  rank      : 0 " "cause     : CUDA out of memory on its GPU"
  [[ $rc == 1 ]] && _verdict PASS "oom exit" 1 || _verdict FAIL "oom exit" "$rc (want 1)"

  # 3. Device selection and NUMA binding.
  _probe dev_gpu "${c[@]}" --nproc-per-node gpu
  _probe dev_index env CUDA_VISIBLE_DEVICES=0 "${c[@]}" --nproc-per-node 1
  _probe dev_uuid env CUDA_VISIBLE_DEVICES="$uuid" "${c[@]}" --nproc-per-node 1
  _probe dev_virtual "${c[@]}" --nproc-per-node gpu --virtual-local-rank
  _probe dev_numa "${c[@]}" --nproc-per-node gpu --numa-binding node
  if grep -q "\"cpus\": \"$cpus\"" "$OUT"/dev_numa/probe_0.json 2>/dev/null &&
    grep -q "\"policy\": \"bind\", \"policy_nodes\": \[$node\]" "$OUT"/dev_numa/probe_0.json; then
    _verdict PASS "numa binding" "CPUs $cpus and memory bound to node $node"
  else
    _verdict FAIL "numa binding" "want CPUs $cpus, memory bound to node $node"
  fi

  # 4. A CUDA model's state through crun's node memory (the Python module).
  mkdir -p "$OUT/snap"
  PYTHONPATH="$PWD/worker_sdk/python" timeout 180 "${c[@]}" --nproc-per-node 1 --max-restarts 1 \
    "$w" snapshot "$OUT/snap" 10 > "$OUT/snapshot.log" 2>&1
  _expect snapshot_python "$OUT/snapshot.log" "loaded step 5 from crun's node memory into \{'cuda'\}.*identical" \
    "attempt 1: trained to step 10"
  _verdict INFO "faults done" "$((SECONDS - started)) s"

  wait "$build"
  if [[ "$(cat "$OUT/build.rc" 2>/dev/null)" != 0 ]]; then
    _verdict FAIL build "$(tail -20 "$OUT/build.log")"
    return 0
  fi
  _verdict INFO build "done at $((SECONDS - started)) s"
  timeout 180 build-gpu/tests/nccl_unit_tests "[gpu]" > "$OUT/nccl_tests.log" 2>&1 &&
    _verdict PASS nccl_unit_tests "$(tail -2 "$OUT/nccl_tests.log" | tr '\n' ' ')" ||
    _verdict FAIL nccl_unit_tests "$(tail -30 "$OUT/nccl_tests.log")"

  # 5. train: its snapshot of CUDA state, the worker SIGKILLed in its second epoch.
  local data=/tmp/crun-gpu-cifar small=/tmp/crun-gpu-cifar-small
  timeout 300 "${c[@]}" --nproc-per-node 1 --max-restarts 1 build-gpu/train/train --model resnet18 \
    --synthetic 20000 --data-dir $small --epochs 2 --batch-size 256 --device cuda \
    --snapshot-every 10 --log-every 10 --metrics-json "$OUT/train_resumed.json" \
    > "$OUT/train_snapshot.log" 2>&1 &
  local job=$! i
  for ((i = 0; i < 600; i++)); do
    grep -q "epoch 2/2 step" "$OUT/train_snapshot.log" && break
    kill -0 "$job" 2>/dev/null || break
    sleep 0.2
  done
  pkill -KILL -f '^[^ ]*build-gpu/train/train'
  wait "$job"
  _expect snapshot_train "$OUT/train_snapshot.log" "resuming at epoch 2 after batch"
  grep -q '"parameters_identical":true' "$OUT/train_resumed.json" 2>/dev/null &&
    _verdict PASS "snapshot_train metrics" "$(cat "$OUT/train_resumed.json" | head -c 300)" ||
    _verdict FAIL "snapshot_train metrics" "no train_resumed.json with identical parameters"

  # 6. train against the model's ceiling and PyTorch, each autocast mode; in bf16 also train
  # with host-synchronised averaging and the ceiling with per-parameter SGD, for attribution.
  local tr=(build-gpu/train/train --model resnet18 --data-dir $data --epochs 2 --batch-size 256
    --device cuda --log-every 50)
  for m in "fp32:--amp off" "bf16:--amp bf16 --channels-last" "fp16:--amp fp16 --channels-last"; do
    local name=${m%%:*} opts=${m#*:} sides="train torch ceiling"
    # shellcheck disable=SC2086
    {
      timeout 240 "${c[@]}" --nproc-per-node 1 "${tr[@]}" --synthetic 50000 $opts \
        --metrics-json "$OUT/train_$name.json"
      timeout 240 "${c[@]}" --nproc-per-node 1 tests/bench/ddp_cifar.py $data 2 256 \
        "$OUT/torch_$name.json" --model resnet18 --device cuda $opts
      timeout 240 "${c[@]}" --nproc-per-node 1 tests/bench/ddp_cifar.py $data 2 256 \
        "$OUT/ceiling_$name.json" --model resnet18 --device cuda $opts --ceiling
      if [[ $name == bf16 ]]; then
        sides="$sides trainsync ceilingloop"
        CRUN_NCCL_STREAM_ORDER=0 timeout 240 "${c[@]}" --nproc-per-node 1 "${tr[@]}" $opts \
          --metrics-json "$OUT/trainsync_$name.json"
        timeout 240 "${c[@]}" --nproc-per-node 1 tests/bench/ddp_cifar.py $data 2 256 \
          "$OUT/ceilingloop_$name.json" --model resnet18 --device cuda $opts --ceiling --sgd loop
      fi
    } >> "$OUT/train.log" 2>&1
    for s in $sides; do
      _verdict INFO "row $name $s" "$("$py" - "$OUT/${s}_$name.json" <<'PY' 2>&1
import json, sys
m = json.load(open(sys.argv[1]))
print("%.0f img/s in %.2f s; data wait %s; host %s" % (m["images_per_second_per_worker"],
      m["train_seconds"], m.get("data_wait_seconds"), m.get("host_seconds")))
PY
      )"
    done
  done
  cp docs/benchmarks.md "$OUT/benchmarks.md"
  "$py" tests/bench/train_gpu_table.py --dir "$OUT" --out "$OUT/benchmarks.md" --device \
    "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)" \
    >> "$FAULTS_LOG" 2>&1

  # 7. Where train's time goes: nsys's summary of one bf16 epoch, where nsys is installed.
  if command -v nsys > /dev/null; then
    # shellcheck disable=SC2086
    timeout 180 nsys profile --force-overwrite true -o "$OUT/train_bf16" -t cuda,osrt \
      --stats=true "${c[@]}" --nproc-per-node 1 "${tr[@]}" --amp bf16 --channels-last \
      --epochs 1 --max-steps 120 > "$OUT/nsys.log" 2>&1
    _verdict INFO nsys "exit $?; summary in nsys.log"
    rm -f "$OUT"/*.nsys-rep "$OUT"/*.sqlite
  fi
  gpu_health "$crun" "$OUT" "$py"
  _verdict INFO "all done" "$((SECONDS - started)) s"
}
