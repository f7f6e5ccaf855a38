"""Precision: is `runtime.mixed_precision` right for the target, and which policy the check uses.

TPU: `mixed_bfloat16` (or `auto`, which becomes it) is the native format; `float32` works but
is about half as fast; `mixed_float16` is an error: TPUs have no fast float16 (use bfloat16,
which needs no loss scaling). GPU: `mixed_float16` (or `auto`) uses the tensor cores;
`mixed_bfloat16` is fast only from Ampere (compute capability 8.0) on. CPU: `float32`, or a
mixed policy on a CPU with 16-bit matmul units and without XLA (see `_cpu`).
Config only, no TensorFlow.
"""
from __future__ import annotations

from tftrain import host
from tftrain.rules.report import ADVICE, ERROR, OK, Finding, Target

FAMILY = "precision"
_AUTO = {"tpu": "mixed_bfloat16", "gpu": "mixed_float16"}  # cpu, multi_worker: float32


def policy_for(config, target: Target) -> str:
    """The Keras policy the target would train with (`auto` resolved as the target would).

    bfloat16 and float16 both compile and run on the CPU (verified with TF 2.21: XLA and plain
    kernels), so the check builds the model with exactly this policy.
    """
    name = config.runtime.mixed_precision
    return _AUTO.get(target.kind, "float32") if name == "auto" else name


def check(config, target: Target) -> list[Finding]:
    """One finding for `runtime.mixed_precision` on the target."""
    name = config.runtime.mixed_precision
    key = f"runtime.mixed_precision={name}"
    policy = policy_for(config, target)
    resolved = f" (auto: {policy})" if name == "auto" else ""
    if target.kind == "tpu":
        if policy == "mixed_bfloat16":
            return [Finding(OK, FAMILY, f"{key}{resolved}: bfloat16, the TPU's native format")]
        if policy == "mixed_float16":
            return [Finding(ERROR, FAMILY, f"{key}: TPUs have no fast float16 (their 16-bit "
                            "format is bfloat16; float16 would add loss scaling for nothing)",
                            "use runtime.mixed_precision=mixed_bfloat16 (same range as float32, "
                            "no loss scaling)")]
        return [Finding(ADVICE, FAMILY, f"{key} on TPU: works, at about half the speed of "
                        "bfloat16 matmuls", "runtime.mixed_precision=mixed_bfloat16 (same "
                        "accuracy for most models)")]
    if target.kind == "gpu":
        if policy == "mixed_float16":
            return [Finding(OK, FAMILY, f"{key}{resolved}: float16 on the tensor cores, with "
                            "loss scaling")]
        if policy == "mixed_bfloat16":
            return [Finding(ADVICE, FAMILY, f"{key}: fast only on Ampere or newer GPUs (compute "
                            "capability 8.0+); older GPUs emulate it slowly",
                            "on pre-Ampere GPUs use mixed_float16")]
        return [Finding(ADVICE, FAMILY, f"{key} on GPU: the tensor cores stay idle",
                        "runtime.mixed_precision=mixed_float16 (or auto) is typically 2-3x faster")]
    return _cpu(config, key, resolved, policy, target)


def _cpu(config, key: str, resolved: str, policy: str, target: Target) -> list[Finding]:
    """CPU: a mixed policy pays only with 16-bit matmul units (AMX, AVX512-BF16/FP16: a CPU
    target is this host, whose flags say), and only without XLA, whose CPU backend does not use
    them (bench/precision.py: bfloat16 matmuls 3.65x float32 through oneDNN, 1.04x through XLA
    on an AMX CPU)."""
    here = target.kind == "cpu"
    units = host.low_precision_units(policy if policy != "float32" else "mixed_bfloat16")
    if policy == "float32":
        if here and units:
            return [Finding(ADVICE, FAMILY, f"{key}{resolved}: float32 leaves this CPU's "
                            f"bfloat16 units idle ({', '.join(units)}: {host.cpu_name()})",
                            "runtime.mixed_precision=mixed_bfloat16 (bench/precision.py: up "
                            "to 3-4x faster matmuls on such CPUs)")]
        return [Finding(OK, FAMILY, f"{key}{resolved}: float32 on CPU")]
    findings = []
    if not here:
        findings.append(Finding(ADVICE, FAMILY, f"{key} on CPU workers: faster only where they "
                                "have 16-bit matmul units (AMX, AVX512-BF16); elsewhere it is "
                                "converted and no faster", "runtime.mixed_precision=float32 "
                                "unless the workers' CPUs have them"))
    elif units:
        findings.append(Finding(OK, FAMILY, f"{key}: this CPU's 16-bit matmul units "
                                f"({', '.join(units)}) run it through oneDNN"))
    else:
        wanted = " or ".join(host.LOW_PRECISION_UNITS[policy])
        findings.append(Finding(ADVICE, FAMILY, f"{key}: this CPU ({host.cpu_name()}) has no "
                                f"16-bit matmul units ({wanted}): "
                                "its matmuls are converted and run no faster than float32 "
                                "(bench/precision.py)", "runtime.mixed_precision=float32"))
    if config.runtime.jit_compile == "true":
        findings.append(Finding(ADVICE, FAMILY, f"{key} with runtime.jit_compile=true on CPU: "
                                "XLA's CPU backend does not use the 16-bit matmul units that "
                                "oneDNN uses (bfloat16 matmuls 1.04x float32 through XLA, 3.65x "
                                "through oneDNN on an AMX CPU)", "runtime.jit_compile=auto (no "
                                "XLA on CPU)"))
    return findings
