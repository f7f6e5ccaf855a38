"""Imports TensorFlow without its C++ start-up chatter, so a command's own messages stand alone.

TensorFlow's shared libraries log a few lines while they load (oneDNN notes, CUDA stub probes)
before absl logging is initialized, so `TF_CPP_MIN_LOG_LEVEL` cannot silence them. Here the
process's stderr (fd 2) is sent to a temporary file while TensorFlow loads and probes its
devices; afterwards every line is written back except the chatter the log level asks to hide.
Nothing else is ever dropped: an import error and its output reach stderr as they were.

`hiding_native_chatter()` does the same around the TFLite converter and interpreter, whose C++
code prints "INFO: Created TensorFlow Lite XNNPACK delegate" and converter settings, when the
CLI runs at its default verbosity (`tftrain.log_filter`).
"""
from __future__ import annotations

import contextlib
import gc
import glob
import os
import re
import sys
import tempfile

_BEFORE_ABSL_INIT = "WARNING: All log messages before absl::InitializeLog() is called"
_CPP_LOG_LINE = re.compile(r"^([IWEF])\d{4} [\d:.]+\s+\d+ [\w.]+:\d+\] ")
_LEVELS = "IWEF"
_NATIVE_CHATTER = re.compile(r"^(INFO: Created TensorFlow Lite .*delegate|fully_quantize: |"
                             r"Estimated count of arithmetic ops)")
HIDE_NATIVE_CHATTER = False  # set by tftrain.log_filter.install()


def import_tensorflow(list_devices: bool = True) -> None:
    """Imports TensorFlow (and tf_keras) and lists the devices, hiding the start-up chatter.

    `list_devices=False` leaves the devices alone, for a process that forks workers later
    (CUDA must not be initialized before a fork).
    """
    if "tensorflow" in sys.modules:
        return
    with _stderr_filtered(is_chatter), long_lived_imports():
        import tensorflow as tf
        import tf_keras  # noqa: F401  (loads its own libraries, which log again)

        if list_devices:
            tf.config.list_physical_devices()  # the CUDA probe logs here


@contextlib.contextmanager
def long_lived_imports():
    """Runs a block of imports whose objects live as long as the process (TensorFlow's and
    tf-keras's: ~340,000) with the garbage collector off, then moves every object alive out of
    its reach (`gc.freeze`; a forked child inherits that). Each collection during TensorFlow's
    import walks the growing heap again (0.5 of its 2.4 s of CPU), and each full collection
    after it would walk it all once more (0.15-0.4 s per command)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


@contextlib.contextmanager
def hiding_start_up_chatter():
    """Runs a block that may import TensorFlow (e.g. a user's pipeline module) with the start-up
    chatter hidden as `import_tensorflow` hides it."""
    with _stderr_filtered(is_chatter):
        yield


@contextlib.contextmanager
def hiding_native_chatter():
    """Runs the block with fd 2 captured (when the log is quiet); writes back all but the
    TFLite converter's and interpreter's chatter lines, also if the block raises."""
    if not HIDE_NATIVE_CHATTER:
        yield
        return
    with _stderr_filtered(lambda line: bool(_NATIVE_CHATTER.match(line)) or is_chatter(line)):
        yield


@contextlib.contextmanager
def _stderr_filtered(drop):
    """Sends fd 2 to a temporary file for the block, then writes back the lines not `drop`ped."""
    sys.stderr.flush()
    saved_stderr = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved_stderr, 2)
            os.close(saved_stderr)
            captured.seek(0)
            lines = captured.read().decode("utf-8", "replace").splitlines(keepends=True)
            sys.stderr.write("".join(line for line in lines if not drop(line)))
            sys.stderr.flush()


def is_chatter(line: str) -> bool:
    """True for a start-up line that TF_CPP_MIN_LOG_LEVEL (tftrain's default: 2) would hide.

    The failed CUDA probe (an error line) counts as chatter on a machine without NVIDIA devices.
    """
    if line.startswith(_BEFORE_ABSL_INIT):
        return True
    match = _CPP_LOG_LINE.match(line)
    if not match:
        return False
    level = _LEVELS.index(match.group(1))
    if level < min_log_level():
        return True
    return "failed call to cuInit" in line and not glob.glob("/dev/nvidia[0-9]*")


def min_log_level() -> int:
    """TF_CPP_MIN_LOG_LEVEL as a number (0: show everything)."""
    try:
        return int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        return 0
