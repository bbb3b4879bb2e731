"""GPU workers for scripts/gpu-check.sh's `faults` step (a GPU machine; stock PyTorch 2.x):

    cuda_worker.py spin                 a rank stuck in a CUDA kernel that never finishes
    cuda_worker.py gloo-block           world 2 over Gloo with CUDA tensors: rank 1 blocks
                                        before its collective, rank 0 waits inside it
    cuda_worker.py nccl-stuck           one NCCL rank whose allreduce waits behind a spinning
                                        kernel (the flight recorder holds it as not completed)
    cuda_worker.py oom                  allocates past the device: CUDA out of memory
    cuda_worker.py probe OUT            writes OUT/probe_<RANK>.json: its GPU (index, UUID),
                                        CUDA_VISIBLE_DEVICES, LOCAL_RANK, CPU affinity and
                                        memory policy
    cuda_worker.py snapshot OUT STEPS   a CUDA model saved into crun's node memory each step;
                                        attempt 0 SIGKILLs itself after step STEPS // 2, the
                                        next attempt loads into the CUDA tensors and checks
                                        them against the hash written at that save

Every hang prints "stuck" once before blocking, so a test knows it got there.

On a host without a GPU (no /dev/nvidia0, ...: the rehearsal of scripts/gpu-check.sh,
tests/integration/test_gpu_check.py) every mode fails at once, before importing torch, which
would cost over a second of CPU only to fail at the first CUDA call."""
import glob
import hashlib
import json
import os
import signal
import sys
import time

if not glob.glob("/dev/nvidia[0-9]*"):
    sys.exit(f"cuda_worker.py {' '.join(sys.argv[1:2])}: no GPU on this host (no "
             "/dev/nvidia[0-9]* device)")

import torch  # noqa: E402

SPIN_CYCLES = 1 << 60  # torch.cuda._sleep: a kernel that spins this many GPU cycles (years)


def stuck(what):
    print(f"rank {os.environ.get('RANK')}: stuck {what}", flush=True)


def spin():
    x = torch.ones(1 << 20, device="cuda")
    print(f"rank {os.environ['RANK']}: sum {x.sum().item():.0f}", flush=True)
    torch.cuda._sleep(SPIN_CYCLES)
    stuck("in a CUDA kernel")
    torch.cuda.synchronize()


def gloo_block():
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(1 << 16, device="cuda")
    for _ in range(3):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    print(f"rank {rank}: three allreduces of a CUDA tensor over Gloo: {t[0].item():.0f}",
          flush=True)
    if rank == 1:
        stuck("before its collective")
        time.sleep(3600)
    stuck("inside all_reduce")
    dist.all_reduce(t)


def nccl_stuck():
    import datetime
    import torch.distributed as dist
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=600))
    t = torch.ones(1 << 20, device="cuda")
    for _ in range(5):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    print(f"rank {dist.get_rank()}: five NCCL allreduces done", flush=True)
    torch.cuda._sleep(SPIN_CYCLES)  # the allreduce below waits for this stream on the GPU
    dist.all_reduce(t)
    stuck("waiting for an allreduce queued behind a spinning kernel")
    torch.cuda.synchronize()


def oom():
    free, total = torch.cuda.mem_get_info()
    print(f"rank {os.environ['RANK']}: {free >> 20} of {total >> 20} MiB free; asking for "
          f"{(total * 4) >> 30} GiB", flush=True)
    return torch.empty(total * 4, dtype=torch.uint8, device="cuda")


def probe(out):
    from affinity_probe import mempolicy, status  # beside this file
    mode, nodes = mempolicy()
    policy = {0: "default", 1: "preferred", 2: "bind", 3: "interleave"}.get(mode, str(mode))
    st = status()
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    info = {"rank": int(os.environ["RANK"]), "local_rank": int(os.environ["LOCAL_RANK"]),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "device_count": torch.cuda.device_count(), "device": torch.cuda.current_device(),
            "name": props.name, "uuid": str(getattr(props, "uuid", "?")),
            "cpus": st["Cpus_allowed_list"], "mems": st["Mems_allowed_list"],
            "policy": policy, "policy_nodes": nodes}
    print(json.dumps(info), flush=True)
    with open(os.path.join(out, f"probe_{os.environ['RANK']}.json"), "w") as f:
        json.dump(info, f)


def digest(state):
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def snapshot(out, steps):
    import crun_worker
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    start = 0
    got = crun_worker.load(into={"model": model.state_dict(), "optimizer": opt.state_dict()})
    if got is not None:
        start, state = got
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        with open(os.path.join(out, f"saved_{start}.txt")) as f:
            want = f.read().strip()
        have = digest(model.state_dict())
        on = {t.device.type for t in model.state_dict().values()}
        print(f"attempt {attempt}: loaded step {start} from crun's node memory into {on} "
              f"tensors; parameters {'identical' if have == want else 'DIFFERENT'} "
              f"({have[:12]} vs {want[:12]})", flush=True)
        if have != want:
            sys.exit(3)
    x = torch.randn(256, 1024, device="cuda")
    for step in range(start + 1, steps + 1):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        t0 = time.perf_counter()
        crun_worker.save(step, {"model": model.state_dict(), "optimizer": opt.state_dict()},
                         layout="replicated")
        ms = (time.perf_counter() - t0) * 1e3
        with open(os.path.join(out, f"saved_{step}.txt"), "w") as f:
            f.write(digest(model.state_dict()))
        crun_worker.heartbeat()
        if step == steps // 2 and attempt == 0:
            print(f"attempt 0: saved step {step} ({ms:.1f} ms); SIGKILLing myself", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    print(f"attempt {attempt}: trained to step {steps}", flush=True)


def main():
    mode = sys.argv[1]
    if mode == "probe":
        return probe(sys.argv[2])
    if mode == "snapshot":
        return snapshot(sys.argv[2], int(sys.argv[3]))
    {"spin": spin, "gloo-block": gloo_block, "nccl-stuck": nccl_stuck, "oom": oom}[mode]()


if __name__ == "__main__":
    main()
