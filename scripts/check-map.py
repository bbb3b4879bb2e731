#!/usr/bin/env python3
"""The map covers the house: every folder that holds tracked source has its row in the README's
layout table (its own row, `folder`, or `sub/` in its parent's row) and is named in
docs/architecture.md (`folder` or `sub/`). Fails naming each folder the map lacks.
  python3 scripts/check-map.py"""
import os
import re
import subprocess
import sys

ROOT = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
SOURCE = (".cc", ".h", ".cu", ".py", ".proto", ".sh")
# Folders the map describes as a whole, not their insides: generated, fixtures, tests.
WHOLE = ("tests", "docs", "packaging", "cmake", "scripts", ".ci", "worker_sdk", "train", "proto")
# Folders of tools and tests: the README's table has them, the architecture need not.
NOT_ARCHITECTURE = ("tests", "docs", "packaging", "cmake", "scripts", ".ci")


def folders(paths):
    """The folders that hold source, outside WHOLE's insides."""
    found = set()
    for p in paths:
        if not p.endswith(SOURCE) or "/" not in p:
            continue
        parts = p.split("/")[:-1]
        depth = 1 if parts[0] in WHOLE else len(parts)
        for i in range(1, depth + 1):
            found.add("/".join(parts[:i]))
    return sorted(found)


def layout_rows(readme):
    """{folder in backticks: the row's text} of the README's layout table."""
    table = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in table.splitlines():
        m = re.match(r"\|\s*(.+?)\s*\|(.*)\|\s*$", line)
        if m:
            for name in re.findall(r"`([^`]+)`", m.group(1)):
                rows[name] = m.group(2)
    return rows


def missing(paths, readme, architecture):
    rows, lacks = layout_rows(readme), []
    for folder in folders(paths):
        parent, _, leaf = folder.rpartition("/")
        in_row = folder in rows or any(r.startswith(folder + "/") for r in rows) or any(
            f"`{leaf}/`" in rows.get(p, "") or f"`{leaf}`" in rows.get(p, "")
            for p in (parent, parent.rpartition("/")[0]) if p)
        if not in_row:
            lacks.append(f"{folder}: no row of the README's layout table names it")
        if folder.split("/")[0] in NOT_ARCHITECTURE:
            continue
        tail = "/".join(folder.split("/")[-2:]) + "/"
        if folder not in architecture and f"`{leaf}/`" not in architecture and (
                "/" not in folder[:-1] or tail not in architecture):
            lacks.append(f"{folder}: docs/architecture.md does not name it")
    return lacks


def main():
    paths = subprocess.run(["git", "-C", ROOT, "ls-files"], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    with open(os.path.join(ROOT, "docs", "architecture.md")) as f:
        architecture = f.read()
    lacks = missing(paths, readme, architecture)
    for line in lacks:
        print(f"check-map.py: {line}", file=sys.stderr)
    if lacks:
        return 1
    print(f"check-map.py: the README's layout and docs/architecture.md name all "
          f"{len(folders(paths))} folders")
    return 0


if __name__ == "__main__":
    sys.exit(main())
