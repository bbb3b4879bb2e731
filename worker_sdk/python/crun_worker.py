"""crun's worker module for Python (docs/checkpoints.md): snapshots of the training state in
the node's memory, which crun holds across restarts, and the step heartbeat.

    import crun_worker
    got = crun_worker.load()                    # collective: every rank calls it
    if got is not None:
        step, state = got
        model.load_state_dict(state["model"]); optimizer.load_state_dict(state["optim"])
    ...
    crun_worker.save(step, {"model": model.state_dict(), "optim": optimizer.state_dict()})

crun puts this module on its Python workers' path; the wheel installs it too. A state is a
dict (nested as deep as wanted) of tensors and plain values: each tensor is saved as its raw
bytes, the plain values as one pickled blob. The memory layout is the C++ SDK's
(crun/worker/snapshot_layout.h), field by field.
"""

import atexit
import os
import pickle
import socket
import struct
import time
import mmap as _mmap

__all__ = ["save", "load", "heartbeat", "step", "allreduce_hook", "available", "SnapshotError"]

_HEADER_BYTES = 4096
_ALIGN = 64
_MAGIC = b"CRUNSNP1"
_VERSION = 1
_EMPTY, _WRITING, _COMPLETE = 0, 1, 2
_SHARDED, _REPLICATED = 1, 2
# magic, version, state, generation, step, payload_bytes, toc_bytes, rank, world_size, layout,
# reserved, saved_unix_ns, checksum, checksum_generation
_HEADER = struct.Struct("<8sIIQQQQqqIIQQQ")
_STATE_AT = 12
_VALUES = "__crun_values__"


class SnapshotError(RuntimeError):
    """A snapshot was refused: no room for it, another world's, or a failed checksum."""


def available():
    """Whether crun gives this worker a snapshot store."""
    return bool(os.environ.get("CRUN_SNAPSHOT_SOCKET"))


def heartbeat():
    """Tells crun this worker made progress (a step), for --hang-timeout; a no-op without it."""
    fd = os.environ.get("CRUN_HEARTBEAT_FD")
    if fd is None:
        return
    try:
        os.write(int(fd), b".")
    except (OSError, ValueError):
        pass


_step_clock = {"last": None, "launched": None}


def step(n, compute_seconds=None):
    """A training step done: a heartbeat that also tells crun the step's compute time, which it
    compares across ranks to name a slow one (docs/health.md, "Slow ranks"). `n`: the global
    step number.

    The compute time is `compute_seconds` when given; else, with allreduce_hook as the model's
    DDP communication hook, the time from the last step() to the moment backward handed DDP its
    last bucket (after that a fast rank only waits for the others); else the time since the
    last step(), which every rank of a synchronous job shares, so that it names nobody. The
    first call starts the clock and tells crun the step a worker starts at, for the goodput
    ledger's "redone". A no-op without crun."""
    fd = os.environ.get("CRUN_HEARTBEAT_FD")
    if fd is None:
        return
    now = time.monotonic()
    last, launched = _step_clock["last"], _step_clock["launched"]
    _step_clock["last"], _step_clock["launched"] = now, None
    if compute_seconds is None and last is not None:
        compute_seconds = (launched if launched is not None and launched > last else now) - last
    if compute_seconds is None:
        record = b"S %d\n" % int(n)
    else:
        record = b"S %d %d\n" % (int(n), max(0, int(compute_seconds * 1e6)))
    try:
        os.write(int(fd), record)
    except (OSError, ValueError):
        pass


def allreduce_hook(process_group, bucket):
    """A DDP communication hook that is DDP's own allreduce, noting when backward handed over
    each bucket, for step(): model.register_comm_hook(None, crun_worker.allreduce_hook)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    _step_clock["launched"] = time.monotonic()
    return default_hooks.allreduce_hook(process_group, bucket)


def _align(n):
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _env_int(name, default):
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else default


class _Buffer:
    def __init__(self, fd, capacity):
        self.fd = fd
        self.capacity = capacity
        self.map = _mmap.mmap(fd, _HEADER_BYTES + capacity)

    def close(self):
        self.map.close()
        os.close(self.fd)

    def header(self):
        return _HEADER.unpack_from(self.map, 0)

    def complete(self):
        h = self.header()
        return h[0] == _MAGIC and h[1] == _VERSION and h[2] == _COMPLETE

    def generation(self):
        return self.header()[3]

    def done_with(self):
        """Whether crun is done with what the buffer holds (snapshot_layout.h's DoneWith)."""
        h = self.header()
        return not (h[0] == _MAGIC and h[2] == _COMPLETE) or h[13] == h[3]


class _Store:
    def __init__(self):
        name = os.environ.get("CRUN_SNAPSHOT_SOCKET", "")
        if not name.startswith("@") or len(name) < 2:
            raise SnapshotError("no snapshot store: CRUN_SNAPSHOT_SOCKET is not set (the worker "
                                "was not started by crun, or with --snapshots off)")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.connect("\0" + name[1:])
        except OSError as e:
            raise SnapshotError(f"cannot reach crun's snapshot store at {name}: {e}") from None
        self.sock.settimeout(60)
        self.local_rank = _env_int("LOCAL_RANK", 0)
        self.rank = _env_int("RANK", 0)
        self.world = _env_int("WORLD_SIZE", 1)
        self.buffers = [None, None]
        self.opened = False
        self.loads = 0
        # The buffer of a save told with "saved" and not waited for since: a worker that saves
        # and ends at once would otherwise end the job before crun read that save, and its last
        # step would not reach --checkpoint-dir. Waited for at exit.
        self.unsettled = None
        atexit.register(self.settle)

    def settle(self):
        if self.unsettled is None:
            return
        try:
            self.ask(f"settle {self.local_rank} {self.unsettled}")
        except (OSError, SnapshotError):
            pass  # crun is gone: nothing to wait for
        self.unsettled = None

    def ask(self, request, answer=True):
        self.sock.sendall((request + "\n").encode())
        if not answer:
            return "", []
        data, fds = b"", []
        while not data.endswith(b"\n"):
            chunk, got, _, _ = socket.recv_fds(self.sock, 512, 4)
            if not chunk:
                raise SnapshotError("crun's snapshot store closed the connection")
            data += chunk
            fds += got
        line = data[:-1].decode()
        if line.startswith("error "):
            for fd in fds:
                os.close(fd)
            raise SnapshotError(line[6:])
        if not line.startswith("ok"):
            raise SnapshotError(f"crun's snapshot store answered {line!r}")
        return line[3:], fds

    def take(self, answer, fds):
        """Maps the slot's buffers from an open's or a load's answer; their verdicts."""
        words = answer.split()
        verdicts = [words[0], words[2]]
        capacities = [int(words[1]), int(words[3])]
        for i in range(2):
            if self.buffers[i] is not None:
                self.buffers[i].close()
                self.buffers[i] = None
            if capacities[i]:
                self.buffers[i] = _Buffer(fds.pop(0), capacities[i])
        self.opened = True
        return verdicts

    def target(self):
        a, b = self.buffers
        a_done = a is not None and a.complete()
        b_done = b is not None and b.complete()
        if a_done and b_done:
            return 0 if a.generation() <= b.generation() else 1
        return 1 if a_done else 0


def _rebuilt(like, pairs):
    """A dict of `like`'s type (an OrderedDict stays one) with its attributes (a state_dict's
    _metadata) and `pairs` as items."""
    try:
        out = type(like)(pairs)
    except TypeError:
        out = dict(pairs)
    if type(out) is not dict and hasattr(like, "__dict__"):
        out.__dict__.update(like.__dict__)
    return out


def _flatten(state, tensors):
    """The state with every tensor replaced by its index in `tensors`."""
    import torch
    if isinstance(state, torch.Tensor):
        tensors.append(state)
        return _TensorRef(len(tensors) - 1)
    if isinstance(state, dict):
        return _rebuilt(state, [(k, _flatten(v, tensors)) for k, v in state.items()])
    if type(state) in (list, tuple):
        return type(state)(_flatten(v, tensors) for v in state)
    return state


def _unflatten(skeleton, tensors):
    if isinstance(skeleton, _TensorRef):
        return tensors[skeleton.index]
    if isinstance(skeleton, dict):
        return _rebuilt(skeleton, [(k, _unflatten(v, tensors)) for k, v in skeleton.items()])
    if type(skeleton) in (list, tuple):
        return type(skeleton)(_unflatten(v, tensors) for v in skeleton)
    return skeleton


class _TensorRef:
    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index

    def __reduce__(self):
        return (_TensorRef, (self.index,))


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def _encode_toc(items):
    out = [struct.pack("<I", len(items))]
    for name, dtype, shape, offset, nbytes in items:
        n, d = name.encode()[:65535], dtype.encode()
        out.append(struct.pack("<H", len(n)) + n + struct.pack("<B", len(d)) + d)
        out.append(struct.pack("<B", len(shape)) + struct.pack(f"<{len(shape)}q", *shape))
        out.append(struct.pack("<QQ", offset, nbytes))
    return b"".join(out)


def _decode_toc(raw):
    (count,), at = struct.unpack_from("<I", raw, 0), 4
    items = []
    for _ in range(count):
        (n,) = struct.unpack_from("<H", raw, at)
        name = bytes(raw[at + 2:at + 2 + n]).decode()
        at += 2 + n
        (d,) = struct.unpack_from("<B", raw, at)
        dtype = bytes(raw[at + 1:at + 1 + d]).decode()
        at += 1 + d
        (ndim,) = struct.unpack_from("<B", raw, at)
        shape = list(struct.unpack_from(f"<{ndim}q", raw, at + 1))
        at += 1 + 8 * ndim
        offset, nbytes = struct.unpack_from("<QQ", raw, at)
        at += 16
        items.append((name, dtype, shape, offset, nbytes))
    return items


_store = None


def _the_store():
    global _store
    if _store is None:
        _store = _Store()
    return _store


def save(step, state, layout="sharded"):
    """Saves `state` (tensors and plain values, nested in dicts, lists and tuples) as step
    `step` in the node's memory; returns once the copy is complete. `layout`: "sharded" (each
    rank's own state: it loads back only into the same rank of the same world size) or
    "replicated" (the same on every rank, as DDP's: any rank may load it)."""
    if layout not in ("sharded", "replicated"):
        raise ValueError(f"layout {layout!r}: expected 'sharded' or 'replicated'")
    s = _the_store()
    import torch
    if not s.opened:
        s.take(*s.ask(f"open {s.local_rank}"))
    tensors = []
    values = pickle.dumps(_flatten(state, tensors), protocol=pickle.HIGHEST_PROTOCOL)
    items = []
    for i, t in enumerate(tensors):
        items.append([f"t{i}", _dtype_name(t.dtype), list(t.shape), 0, t.numel() * t.element_size()])
    items.append([_VALUES, "bytes", [len(values)], 0, len(values)])
    toc_len = len(_encode_toc(items))
    at = _align(toc_len)
    for item in items:
        item[3] = at
        at = _align(at + item[4])
    payload = at
    target = s.target()
    if s.buffers[target] is None or s.buffers[target].capacity < payload:
        answer, fds = s.ask(f"reserve {s.local_rank} {target} {payload}")
        if s.buffers[target] is not None:
            s.buffers[target].close()
        s.buffers[target] = _Buffer(fds[0], int(answer))
    b, other = s.buffers[target], s.buffers[1 - target]
    if not b.done_with():  # crun still seals (or copies) what it holds: wait for that
        s.ask(f"settle {s.local_rank} {target}")
    m = b.map
    struct.pack_into("<I", m, _STATE_AT, _WRITING)
    toc = _encode_toc(items)
    m[_HEADER_BYTES:_HEADER_BYTES + len(toc)] = toc
    with torch.no_grad():
        for t, item in zip(tensors, items):
            if item[4] == 0:
                continue
            dst = torch.frombuffer(m, dtype=t.dtype, count=t.numel(),
                                   offset=_HEADER_BYTES + item[3]).view(t.shape)
            dst.copy_(t.detach())
    start = _HEADER_BYTES + items[-1][3]
    m[start:start + len(values)] = values
    own_generation = b.header()[3] if b.header()[0] == _MAGIC else 0
    other_generation = other.generation() if other is not None and other.complete() else 0
    generation = max(own_generation, other_generation) + 1
    rank, world = s.rank, s.world
    _HEADER.pack_into(m, 0, _MAGIC, _VERSION, _WRITING, generation, step, payload, len(toc),
                      rank, world, _SHARDED if layout == "sharded" else _REPLICATED, 0,
                      time.time_ns(), 0, 0)
    struct.pack_into("<I", m, _STATE_AT, _COMPLETE)
    # In a job of several nodes, crun answers once the snapshot is sealed and on the next node.
    if os.environ.get("CRUN_SNAPSHOT_COMMIT") == "1":
        s.ask(f"commit {s.local_rank} {target}")
        s.unsettled = None
    else:
        s.ask(f"saved {s.local_rank} {target}", answer=False)
        s.unsettled = target


def _job_store(timeout):
    from datetime import timedelta
    from torch.distributed import TCPStore
    return TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                    timeout=timedelta(seconds=timeout))


def _agree(s, held, refusal, timeout):
    """The step every rank holds (through the job's store), or None; raises a rank's refusal."""
    if s.world == 1:
        if not held and refusal:
            raise SnapshotError(refusal)
        return max(held) if held else None
    store = _job_store(timeout)
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    prefix = f"crun/worker/{run_id}/{attempt}/snapshot/{s.loads}/"
    s.loads += 1
    mine = ("refused:" + refusal) if (not held and refusal) else \
        "steps:" + ",".join(str(v) for v in held)
    store.set(prefix + str(s.rank), mine)
    agreed_key = prefix + "agreed"
    if s.rank == 0:
        keys = [prefix + str(r) for r in range(s.world)]
        store.wait(keys)
        verdict, sets = None, []
        for k in keys:
            v = store.get(k).decode()
            if v.startswith("refused:") and verdict is None:
                verdict = v
            sets.append([int(x) for x in v[6:].split(",") if x] if v.startswith("steps:") else [])
        if verdict is None:
            common = set(sets[0]).intersection(*sets[1:])
            verdict = f"step:{max(common)}" if common else "none"
        store.set(agreed_key, verdict)
    store.wait([agreed_key])
    verdict = store.get(agreed_key).decode()
    if verdict.startswith("refused:"):
        raise SnapshotError(verdict[8:])
    return int(verdict[5:]) if verdict.startswith("step:") else None


def _leaves(nest, is_leaf, prefix=()):
    """(path, leaf) for every leaf in a nest of dicts, lists and tuples."""
    if is_leaf(nest):
        yield prefix, nest
    elif isinstance(nest, dict):
        for k, v in nest.items():
            yield from _leaves(v, is_leaf, prefix + (k,))
    elif type(nest) in (list, tuple):
        for i, v in enumerate(nest):
            yield from _leaves(v, is_leaf, prefix + (i,))


def _paths(state):
    """{path: tensor} for every tensor of a state."""
    import torch
    return dict(_leaves(state, lambda x: isinstance(x, torch.Tensor)))


def _ref_paths(skeleton):
    """{tensor index: path} for the tensor references of a saved skeleton."""
    return {ref.index: path
            for path, ref in _leaves(skeleton, lambda x: isinstance(x, _TensorRef))}


def _held_steps(s, verdicts):
    """(steps, refusal, {step: (index, buffer)}) of the snapshots this rank may load: whole,
    and (sharded) its own rank's of this world size; the refusal says why one was passed over."""
    held, refusal, by_step = [], "", {}
    for i, b in enumerate(s.buffers):
        if b is None:
            continue
        h = b.header()
        step, rank, world, layout = h[4], h[7], h[8], h[9]
        if verdicts[i] == "corrupt":
            refusal = (f"the snapshot of rank {s.rank} at step {step} fails its checksum "
                       "(crun's node memory was overwritten): not loaded")
            continue
        if verdicts[i] not in ("valid", "sealed"):
            continue
        if layout == _SHARDED and (world != s.world or rank != s.rank):
            refusal = (f"the snapshot in local rank {s.local_rank}'s memory at step {step} was "
                       f"saved by rank {rank} of {world}, not by rank {s.rank} of {s.world}: a "
                       "sharded snapshot loads only into the same rank of the same world size")
            continue
        held.append(step)
        by_step[step] = (i, b)
    return held, refusal, by_step


def _restore_from_disk(s, step, by_step, verdicts):
    """The agreed step, which this rank holds on disk only: crun reads it back into a buffer."""
    try:
        answer, fds = s.ask(f"restore {s.local_rank} {s.rank} {step}")
    except SnapshotError as e:
        raise SnapshotError(f"rank {s.rank} cannot resume from disk at step {step}: {e}") \
            from None
    index, capacity = (int(w) for w in answer.split())
    if s.buffers[index] is not None:
        s.buffers[index].close()
    s.buffers[index] = _Buffer(fds[0], capacity)
    by_step[step] = (index, s.buffers[index])
    verdicts[index] = "valid"


def _read_state(b, into):
    """The state in buffer `b`: its skeleton, with each tensor copied into `into`'s tensor at
    the same place where shape and dtype match, else a new tensor."""
    import torch
    h = b.header()
    payload = memoryview(b.map)[_HEADER_BYTES:_HEADER_BYTES + h[5]]
    items = _decode_toc(payload[:h[6]])
    values = next(bytes(payload[o:o + n]) for name, _, _, o, n in items if name == _VALUES)
    del payload
    skeleton = pickle.loads(values)
    targets = _paths(into) if into is not None else {}
    where = _ref_paths(skeleton) if targets else {}
    tensors = []
    with torch.no_grad():
        for name, dtype, shape, offset, nbytes in items:
            if name == _VALUES:
                continue
            dt = getattr(torch, dtype)
            target = targets.get(where.get(len(tensors)))
            fits = target is not None and target.dtype == dt and list(target.shape) == shape
            numel = 1
            for d in shape:
                numel *= d
            if numel == 0:
                tensors.append(target if fits else torch.empty(shape, dtype=dt))
                continue
            t = torch.frombuffer(b.map, dtype=dt, count=numel,
                                 offset=_HEADER_BYTES + offset).view(shape)
            tensors.append(target.copy_(t) if fits else t.clone())
            del t
    return _unflatten(skeleton, tensors)


def load(timeout=300, into=None):
    """Collective: every rank of the job calls it. Returns (step, state) for the newest step
    that every rank holds complete, in its node's memory or on disk (crun's --checkpoint-dir,
    read back into memory by crun), or None when there is none. Raises
    SnapshotError for a sharded snapshot saved by another rank or world size, and for one whose
    checksum fails when no whole one is left.

    `into`: a state of the same shape as the one saved (say {"model": model.state_dict(),
    "optimizer": optimizer.state_dict()}). Each saved tensor whose place, shape and dtype match
    one of its tensors is copied straight into it, and the returned state holds that tensor:
    no second copy of the model is made, and load_state_dict() of it then copies nothing.
    Tensors without a match are returned as new tensors."""
    s = _the_store()
    import torch  # noqa: F401  (before any answer: a rank without torch fails here, not later)
    verdicts = s.take(*s.ask(f"load {s.local_rank}"))
    held, refusal, by_step = _held_steps(s, verdicts)
    # Steps on disk (crun's --checkpoint-dir) count as held: crun reads the agreed one back.
    on_disk, _ = s.ask(f"disk {s.local_rank} {s.rank} {s.world}")
    held += [int(v) for v in on_disk.split(",") if v and int(v) not in by_step]
    if held:
        refusal = ""
    step = _agree(s, held, refusal, timeout)
    # The job goes on from the agreed step: a snapshot of any other step belongs to an abandoned
    # timeline (a newer step this rank saved before another rank failed), and must neither be
    # loaded later nor make a save overwrite the agreed one.
    for b in s.buffers:
        if b is not None and b.header()[4] != step:
            struct.pack_into("<I", b.map, _STATE_AT, _EMPTY)
    if step is None:
        return None
    if step not in by_step:
        _restore_from_disk(s, step, by_step, verdicts)
    i, b = by_step[step]
    if verdicts[i] == "sealed":
        # The older buffer: crun checks it now that it is the one to load.
        checked, _ = s.ask(f"verify {s.local_rank} {i}")
        if checked != "valid":
            raise SnapshotError(f"the snapshot of rank {s.rank} at step {step} fails its "
                                f"checksum ({checked}): crun's node memory was overwritten")
    return step, _read_state(b, into)
