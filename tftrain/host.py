"""This machine and this process: the memory the checks see, its CPU, and a child that dies
with its parent."""
from __future__ import annotations

import os
import platform
import signal


def available_memory() -> int | None:
    """Bytes of memory available to a new process (Linux MemAvailable), or None if unknown."""
    return _meminfo("MemAvailable")


def total_memory() -> int | None:
    """Bytes of this machine's memory (Linux MemTotal), or None if unknown."""
    return _meminfo("MemTotal")


def memory_for_this_process() -> int | None:
    """Bytes this process may hold at its peak: what it holds now (its anonymous memory) plus
    what is available (MemAvailable), or its cgroup's headroom when that is lower; None if
    unknown."""
    held = _status_bytes("RssAnon") or 0
    free = available_memory()
    headroom = _cgroup_headroom()
    if headroom is not None:
        free = headroom if free is None else min(free, headroom)
    return None if free is None else free + held


def _status_bytes(field: str) -> int | None:
    """A field of this process's /proc/self/status (e.g. RssAnon) in bytes."""
    return _kb_field("/proc/self/status", field)


# cgroup v2, then v1: (limit, usage, stat) files; a v1 "no limit" is a huge number, not "max".
_CGROUP_FILES = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current",
                  "/sys/fs/cgroup/memory.stat"),
                 ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                  "/sys/fs/cgroup/memory/memory.usage_in_bytes",
                  "/sys/fs/cgroup/memory/memory.stat"))


def _cgroup_headroom() -> int | None:
    """Bytes left under this process's cgroup memory limit, or None without a limit. The
    usage counts the page cache: its inactive part, which the kernel reclaims first, is
    counted as free (as container runtimes count a working set)."""
    for limit_file, usage_file, stat_file in _CGROUP_FILES:
        try:
            with open(limit_file) as f:
                limit = f.read().strip()
            with open(usage_file) as f:
                usage = int(f.read())
        except (OSError, ValueError):
            continue
        if limit == "max" or int(limit) >= 1 << 60:
            return None
        return max(0, int(limit) - usage + _cgroup_stat(stat_file, "inactive_file"))
    return None


def _cgroup_stat(path: str, field: str) -> int:
    """A field of a cgroup's memory.stat (v1 also names it `total_<field>`), 0 if unknown."""
    try:
        with open(path) as f:
            values = dict(line.split() for line in f if len(line.split()) == 2)
    except (OSError, ValueError):
        return 0
    return int(values.get(field, values.get(f"total_{field}", 0)))


def _meminfo(field: str) -> int | None:
    return _kb_field("/proc/meminfo", field)


def _kb_field(path: str, field: str) -> int | None:
    """A `<field>: <n> kB` line of a /proc file, in bytes; None when absent or unreadable."""
    try:
        with open(path) as f:
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


def leave_forkserver() -> None:
    """In a child of multiprocessing's forkserver: closes the server's "alive" pipe, which the
    child inherits so that it could start processes through the same server. While any child
    holds it, the server outlives the process that started it, and so a child that asked to die
    with its parent (the server) outlives that process too. A process the child starts later
    comes from a server of its own, as in a process started fresh."""
    from multiprocessing import forkserver

    client = forkserver._forkserver  # noqa: SLF001  (no public way to drop the inherited pipe)
    if client._forkserver_pid is None and client._forkserver_alive_fd is not None:
        os.close(client._forkserver_alive_fd)
        client._forkserver_alive_fd = None
        client._forkserver_address = None


def _cpu_fields() -> dict[str, str] | None:
    """The first processor's fields of /proc/cpuinfo (None off Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    fields = {}
    for line in lines:
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_flags() -> set[str]:
    """The CPU's feature flags (x86 `flags`, Arm `Features`); empty off Linux."""
    fields = _cpu_fields() or {}
    return set((fields.get("flags") or fields.get("Features") or "").split())


# 16-bit matmul units per precision policy: what makes a mixed policy faster than float32 on a
# CPU (oneDNN uses them; without them bfloat16 and float16 are converted and run no faster).
LOW_PRECISION_UNITS = {"mixed_bfloat16": ("amx_bf16", "avx512_bf16"),
                       "mixed_float16": ("amx_fp16", "avx512_fp16")}


def low_precision_units(policy: str) -> list[str]:
    """This CPU's units that run `policy`'s 16-bit matmuls fast (empty: none, or not a mixed
    policy)."""
    flags = cpu_flags()
    return [unit for unit in LOW_PRECISION_UNITS.get(policy, ()) if unit in flags]


def cpu_name() -> str:
    """The CPU model and its vector extensions, e.g. `AMD EPYC (avx2, fma)`.

    They decide how int8 and bfloat16 compare with float32: on an AVX2 CPU without int8
    dot-product instructions (x86 VNNI, Arm dotprod/i8mm) int8 measured no faster
    (docs/optimize.md); bfloat16 matmuls are fast with AVX512-BF16 or AMX units only.
    Linux only; elsewhere `platform.processor()`.
    """
    fields = _cpu_fields()
    if fields is None:
        return platform.processor() or platform.machine()
    name = fields.get("model name") or fields.get("CPU part") or platform.machine()
    flags = cpu_flags()
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16",
              "amx_fp16", "amx_int8", "asimddp", "i8mm")
    shown = [flag for flag in wanted if flag in flags]
    return f"{name} ({', '.join(shown)})" if shown else name
