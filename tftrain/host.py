"""This machine and this process: the memory the checks see, its CPU, and a child that dies
with its parent."""
from __future__ import annotations

import platform
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


def cpu_name() -> str:
    """The CPU model and its vector extensions, e.g. `AMD EPYC (avx2, fma)`.

    They decide how int8 and bfloat16 compare with float32: on an AVX2 CPU without int8
    dot-product instructions (x86 VNNI, Arm dotprod/i8mm) int8 measured no faster
    (docs/optimize.md); bfloat16 matmuls are fast with AVX512-BF16 or AMX units only.
    Linux only; elsewhere `platform.processor()`.
    """
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    fields = {}
    for line in lines:
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or fields.get("CPU part") or platform.machine()
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16",
              "amx_int8", "asimddp", "i8mm")
    shown = [flag for flag in wanted if flag in flags]
    return f"{name} ({', '.join(shown)})" if shown else name
