"""Fast unit tests of `reader.ReadOptions` (defaults and checks) and of the worker count the
evaluation input reads from its strategy; no input pipeline is run."""
import dataclasses
import inspect
import types

import pytest
import tensorflow as tf

from tftrain.config_schema import CACHE_MODES
from tftrain.data import reader
from tftrain.data.reader import ReadOptions
from tftrain.errors import DataError


def test_defaults_are_loads_defaults():
    load_defaults = {name: p.default for name, p in inspect.signature(reader.load).parameters.items()}
    for field in dataclasses.fields(ReadOptions):
        if field.name in ("training", "drop_remainder", "deterministic"):
            continue  # required, or resolved from None by `load`
        assert field.default == load_defaults[field.name], field.name
    options = ReadOptions(training=False)
    assert (options.drop_remainder, options.deterministic, options.seed) == (False, True, None)


def test_options_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ReadOptions(training=True).seed = 3


@pytest.mark.parametrize("changes", [
    {}, {"last_stage": "read"}, {"last_stage": "parse"},
    *({"cache": mode} for mode in CACHE_MODES),
    {"training": True, "repeat": True, "start_batch": 7},
])
def test_valid_options_pass(changes):
    ReadOptions(**{"training": False, **changes}).check()


@pytest.mark.parametrize("changes, words", [
    ({"last_stage": "decoded"}, "last_stage='decoded' is not one of read, parse, decode"),
    ({"cache": "memory"}, "cache='memory' is not one of none, records, decoded"),
    ({"training": True, "start_batch": 1}, "start_batch needs a repeated training input"),
    ({"repeat": True, "start_batch": 1}, "start_batch needs a repeated training input"),
])
def test_invalid_options_raise(changes, words):
    with pytest.raises(DataError, match=words):
        ReadOptions(**{"training": False, **changes}).check()


def test_load_checks_its_options_before_it_opens_the_data(tmp_path):
    with pytest.raises(DataError, match="cache='memory'"):
        reader.load(str(tmp_path / "missing"), "train", 8, training=False, cache="memory")


def _strategy(resolver, replicas: int, local_devices: int):
    """Stands in for a strategy: the public attributes `input_workers` reads."""
    extended = types.SimpleNamespace(worker_devices=tuple(f"/cpu:{i}" for i in range(local_devices)))
    return types.SimpleNamespace(cluster_resolver=resolver, num_replicas_in_sync=replicas,
                                 extended=extended)


@pytest.mark.parametrize("strategy, workers", [
    (_strategy(None, 2, 2), 1),  # MirroredStrategy: no cluster resolver
    (_strategy(object(), 2, 1), 2),  # MultiWorkerMirroredStrategy: 2 workers, 1 device each
    (_strategy(object(), 8, 2), 4),  # 4 workers, 2 devices each
    (_strategy(object(), 1, 1), 1),  # MultiWorkerMirroredStrategy on one machine
    (_strategy(object(), 8, 8), 1),  # TPUStrategy: one program feeds every core
])
def test_input_workers(strategy, workers):
    assert reader.input_workers(strategy) == workers


def test_input_workers_of_the_default_strategy():
    assert reader.input_workers(tf.distribute.get_strategy()) == 1


def test_evaluation_shards_by_example_only_across_workers():
    dataset = tf.data.Dataset.range(4)
    assert reader._shard_by_example_across_workers(dataset, 1) is dataset
    sharded = reader._shard_by_example_across_workers(dataset, 2)
    assert (sharded.options().experimental_distribute.auto_shard_policy
            == tf.data.experimental.AutoShardPolicy.DATA)
