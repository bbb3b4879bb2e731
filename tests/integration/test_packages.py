"""crun's three packages as users install them (scripts/package.sh, docs/install.md): the
relocatable tarball untarred anywhere, the wheel pip-installed into a fresh virtual
environment, the Debian package installed with dpkg. Each installed crun must need nothing but
the C runtime and must run a stock PyTorch DDP job (Debian's python3-torch). The .deb part
installs into the system, so it runs only as root where no crun package is installed yet, and
removes the package again."""
import glob
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from crun_testing import run_checked as run  # noqa: E402

BUILD_DIR = os.environ["CRUN_BUILD_DIR"]
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
DDP = os.path.join(HERE, "..", "workers", "ddp_train.py")
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's, with python3-torch and python3-wheel
RUNTIME = {"linux-vdso.so.1", "libc.so.6", "libm.so.6", "libgcc_s.so.1",
           "/lib64/ld-linux-x86-64.so.2"}
OLDEST_GLIBC = 34  # docs/install.md: Ubuntu 22.04 (2.35) and RHEL 9 (2.34) run crun




def shared_libraries(binary):
    return {line.split()[0] for line in run(["ldd", binary]).stdout.splitlines() if line.strip()}


class Packages(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="crun-packages-")
        cls.dist = os.path.join(cls.tmp, "dist")
        r = run(["bash", os.path.join(ROOT, "scripts", "package.sh"), "--build-dir", BUILD_DIR,
                 "--out", cls.dist])
        cls.package_log = r.stdout + r.stderr

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def one(self, pattern):
        found = glob.glob(os.path.join(self.dist, pattern))
        self.assertEqual(len(found), 1, f"{pattern} in {os.listdir(self.dist)}")
        return found[0]

    def ddp_job(self, crun, env=None, die_once=False):
        """A stock PyTorch DDP job (gloo, 2 workers) under the installed crun; with `die_once`,
        rank 1 SIGKILLs itself in the first attempt and crun restarts the group."""
        out = tempfile.mkdtemp(dir=self.tmp)
        env = dict(env or os.environ, PYTHON_EXEC=SYSTEM_PYTHON)
        restarts = ["--max-restarts", "1"] if die_once else []
        r = subprocess.run([crun, "--standalone", "--nproc-per-node", "2", *restarts, DDP, out,
                            *(["--die-once"] if die_once else [])],
                           capture_output=True, text=True, timeout=300, env=env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        if die_once:
            self.assertIn("signal 9 (SIGKILL)", r.stderr)
            self.assertIn("restarting the worker group (restart 1 of at most 1)", r.stderr)
        self.assertIn("epoch 4", r.stdout)
        self.assertEqual(sorted(os.listdir(out)), ["params_0.pt", "params_1.pt"])

    def test_the_tarball_is_relocatable_and_complete(self):
        path = self.one("crun-*-linux-x86_64.tar.gz")
        where = os.path.join(self.tmp, "anywhere", "deep")
        os.makedirs(where)
        with tarfile.open(path) as t:
            top = {m.name.split("/")[0] for m in t.getmembers()}
            self.assertEqual(len(top), 1, top)
            t.extractall(where)
        prefix = os.path.join(where, top.pop())
        for f in ["bin/crun", "include/crun/worker/context.h", "lib/libcrun_worker.a",
                  "lib/libcrun_store.a", "lib/libcrun_base.a",
                  "lib/cmake/crun_worker/crun_workerConfig.cmake",
                  "lib/pkgconfig/crun_worker.pc", "share/doc/crun/install.md",
                  "share/doc/crun/cli.md", "lib/systemd/system/crun-rendezvous.service"]:
            self.assertTrue(os.path.exists(os.path.join(prefix, f)), f)
        crun = os.path.join(prefix, "bin", "crun")
        self.assertEqual(shared_libraries(crun) - RUNTIME, set())
        with open(os.path.join(prefix, "lib/systemd/system/crun-rendezvous.service")) as f:
            self.assertIn("ExecStart=/usr/local/bin/crun rendezvous", f.read())
        self.ddp_job(crun, die_once=True)
        # The SDK in it builds a program by its pkg-config file, from wherever it was untarred.
        env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(prefix, "lib", "pkgconfig"))
        flags = run(["pkg-config", "--cflags", "--libs", "crun_worker"], env=env).stdout.split()
        program = os.path.join(self.tmp, "allreduce")
        run(["c++", os.path.join(ROOT, "docs", "examples", "worker_sdk", "allreduce.cc"), "-o",
             program, *flags])
        r = run([crun, "--nproc-per-node", "2", program])
        self.assertIn("average over 2 ranks: 1.5", r.stdout)

    def test_the_wheel_puts_crun_on_a_venvs_path(self):
        path = self.one("crun-*-py3-none-manylinux_2_*_x86_64.whl")
        # The tag is honest: no glibc symbol newer than it names.
        tag_glibc = int(path.rsplit("manylinux_2_", 1)[1].split("_")[0])
        objdump = run(["objdump", "-T", os.path.join(BUILD_DIR, "launcher", "crun")]).stdout
        self.assertEqual(tag_glibc, max(int(v) for v in re.findall(r"GLIBC_2\.(\d+)", objdump)))
        self.assertLessEqual(tag_glibc, OLDEST_GLIBC)
        venv = os.path.join(self.tmp, "venv")
        run([SYSTEM_PYTHON, "-m", "venv", "--system-site-packages", venv])
        run([os.path.join(venv, "bin", "pip"), "install", "--no-index", "--no-deps",
             "--disable-pip-version-check", path])
        crun = os.path.join(venv, "bin", "crun")
        self.assertEqual(shared_libraries(crun) - RUNTIME, set())
        self.assertIn("crun ", run([crun, "--version"]).stdout)
        # An activated venv: crun found on PATH, python3 the venv's.
        env = dict(os.environ, PATH=os.path.join(venv, "bin") + os.pathsep + os.environ["PATH"],
                   VIRTUAL_ENV=venv)
        self.assertEqual(shutil.which("crun", path=env["PATH"]), crun)
        self.ddp_job("crun", env)
        # The worker module, importable in the environment itself.
        where = run([os.path.join(venv, "bin", "python"), "-c",
                     "import crun_worker; print(crun_worker.__file__)"]).stdout.strip()
        self.assertTrue(where.startswith(venv), where)
        run([os.path.join(venv, "bin", "pip"), "uninstall", "-y", "crun"])
        self.assertFalse(os.path.exists(crun))
        self.assertFalse(os.path.exists(where))

    def test_the_debian_package_installs_runs_and_removes(self):
        path = self.one("crun_*_amd64.deb")
        info = run(["dpkg-deb", "--info", path]).stdout
        self.assertIn("Depends: libc6", info)
        contents = run(["dpkg-deb", "--contents", path]).stdout
        for f in ["./usr/bin/crun", "./usr/lib/systemd/system/crun-rendezvous.service",
                  "./usr/include/crun/worker/context.h", "./usr/share/doc/crun/install.md"]:
            self.assertIn(f, contents)
        if os.geteuid() != 0:
            self.skipTest("installing a .deb needs root")
        status = subprocess.run(["dpkg-query", "-W", "-f", "${Status}", "crun"],
                                capture_output=True, text=True)
        if "installed" in status.stdout:
            self.skipTest("a crun package is installed on this machine already: not touching it")
        run(["dpkg", "-i", path])
        try:
            self.assertEqual(shared_libraries("/usr/bin/crun") - RUNTIME, set())
            unit = "/usr/lib/systemd/system/crun-rendezvous.service"
            with open(unit) as f:
                self.assertIn("ExecStart=/usr/bin/crun rendezvous", f.read())
            if shutil.which("systemd-analyze"):
                r = subprocess.run(["systemd-analyze", "verify", unit], capture_output=True,
                                   text=True, timeout=60)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.ddp_job("/usr/bin/crun")
        finally:
            run(["dpkg", "-r", "crun"])
        self.assertFalse(os.path.exists("/usr/bin/crun"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
