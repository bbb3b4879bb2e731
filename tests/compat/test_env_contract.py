"""The worker environment under crun against stock torchrun's, same configuration
(--standalone --nproc-per-node 2), with the PyTorch of the interpreter running this file.
Every variable torchrun sets must be set by crun with the same value, except those listed
here with their reason (docs/environment.md)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

CRUN = os.environ["CRUN_BIN"]
HERE = os.path.dirname(os.path.abspath(__file__))
DUMP = os.path.join(HERE, "..", "workers", "env_dump.py")

# Values that differ by design.
DIFFERENT_VALUES = {
    "MASTER_ADDR": "crun's store binds 127.0.0.1; torchrun advertises the host name",
    "MASTER_PORT": "each launcher's own store on a free port",
    "TORCHELASTIC_ERROR_FILE": "each launcher's own log directory",
    "TORCHELASTIC_RUN_ID": "random per standalone run",
    "TORCHELASTIC_USE_AGENT_STORE": "workers are always clients of crun's store (1.13 c10d: False)",
    "_": "the shell's last command",
}
# Variables only crun sets.
CRUN_ONLY = {"CRUN_ATTEMPT", "CRUN_ATTEMPT_LOG_DIR", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
             "NCCL_ASYNC_ERROR_HANDLING",  # both names: 1.13 reads one, 2.x the other
             "TORCHELASTIC_SIGNALS_TO_HANDLE"}  # torchrun 1.13 does not export it


def run(cmd, out):
    env = dict(os.environ, PYTHON_EXEC=sys.executable)
    env.pop("OMP_NUM_THREADS", None)
    r = subprocess.run(cmd + [DUMP, out], capture_output=True, text=True, timeout=300, env=env)
    if r.returncode != 0:
        raise AssertionError(f"{cmd[0]} failed: {r.stdout}{r.stderr}")
    result = {}
    for rank in range(2):
        with open(os.path.join(out, f"env_{rank}.json")) as f:
            result[rank] = json.load(f)
    return result


class EnvContract(unittest.TestCase):
    def test_same_variables_and_values_as_torchrun(self):
        theirs = run([sys.executable, os.path.join(HERE, "torchrun_fixed.py"), "--standalone",
                      "--nproc_per_node", "2"], tempfile.mkdtemp())
        ours = run([CRUN, "--standalone", "--nproc-per-node", "2"], tempfile.mkdtemp())
        inherited = set(os.environ) | {"PYTHON_EXEC"}
        for rank in range(2):
            t, c = theirs[rank], ours[rank]
            missing = set(t) - set(c) - inherited
            self.assertEqual(missing, set(), f"rank {rank}: set by torchrun, not by crun")
            extra = set(c) - set(t) - inherited - CRUN_ONLY
            self.assertEqual(extra, set(), f"rank {rank}: set by crun only")
            for key in (set(t) & set(c)) - set(DIFFERENT_VALUES):
                self.assertEqual(c[key], t[key], f"rank {rank}: {key}")
            self.assertEqual(c["TORCHELASTIC_USE_AGENT_STORE"], "True")


if __name__ == "__main__":
    unittest.main(verbosity=2)
