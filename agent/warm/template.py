# crun's warm template (docs/warm.md), written by crun into its log directory and run as
#   PYTHON_EXEC -u -c "<boot>" THIS_FILE
# with the workers' interpreter and environment. It imports the modules crun names, says so,
# and waits. For each worker of each attempt crun asks for, it forks a process that becomes
# exactly what a cold start of the worker makes, and that process runs the worker's script.
#
# crun and the template talk over a SOCK_SEQPACKET socket (CRUN_WARM_FD), one JSON message
# each way per request:
#   template -> crun, once:  {"ready": true, "pid", "executable", "version", "threads"}
#                        or  {"ready": false, "module", "error"}
#   crun -> template:        {"argv", "env", "cwd", "cpus", "mems", "crun", "fd_env", "hook",
#                             "cgroup"}
#                            with descriptors [go, stdout, stderr, *extras] (SCM_RIGHTS)
#   template -> crun:        {"pid": N, "in_cgroup": bool} or {"error": "..."}, in the order
#                            of the requests (crun may send several before it reads)
# The worker process is forked twice (template -> M -> W) and M exits at once, so that W's
# parent becomes crun (its subreaper): crun watches, reaps and ends it like any worker. W sets
# itself up, says so through the template, and waits on `go` (one byte: run; EOF: exit), so
# that crun adopts it and moves it into the attempt's cgroup before any of the user's code runs.
#
# Spares: each fork costs about 20 ms here (the page tables of the template's memory), and a
# restart waited for two of them per worker, one after the other. So while it waits, the
# template forks up to CRUN_WARM_SPARES of its M ahead (crun asks for one per worker of the
# node), each waiting on a socket of its own; a request goes to a spare, which forks W, says
# its pid and exits, and the template forks a new spare once no request waits. A spare is the
# template's child, in its process group and cgroup, shown as "crun warm spare", and dies with
# it (PR_SET_PDEATHSIG, and EOF on its socket): never an orphan of crun's.
#
# Fork only from a single thread: a request that finds another thread is refused (crun starts
# that worker cold). Nothing here may start a thread or initialise CUDA.
import json
import os
import signal
import socket
import sys

MAX_MESSAGE = 1 << 20  # a worker's command line and environment
MAX_FDS = 16
SPARE_AFTER_S = 0.5
PR_SET_PDEATHSIG = 1
PR_SET_PTRACER = 0x59616D61
MPOL_BIND = 2
SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237, "ppc64le": 261, "s390x": 237}


def send(sock, message):
    try:
        sock.send(json.dumps(message).encode())
    except OSError:
        pass  # crun is gone: the template reads EOF next and ends


def receive(sock):
    data, fds, flags, _ = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            os.close(fd)
        raise RuntimeError("crun's request was truncated")
    return (json.loads(data) if data else None), fds


def threads():
    return len(os.listdir("/proc/self/task"))


def import_all(modules):
    """Imports every module crun named; the first that fails is named with its error. A name
    ending in "?" (crun's defaults: torch, and what an older torch lacks) is skipped where the
    interpreter has no such module or package."""
    import importlib
    import traceback
    imported = []
    threaded = ""  # the first module after whose import more than one thread ran
    for name in modules:
        optional = name.endswith("?")
        name = name.rstrip("?")
        try:
            importlib.import_module(name)
        except BaseException as e:  # noqa: B902 - anything a module's import raises
            if optional and isinstance(e, ModuleNotFoundError) and e.name is not None and \
                    (name == e.name or name.startswith(e.name + ".")):
                continue
            return {"ready": False, "module": name,
                    "error": "".join(traceback.format_exception_only(type(e), e)).strip()}
        imported.append(name)
        if not threaded and threads() != 1:
            threaded = name
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "cuda") and torch.cuda.is_initialized():
        return {"ready": False, "module": modules[-1].rstrip("?"),
                "error": "CUDA was initialised while importing; a forked worker could not use it"}
    n = threads() if not threaded else settle()
    if n != 1:
        return {"ready": False, "module": threaded,
                "error": f"its import left {n} threads running, which fork would not stop; "
                         "fork needs one"}
    return {"ready": True, "pid": os.getpid(), "executable": sys.executable,
            "version": sys.version.split()[0], "threads": n, "imported": imported}


def settle():
    """Forks once, lets the child exit, and counts the threads again. A library that keeps a
    pool of threads and knows fork (numpy's OpenBLAS, whose pool starts with numpy's import and
    so with torch's, where OMP_NUM_THREADS does not make it one thread) stops the pool in its
    pthread_atfork handler and starts it again on its next call, which the template never
    makes. Threads that survive this would survive every fork: those keep workers cold."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12 on fork with threads
        pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return threads()


class Spare:
    """M forked ahead: the template's child, waiting for a request on `channel` (the
    template's end), which it answers with W's pid before it exits."""

    def __init__(self, pid, channel, status):
        self.pid, self.channel, self.status = pid, channel, status

    def close(self):
        self.channel.close()
        os.close(self.status)


def fork_spare(sock, spares):
    """Forks a spare M; returns W's request in W once the spare was handed one and forked it,
    None in the template."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    status_r, status_w = os.pipe()
    template = os.getpid()
    m = os.fork()
    if m == 0:
        mine.close()
        sock.close()
        for s in spares:  # the other spares' ends: each must see EOF when the template goes
            s.close()
        os.close(status_r)
        import ctypes
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != template:
            os._exit(0)  # the template went before the line above
        set_cmdline_text(b"crun warm spare", ctypes)
        request, fds = receive_handed(theirs)
        if request is None:
            os._exit(0)  # the template is gone
        # Into the attempt's cgroup before the fork, so that W starts there (crun moves it
        # when this fails): the moves of several spares then take place at the same time.
        moved = b""
        if request.get("cgroup"):
            try:
                with open(os.path.join(request["cgroup"], "cgroup.procs"), "w") as f:
                    f.write("0")
                moved = b" cgroup"
            except OSError:
                pass
        try:
            w = os.fork()
        except OSError:
            os._exit(1)
        if w == 0:
            theirs.close()
            return (request, fds, status_w)
        theirs.sendall(b"%d" % w + moved)
        os._exit(0)
    os.close(status_w)
    theirs.close()
    spares.append(Spare(m, mine, status_r))
    return None


def hand(spare, request, fds):
    """Gives a spare a request and its descriptors; False if the spare is gone."""
    data = json.dumps(request).encode()
    try:
        socket.send_fds(spare.channel, [len(data).to_bytes(4, "little")], fds)
        spare.channel.sendall(data)
        return True
    except OSError:
        return False


def receive_handed(channel):
    """In a spare: its request and descriptors, or (None, []) at EOF."""
    head, fds, _, _ = socket.recv_fds(channel, 4, MAX_FDS)
    while head and len(head) < 4:
        more = channel.recv(4 - len(head))
        if not more:
            break
        head += more
    if len(head) < 4:
        return None, []
    want = int.from_bytes(head, "little")
    data = b""
    while len(data) < want:
        more = channel.recv(min(want - len(data), 1 << 16))
        if not more:
            return None, []
        data += more
    return json.loads(data), fds


def answer(sock, pid, status, in_cgroup=False):
    if not pid:
        send(sock, {"error": "fork failed"})
    elif status != b"ok":
        send(sock, {"error": status.decode(errors="replace") or "the worker process died"})
    else:
        send(sock, {"pid": int(pid), "in_cgroup": in_cgroup})


def give(spares, request, fds):
    """Hands a request to the first spare that takes it (which forks W at once); returns that
    spare, or None when none is left."""
    while spares:
        spare = spares.pop(0)
        if hand(spare, request, fds):
            for fd in fds:
                os.close(fd)
            return spare
        os.kill(spare.pid, signal.SIGKILL)  # it could not take the request: gone, or going
        os.waitpid(spare.pid, 0)
        spare.close()
    return None


def answer_spares(sock, handed):
    """Answers the requests handed to spares, in order: each says W's pid, and whether it moved
    into the attempt's cgroup before it forked W, then exits."""
    for spare in handed:
        said = b""
        while chunk := spare.channel.recv(64):
            said += chunk
        spare.channel.close()
        os.waitpid(spare.pid, 0)  # W is crun's child from here on
        pid, _, moved = said.partition(b" ")
        answer(sock, pid, read_all(spare.status), in_cgroup=moved == b"cgroup")


def fork_worker(sock, request, fds):
    """Forks W (through M); returns W's request in W, None in the template."""
    n = threads()
    if n != 1:
        for fd in fds:
            os.close(fd)
        send(sock, {"error": f"the template has {n} threads; fork needs one"})
        return None
    pid_r, pid_w = os.pipe()
    status_r, status_w = os.pipe()
    m = os.fork()
    if m == 0:  # M: forks W, says its pid, exits
        os.close(pid_r)
        os.close(status_r)
        try:
            w = os.fork()
        except OSError:
            os._exit(1)
        if w == 0:
            os.close(pid_w)
            sock.close()
            return (request, fds, status_w)
        os.write(pid_w, b"%d" % w)
        os._exit(0)
    os.close(pid_w)
    os.close(status_w)
    for fd in fds:
        os.close(fd)
    pid = read_all(pid_r)
    os.waitpid(m, 0)  # W is crun's child from here on
    answer(sock, pid, read_all(status_r))
    return None


def read_all(fd):
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def serve():
    """The template's life; returns (request, fds, status fd) in a forked worker."""
    sock = socket.socket(fileno=int(os.environ.pop("CRUN_WARM_FD")))
    modules = [m for m in os.environ.pop("CRUN_WARM_MODULES", "").split(",") if m]
    os.environ.pop("CRUN_WARM_ROOM", None)  # room in /proc/self/environ for set_environ
    hello = import_all(modules)
    send(sock, hello)
    if not hello["ready"]:
        return None
    # The template's log (and the tests) learn it is ready, one whole line.
    print(f"crun warm template {os.getpid()}: ready ({', '.join(hello['imported'])})",
          flush=True)
    import select
    want = int(os.environ.pop("CRUN_WARM_SPARES", "0") or "0")
    spares = []
    while True:
        # Spares are forked once no request came for SPARE_AFTER_S (the workers just forked
        # start up meanwhile, and a fork of the template would take a core from them: half a
        # second covers a warm worker's own start on 2 cores here), and only from a single
        # thread.
        if len(spares) < want and not select.select([sock], [], [], SPARE_AFTER_S)[0] and \
                threads() == 1:
            child = fork_spare(sock, spares)
            if child is not None:
                return child
            continue
        # The requests that wait go to spares one after the other, which fork their workers
        # at the same time; then they are answered in order.
        handed = []
        while True:
            request, fds = receive(sock)
            if request is None:
                break  # crun is gone or done
            spare = give(spares, request, fds)
            if spare is None:
                answer_spares(sock, handed)
                handed = []
                child = fork_worker(sock, request, fds)
                if child is not None:
                    return child
            else:
                handed.append(spare)
            if not select.select([sock], [], [], 0)[0]:
                break
        answer_spares(sock, handed)
        if request is None:
            return None


# ---- in W ------------------------------------------------------------------------------------

def set_up(request, fds):
    """Everything but running: the process group, the bindings, stdio, the environment, the
    signals. Returns the `go` descriptor. Raises OSError naming what failed."""
    import ctypes
    go, stdout, stderr, *extras = fds
    os.setpgid(0, 0)
    if request["cpus"]:
        os.sched_setaffinity(0, request["cpus"])
    if request["mems"]:
        bind_memory(ctypes, request["mems"])
    sys.stdout.flush()
    sys.stderr.flush()
    set_cmdline(ctypes, request["argv"])
    os.dup2(stdout, 1)
    os.dup2(stderr, 2)
    os.close(stdout)
    os.close(stderr)
    env = dict(request["env"])
    for fd, name in zip(extras, request["fd_env"]):
        os.set_inheritable(fd, True)
        env[name] = str(fd)  # the descriptor's number here
    os.environ.clear()  # unsetenv and putenv too: the C-level environment follows
    os.environ.update(env)
    set_environ(ctypes, env)
    os.chdir(request["cwd"])
    handler = {signal.SIGINT: signal.default_int_handler, signal.SIGPIPE: signal.SIG_IGN,
               signal.SIGXFSZ: signal.SIG_IGN}
    for s in signal.valid_signals():
        if s not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(s, handler.get(s, signal.SIG_DFL))
            except (OSError, ValueError):
                pass  # signals Python cannot set (the real-time ones glibc keeps)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    return go


def bind_memory(ctypes, nodes):
    import platform
    number = SET_MEMPOLICY.get(platform.machine())
    if number is None:
        raise OSError(f"--numa-binding memory: set_mempolicy is unknown on {platform.machine()}")
    bits = 64
    mask = (ctypes.c_ulong * (max(nodes) // bits + 1))()
    for n in nodes:
        mask[n // bits] |= 1 << (n % bits)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, MPOL_BIND, mask, len(mask) * bits + 1) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"set_mempolicy: {os.strerror(e)}")


def set_cmdline(ctypes, argv):
    """Makes /proc/self/cmdline (ps, top, pgrep -f, nvidia-smi) the worker's command line, not
    the template's: written over the template's own argument strings, which crun padded to
    fit. What does not fit is cut."""
    set_cmdline_text(b"\0".join(a.encode("utf-8", "surrogateescape") for a in argv), ctypes)


def set_cmdline_text(text, ctypes=None):
    if ctypes is None:
        import ctypes
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    start, end = int(fields[47 - 2]), int(fields[48 - 2])  # arg_start, arg_end (man 5 proc)
    text = text[:end - start - 1]
    ctypes.memmove(start, text.ljust(end - start, b"\0"), end - start)


def set_environ(ctypes, env):
    """Makes /proc/self/environ (ps e, tools that find a job's processes by a variable) the
    worker's environment, not the template's: written over the template's own environment
    strings, which crun padded (CRUN_WARM_ROOM), once the C-level environment no longer points
    into them (os.environ's clear and update above). Whole variables only: one that does not
    fit is left out of what /proc shows, never out of the environment itself."""
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    start, end = int(fields[50 - 3]), int(fields[51 - 3])  # (50) env_start, (51) env_end
    # (man 5 proc; fields[0] is field (3))
    text = b""
    for key, value in env.items():
        entry = f"{key}={value}".encode("utf-8", "surrogateescape") + b"\0"
        if len(text) + len(entry) <= end - start:
            text += entry
    ctypes.memmove(start, text.ljust(end - start, b"\0"), end - start)


def wait_for_go(request, go):
    """Blocks until crun says run; then takes crun as the process's parent for good."""
    import ctypes
    if os.read(go, 1) != b"g":
        os._exit(1)  # crun went away or gave up on this worker
    os.close(go)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != request["crun"]:
        os._exit(1)  # crun died before the line above
    # Yama (ptrace_scope 1) lets only ancestors trace: crun and what it runs may.
    libc.prctl(PR_SET_PTRACER, request["crun"], 0, 0, 0)


def leave_hook(hook):
    """What crun's sitecustomize does in a cold worker: the stack hook from this worker's
    environment, and the hook's directory off PYTHONPATH and sys.path (the template already
    ran any sitecustomize it shadows)."""
    if not hook:
        return
    import runpy
    g = runpy.run_path(hook, run_name="crun_hook")
    g["_crun_register_stack_hook"]()
    g["_crun_leave_path"]()


def reseed():
    """What a fresh process would draw anew: Python's random is reseeded by os.fork itself;
    numpy's global generator, seeded from the OS when numpy was imported, is not."""
    np = sys.modules.get("numpy")
    if np is not None:
        try:
            np.random.seed()
        except Exception:  # noqa: BLE001 - a numpy without the legacy generator
            pass


def run(request):
    """Runs the worker's command line as `python -u ...` would, in this interpreter."""
    import builtins
    import importlib.machinery
    import runpy
    argv = request["argv"][2:]  # after "python -u"
    sys.orig_argv = list(request["argv"])
    main = sys.modules["__main__"]
    main.__dict__.clear()
    main.__dict__.update(__name__="__main__", __doc__=None, __package__=None, __spec__=None,
                         __builtins__=builtins)
    if argv[0] == "-m":
        sys.argv = ["-m", *argv[2:]]
        sys.path[0] = os.getcwd()
        runpy._run_module_as_main(argv[1], alter_argv=True)
        return
    if argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        sys.path[0] = ""
        code = compile(argv[1], "<string>", "exec")
    else:
        # As the interpreter makes it: absolute, but not normalised ("a/../b.py" stays).
        path = argv[0] if os.path.isabs(argv[0]) else os.path.join(os.getcwd(), argv[0])
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.realpath(argv[0]))
        try:
            with open(path, "rb") as f:
                source = f.read()
        except OSError as e:
            print(f"{sys.executable}: can't open file {path!r}: [Errno {e.errno}] {e.strerror}",
                  file=sys.stderr)
            sys.exit(2)
        code = compile(source, path, "exec", dont_inherit=True)
        main.__file__ = path
        main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    exec(code, main.__dict__)


def become_worker(request, fds, status):
    try:
        go = set_up(request, fds)
        leave_hook(request.get("hook", ""))
    except BaseException as e:  # noqa: B902 - told to crun, which starts this worker cold
        os.write(status, f"{type(e).__name__}: {e}".encode())
        os._exit(1)
    os.write(status, b"ok")
    os.close(status)
    wait_for_go(request, go)
    reseed()
    try:
        run(request)
    except SystemExit:
        raise  # the interpreter ends the process as it would have: its code, its message
    except BaseException as e:  # noqa: B902 - shown as a cold start shows it, then ended so
        # The traceback from the worker's own first frame, as a cold start prints it; then the
        # interpreter ends the process as it would have (1, or SIGINT for KeyboardInterrupt).
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        # The hook prints the exception's own traceback when it has one (3.11), not its
        # argument: trim that too.
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        sys.excepthook = lambda *args: None
        raise


child = serve()
if child is not None:
    become_worker(*child)
