"""Model FLOPs utilization (MFU): the model's FLOPs per second over what its devices can do.

`model_flops_per_example` is counted from the built model (`models.flops`: matmuls,
convolutions and attention; a training step is 3x the forward pass), the peak is the devices'
at the run's precision (`runtime.peak_flops`: published for GPUs and TPUs, measured once per
host on CPUs, where the virtual devices of `runtime.cpu_devices` share one host's peak). The
progress line and TensorBoard show it as the run goes; summary.json records it at the end.
"""
from __future__ import annotations

import dataclasses

from tftrain.models import flops as flops_lib
from tftrain.rules import hardware
from tftrain.runtime import peak_flops


@dataclasses.dataclass(frozen=True)
class Utilization:
    """What MFU is computed from: the model's training FLOPs per example and the devices' peak."""

    model_flops_per_example: int
    peak_flops_per_second: float | None  # all the run's devices together
    peak_source: str
    devices: int
    precision: str = "float32"
    measured_here: bool = False  # the peak is this CPU's measurement (not a published one)

    @classmethod
    def of(cls, model, backend, policy: str) -> "Utilization":
        """The model's FLOPs and the peak of the devices `backend` computes on."""
        per_device, source = peak_flops.device_peak(
            backend.device_type, policy,
            gpu_name=peak_flops.gpu_name() if backend.device_type == "GPU" else "",
            tpu_type=hardware.tpu_from_environment()[0] if backend.device_type == "TPU" else "")
        devices = 1 if backend.device_type == "CPU" else backend.num_devices
        return cls(flops_lib.training_flops_per_example(model),
                   per_device * devices if per_device else None, source, devices,
                   policy, backend.device_type == "CPU")

    def confirmed(self, examples_per_second: float | None) -> "Utilization":
        """This, with a CPU peak that a run at `examples_per_second` did not exceed: one that
        it did was measured under load, and is measured again (`peak_flops.raise_cpu_peak`)."""
        if not (self.measured_here and examples_per_second and self.peak_flops_per_second):
            return self
        achieved = self.model_flops_per_example * examples_per_second
        if achieved <= self.peak_flops_per_second:
            return self
        return dataclasses.replace(
            self, peak_flops_per_second=peak_flops.raise_cpu_peak(self.precision, achieved))

    def mfu(self, examples_per_second: float) -> float | None:
        """The achieved model FLOP/s over the peak (None when the peak is unknown)."""
        if not self.peak_flops_per_second:
            return None
        return self.model_flops_per_example * examples_per_second / self.peak_flops_per_second

    def summary(self, examples_per_second: float | None) -> dict:
        """Its keys in summary.json."""
        achieved = (self.model_flops_per_example * examples_per_second
                    if examples_per_second else None)
        mfu = self.mfu(examples_per_second) if examples_per_second else None
        return {"model_flops_per_example": self.model_flops_per_example,
                "achieved_flops_per_second": achieved,
                "peak_flops_per_second": self.peak_flops_per_second,
                "peak_source": self.peak_source, "peak_devices": self.devices,
                "mfu": round(mfu, 6) if mfu is not None else None}
