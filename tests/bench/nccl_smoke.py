"""The NCCL benchmark's machinery under crun. With a GPU: nccl_bench.py on one small size
(PyTorch with CUDA as the anchor). Without one (CI): the timer run by crun fails the way a
user on a GPU-less node must see it: exit 1, and crun's report naming rank 0 and the SDK's
error ("no CUDA device visible"). Env: CRUN_BIN, NCCL_BENCH_BIN, TORCH_PYTHON."""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def have_gpu():
    smi = shutil.which("nvidia-smi")
    return smi is not None and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


def main():
    crun, bench = os.environ["CRUN_BIN"], os.environ["NCCL_BENCH_BIN"]
    tmp = tempfile.mkdtemp(prefix="crun-nccl-smoke-")
    if have_gpu():
        out = os.path.join(tmp, "bench.md")
        subprocess.run([sys.executable, os.path.join(HERE, "nccl_bench.py"), "--bench", bench,
                        "--crun", crun, "--torch-python", os.environ["TORCH_PYTHON"],
                        "--sizes", "4096", "--out", out], check=True, timeout=600)
        text = open(out).read()
        assert "| 1 | 4 KiB |" in text, text
        print("gpu: benchmark table written")
        return
    r = subprocess.run([crun, "--standalone", "--nproc-per-node", "1", bench,
                        os.path.join(tmp, "bench.json"), "4096"],
                       capture_output=True, text=True, timeout=120)
    print(r.stderr)
    assert r.returncode == 1, r.returncode
    assert "rank      : 0 (local rank 0" in r.stderr
    assert "nccl group 'default', rank 0 of 1: no CUDA device visible" in r.stderr
    assert not os.path.exists(os.path.join(tmp, "bench.json"))
    print("no gpu: the named error, through crun's failure report")


if __name__ == "__main__":
    main()
