"""What a device can do: peak FLOP/s for the run's precision, the denominator of MFU.

GPUs and TPUs: the dense (not sparse) peaks their makers publish, per GPU or per TPU replica,
for float32 (TF32 tensor cores on Ampere and later, which TensorFlow uses for float32 matmuls
by default; a TPU multiplies float32 matmuls in bfloat16 passes) and for 16-bit (bfloat16 or
float16). CPUs: measured, a square matmul timed for a moment on this host in the run's
precision, and cached per host (CPU model, cores, precision, TensorFlow version) in
`~/.cache/tftrain/peak_flops.json` (`TFTRAIN_CACHE_DIR` moves it), so it is paid once.

A shared host's neighbours can halve a measurement (seen: 30 and 64 against 78-84 GFLOP/s quiet),
and a low peak would stay cached. So the cached peak is the most this host has shown: when a run
computes faster than it (`raise_cpu_peak`), the matmul is timed again and the cache keeps the
larger of the two measurements and the run's own rate. MFU therefore never exceeds 100%.
"""
from __future__ import annotations

import json
import os
import time

import tensorflow as tf
from absl import logging

from tftrain import fileio
from tftrain.host import cpu_name

# Dense peak FLOP/s per device: (float32, 16-bit), from the datasheets.
GPU_PEAKS = {
    "h200": (494.7e12, 989.4e12), "h100": (494.7e12, 989.4e12), "a100": (156e12, 312e12),
    "l4": (60e12, 121e12), "a10": (62.5e12, 125e12), "v100": (15.7e12, 125e12),
    "t4": (8.1e12, 65e12),
}
TPU_PEAKS = {  # per replica (a core on v2/v3, a chip from v4 on: rules/hardware.py)
    "v2": 22.5e12, "v3": 61.5e12, "v4": 275e12, "v5e": 197e12, "v5p": 459e12, "v6e": 918e12,
}
MATMUL_SIZE = 1024
SECONDS = 0.5


def device_peak(device_type: str, precision: str, *, gpu_name: str = "",
                tpu_type: str = "") -> tuple[float | None, str]:
    """(peak FLOP/s of one device at `precision` — `float32` or a mixed policy —, where the
    number comes from); None when the device is not in the tables."""
    sixteen = precision.startswith("mixed_")
    if device_type == "GPU":
        lowered = gpu_name.lower()
        for name, peaks in GPU_PEAKS.items():
            if name in lowered:
                return peaks[1 if sixteen else 0], f"published peak of {gpu_name}"
        return None, f"no published peak for GPU {gpu_name!r}"
    if device_type == "TPU":
        peak = TPU_PEAKS.get(tpu_type)
        return (peak, f"published peak of a TPU {tpu_type}") if peak else (
            None, f"no published peak for TPU {tpu_type or '(unknown generation)'}")
    return cpu_peak(precision), f"measured on this host ({cpu_name()})"


def gpu_name() -> str:
    """The first GPU's model name, e.g. `NVIDIA A100-SXM4-80GB` ('' without a GPU)."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return ""
    return tf.config.experimental.get_device_details(gpus[0]).get("device_name", "")


def cpu_peak(precision: str) -> float:
    """This host's matmul FLOP/s in `precision`'s compute type, from the cache or measured."""
    dtype, key, path = _cache_entry(precision)
    cache = _read(path)
    if key not in cache:
        cache[key] = measure_matmul(dtype)
        logging.info("this host's %s matmul peak: %.3g FLOP/s (measured once, cached in %s)",
                     dtype, cache[key], path)
        _write(path, cache)
    return float(cache[key])


def raise_cpu_peak(precision: str, achieved: float) -> float:
    """The CPU peak for `precision` once a run has computed at `achieved` FLOP/s: unchanged
    when it is at least that, else measured again and raised to the larger of the new
    measurement and `achieved` (the cached one was measured under load), and cached."""
    peak = cpu_peak(precision)
    if achieved <= peak:
        return peak
    dtype, key, path = _cache_entry(precision)
    raised = max(measure_matmul(dtype), achieved)
    logging.warning("this host computed %.3g FLOP/s, above its cached %s peak %.3g (measured "
                    "under load): the peak is now %.3g", achieved, dtype, peak, raised)
    _write(path, {**_read(path), key: raised})
    return raised


def _cache_entry(precision: str) -> tuple[str, str, str]:
    """(the compute dtype of `precision`, its key in the cache, the cache file)."""
    dtype = "bfloat16" if precision == "mixed_bfloat16" else (
        "float16" if precision == "mixed_float16" else "float32")
    key = f"{cpu_name()}|{os.cpu_count()} cores|{dtype}|tf {tf.__version__}"
    path = os.path.join(os.environ.get("TFTRAIN_CACHE_DIR")
                        or os.path.expanduser("~/.cache/tftrain"), "peak_flops.json")
    return dtype, key, path


def _write(path: str, cache: dict) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fileio.write_atomic(path, json.dumps(cache, indent=1))
    except OSError as e:  # a read-only home: measured again next time
        logging.warning("cannot cache the CPU peak in %s: %s", path, e)


def _read(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            values = json.load(f)
        return values if isinstance(values, dict) else {}
    except (OSError, ValueError):
        return {}


def measure_matmul(dtype: str, size: int = MATMUL_SIZE, seconds: float = SECONDS) -> float:
    """FLOP/s of `size`² matmuls in `dtype` on the CPU, the best of repeated timed rounds."""
    with tf.device("/device:CPU:0"):
        a = tf.random.stateless_normal([size, size], seed=[1, 2], dtype=tf.float32)
        a = tf.cast(a, dtype)
        matmul = tf.function(lambda x: tf.reduce_sum(tf.cast(x @ x, tf.float32)))
        matmul(a).numpy()  # traced and warmed
        best, deadline = 0.0, time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            matmul(a).numpy()
            best = max(best, 2 * size**3 / (time.perf_counter() - started))
    return best
