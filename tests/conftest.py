"""Shared test fixtures.

The test process splits its CPU into 2 logical devices before TensorFlow starts, so that
MirroredStrategy over 2 replicas runs in-process (as `runtime.cpu_devices=2` does in a run).
"""
import contextlib
import gc
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
    # One thread per op, and one running the ops, in each test process and every command it
    # starts: the suite runs several processes on two cores, and TensorFlow's defaults (intra-
    # and inter-op pools as big as the machine in each) spend CPU spinning in pools that wait
    # for a core.
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
    os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")

    quiet_start.import_tensorflow()
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(TEST_CPU_DEVICES)])


def pytest_report_header(config):
    """The CPU the suite runs on (its speed decides the suite's time: docs/testing.md)."""
    from tftrain import host

    return f"cpu: {host.cpu_name()}, {os.cpu_count()} cores"


def pytest_unconfigure(config):
    """Stops this process's forkserver (`tests/forked_cli.py`, the converter) and waits for it,
    so the CPU time of the commands forked from it is counted with this process's children
    (`/usr/bin/time make test` reports the whole suite)."""
    import signal
    from multiprocessing import forkserver

    server = forkserver._forkserver
    if server._forkserver_pid is not None:  # ended now: it waits for no command a test left
        os.kill(server._forkserver_pid, signal.SIGKILL)
        os.waitpid(server._forkserver_pid, 0)
        server._forkserver_pid = None


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


class Crash(Exception):
    """The simulated failure of `crash_at`."""


def crash_at(step: int):
    """A Keras callback that raises `Crash` once `step` steps have run (counted over epochs):
    add it to `train.make_callbacks` to crash a run in-process after its backups."""
    import tf_keras as keras

    class CrashAt(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if self.epoch * self.params["steps"] + batch + 1 >= step:
                raise Crash(f"crashed after step {step}")

    return CrashAt()


@pytest.fixture
def restore_determinism():
    """train.deterministic switches process-wide settings on: off again after the test."""
    yield
    import tf_keras as keras
    from tensorflow.python.framework import config as tf_config  # no public switch back

    tf_config.disable_op_determinism()
    keras.backend.experimental.disable_tf_random_generator()


def run_cli(*args):
    """Runs `tftrain <args>` in-process, through the console script's entry point; returns its
    exit code (its stdout and stderr reach pytest's capsys/capfd as a process's would).

    The process-wide state a command changes is put back afterwards, so the next test starts as
    a new process would: environment variables, the working directory, sys.argv, warnings
    filters, absl's verbosity and the filters on its handler (`tftrain.log_filter`), the Python
    loggers' levels, the mixed-precision policy and Keras's layer-name counters (`clear_session`).
    What cannot be put back (op determinism once enabled, the number of logical devices, which
    is fixed at the first op) is why tests that depend on those start a process
    (`tests/forked_cli.py`)."""
    from tftrain.cli import run

    with isolated_process_state():
        with pytest.raises(SystemExit) as exited:
            run(["tftrain", *args])
    return exited.value.code or 0


@contextlib.contextmanager
def isolated_process_state():
    """Restores what a command run in-process changes in this process (see `run_cli`)."""
    import logging
    import warnings

    import tf_keras
    from absl import logging as absl_logging

    from tftrain import quiet_start

    environ, cwd, argv = dict(os.environ), os.getcwd(), list(sys.argv)
    handler = absl_logging.get_absl_handler()
    handler_filters, verbosity = list(handler.filters), absl_logging.get_verbosity()
    loggers = {name: logging.getLogger(name).level for name in ("", "tensorflow", "absl")}
    policy = tf_keras.mixed_precision.global_policy()
    hide_native = quiet_start.HIDE_NATIVE_CHATTER
    with warnings.catch_warnings():
        try:
            yield
        finally:
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(environ)
            sys.argv[:] = argv
            handler.filters[:] = handler_filters
            absl_logging.set_verbosity(verbosity)
            for name, level in loggers.items():
                logging.getLogger(name).setLevel(level)
            tf_keras.mixed_precision.set_global_policy(policy)
            tf_keras.backend.clear_session()
            quiet_start.HIDE_NATIVE_CHATTER = hide_native


@pytest.fixture
def cli():
    return run_cli


PYTHON = sys.executable
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# The files that take longest, run first: `make test` runs one file per pytest process in
# collection order (`--dist loadfile`), so a long file collected late keeps one process busy
# alone at the end (the make demo test did, for ~5 of 23 minutes).
LONGEST_FIRST = ("test_imagenet_recipe.py", "test_imagenet_recipe_check.py",
                 "test_documented_commands.py", "test_pipeline.py", "test_multiworker.py",
                 "test_launch_restarts.py", "test_remat.py", "test_fault_injection.py",
                 "test_exact_resume.py", "test_own_data_guide.py", "test_fuzz.py", "test_wheel.py",
                 "test_dtensor.py", "test_check.py", "test_dtensor_transformer.py",
                 "test_applications.py", "test_language_model.py", "test_optimize_cli.py",
                 "test_pipeline_workers.py", "test_big_quantize.py", "test_subwords.py",
                 "test_regression.py", "test_partition.py", "test_ema.py", "test_predict.py",
                 "test_imagenet_layout.py", "test_gradient_clipping.py", "test_class_weights.py",
                 "test_augment.py", "test_label_smoothing.py")


def pytest_collection_modifyitems(config, items):
    def rank(item):
        name = os.path.basename(str(item.fspath))
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order inside each file is kept


def pytest_collection_finish(session):
    """The test modules and what they import live as long as this process."""
    fewer_collections()


def fewer_collections():
    """For a test process that lives through many commands in-process (a pytest worker, the fuzz
    driver): what is alive now out of the garbage collector's walks, as `quiet_start` puts
    TensorFlow's, and a full collection per million allocations rather than per 70,000 (the
    default), each walking a heap of hundreds of thousands of objects (1-5 s of CPU per worker
    per file group, 2.9 s in 200 fuzz cases: `gc.callbacks`)."""
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


def _cpu_seconds() -> float:
    """CPU used so far by this process, its waited children and its forkserver's commands."""
    from multiprocessing import forkserver

    times = os.times()
    total = times.user + times.system + times.children_user + times.children_system
    server = forkserver._forkserver._forkserver_pid
    if server:
        try:
            with open(f"/proc/{server}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")
        except FileNotFoundError:
            pass
    return total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With TFTRAIN_TEST_CPU_LOG=PATH, appends each test's CPU seconds (setup, call and
    teardown, with the processes it ran) to PATH: where the suite's CPU budget goes."""
    log = os.environ.get("TFTRAIN_TEST_CPU_LOG")
    before = _cpu_seconds() if log else 0.0
    yield
    if log:
        with open(log, "a") as f:
            f.write(f"{_cpu_seconds() - before:.1f}\t{item.nodeid}\n")
