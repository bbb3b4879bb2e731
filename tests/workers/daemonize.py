"""A worker that leaves a daemon behind, as some libraries do: it double-forks a grandchild
into a new session (out of the worker's process group), which writes its pid to
OUT/daemon_<RANK>.pid and sleeps, holding the worker's stdout and stderr; the worker then
exits 0 at once, or with --stay sleeps too (until killed). Stdlib only."""
import os
import sys
import time

out = sys.argv[1]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open(os.path.join(out, f"daemon_{os.environ['RANK']}.pid.tmp"), "w") as f:
            f.write(str(os.getpid()))
        os.rename(os.path.join(out, f"daemon_{os.environ['RANK']}.pid.tmp"),
                  os.path.join(out, f"daemon_{os.environ['RANK']}.pid"))
        time.sleep(600)
    os._exit(0)
os.wait()
# The daemon has written its pid before the worker exits: the test can look for it.
while not os.path.exists(os.path.join(out, f"daemon_{os.environ['RANK']}.pid")):
    time.sleep(0.01)
if "--stay" in sys.argv:
    time.sleep(600)
