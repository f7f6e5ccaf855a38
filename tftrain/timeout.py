"""A call bounded in time, for what can block forever: a TPU connect, a stalled file system."""
from __future__ import annotations

import threading


def run_bounded(fn, timeout: float, name: str = "bounded"):
    """Runs `fn()` in a daemon thread named `name`; its result, its exception, or TimeoutError
    after `timeout`s.

    TensorFlow's TPU connect can block forever on an address that accepts connections but does
    not speak its protocol (and a remote `data.dir` on a stalled file system likewise); the
    daemon thread is abandoned and the process can still exit.
    """
    result: dict = {}

    def run():
        try:
            result["value"] = fn()
        except BaseException as e:  # noqa: BLE001  (re-raised in the caller's thread)
            result["error"] = e

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError
    if "error" in result:
        raise result["error"]
    return result["value"]
