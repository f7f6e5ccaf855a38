"""Hides TensorFlow's native dump of a lost peer from a multi-worker run's default log.

When a worker loses a peer (a crash, a freeze, a network cut), TensorFlow's C++ runtime logs
the failure at ERROR level before the Python error that tftrain turns into one line: the
collective executor's and the ring's aborts, the coordination service's heartbeat errors,
gRPC's `Additional GRPC error information from remote target ...`, each record several lines
long. `TF_CPP_MIN_LOG_LEVEL` cannot hide them without hiding every native error, and it is
read once, when TensorFlow loads. So `install()` sends the process's stderr (fd 2) through a
small filter process (this file, run by a bare interpreter) that drops those records and
passes every other line on as it comes; `tftrain train -v 1` does not install it.

A process rather than a thread: when the worker dies (an abort, SIGKILL), the filter still
reads the pipe to its end, so no line written before is lost; it ignores SIGINT, SIGTERM and
SIGHUP (a signal to the worker's process group) for the same reason, and exits at the end of
the pipe, once every process that holds its write end has closed it.

Stdlib only: the filter runs with `python -I -S`, without tftrain or site-packages.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

# A native (C++) log record's first line, as absl formats it: level, date or 0000, time,
# thread, source file (.cc/.h) and line. Python's absl lines have a .py source.
_NATIVE = re.compile(r"^([IWEF])\d{4} [\d:.]+\s+\d+ ([\w.]+\.(?:cc|h|cpp)):\d+\] ")
_RECORD = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ [\w.]+:\d+\] ")
# The sources of the distributed runtime that log a lost peer (collectives, coordination, RPC).
_DISTRIBUTED = re.compile(r"collective|ring_alg|coordination|grpc|rpc|remote|cancellable_call|"
                          r"device_resolver|worker_session")
# A line that begins something new ends a dropped record's continuation lines: a log record,
# or a line of tftrain's own (`tftrain train: error: ...`).
_OWN = "tftrain"
_MAYBE_RECORD = re.compile(rb"^[IWEF]\d{0,4}( |$)")

_installed = {"process": None}


class LostPeerDump:
    """Decides line by line: ERROR and WARNING records of the distributed runtime, with their
    continuation lines, are dropped; everything else (FATAL records too) is kept."""

    def __init__(self):
        self.dropping = False

    def keep(self, line: str) -> bool:
        """Whether `line` (without its newline) is passed on."""
        native = _NATIVE.match(line)
        if native:
            self.dropping = native.group(1) in "EW" and bool(_DISTRIBUTED.search(native.group(2)))
            return not self.dropping
        if _RECORD.match(line) or line.startswith(_OWN):
            self.dropping = False
        return not self.dropping


def filter_stream(read_fd: int, write_fd: int) -> None:
    """Copies `read_fd` to `write_fd` until its end, less what `LostPeerDump` drops. A line
    still without its newline is passed on at once when it cannot start a native record (a
    progress line redrawn with \\r), so nothing that is kept waits for a newline."""
    dump = LostPeerDump()
    pending, passing = b"", False  # passing: the rest of a line already passed on in part
    while True:
        chunk = os.read(read_fd, 1 << 16)
        ended = not chunk
        out = []
        if passing:
            head, newline, chunk = chunk.partition(b"\n")
            out.append(head + newline)
            passing = not newline and not ended
        pending += chunk
        *lines, pending = pending.split(b"\n")
        out += [line + b"\n" for line in lines if dump.keep(line.decode("utf-8", "replace"))]
        if ended:  # a last line without its newline
            if pending and dump.keep(pending.decode("utf-8", "replace")):
                out.append(pending)
        elif pending and not dump.dropping and not _MAYBE_RECORD.match(pending):
            out.append(pending)
            pending, passing = b"", True
        data = memoryview(b"".join(out))
        try:
            while data:
                data = data[os.write(write_fd, data):]
        except BrokenPipeError:  # the reader of stderr is gone: nothing more to pass on
            return
        if ended:
            return


def install() -> None:
    """Sends this process's stderr through the filter, for the rest of the process (the
    runtime logs a lost peer again while it shuts down). Idempotent."""
    if _installed["process"] is not None:
        return
    sys.stderr.flush()
    read_fd, write_fd = os.pipe()
    original = os.dup(2)
    try:
        _installed["process"] = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__)], stdin=read_fd,
            stdout=original, stderr=original, close_fds=True)
    finally:
        os.close(read_fd)
        os.close(original)
    os.dup2(write_fd, 2)
    os.close(write_fd)


def _main() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    filter_stream(0, 1)


if __name__ == "__main__":
    _main()
