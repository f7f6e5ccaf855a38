"""This machine, as the memory checks see it."""
from __future__ import annotations


def available_memory() -> int | None:
    """Bytes of memory available to a new process (Linux MemAvailable), or None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
