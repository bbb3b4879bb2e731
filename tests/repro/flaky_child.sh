#!/bin/sh
# Issue 33's first reproduction: local rank 0 runs a child (`sleep`) while local rank 1 exits 7
# in the first attempt. The restarted group must run whole: rank 0 sleeps a second, both exit 0.
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  if [ "$LOCAL_RANK" = 1 ]; then exit 7; fi
  sleep 5
fi
if [ "$LOCAL_RANK" = 0 ]; then sleep 1; fi
exit 0
