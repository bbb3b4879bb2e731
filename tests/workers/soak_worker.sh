#!/bin/sh
# A worker of the restart soak (tests/integration/test_restart_soak.py) as a shell script: it
# leaves processes behind the way real jobs do, and fails on a different rank each attempt.
#
# Environment: SOAK_OUT (the directory of events.log), SOAK_KIND, SOAK_TAG and SOAK_NODE (which
# processes are this test's and this node's), SOAK_LAST (the attempt in which every rank
# succeeds), and torchrun's RANK, WORLD_SIZE, LOCAL_RANK, TORCHELASTIC_RESTART_COUNT.
# Kinds:
#   shell        a background `sleep` and a subshell with its own `sleep`, all in its group
#   daemon       also a grandchild that leaves the group and session (setsid) and is orphaned
#   ignore-term  SIGTERM ignored by the worker and its children: only SIGKILL ends them
#   exit-at-stop every rank ends at the same moment as the failing one, racing the stop
# Lines appended to events.log (one write each, whole lines): "start A R PID" (once its
# children run),
# "overlap A R PID" (a process of an earlier attempt of this node still there when attempt A
# started), "fail A R", "done A R", "timeout A R".
set -u
A="$TORCHELASTIC_RESTART_COUNT"
R="$RANK"
EV="$SOAK_OUT/events.log"
say() { printf '%s\n' "$*" >>"$EV"; }

if [ "$LOCAL_RANK" = 0 ]; then
  # Every process of this test and node carries SOAK_TAG and SOAK_NODE, and the attempt it
  # belongs to in TORCHELASTIC_RESTART_COUNT. One grep reads every process's environment
  # (zombies have none) and prints those three as "/proc/PID/environ:NAME=VALUE", a process's
  # lines together; the shell's builtins judge them. (A few programs a process, forked each
  # attempt, were most of the soak's CPU.)
  grep -a -s -z -H -E "^(SOAK_TAG|SOAK_NODE|TORCHELASTIC_RESTART_COUNT)=" /proc/[0-9]*/environ |
    tr '\0' '\n' | {
    f="" tag="" node="" a=""
    judge() {
      if [ "$tag" = "$SOAK_TAG" ] && [ "$node" = "$SOAK_NODE" ] && [ -n "$a" ] &&
        [ "$a" -lt "$A" ]; then
        p=${f#/proc/}
        say "overlap $A $R ${p%/environ}"
      fi
    }
    while IFS= read -r line; do
      if [ "${line%%:*}" != "$f" ]; then
        judge
        f=${line%%:*} tag="" node="" a=""
      fi
      case "${line#*:}" in
        SOAK_TAG=*) tag=${line#*:SOAK_TAG=} ;;
        SOAK_NODE=*) node=${line#*:SOAK_NODE=} ;;
        TORCHELASTIC_RESTART_COUNT=*) a=${line#*:TORCHELASTIC_RESTART_COUNT=} ;;
      esac
    done
    judge
  }
fi

case "$SOAK_KIND" in
  ignore-term) trap '' TERM ;;
esac
sleep 600 &
(sleep 600; true) &
if [ "$SOAK_KIND" = daemon ]; then
  # Orphaned at once (its subshell exits), in a session of its own; it says so once it is.
  d="$SOAK_OUT/daemon.$SOAK_NODE.$A.$R"
  (setsid sh -c 'echo $$ >"$0.tmp" && mv "$0.tmp" "$0" && exec sleep 600' "$d" \
    </dev/null >/dev/null 2>&1 &)
  i=0
  until [ -e "$d" ]; do
    i=$((i + 1))
    if [ $i -gt 12000 ]; then say "timeout $A $R"; exit 3; fi
    sleep 0.005
  done
fi
# Its children are all there before it says it started: a stop from here on meets them.
say "start $A $R $$"

# Every rank of this attempt has started (bounded: 60 s).
i=0
while [ "$(grep -c "^start $A " "$EV")" -lt "$WORLD_SIZE" ]; do
  i=$((i + 1))
  if [ $i -gt 12000 ]; then say "timeout $A $R"; exit 3; fi
  sleep 0.005
done

if [ "$A" -ge "$SOAK_LAST" ]; then say "done $A $R"; exit 0; fi
if [ "$R" -eq $((A % WORLD_SIZE)) ]; then say "fail $A $R"; exit 7; fi
if [ "$SOAK_KIND" = exit-at-stop ]; then exit 0; fi
wait
