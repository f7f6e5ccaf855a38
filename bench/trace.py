"""TensorFlow's profiler read back in a benchmark's child process: one call traced, and the most
bytes its tensors held at once.

`tensorflow.tsl.profiler.protobuf.xplane_pb2` is TensorFlow's own copy of the trace's protobuf
(not a public API; present in the pinned TensorFlow)."""
from __future__ import annotations

import collections
import glob
import shutil
import tempfile


def traced(call):
    """`call()` run under TensorFlow's profiler; its trace (an `XSpace`)."""
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    logdir = tempfile.mkdtemp(prefix="bench-trace-")
    try:
        tf.profiler.experimental.start(logdir)
        try:
            call()
        finally:
            tf.profiler.experimental.stop()
        space = xplane_pb2.XSpace()
        (path,) = glob.glob(f"{logdir}/plugins/profile/*/*.xplane.pb")
        with open(path, "rb") as f:
            space.ParseFromString(f.read())
        return space
    finally:
        shutil.rmtree(logdir, ignore_errors=True)


def tensor_peak_bytes(space, group=lambda allocator, op: allocator) -> dict:
    """Per group of tensors (by default their allocator: `mklcpu` for the CPU and its virtual
    devices, `GPU_0_bfc`, ...; `group(allocator, op name)` says which group a tensor counts in,
    None: none): the most bytes the traced call's tensors of that group requested and held at
    once, from the trace's allocation and deallocation events replayed in time order. Tensors
    allocated before the trace began (weights, optimizer state) are not counted, nor, on the
    CPU, those under 256 KiB (its allocator serves them from a pool that emits no events and
    keeps no statistics). The allocator's own in-use count
    (`tf.config.experimental.get_memory_info`) counts the chunks its BFC allocator hands out,
    which may be up to twice a request (a free chunk is not split unless twice the size), so it
    moves with the order of the allocations."""
    events = []
    for plane in space.planes:
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        stat_names = {key: meta.name for key, meta in plane.stat_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                kind = names.get(event.metadata_id)
                if kind not in ("MemoryAllocation", "MemoryDeallocation"):
                    continue
                stats = {stat_names.get(s.metadata_id): _value(s, stat_names) for s in event.stats}
                events.append((line.timestamp_ns * 1000 + event.offset_ps, kind,
                               stats["allocator_name"], stats["addr"],
                               stats.get("requested_bytes", 0), stats.get("tf_op", "")))
    held, live, peak = collections.Counter(), {}, collections.Counter()
    for _, kind, allocator, address, requested, op in sorted(events):
        if kind == "MemoryAllocation":
            key = group(allocator, op)
            live[allocator, address] = key, requested
            if key is not None:
                held[key] += requested
                peak[key] = max(peak[key], held[key])
        else:
            key, requested = live.pop((allocator, address), (None, 0))
            if key is not None:
                held[key] -= requested
    return dict(peak)


def _value(stat, stat_names: dict):
    """An XStat's value, whichever field holds it (a string may be a reference to a name)."""
    field = stat.WhichOneof("value")
    return stat_names.get(stat.ref_value) if field == "ref_value" else getattr(stat, field)
