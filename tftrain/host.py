"""This machine and this process: the memory the checks see, and a child that dies with its
parent."""
from __future__ import annotations

import signal


def available_memory() -> int | None:
    """Bytes of memory available to a new process (Linux MemAvailable), or None if unknown."""
    return _meminfo("MemAvailable")


def total_memory() -> int | None:
    """Bytes of this machine's memory (Linux MemTotal), or None if unknown."""
    return _meminfo("MemTotal")


def _meminfo(field: str) -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def die_with_parent() -> None:
    """Linux: asks for SIGKILL when the parent process dies (kill -9 included), so a worker
    is never orphaned; elsewhere, nothing. Call it in the child, and compare `os.getppid()`
    with what it was before the call to catch a parent that died first."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
