"""scripts/check-layers.sh on a throwaway repository: an include from a layer above fails, a
file in a folder without a rule fails, each named; a tree within its rules passes.
  python3 scripts/check_layers_test.py"""
import os
import shutil
import subprocess
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check-layers.sh")


class CheckLayers(unittest.TestCase):
    def run_on(self, files):
        """check-layers.sh's (exit, stderr) in a new git repository holding `files`."""
        with tempfile.TemporaryDirectory(prefix="crun-layers-") as d:
            os.mkdir(os.path.join(d, "scripts"))
            shutil.copy(SCRIPT, os.path.join(d, "scripts", "check-layers.sh"))
            for path, text in files.items():
                os.makedirs(os.path.join(d, os.path.dirname(path)), exist_ok=True)
                with open(os.path.join(d, path), "w") as f:
                    f.write(text)
            subprocess.run(["git", "init", "-q", d], check=True)
            subprocess.run(["git", "-C", d, "add", "."], check=True)
            r = subprocess.run(["bash", os.path.join(d, "scripts", "check-layers.sh")],
                               capture_output=True, text=True, timeout=60)
            return r.returncode, r.stderr

    def test_within_the_rules(self):
        code, err = self.run_on({"base/a.h": "", "http/b.cc": '#include "base/a.h"\n',
                                 "tests/t.cc": '#include "http/b.h"\n'})
        self.assertEqual((code, err), (0, ""))

    def test_an_include_from_above_is_named(self):
        code, err = self.run_on({"base/a.cc": '#include "http/b.h"\n', "http/b.h": ""})
        self.assertEqual(code, 1)
        self.assertIn('base/a.cc:1 includes "http/b.h", outside base\'s layers', err)

    def test_a_folder_without_a_rule_is_named(self):
        code, err = self.run_on({"base/a.h": "", "newfolder/c.cc": '#include "base/a.h"\n'})
        self.assertEqual(code, 1)
        self.assertIn("newfolder/c.cc is in a folder without a rule", err)


if __name__ == "__main__":
    unittest.main()
