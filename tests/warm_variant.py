#!/usr/bin/env python3
"""Runs a test suite again with warm starts (docs/warm.md), and proves that it ran warm:

  warm_variant.py [--allow-cold N] -- COMMAND...

COMMAND runs with PET_WARM=1, so every crun it starts forks its Python workers from a template,
and with tests/pylib/warm_witness on PYTHONPATH, which writes one ledger line for each worker
crun starts, warm or cold. The variant passes when COMMAND passes, at least one worker started
warm, and no worker started cold (a silent fallback would make the variant prove nothing);
--allow-cold N admits the suite's own deliberate cold starts. COMMAND's exit status 77
(skipped) passes through."""
import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "pylib"))
from crun_testing import whole_lines  # noqa: E402

WITNESS = os.path.join(HERE, "pylib", "warm_witness")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--allow-cold", type=int, default=0)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command to run")
    with tempfile.TemporaryDirectory(prefix="crun-warm-variant-") as tmp:
        ledger = os.path.join(tmp, "ledger")
        path = os.environ.get("PYTHONPATH", "")
        env = dict(os.environ, PET_WARM="1", CRUN_TEST_WARM_LEDGER=ledger,
                   PYTHONPATH=WITNESS + (os.pathsep + path if path else ""))
        rc = subprocess.call(command, env=env)
        if rc != 0:
            return rc
        lines = whole_lines(ledger)
    warm = [line for line in lines if line.startswith("warm ")]
    cold = [line for line in lines if line.startswith("cold ")]
    print(f"warm variant: {len(warm)} worker(s) started warm, {len(cold)} cold")
    for line in cold:
        print(f"  {line}")
    if not warm:
        print("warm variant: FAILED: no worker started warm", file=sys.stderr)
        return 1
    if len(cold) > args.allow_cold:
        print(f"warm variant: FAILED: {len(cold)} worker(s) started cold "
              f"(at most {args.allow_cold} allowed)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
