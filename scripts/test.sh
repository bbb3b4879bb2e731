#!/usr/bin/env bash
# Installs everything, builds, and runs every test (unit, integration, PyTorch 1.13 and 2.x
# compatibility, the frameworks, Slurm, etcd, Kubernetes). Ends with ctest's summary line; fails
# when a test fails or none ran.
#   scripts/test.sh                        everything (what CI runs)
#   scripts/test.sh --quick                the unit tests and one smoke test per area, for the
#                                          edit loop (ctest label `quick`)
#   scripts/test.sh --sanitize address     ASan and UBSan in build-asan/: the unit tests and the
#                                          suites that drive the agent, the store server, the
#                                          rendezvous service and the snapshot server (label
#                                          `sanitize`)
#   scripts/test.sh --sanitize thread      TSan in build-tsan/: the unit tests of crun's own
#                                          threaded code (label `tsan`; tests/tsan.supp)
# Extra arguments after `--` go to ctest (-R, -E, --repeat ...).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=full
sanitize=""
ctest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) mode=quick ;;
    --sanitize)
      sanitize="${2:-}"
      case "$sanitize" in
        address | thread) ;;
        *)
          echo "test.sh: --sanitize takes 'address' or 'thread', not '$sanitize'" >&2
          exit 2
          ;;
      esac
      shift
      ;;
    --)
      shift
      ctest_args=("$@")
      break
      ;;
    *)
      echo "test.sh: unknown option '$1' (expected --quick, --sanitize address|thread, -- ARGS)" >&2
      exit 2
      ;;
  esac
  shift
done

t0=$(date +%s)
phase() { echo "test.sh: $1 ($(($(date +%s) - t0)) s since start)" >&2; }

# Every entry's temporary files (crun's default log folders crun_XXXXXX, Python's pymp-*, the
# suites' own) go to one folder of this run, removed with it on every path: thousands a run
# would otherwise stay in /tmp. Short, under /tmp: Unix socket paths there must stay within
# 108 bytes. What else must end with the run joins `cleanup` (run first to last, each whatever
# the others do; the script's exit status stays its own).
suite_tmp="$(mktemp -d /tmp/crun-suite.XXXXXX)"
cleanup=()
finish() {
  finish_rc=$?  # globals: `local` fails where a signal's trap exits inside a function
  set +e
  for finish_c in "${cleanup[@]}"; do eval "$finish_c"; done
  rm -rf "$suite_tmp"
  exit "$finish_rc"
}
trap finish EXIT

# write_resources FILE: ctest's resource spec for this machine (below, where the full run uses
# it): its cores, a quarter over, and three quarters of its available memory.
write_resources() {
  python3 - "$1" tests/budget.txt <<'PY'
import json, os, sys
rows = [line.split() for line in open(sys.argv[2]) if line.strip() and not line.startswith("#")]
with open("/proc/meminfo") as f:
    available = dict(line.split(":") for line in f)["MemAvailable"].split()[0]
# A row asking for more than this machine has still runs, alone: ctest refuses a test whose
# share no spec could ever give.
cpu = max([125 * os.cpu_count()] + [int(r[4]) for r in rows])
mem = max([int(available) // 1024 * 3 // 4] + [int(r[5]) for r in rows])
json.dump({"version": {"major": 1, "minor": 0},
           "local": [{"cpu": [{"id": "0", "slots": cpu}], "mem": [{"id": "0", "slots": mem}]}]},
          open(sys.argv[1], "w"))
print(f"test.sh: ctest's resources: {cpu} % of a core, {mem} MiB", file=sys.stderr)
PY
}

# ctest in the background and waited for, so that a signal that stops this script (CI's
# timeout, ^C) stops ctest and the tests too, before the folder they write to goes.
run_ctest() {
  TMPDIR="$suite_tmp" ctest "$@" &
  ctest_pid=$!
  trap 'kill -TERM "$ctest_pid" 2> /dev/null; wait "$ctest_pid"; exit 143' TERM INT HUP
  wait "$ctest_pid"
}

bash scripts/install-deps.sh
phase "Debian packages installed"

# The sanitizer builds need no PyPI venv: their suites run crun's own code and Debian's python.
if [ -n "$sanitize" ]; then
  if [ "$sanitize" = address ]; then
    dir=build-asan
    flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
    label=sanitize
    # Leaks: crun's processes exit through _exit in places on purpose (a forked child that
    # failed to exec); LeakSanitizer's report is not what this run judges.
    export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:strict_string_checks=1"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  else
    dir=build-tsan
    flags="-fsanitize=thread -fno-omit-frame-pointer"
    label=tsan
    export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp"
  fi
  # Without libtorch (train, the SDK's torch glue) and NCCL: not what these suites drive, and
  # half the build. Dynamic: the sanitizer's runtime must come first, before the C++ runtime.
  configure=(-DCRUN_BUILD_TESTS=ON -DCRUN_WITHOUT_TORCH2=ON -DCRUN_WITH_NCCL=OFF
    -DCRUN_WITH_TORCH=OFF -DCRUN_STATIC_DEPS=OFF -DCRUN_WERROR=OFF
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags"
    -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags")
  # The TSan suites are unit test binaries: only they are built (the programs that the tests
  # labelled `tsan` run, read from ctest once configured), not the rest of crun. Before its
  # first build ctest cannot resolve a program yet: a unit entry is named after its binary
  # (crun_unit_test), and a name that is no target stops the build, naming it.
  targets=""
  if [ "$sanitize" = thread ]; then
    cmake -S . -B "$dir" -G Ninja "${configure[@]}" > /dev/null
    targets="$(ctest --test-dir "$dir" -N -L "^$label\$" --show-only=json-v1 | python3 -c '
import json, os, sys
dir = os.path.realpath(sys.argv[1])
for t in json.load(sys.stdin)["tests"]:
    if "command" not in t:
        print(t["name"])
        continue
    exe = os.path.realpath(t["command"][0])
    if exe.startswith(dir + os.sep):
        print(os.path.basename(exe))' "$dir" | sort -u | tr '\n' ' ')"
    if [ -z "$targets" ]; then
      echo "test.sh: no test is labelled '$label' in $dir" >&2
      exit 1
    fi
  fi
  CRUN_BUILD_TARGETS="$targets" CRUN_BUILD_DIR=$dir bash scripts/build.sh "${configure[@]}"
  phase "built with -fsanitize=$sanitize"
  phase "ctest starts"
  # The machine shared out as in the full run (an instrumented entry uses more than its row,
  # which its scaled TIMEOUT allows for): four suites of instrumented starts at once took one
  # past eight times its TIMEOUT.
  write_resources "$suite_tmp/resources.json"
  run_ctest --test-dir "$dir" --output-on-failure --no-tests=error -L "^$label\$" -j4 \
    --resource-spec-file "$suite_tmp/resources.json" "${ctest_args[@]}"
  exit
fi

# The PyPI venvs (~/.cache/crun) are made while crun builds: they download and unpack, the
# build compiles. Their paths are known before they exist, so the build is configured at once.
TORCH2_PYTHON="$(bash scripts/setup-torch2.sh --path)"
declare -A FRAMEWORK
while IFS== read -r name py; do FRAMEWORK[$name]=$py; done <<< "$(bash scripts/setup-frameworks.sh --paths)"
venv_log="$(mktemp -t crun-venvs.XXXXXX)"
setsid bash -c 'bash scripts/setup-torch2.sh > /dev/null && bash scripts/setup-frameworks.sh > /dev/null' \
  > "$venv_log" 2>&1 &
venvs=$!
# The venvs' job (its own process group: pip and its compilers) ends with this script, on
# every path.
printf -v rm_log 'rm -f %q' "$venv_log"
cleanup+=("[ -z \"\${venvs:-}\" ] || kill -- -\"\$venvs\" 2> /dev/null" "$rm_log")

# -g1: function names and line tables, what the suites' stacks (crun stacks, the hang reports,
# the sanitizers' traces) name; not the locals' and types' records of -g, a quarter of the
# build's time (docs/reliability.md). A developer's own build (scripts/build.sh) keeps -g.
bash scripts/build.sh -DCRUN_BUILD_TESTS=ON -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCRUN_TORCH2_PYTHON="$TORCH2_PYTHON" \
  -DCRUN_TF_PYTHON="${FRAMEWORK[tf]}" -DCRUN_JAX_PYTHON="${FRAMEWORK[jax]}" \
  -DCRUN_DEEPSPEED_PYTHON="${FRAMEWORK[deepspeed]}" -DCRUN_HOROVOD_PYTHON="${FRAMEWORK[horovod]}"
phase "crun built"
if ! wait "$venvs"; then
  cat "$venv_log" >&2
  echo "test.sh: making the PyPI venvs failed (above)" >&2
  exit 1
fi
cat "$venv_log" >&2
venvs=""  # ended: its group id may belong to another process by the end
phase "PyPI venvs ready"

# ctest runs tests beside each other as far as the machine holds them: its cores and memory
# are ctest's resources (a resource spec file), and each test takes its share of them, as a
# run of it alone measured (tests/budget.txt: cpu, percent of a core; mem, MiB). The cores are
# offered a quarter over (most suites wait on processes, sockets and timeouts between their
# bursts, and an average is no peak); beyond that a test would wait for the CPU rather than
# run, and take more than its TIMEOUT allows. RESOURCE_LOCKs keep the timing-sensitive ones
# apart. At most $jobs at once (CRUN_TEST_JOBS; 1: each test alone, how `measured` is taken).
jobs="${CRUN_TEST_JOBS:-8}"
resources="$suite_tmp/resources.json"
write_resources "$resources"
label=(-LE '^quick-only$')  # the smoke tests: each also runs in its area's suite
if [ "$mode" = quick ]; then label=(-L '^quick$'); fi
phase "ctest starts"
run_ctest --test-dir build --output-on-failure --no-tests=error -j "$jobs" "${label[@]}" \
  --resource-spec-file "$resources" "${ctest_args[@]}"
