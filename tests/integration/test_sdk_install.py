"""The worker SDK as a user gets it: `cmake --install` into a fresh prefix (crun, the SDK, docs
and the systemd unit; scripts/package.sh packs the same install), then the example
project in docs/examples/worker_sdk built two ways (find_package(crun_worker) and pkg-config)
and run under crun, and a user's project whose own base/status.h and rendezvous/store/store.h
must not collide with crun's (everything crun installs lives under include/crun/)."""
import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from crun_testing import run_checked as run  # noqa: E402

CRUN = os.environ["CRUN_BIN"]
BUILD_DIR = os.environ["CRUN_BUILD_DIR"]
EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs",
                       "examples", "worker_sdk")
USER_PROJECT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sdk_user_project")


class InstalledSdk(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="crun-sdk-")
        cls.prefix = os.path.join(cls.tmp, "prefix")
        run(["cmake", "--install", BUILD_DIR, "--prefix", cls.prefix])

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_under_crun(self, program, nproc):
        r = run([CRUN, "--nproc-per-node", str(nproc), program])
        self.assertIn(f"average over {nproc} ranks: {(nproc + 1) / 2:g}", r.stdout)

    def test_the_install_holds_the_sdk_and_crun(self):
        self.assertEqual(os.listdir(os.path.join(self.prefix, "bin")), ["crun"])
        libs = sorted(os.listdir(os.path.join(self.prefix, "lib")))
        self.assertEqual([f for f in libs if f.endswith(".a")],
                         ["libcrun_base.a", "libcrun_store.a", "libcrun_worker.a",
                          "libcrun_worker_torch.a"])
        include = os.path.join(self.prefix, "include")
        for header in ["crun/worker/context.h", "crun/worker/process_group.h",
                       "crun/base/status.h", "crun/rendezvous/store/store.h"]:
            self.assertTrue(os.path.exists(os.path.join(include, header)), header)
        # Everything crun installs lives under include/crun/.
        self.assertEqual(os.listdir(include), ["crun"])
        # The installed headers are crun's own, not the build tree's forwarders.
        with open(os.path.join(include, "crun", "rendezvous", "store", "store.h")) as f:
            text = f.read()
        self.assertIn('#include "crun/base/status.h"', text)
        self.assertIn("class Store", text)

    def test_a_user_project_with_its_own_base_and_store_headers(self):
        """A user's base/status.h and rendezvous/store/store.h, found first, reach neither the
        SDK's headers nor crun's types."""
        build = os.path.join(self.tmp, "user-build")
        run(["cmake", "-S", USER_PROJECT, "-B", build, f"-DCMAKE_PREFIX_PATH={self.prefix}"])
        run(["cmake", "--build", build, "-j2"])
        r = run([os.path.join(build, "user_program")])
        self.assertEqual(r.stdout.strip(), "user 0 0, crun 'crun's own Status', 4 samples")

    def test_the_package_names_nothing_of_this_machine(self):
        # Relocatable: the CMake package finds its dependencies (libtorch, NCCL) where it is
        # used, so no path of the building machine may be written in it. The .pc file cannot
        # search: where CUDA and NCCL are is in variables a user can redefine
        # (--define-variable), and nowhere else.
        source = os.path.realpath(os.path.join(EXAMPLE, "..", "..", ".."))
        overridable = ("cuda_includedir=", "cuda_libdir=", "nccl_libdir=")
        for sub in ["cmake/crun_worker", "pkgconfig"]:
            folder = os.path.join(self.prefix, "lib", sub)
            for name in sorted(os.listdir(folder)):
                with open(os.path.join(folder, name)) as f:
                    lines = [line for line in f if not line.startswith(overridable)]
                for path in [os.path.realpath(BUILD_DIR), source, "/usr/", "/opt/"]:
                    for line in lines:
                        self.assertNotIn(path, line, f"{sub}/{name} names {path}")

    def test_find_package(self):
        build = os.path.join(self.tmp, "cmake-build")
        run(["cmake", "-S", EXAMPLE, "-B", build, f"-DCMAKE_PREFIX_PATH={self.prefix}"])
        run(["cmake", "--build", build, "-j2"])
        self.run_under_crun(os.path.join(build, "allreduce"), 2)

    def test_find_package_with_the_torch_component(self):
        build = os.path.join(self.tmp, "cmake-build-torch")
        run(["cmake", "-S", EXAMPLE, "-B", build, f"-DCMAKE_PREFIX_PATH={self.prefix}",
             "-DWITH_TORCH=ON"])
        run(["cmake", "--build", build, "-j2", "--target", "ddp_step"])
        r = run([CRUN, "--nproc-per-node", "2", os.path.join(build, "ddp_step")])
        self.assertIn("weights identical on 2 ranks after 5 averaged steps", r.stdout)

    def test_pkg_config(self):
        env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(self.prefix, "lib", "pkgconfig"))
        flags = run(["pkg-config", "--cflags", "--libs", "crun_worker"], env=env).stdout.split()
        program = os.path.join(self.tmp, "allreduce-pc")
        run(["c++", os.path.join(EXAMPLE, "allreduce.cc"), "-o", program, *flags])
        self.run_under_crun(program, 3)


if __name__ == "__main__":
    unittest.main(verbosity=2)
