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
import threading

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
    process = forked_cli.Popen([script, *args], cwd=cwd, env=env, stdout=forked_cli.PIPE,
                               stderr=forked_cli.PIPE, entry=ENTRY)
    captured = {}

    def read(name, stream):
        captured[name] = stream.read()
        stream.close()

    readers = [threading.Thread(target=read, args=(name, getattr(process, name)), daemon=True)
               for name in ("stdout", "stderr")]
    for reader in readers:
        reader.start()
    command = ["python", "-c", "<script>", *args]
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        forked_cli.kill_group(process.pid)
        process.wait(30)
        raise subprocess.TimeoutExpired(command, timeout) from None
    finally:
        for reader in readers:
            reader.join(30)
    return subprocess.CompletedProcess(command, process.returncode, captured.get("stdout", ""),
                                       captured.get("stderr", ""))
