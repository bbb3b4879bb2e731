"""The worker environment under crun against stock torchrun's, key for key, for the same
configurations, with the PyTorch of the interpreter running this file (Debian's 1.13, PyPI's
2.x). Every variable torchrun sets must be set by crun with the same value, and crun must set
nothing torchrun does not, except the differences listed here; each of those must be
explained in docs/environment.md ("Differences from torchrun")."""
import json
import os
import subprocess
import sys
import unittest

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from crun_testing import scratch_dir  # noqa: E402

CRUN = os.environ["CRUN_BIN"]
HERE = os.path.dirname(os.path.abspath(__file__))
DUMP = os.path.join(HERE, "..", "workers", "env_dump.py")
DOC = os.path.join(HERE, "..", "..", "docs", "environment.md")
TORCH_1 = torch.__version__.startswith("1.")

# Same variable, other value, by design.
DIFFERENT_VALUES = {"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_ERROR_FILE",
                    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE"}
# Set by crun only (CRUN_HEARTBEAT_FD in a job that restarts: docs/health.md).
CRUN_ONLY = {"CRUN_ATTEMPT", "CRUN_ATTEMPT_LOG_DIR", "CRUN_HEARTBEAT_FD", "CRUN_SNAPSHOT_SOCKET"}
# Set by crun, or extended: PYTHONPATH begins with the crun_worker module's directory (compared
# without it).
SDK_DIR_SUFFIX = "/python-sdk"
if TORCH_1:
    # torchrun 1.13 sets neither of these; 1.13 reads only the old NCCL name.
    CRUN_ONLY |= {"TORCHELASTIC_SIGNALS_TO_HANDLE", "TORCH_NCCL_ASYNC_ERROR_HANDLING"}
# Set by torchrun only.
TORCHRUN_ONLY = {"NCCL_ASYNC_ERROR_HANDLING"} if TORCH_1 else set()
# Not the launcher's doing: the shell's last command.
IGNORED = {"_"}

CONFIGURATIONS = [
    ["--standalone", "--nproc-per-node", "2"],
    ["--nnodes", "1", "--nproc-per-node", "2", "--role", "trainer", "--max-restarts", "1"],
]


def without_sdk_dir(env, rank):
    """crun's worker environment with the crun_worker directory taken off PYTHONPATH (where it
    must be first), and PYTHONPATH dropped when nothing else was in it."""
    parts = env.get("PYTHONPATH", "").split(os.pathsep)
    if not parts[0].endswith(SDK_DIR_SUFFIX):
        raise AssertionError(f"rank {rank}: PYTHONPATH does not begin with crun's module: "
                             f"{env.get('PYTHONPATH')!r}")
    env = dict(env)
    if len(parts) == 1:
        del env["PYTHONPATH"]
    else:
        env["PYTHONPATH"] = os.pathsep.join(parts[1:])
    return env


def underscored(args):
    """1.13's torchrun knows only --nproc_per_node, --max_restarts."""
    return ["--" + a[2:].replace("-", "_") if a.startswith("--") else a for a in args]


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
        inherited = set(os.environ) | {"PYTHON_EXEC"}
        for config in CONFIGURATIONS:
            with self.subTest(config=" ".join(config)):
                # Its agent looks at the workers every 0.1 s rather than 1.13's 5 s (2.x's
                # default): an agent setting, not one that reaches the workers' environment.
                torchrun = [sys.executable, os.path.join(HERE, "torchrun_fixed.py"),
                            "--monitor-interval", "0.1"]
                theirs = run(underscored(torchrun + config) if TORCH_1 else torchrun + config,
                             scratch_dir(self, "crun-env-torchrun-"))
                ours = run([CRUN, *config], scratch_dir(self, "crun-env-crun-"))
                for rank in range(2):
                    t, c = theirs[rank], without_sdk_dir(ours[rank], rank)
                    missing = set(t) - set(c) - inherited - TORCHRUN_ONLY - IGNORED
                    self.assertEqual(missing, set(), f"rank {rank}: set by torchrun, not by crun")
                    extra = set(c) - set(t) - inherited - CRUN_ONLY - IGNORED
                    self.assertEqual(extra, set(), f"rank {rank}: set by crun only")
                    for key in (set(t) & set(c)) - DIFFERENT_VALUES - IGNORED:
                        self.assertEqual(c[key], t[key], f"rank {rank}: {key}")
                    self.assertEqual(c["TORCHELASTIC_USE_AGENT_STORE"], "True")
                    # The deprecated NCCL name would make PyTorch 2.x warn on every rank.
                    self.assertNotIn("NCCL_ASYNC_ERROR_HANDLING", c)

    def test_every_difference_is_explained_in_the_docs(self):
        with open(DOC) as f:
            doc = f.read()
        section = doc[doc.index("## Differences from torchrun"):]
        for key in DIFFERENT_VALUES | CRUN_ONLY | TORCHRUN_ONLY | {
                "TORCHELASTIC_SIGNALS_TO_HANDLE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                "NCCL_ASYNC_ERROR_HANDLING", "PYTHONPATH"}:
            self.assertIn(f"`{key}`", section, f"{key} is not explained in {DOC}")


if __name__ == "__main__":
    unittest.main(verbosity=2)
