"""The health gate (docs/health.md): checks each node runs before each join, with real crun
processes.

  Gpu           `--health-check gpu` against a stand-in nvidia-smi on PATH
                (tests/workers/fake_gpu): a table of what the driver may answer (ECC errors,
                retired pages, rows to remap, a GPU that does not answer, memory a process
                holds), the GPUs the node may use (CUDA_VISIBLE_DEVICES), and the wait for GPU
                memory that a stopped attempt's processes still hold before the next join
  Commands      a shell command as a check: its exit and last lines named, a hung one killed at
                its deadline with everything it started, the node noted for the batch script
  AcrossHosts   three hosts (network namespaces) on the rendezvous service: the one whose
                check fails stays out, the other two form the round, and `crun status` names
                it with its reason, also when its check failed before the host node listened

The same gate across backends and warm starts is the `health` part of test_matrix.py."""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from crun_testing import kill_all, probe_events, processes_mentioning, wait_for, whole_lines  # noqa: E402,E501
from fabric import Fabric  # noqa: E402

CRUN = os.environ["CRUN_BIN"]
FAKE_GPU = os.path.join(HERE, "..", "workers", "fake_gpu")
PROBE = os.path.join(HERE, "..", "workers", "node_probe.py")
LIMIT_S = 120
REQUEUE_WITHOUT_NODE = 87

HEALTHY = "0, GPU-a, 0, No\n1, GPU-b, 0, No\n"


class Case(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="crun-health-")
        self.procs = []

    def tearDown(self):
        kill_all(self.procs)
        shutil.rmtree(self.dir, ignore_errors=True)

    def crun(self, args, worker, env=None, path=None):
        """Runs crun standalone to its end: (exit code, stderr)."""
        e = dict(os.environ, **(env or {}))
        if path is not None:
            e["PATH"] = path
        p = subprocess.Popen([CRUN, "--standalone", "--log-level", "info", *args, "--no-python",
                              *worker], env=e, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.procs.append(p)
        _, err = p.communicate(timeout=LIMIT_S)
        return p.returncode, err

    def marker_worker(self):
        """A worker that notes each start in OUT/ran: whether the node ran anything."""
        ran = os.path.join(self.dir, "ran")
        return ["/bin/sh", "-c", f"echo $TORCHELASTIC_RESTART_COUNT >> {ran}"], ran


class Gpu(Case):
    def smi(self, files):
        d = os.path.join(self.dir, "smi")
        os.makedirs(d, exist_ok=True)
        for name, text in files.items():
            with open(os.path.join(d, name), "w") as f:
                f.write(text)
        return d

    def gpu_run(self, files, visible=None, timeout="5", extra=()):
        d = self.smi(files)
        env = {"FAKE_SMI_DIR": d}
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        worker, ran = self.marker_worker()
        code, err = self.crun(["--health-check", "gpu", "--health-check-timeout", timeout,
                               *extra], worker, env,
                              path=FAKE_GPU + os.pathsep + os.environ["PATH"])
        return code, err, whole_lines(ran)

    def test_what_the_driver_says_decides_whether_the_node_joins(self):
        cases = [
            # (what, files, CUDA_VISIBLE_DEVICES, refused with these words, or None: joins)
            ("healthy", {"gpus.csv": HEALTHY}, None, None),
            ("an uncorrectable ECC error",
             {"gpus.csv": "0, GPU-a, 0, No\n1, GPU-b, 2, No\n"}, None,
             "gpu: GPU 1 (GPU-b) has 2 uncorrectable ECC errors since the driver loaded"),
            ("ECC errors on a GPU the node does not use",
             {"gpus.csv": "0, GPU-a, 0, No\n1, GPU-b, 2, No\n"}, "0", None),
            ("the GPU used named by its uuid",
             {"gpus.csv": "0, GPU-a, 0, No\n1, GPU-b, 2, No\n"}, "GPU-b",
             "gpu: GPU 1 (GPU-b) has 2 uncorrectable ECC errors"),
            ("retired pages pending",
             {"gpus.csv": "0, GPU-a, [N/A], Yes\n"}, None,
             "gpu: GPU 0 (GPU-a) has retired pages pending: it needs a reset"),
            ("a GPU that does not answer",
             {"gpus.csv": "0, GPU-a, [Unknown Error], [Unknown Error]\n"}, None,
             "gpu: GPU 0 (GPU-a) does not answer"),
            ("rows pending remapping",
             {"gpus.csv": HEALTHY, "remap.csv": "0, GPU-a, No, No\n1, GPU-b, Yes, No\n"}, None,
             "gpu: GPU 1 (GPU-b) has rows pending remapping: it needs a reset"),
            ("no GPU the node may use", {"gpus.csv": HEALTHY}, "7",
             "gpu: nvidia-smi lists none of the GPUs this node should use"),
            ("memory of a process outside the job",
             {"gpus.csv": HEALTHY, "apps.csv": "4242, GPU-a, 1024\n"}, None,
             "gpu: memory still held after 2 s: process 4242 holds 1024 MiB on GPU-a"),
            # The deadline comes while a poll is under way: the verdict is what held the
            # memory, not the poll that was cut short.
            ("memory held, nvidia-smi slow to answer",
             {"gpus.csv": HEALTHY, "apps.csv": "4242, GPU-a, 1024\n", "apps_delay": "0.6"}, None,
             "gpu: memory still held after 2 s: process 4242 holds 1024 MiB on GPU-a"),
            ("a process on a GPU the node does not use",
             {"gpus.csv": HEALTHY, "apps.csv": "4242, GPU-b, 1024\n"}, "0", None),
        ]
        for what, files, visible, refused in cases:
            with self.subTest(what):
                shutil.rmtree(os.path.join(self.dir, "smi"), ignore_errors=True)
                if os.path.exists(os.path.join(self.dir, "ran")):
                    os.unlink(os.path.join(self.dir, "ran"))
                code, err, ran = self.gpu_run(files, visible, timeout="2")
                if refused is None:
                    self.assertEqual(code, 0, err)
                    self.assertEqual(ran, ["0"], err)
                else:
                    self.assertEqual(code, REQUEUE_WITHOUT_NODE, err)
                    self.assertIn("failed its health check and does not join: " + refused, err)
                    self.assertIn("requeue without this node", err)
                    self.assertEqual(ran, [], "a refused node ran workers")

    def test_a_restart_waits_for_the_stopped_attempts_gpu_memory(self):
        """Attempt 0's worker leaves its pid on GPU-a for three more queries, as the driver
        does while it tears a dead process's context down, and fails. The next join may come
        only once nvidia-smi no longer lists it."""
        d = self.smi({"gpus.csv": HEALTHY})
        calls = os.path.join(d, "calls.log")
        worker = ["/bin/sh", "-c",
                  f'echo "start $TORCHELASTIC_RESTART_COUNT" >> {calls}; '
                  f'[ "$TORCHELASTIC_RESTART_COUNT" != 0 ] && exit 0; '
                  f'echo "$$, GPU-a, 2048" > {d}/apps.csv; '
                  f'n=$(grep -c query-compute-apps {calls}); echo $((n + 3)) > '
                  f'{d}/apps_release_after; exit 1']
        code, err = self.crun(["--health-check", "gpu", "--max-restarts", "1",
                               "--max-restarts-without-progress", "0"], worker,
                              {"FAKE_SMI_DIR": d}, path=FAKE_GPU + os.pathsep + os.environ["PATH"])
        self.assertEqual(code, 0, err)
        lines = whole_lines(calls)
        first, second = lines.index("start 0"), lines.index("start 1")
        between = [c for c in lines[first:second] if c.startswith("--query-compute-apps")]
        self.assertEqual(len(between), 4, lines)  # three that list it, one that does not
        self.assertIn("health check gpu: waiting up to 60 s for GPU memory to be released: "
                      "process", err)
        self.assertIn("holds 2048 MiB on GPU-a", err)

    def test_gpu_without_nvidia_smi_is_refused_before_anything_runs(self):
        worker, ran = self.marker_worker()
        path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                               if not os.path.exists(os.path.join(p, "nvidia-smi")))
        code, err = self.crun(["--health-check", "gpu"], worker, path=path)
        self.assertEqual(code, 2, err)
        self.assertIn("--health-check 'gpu': needs nvidia-smi, which is not on PATH", err)
        self.assertEqual(whole_lines(ran), [])


class Commands(Case):
    def test_a_failing_command_is_named_with_its_exit_and_last_lines(self):
        worker, ran = self.marker_worker()
        noted = os.path.join(self.dir, "unhealthy")
        with open(noted, "w") as f:
            f.write("earlier-node\n")
        check = "for i in 1 2 3 4 5 6 7 8; do echo line $i; done; echo 'nic eth9 down' >&2; exit 4"
        code, err = self.crun(["--health-check", "true", "--health-check", check,
                               "--unhealthy-nodes-file", noted], worker)
        self.assertEqual(code, REQUEUE_WITHOUT_NODE, err)
        self.assertIn(f"health check `{check}` failed with exit code 4: line 5 | line 6 | line 7 "
                      "| line 8 | nic eth9 down", err)
        self.assertNotIn("line 4", err)
        self.assertNotIn("`true`", err)  # the check that passed is not blamed
        self.assertEqual(whole_lines(ran), [])
        # Appended, never overwritten: the nodes of a job share the file.
        self.assertEqual(whole_lines(noted), ["earlier-node", socket.gethostname()])

    def test_a_hung_check_is_killed_at_its_deadline_with_what_it_started(self):
        tag = f"sleep {600 + uuid.uuid4().int % 1000}.{os.getpid()}"
        worker, ran = self.marker_worker()
        code, err = self.crun(["--health-check", f"{tag} & {tag}", "--health-check-timeout",
                               "1"], worker)
        self.assertEqual(code, REQUEUE_WITHOUT_NODE, err)
        self.assertIn(f"health check `{tag} & {tag}` did not finish in time; killed", err)
        # SIGKILL went to the check's whole group; each of its processes ends a moment later.
        wait_for(lambda: processes_mentioning(tag) == [], "the check's processes to end", 30)
        self.assertEqual(whole_lines(ran), [])

    def test_a_check_that_passes_runs_before_every_join(self):
        gates = os.path.join(self.dir, "gates")
        worker, ran = self.marker_worker()
        worker = ["/bin/sh", "-c", worker[2] + '; [ "$TORCHELASTIC_RESTART_COUNT" = 2 ]']
        code, err = self.crun(["--health-check", f"echo gate >> {gates}", "--health-check",
                               "disk", "--health-check", "memory:1M", "--max-restarts", "2",
                               "--max-restarts-without-progress", "0"], worker)
        self.assertEqual(code, 0, err)
        self.assertEqual(whole_lines(ran), ["0", "1", "2"])
        self.assertEqual(whole_lines(gates), ["gate"] * 3)

    def test_bad_values_are_refused_with_exit_2(self):
        worker, ran = self.marker_worker()
        cases = [
            (["--health-check", ""], "--health-check '': give gpu, disk[:SIZE], memory[:SIZE]"),
            (["--health-check", "disk:0"], "--health-check 'disk:0': '0' is not a size above 0"),
            (["--health-check", "memory:8GB"], "'8GB' is not a size above 0 such as 512M or 8G"),
            (["--health-check", "dsik:10G"],
             "--health-check 'dsik:10G': no command 'dsik:10G' on PATH (did you mean disk?)"),
            (["--health-check", "true", "--health-check-timeout", "0"],
             "--health-check-timeout '0'"),
            (["--unhealthy-nodes-file", os.path.join(self.dir, "u")],
             "needs --health-check or --straggler-action exclude: without either no node is ever "
             "noted"),
        ]
        for args, words in cases:
            with self.subTest(args=args):
                code, err = self.crun(args, worker)
                self.assertEqual(code, 2, err)
                self.assertIn(words, err)
        self.assertEqual(whole_lines(ran), [])
        self.assertFalse(os.path.exists(os.path.join(self.dir, "u")))


class StaticCrashLoop(Case):
    def test_a_crash_loop_on_one_static_node_ends_the_job_86_on_every_node(self):
        """Static nodes that share a store (here, for the health gate's barrier) weigh every
        node's failure by the same rules: when node 1's workers fail the same way before any
        step, node 0, whose workers are fine, counts the loop too and ends with exit 86 rather
        than waiting for its own workers."""
        from crun_testing import free_port
        port = str(free_port())
        script = 'if [ "$GROUP_RANK" = 1 ]; then echo "boom: the same" >&2; exit 3; fi; ' \
                 'exec sleep 120'
        for rank in ("0", "1"):
            self.procs.append(subprocess.Popen(
                [CRUN, "--nnodes", "2", "--node-rank", rank, "--master-addr", "127.0.0.1",
                 "--master-port", port, "--max-restarts", "5",
                 "--max-restarts-without-progress", "2", "--health-check", "true",
                 "--no-python", "/bin/sh", "-c", script],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                text=True))
        ends = [p.communicate(timeout=LIMIT_S) for p in self.procs]
        for p, (_, err) in zip(self.procs, ends):
            self.assertEqual(p.returncode, 86, err)
            self.assertIn("crash loop: rank 1 (local rank 0)", err)
            self.assertIn("in 2 attempts before any step", err)


class AcrossHosts(Case):
    PORT = 29400

    def node(self, fab, host, check, conf="", extra=()):
        args = [CRUN, "--nnodes", "2:3", "--nproc-per-node", "2", "--rdzv-endpoint",
                f"{fab.addr('a')}:{self.PORT}", "--rdzv-id", "job", "--rdzv-conf",
                "last_call_timeout=0.5" + conf, "--health-check", check, *extra, PROBE, self.dir,
                "--until", "release"]
        p = fab.popen(host, args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                      env=dict(os.environ, NODE_TAG=host))
        self.procs.append(p)
        return p

    def test_a_node_that_fails_its_check_stays_out_and_the_others_go_on(self):
        with Fabric(["a", "b", "c"]) as fab:
            nodes = {h: self.node(fab, h, "true") for h in ("a", "b")}
            nodes["c"] = self.node(fab, "c", "echo 'nic eth9 down' >&2; exit 4")
            _, err = nodes["c"].communicate(timeout=LIMIT_S)
            self.assertEqual(nodes["c"].returncode, REQUEUE_WITHOUT_NODE, err)
            self.assertIn("exit code 4: nic eth9 down", err)
            wait_for(lambda: len(probe_events(self.dir)) == 4, "a round of two hosts")
            events = probe_events(self.dir)
            self.assertEqual({e["NODE_TAG"] for e in events}, {"a", "b"})
            self.assertEqual({e["WORLD_SIZE"] for e in events}, {"4"})
            job = self.status(fab)
            self.assertEqual(job["unhealthy_reports"], 1, job)
            unhealthy = [n for n in job["nodes"] if n["state"] == "unhealthy"]
            self.assertEqual(len(unhealthy), 1, job)
            self.assertIn(fab.addr("c"), unhealthy[0]["node_id"])
            self.assertIn("health check `echo 'nic eth9 down' >&2; exit 4` failed with exit code "
                          "4: nic eth9 down", unhealthy[0]["reason"])
            self.assertEqual(sorted(n["state"] for n in job["nodes"]),
                             ["member", "member", "unhealthy"])
            table = subprocess.run(fab.command("a", [
                CRUN, "status", "--rdzv-endpoint", f"{fab.addr('a')}:{self.PORT}"]),
                capture_output=True, text=True, timeout=60)
            self.assertIn("health checks failed: 1", table.stdout)
            self.assertIn("unhealthy", table.stdout)
            open(os.path.join(self.dir, "release"), "w").close()
            for h in ("a", "b"):
                _, err = nodes[h].communicate(timeout=LIMIT_S)
                self.assertEqual(nodes[h].returncode, 0, err)


    def status(self, fab):
        out = subprocess.run(fab.command("a", [
            CRUN, "status", "--rdzv-endpoint", f"{fab.addr('a')}:{self.PORT}", "--rdzv-id", "job",
            "--json"]), capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        return json.loads(out.stdout)[0]

    def test_a_check_that_fails_before_the_host_node_listens_is_still_reported(self):
        # The check fails within milliseconds, before the host node's crun exists: the node
        # waits for the endpoint to listen, says why it stays out, and only then exits.
        noted = os.path.join(self.dir, "unhealthy")
        with Fabric(["a", "b", "c"]) as fab:
            sick = self.node(fab, "c", "echo 'nic eth9 down' >&2; exit 4",
                             extra=["--unhealthy-nodes-file", noted])
            wait_for(lambda: len(whole_lines(noted)) == 1, "node c to fail its check")
            self.assertIsNone(sick.poll(), "c left before it could tell the service")
            nodes = [self.node(fab, h, "true") for h in ("a", "b")]
            _, err = sick.communicate(timeout=LIMIT_S)
            self.assertEqual(sick.returncode, REQUEUE_WITHOUT_NODE, err)
            self.assertNotIn("could not tell", err)
            job = self.status(fab)
            self.assertEqual(job["unhealthy_reports"], 1, job)
            unhealthy = [n for n in job["nodes"] if n["state"] == "unhealthy"]
            self.assertEqual(len(unhealthy), 1, job)
            self.assertIn(fab.addr("c"), unhealthy[0]["node_id"])
            self.assertIn("exit code 4: nic eth9 down", unhealthy[0]["reason"])
            wait_for(lambda: len(probe_events(self.dir)) == 4, "a round of two hosts")
            self.assertEqual({e["NODE_TAG"] for e in probe_events(self.dir)}, {"a", "b"})
            open(os.path.join(self.dir, "release"), "w").close()
            for p in nodes:
                _, err = p.communicate(timeout=LIMIT_S)
                self.assertEqual(p.returncode, 0, err)

    def test_a_failed_check_with_no_endpoint_listening_waits_no_longer_than_join_timeout(self):
        with Fabric(["a", "c"]) as fab:
            sick = self.node(fab, "c", "exit 4", conf=",join_timeout=2")
            _, err = sick.communicate(timeout=LIMIT_S)
            self.assertEqual(sick.returncode, REQUEUE_WITHOUT_NODE, err)
            self.assertIn(f"could not tell the rendezvous service at {fab.addr('a')}:{self.PORT} "
                          "that this node failed its health check: it did not listen within "
                          "2000 ms", err)
            self.assertEqual(probe_events(self.dir), [])


if __name__ == "__main__":
    unittest.main()
