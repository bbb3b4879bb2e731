"""Writes this worker's whole environment to OUT_DIR/env_<RANK>.json."""
import json
import os
import sys

with open(os.path.join(sys.argv[1], f"env_{os.environ['RANK']}.json"), "w") as f:
    json.dump(dict(os.environ), f)
