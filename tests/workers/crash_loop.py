"""A worker that fails the same way in every attempt (docs/health.md, crash loops).

    crash_loop.py OUT_DIR import|steps

Each attempt appends "<restart count> <rank>" to OUT_DIR/attempts (one whole line, O_APPEND).
import: prints a banner (output is no progress), then fails importing a module that does not
exist, every time. steps: sends a step heartbeat (crun_worker.heartbeat), then fails with a
RuntimeError: the same failure, but after progress."""
import os
import sys

out, mode = sys.argv[1], sys.argv[2]
line = f"{os.environ['TORCHELASTIC_RESTART_COUNT']} {os.environ['RANK']}\n".encode()
fd = os.open(os.path.join(out, "attempts"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, line)
os.close(fd)
print(f"rank {os.environ['RANK']}: starting", flush=True)
if mode == "import":
    import missing_module_of_crash_loop  # noqa: F401
import crun_worker  # noqa: E402

crun_worker.heartbeat()
raise RuntimeError("a step failed")
