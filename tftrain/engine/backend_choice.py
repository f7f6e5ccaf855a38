"""The backend `runtime.strategy` names, built before any other TensorFlow op runs."""
from __future__ import annotations

from tftrain import config as config_lib
from tftrain.engine import backends, pipeline_backend


def create(config: config_lib.Config) -> backends.Backend:
    """A DTensor mesh, pipeline stages, or a `tf.distribute` strategy (every other name)."""
    if config.runtime.strategy == "dtensor":
        return backends.DTensorBackend(config)
    if config.runtime.strategy == "pipeline":
        return pipeline_backend.PipelineBackend(config)
    return backends.StrategyBackend(config)
