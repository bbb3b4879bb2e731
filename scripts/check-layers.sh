#!/usr/bin/env bash
# crun's layers (README "Layout"): each folder includes project headers only from the layers
# below it, and every folder has a rule: a file in a folder without one fails the check, so a
# new folder is placed in the layers when it is made. (That the rendezvous core is plain C++, without protobuf or gRPC, is a target
# boundary instead: crun_rendezvous_core links neither, and rendezvous_core_tests links it
# alone; rendezvous/service/CMakeLists.txt.)
#   scripts/check-layers.sh   exits 1 naming each include that breaks a rule (ctest's `layers`)
set -euo pipefail
cd "$(dirname "$0")/.."

# folder -> the include prefixes it may use ("crun/v1" is the generated protocol, "crun/worker"
# the SDK's public headers, "crun/base" and "crun/rendezvous" their names for the two headers of
# crun's they need; "*" anything: the tests). The longest matching folder decides.
declare -A allowed=(
  [base]="base"
  [metrics]="base metrics http"
  [http]="base http"
  [proto]="proto crun/v1"
  [rendezvous/store]="base rendezvous/store"
  [rendezvous/store_server]="base metrics rendezvous/store rendezvous/store_server"
  [rendezvous/channel]="base rendezvous/channel"
  [rendezvous/report]="base proto crun/v1 rendezvous/report"  # crun/v1: report_proto only
  [rendezvous/beats]="base rendezvous/beats"
  [rendezvous/goodput]="base rendezvous/goodput"
  [rendezvous/contracts]="base rendezvous/contracts"
  [rendezvous/rules]="base rendezvous/contracts rendezvous/report rendezvous/rules"
  [rendezvous/service]="base metrics http proto crun/v1 rendezvous"
  [rendezvous/etcd]="base rendezvous/channel rendezvous/goodput rendezvous/rules rendezvous/service rendezvous/etcd etcd"
  [agent]="base metrics http proto crun/v1 rendezvous agent"
  [launcher]="base metrics http proto crun/v1 rendezvous agent launcher"
  [worker_sdk]="base rendezvous/store worker_sdk crun/worker crun/base crun/rendezvous"
  [train]="base crun/worker crun/base train"
  [docs/examples/worker_sdk]="crun/worker"
  [cmake]=""
  [tests]="*"
)

# agent/'s inner folders, lowest first: each may include the agent's layers above and the
# folders (and agent_options.h) before it, never one after it. local_agent.{h,cc} may use all.
agent_inner=(agent/supervise agent/health agent/output agent/warm agent/snapshots agent/hangs agent/rendezvous
             agent/frameworks agent/agent_options.h agent/workers agent/failures agent/observe
             agent/features)
below="base metrics http proto crun/v1 rendezvous"
for inner in "${agent_inner[@]}"; do
  below="$below $inner"
  allowed[$inner]="$below"
done

bad=0
while IFS= read -r file; do
  folder=""
  for f in "${!allowed[@]}"; do
    if [[ ("$file" == "$f/"* || "$file" == "$f") && ${#f} -gt ${#folder} ]]; then folder=$f; fi
  done
  if [[ -z "$folder" ]]; then
    echo "check-layers.sh: $file is in a folder without a rule: give it one in the table" >&2
    bad=1
    continue
  fi
  while IFS=: read -r line include; do
    ok=0
    [[ "${allowed[$folder]}" == "*" ]] && ok=1
    for prefix in ${allowed[$folder]}; do
      [[ "$include" == "$prefix/"* || "$include" == "$prefix" ]] && ok=1
    done
    # A folder's own headers, named relative to it (worker_sdk/include/crun/worker/...).
    [[ -f "$(dirname "$file")/$include" ]] && ok=1
    if ((!ok)); then
      echo "check-layers.sh: $file:$line includes \"$include\", outside $folder's layers (${allowed[$folder]})" >&2
      bad=1
    fi
  done < <(grep -n '^#include "' "$file" | sed 's/^\([0-9]*\):#include "\([^"]*\)".*/\1:\2/')
done < <(git ls-files '*.h' '*.cc' '*.cu')

((bad)) && exit 1
echo "check-layers.sh: every include within its layers"
