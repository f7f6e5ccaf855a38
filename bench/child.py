"""One benchmark setting in a fresh Python process: what it measured comes back as JSON.

The child's code prints one line `RESULT <json>`; everything else it prints is ignored.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_child(code: str, args: dict, **env) -> dict:
    """Runs `code` with `json.dumps(args)` as its argument; returns its RESULT. `env` adds to
    the environment (the repository is on the path, TensorFlow's C++ logs are quiet)."""
    environment = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2", **env)
    out = subprocess.run([sys.executable, "-c", code, json.dumps(args)], env=environment,
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])
