"""TPU readiness: what must hold before a TPUStrategy run starts, checked before training.

Two moments. Before connecting, `tftrain.rules.before_connecting` (called first in
`train.run`) checks what needs no TensorFlow op: storage, precision, the batch split over the
replicas the environment names (else 8 assumed), and Python calls in the pipeline's decode
source. After connecting, `check_ready` checks what needs the real replica count and the built
input pipeline, before the model is built: the batch split over the real cores, static shapes
of one replica's training batches (`drop_remainder=True`), Python functions in the pipeline's
graph (fine on a TPU VM, an error where a TPU node's hosts run the input), and evaluation
splits that the dropped partial batch would leave empty. Errors raise ConfigError; advice
(bfloat16, `train.steps_per_execution` > 1, ...) is logged and returned. The checks themselves
live in `tftrain.rules`, which `tftrain check` runs without a TPU.
"""
from __future__ import annotations

from tftrain import config_schema as config_lib
from tftrain.rules import batch, input_pipeline, precision, raise_errors
from tftrain.rules.report import Target


def check_ready(config: config_lib.Config, strategy) -> list[str]:
    """Checks a TPU run before it starts (no-op for other strategies); returns the advice given."""
    from tftrain.data import foreign
    from tftrain.data import manifest as manifest_lib
    from tftrain.runtime.distribute import strategy_name

    if strategy_name(strategy) != "tpu":
        return []
    target = Target("tpu", strategy.num_replicas_in_sync, tpu=config.runtime.tpu or "local")
    # Foreign TFRecords (data.format=tfrecord) would be counted again: their partial batches
    # are not checked here.
    manifest = (manifest_lib.typed(foreign.read_manifest(config.data))
                if config.data.format != "tfrecord" else None)
    findings = batch.check(config, target, manifest)
    # One replica's training dataset, built as training builds it (in a throwaway graph: the
    # pipeline's ops are read, none is run).
    findings += input_pipeline.check(config, target)
    findings += precision.check(config, target)
    return raise_errors(findings, "TPU check")


def check_static(element_spec, config: config_lib.Config, replicas: int) -> list[str]:
    """Raises ConfigError for dynamic shapes or an uneven batch; returns advice (also logged).

    `element_spec` is that of one replica's training dataset.
    """
    target = Target("tpu", replicas, tpu=config.runtime.tpu or "local")
    findings = [batch.split(config, target)]
    findings += input_pipeline.static_shape_findings(element_spec)
    findings += precision.check(config, target) + [batch.steps_per_execution(config, None)]
    return raise_errors(findings, "TPU check")
