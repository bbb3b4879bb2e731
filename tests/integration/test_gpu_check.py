"""scripts/gpu-check.sh rehearsed on a machine without a GPU: everything it does on a GPU
machine up to the first step that needs the GPU, so that a session lent one spends its device
time on the GPU and not on the script. In a copy of the source tree: `prepare` packs the
tarball from this build; `run` unpacks it, picks PyTorch's own NCCL, builds the SDK alone with
NCCL, runs its tests (the GPU case skipped) and starts DDP and the benchmark under the
tarball's crun, which refuse for want of a GPU; `train` builds train against PyTorch 2.x's
libtorch and NCCL and starts it under crun, which refuses for the same reason. The Python GPU
workers (tests/workers/cuda_worker.py, tests/bench/ddp_cifar.py --device cuda) stop before
importing torch on a host without a GPU: over a second of CPU each, sixteen of them in
`faults`.

Skipped (exit 77) where the rehearsal cannot run: a GPU is present (run the script itself), no
CUDA toolkit, or no PyTorch 2.x with its NCCL wheel (CRUN_TORCH2_PYTHON)."""
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

BUILD_DIR = os.environ["CRUN_BUILD_DIR"]
TORCH2 = os.environ.get("TORCH2_PYTHON", "")
ROOT = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
RUNTIME = {"linux-vdso.so.1", "libc.so.6", "libm.so.6", "libgcc_s.so.1",
           "/lib64/ld-linux-x86-64.so.2"}
# Not copied: this checkout's builds and packs (the copy gets its own, from BUILD_DIR).
TOP_LEVEL_SKIPPED = {".git", ".gpu", "build", "dist", ".whl"}
# Without a GPU, torch's CMake cannot detect an architecture to compile for: name one (H100's).
GPU_ARCH = "9.0"


def why_not():
    if glob.glob("/dev/nvidia[0-9]*"):
        return "this machine has a GPU: run scripts/gpu-check.sh itself"
    if not shutil.which("nvcc") and not os.path.exists("/usr/local/cuda/bin/nvcc"):
        return "no CUDA toolkit (nvcc)"
    if not TORCH2:
        return "no PyTorch 2.x environment (CRUN_TORCH2_PYTHON)"
    site = subprocess.run([TORCH2, "-c", "import site; print(site.getsitepackages()[0])"],
                          capture_output=True, text=True, timeout=60).stdout.strip()
    if not os.path.exists(os.path.join(site, "nvidia", "nccl", "include", "nccl.h")):
        return f"the PyTorch 2.x in {TORCH2} has no NCCL wheel (nvidia/nccl)"
    return None


def script(repo, *args, env=None, timeout=1200):
    """The script's exit status and output; it may fail (here it must, at the GPU)."""
    r = subprocess.run(["bash", os.path.join(repo, "scripts", "gpu-check.sh"), *args],
                       cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout)
    print(f"--- gpu-check.sh {' '.join(args)}: exit {r.returncode}\n{r.stdout[-6000:]}")
    return r


class GpuCheckRehearsal(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="crun-gpu-check-")
        cls.repo = os.path.join(cls.tmp, "repo")
        shutil.copytree(ROOT, cls.repo, symlinks=True, ignore=lambda d, names: [
            n for n in names
            if os.path.realpath(d) == ROOT and (n in TOP_LEVEL_SKIPPED or n.startswith("build-")
                                                or n.startswith(".venv"))])
        os.symlink(os.path.realpath(BUILD_DIR), os.path.join(cls.repo, "build"))
        cls.out = os.path.join(cls.tmp, "out")
        env = {k: v for k, v in os.environ.items() if k not in ("NCCL_ROOT", "LD_LIBRARY_PATH")}
        # No optimiser, no debug information: what is rehearsed is the script, its configure
        # and its build, not the code it compiles (crun's own build has compiled that).
        env.update(PYTHON=TORCH2, TORCH_CUDA_ARCH_LIST=GPU_ARCH, CRUN_GPU_BUILD_TYPE="None",
                   PATH=os.environ["PATH"] + ":/usr/local/cuda/bin")
        cls.prepared = script(cls.repo, "prepare", env=env, timeout=300)
        cls.ran = script(cls.repo, "run", cls.out, env=env)
        cls.trained = script(cls.repo, "train", cls.out, env=env)
        cls.faults_out = os.path.join(cls.tmp, "faults")
        cls.faulted = script(cls.repo, "faults", cls.faults_out, env=env)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_prepare_packs_the_tarball_and_what_the_builds_there_need(self):
        self.assertEqual(self.prepared.returncode, 0)
        gpu = os.path.join(self.repo, ".gpu")
        self.assertEqual(len(glob.glob(os.path.join(gpu, "crun-*-linux-x86_64.tar.gz"))), 1)
        for part in ["catch2/include/catch2", "catch2/lib/libCatch2WithMain.a",
                     "nlohmann/include/nlohmann/json.hpp",
                     "nlohmann/share/cmake/nlohmann_json",
                     "cli11/include/CLI/CLI.hpp", "cli11/share/cmake/CLI11"]:
            self.assertTrue(os.path.exists(os.path.join(gpu, part)), part)

    def test_run_goes_as_far_as_the_gpu(self):
        log = self.ran.stdout
        self.assertNotEqual(self.ran.returncode, 0, "the benchmark cannot pass without a GPU")
        # crun from the tarball, needing nothing but the C runtime.
        needs = log.split("it needs: ", 1)[1].splitlines()[0].split()
        self.assertTrue(needs and set(needs) <= RUNTIME, needs)
        # PyTorch's NCCL, header and library alike, for the SDK's build.
        self.assertRegex(log, r"NCCL from \S+/nvidia/nccl \(2\.\d+\.\d+\)")
        with open(os.path.join(self.out, "configure-run.log")) as f:
            self.assertRegex(f.read(), r"NCCL: \S+/nvidia/nccl/lib/libnccl\.so\.2 "
                                       r"\(headers in \S+/nvidia/nccl/include\)")
        # DDP under crun refused with the reason; the SDK's tests ran, the GPU case skipped.
        self.assertIn("--nproc-per-node gpu: no GPU found on this host", log)
        with open(os.path.join(self.out, "ctest.log")) as f:
            ctest = f.read()
        self.assertIn("100% tests passed", ctest)
        self.assertRegex(ctest, r"nccl_unit_tests:.*GPU \(Skipped\)")
        # The benchmark started under the tarball's crun and stopped at the missing GPU.
        self.assertIn("nccl_allreduce: unavailable", log)
        self.assertIn("no CUDA device visible", log)

    def test_train_builds_against_pytorch_2_and_stops_at_the_gpu(self):
        log = self.trained.stdout
        self.assertNotEqual(self.trained.returncode, 0, "train cannot run on cuda without a GPU")
        self.assertTrue(os.access(os.path.join(self.repo, "build-gpu", "train", "train"),
                                  os.X_OK), "train was not built")
        self.assertIn("--device cuda: no CUDA device visible to this libtorch", log)
        # train's CLI11 is the one carried in .gpu/, not this machine's.
        with open(os.path.join(self.repo, "build-gpu", "CMakeCache.txt")) as f:
            self.assertRegex(f.read(), r"CLI11_DIR:PATH=\S+/\.gpu/cli11/share/cmake/CLI11")

    def test_faults_reaches_every_step_with_a_verdict(self):
        """Without a GPU every step fails, but each must be reached and end in its verdict
        line: a step that the script skips or that stops it would cost a GPU session."""
        with open(os.path.join(self.faults_out, "faults.log")) as f:
            log = f.read()
        print(log[-3000:])
        for step in ["topology", "hang_spin:", "hang_spin exit", "hang_gloo:",
                     "hang_nccl:", "flight recorder dump", "oom:", "dev_gpu", "dev_index",
                     "dev_uuid", "dev_virtual", "dev_numa", "numa binding", "snapshot_python",
                     "build: done", "nccl_unit_tests", "snapshot_train:",
                     "row fp32 train", "row bf16 trainsync", "row bf16 ceilingloop",
                     "row fp16 ceiling", "all done"]:
            self.assertRegex(log, r"gpu-faults: (PASS|FAIL|INFO) " + step, step)
        self.assertIn("FAIL hang_spin exit", log)  # no GPU: the worker fails, it does not hang
        # The Python workers stopped before importing torch.
        with open(os.path.join(self.faults_out, "oom.log")) as f:
            self.assertIn("cuda_worker.py oom: no GPU on this host", f.read())
        with open(os.path.join(self.faults_out, "train.log")) as f:
            self.assertIn("ddp_cifar.py: --device cuda: no GPU on this host", f.read())
        self.assertIn("SKIPPED: no GPU here", open(os.path.join(self.faults_out,
                                                                "nccl_tests.log")).read())


if __name__ == "__main__":
    reason = why_not()
    if reason:
        print(f"skipped: {reason}")
        sys.exit(77)
    unittest.main(verbosity=2)
