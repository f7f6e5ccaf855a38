"""A test's own DTensor script (not a `tftrain` command) as a process of its own, forked from
the server that `tests/forked_cli.py` forks `tftrain` commands from, instead of a fresh
interpreter: the server imported TensorFlow and tftrain once (the ~5 s of CPU a fresh
interpreter spends again) and ran no TensorFlow op, so the child still configures its own
devices (the 4 virtual CPUs of a 2x2 mesh; the pytest process has 2).

`run_script(SCRIPT, args, ...)` is `subprocess.run([python, "-c", SCRIPT, *args],
capture_output=True, text=True, timeout=...)` in such a child (`tftrain.forked`'s `entry`):
its own session, the given working directory and environment (but for the variables TensorFlow
reads while it is imported, as for `forked_cli`), `sys.argv == ["-c", *args]`, the script run
as `__main__`; the exit code (or -signal), stdout and stderr.
"""
from __future__ import annotations

import os
import subprocess
import sys

from tests import forked_cli

ENTRY = f"{__name__}:script_main"


def script_main(argv: list) -> None:
    """The child's entry point: `argv` is `["tftrain", SCRIPT, *args]`."""
    script, args = argv[1], argv[2:]
    sys.argv = ["-c", *args]
    exec(compile(script, "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102


def run_script(script: str, args, cwd, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """`script` with `args` in a forked child (see the module docstring); a child still running
    after `timeout` seconds is killed with its process group and TimeoutExpired raised."""
    args = [os.fspath(a) for a in args]
    command = ["python", "-c", "<script>", *args]
    try:
        done = forked_cli.run([script, *args], cwd=cwd, env=env, timeout=timeout, entry=ENTRY)
    except subprocess.TimeoutExpired:
        raise subprocess.TimeoutExpired(command, timeout) from None
    return subprocess.CompletedProcess(command, done.returncode, done.stdout, done.stderr)
