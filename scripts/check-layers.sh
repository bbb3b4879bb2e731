#!/usr/bin/env bash
# crun's layers (README "Layout"): each folder includes project headers only from the layers
# below it, and the rendezvous engine (rules, engine, messages) is plain C++: it compiles without
# protobuf or gRPC, whose types only the gRPC adapter and the agent's client see.
#   scripts/check-layers.sh [c++ compiler]   exits 1 naming each include that breaks a rule
#                                           (ctest's `layers`)
set -euo pipefail
cd "$(dirname "$0")/.."
cxx=${1:-c++}

# folder -> the include prefixes it may use ("crun/v1" is the generated protocol, "crun/worker"
# the SDK's public headers). The longest matching folder decides.
declare -A allowed=(
  [base]="base"
  [metrics]="base metrics"
  [proto]="proto crun/v1"
  [rendezvous/store]="base rendezvous/store"
  [rendezvous/server]="base metrics rendezvous/store rendezvous/server"
  [rendezvous/service]="base metrics proto crun/v1 rendezvous"
  [rendezvous/etcd]="base proto crun/v1 rendezvous etcd"
  [agent]="base metrics proto crun/v1 rendezvous agent"
  [launcher]="base metrics proto crun/v1 rendezvous agent launcher"
  [worker_sdk]="base rendezvous/store worker_sdk crun/worker"
  [train]="base crun/worker train"
)

bad=0
while IFS= read -r file; do
  folder=""
  for f in "${!allowed[@]}"; do
    if [[ "$file" == "$f/"* && ${#f} -gt ${#folder} ]]; then folder=$f; fi
  done
  [[ -n "$folder" ]] || continue
  while IFS=: read -r line include; do
    ok=0
    for prefix in ${allowed[$folder]}; do
      [[ "$include" == "$prefix/"* ]] && ok=1
    done
    # A folder's own headers, named relative to it (worker_sdk/include/crun/worker/...).
    [[ -f "$(dirname "$file")/$include" ]] && ok=1
    if ((!ok)); then
      echo "check-layers.sh: $file:$line includes \"$include\", outside $folder's layers (${allowed[$folder]})" >&2
      bad=1
    fi
  done < <(grep -n '^#include "' "$file" | sed 's/^\([0-9]*\):#include "\([^"]*\)".*/\1:\2/')
done < <(git ls-files '*.h' '*.cc' '*.cu')

# The engine without protobuf or gRPC: no generated include path is given, and no header the
# compiler opens (transitively) may be protobuf's or gRPC's.
for src in rendezvous/service/engine.cc rendezvous/service/rules.cc; do
  if ! deps=$("$cxx" -std=c++20 -I. -M "$src" 2>&1); then
    echo "check-layers.sh: $src does not compile without the generated protocol headers:" >&2
    echo "$deps" | head -5 >&2
    bad=1
  elif grep -qE 'google/protobuf|grpc' <<<"$deps"; then
    echo "check-layers.sh: $src includes protobuf or gRPC:" >&2
    grep -oE '[^ ]*(google/protobuf|grpc)[^ ]*' <<<"$deps" | head -5 >&2
    bad=1
  fi
done
((bad)) && exit 1
echo "check-layers.sh: every include within its layers; the rendezvous engine is free of protobuf and gRPC"
