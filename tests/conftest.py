"""Shared test fixtures.

The test process splits its CPU into 2 logical devices before TensorFlow starts, so that
MirroredStrategy over 2 replicas runs in-process (as `runtime.cpu_devices=2` does in a run).
"""
import os
import sys

import pytest

import tftrain  # noqa: F401  (selects tf-keras before TensorFlow is imported)

TEST_CPU_DEVICES = 2


def pytest_configure(config):
    from tftrain import quiet_start

    # The CPU's measured matmul peak (MFU's denominator) is cached here, not in the home of
    # whoever runs the tests; each test process and the runs it starts share it.
    os.environ.setdefault("TFTRAIN_CACHE_DIR", os.path.join(
        config.rootpath, ".pytest_cache", "tftrain"))

    quiet_start.import_tensorflow()
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(TEST_CPU_DEVICES)])


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory):
    """The digits dataset converted once for the whole session (read-only for tests), exactly
    as the default path converts it (`tftrain train` with no dataset yet): one shard per split.
    Tests that need several shards convert their own."""
    from pipelines import load_pipeline
    from tftrain.data.writer import write_dataset

    path = str(tmp_path_factory.mktemp("digits") / "digits")
    write_dataset(load_pipeline("digits"), "", path)
    return path


@pytest.fixture(scope="session")
def text_dir(tmp_path_factory):
    """The embedded text converted once per test process as `tftrain train --config=text_lm`
    converts it (read-only for tests)."""
    from tests.pipeline_testutil import convert

    path = tmp_path_factory.mktemp("text") / "text_lm"
    convert("text", "", path, num_shards=None, workers=1, sequence_length=64)
    return path


def run_cli(*args):
    """Runs `tftrain <args>` in-process; returns its exit code."""
    from tftrain.cli import run

    with pytest.raises(SystemExit) as exited:
        run(["tftrain", *args])
    return exited.value.code or 0


@pytest.fixture
def cli():
    return run_cli


PYTHON = sys.executable
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# The files that take longest, run first: `make test` runs one file per pytest process in
# collection order (`--dist loadfile`), so a long file collected late keeps one process busy
# alone at the end (the make demo test did, for ~5 of 23 minutes).
LONGEST_FIRST = ("test_documented_commands.py", "test_multiworker.py", "test_launch_restarts.py",
                 "test_fault_injection.py", "test_wheel.py", "test_dtensor.py", "test_check.py",
                 "test_dtensor_transformer.py", "test_applications.py", "test_language_model.py")


def pytest_collection_modifyitems(config, items):
    def rank(item):
        name = os.path.basename(str(item.fspath))
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order inside each file is kept
