"""`tftrain` commands as real processes that do not import TensorFlow again.

A test that needs the process itself (a signal, SIGKILL and resume, several workers, a server)
starts `tftrain` here instead of through `subprocess`: `tftrain.forked` runs each command in a
child forked from a server that imported TensorFlow once (as `tftrain launch` starts its
workers). A child costs a fraction of a second of CPU instead of the ~5 s an import of
TensorFlow takes, and is otherwise what `tftrain <args>` started from a shell is (see
`tftrain.forked`).

What it cannot be used for: import order (what a command imports before TensorFlow), the
installed console script, and environment variables that TensorFlow reads while it is imported
(`TF_USE_LEGACY_KERAS`, `TF_CPP_MIN_LOG_LEVEL`): those tests start a fresh interpreter.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading

from tftrain.forked import DEVNULL, ENTRY_POINT, PIPE, STDOUT, Popen  # noqa: F401


def run(args: list[str], cwd=None, env: dict | None = None, timeout: float | None = None,
        entry: str = ENTRY_POINT) -> subprocess.CompletedProcess:
    """`subprocess.run(["tftrain", *args], capture_output=True, text=True, timeout=...)` in a
    forked child: the output is read while the command runs; a command still running after
    `timeout` seconds is killed (with its process group) and TimeoutExpired raised. `entry`:
    another function called with `["tftrain", *args]` (`tftrain.forked.Popen`)."""
    process = Popen(args, cwd=cwd, env=env, stdout=PIPE, stderr=PIPE, entry=entry)
    captured = {}

    def read(name, stream):
        captured[name] = stream.read()
        stream.close()

    readers = [threading.Thread(target=read, args=(name, getattr(process, name)), daemon=True)
               for name in ("stdout", "stderr")]
    for reader in readers:
        reader.start()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        kill_group(process.pid)
        process.wait(30)
        raise
    finally:
        for reader in readers:
            reader.join(30)
    return subprocess.CompletedProcess(process.args, process.returncode,
                                       captured.get("stdout", ""), captured.get("stderr", ""))


def kill_group(pid: int) -> None:
    """SIGKILL to `pid`'s process group (the child and what it started), if it still exists."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
