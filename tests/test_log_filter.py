"""The default verbosity's log (tftrain.log_filter) on records that real library code logs.

The records come from TensorFlow's and tf-keras's own functions, through the logging module, to
a handler that carries the filter as absl's handler carries it in a `tftrain` command.
"""
import logging
import warnings

import pytest
from absl import logging as absl_logging

from tftrain import log_filter, quiet_start


class Collecting(logging.Handler):
    """Keeps the records that pass its filters."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)

    def messages(self, text: str) -> list[str]:
        return [r.getMessage() for r in self.records if text in r.getMessage()]


@pytest.fixture
def verbose_libraries():
    """absl's and TensorFlow's loggers at `level`: every record they make reaches the handlers."""
    tf_logger = logging.getLogger("tensorflow")
    levels = absl_logging.get_verbosity(), tf_logger.level

    def set_level(level):
        absl_logging.set_verbosity(level)
        tf_logger.setLevel(logging.DEBUG if level == absl_logging.DEBUG else logging.INFO)

    try:
        yield set_level
    finally:
        absl_logging.set_verbosity(levels[0])
        tf_logger.setLevel(levels[1])


def collecting(*filters) -> Collecting:
    """A handler on the root logger (where absl's and TensorFlow's loggers propagate)."""
    handler = Collecting()
    for f in filters:
        handler.addFilter(f)
    logging.getLogger().addHandler(handler)
    return handler


@pytest.fixture
def shown(verbose_libraries):
    """What passes a fresh QuietFilter, with the loggers at INFO (as `install` sets absl's)."""
    verbose_libraries(absl_logging.INFO)
    handler = collecting(log_filter.QuietFilter())
    try:
        yield handler
    finally:
        logging.getLogger().removeHandler(handler)


def test_a_library_warning_that_matters_is_shown_exactly_once(shown):
    import tf_keras as keras

    for _ in range(3):  # tf-keras warns on every construction; the user reads it once
        keras.optimizers.Adam(lr=0.01)
    warned = [r for r in shown.records if "`lr` is deprecated" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in shown.records]
    assert warned[0].levelno == logging.WARNING
    assert "tf_keras" in warned[0].pathname  # it is the library's record, not one of ours


def test_different_library_warnings_each_show_once(shown):
    import tensorflow as tf
    import tf_keras as keras

    keras.optimizers.Adam(lr=0.01)
    variables = [tf.Variable(1.0), tf.Variable(2.0)]
    for _ in range(2):  # "Gradients do not exist for variables ...": another warning, once too
        keras.optimizers.SGD(0.1).apply_gradients(zip([tf.constant(1.0), None], variables))
    assert len(shown.messages("`lr` is deprecated")) == 1
    assert len(shown.messages("Gradients do not exist for variables")) == 1


def test_library_chatter_and_info_are_hidden_and_own_lines_are_not(shown, tmp_path):
    import tf_keras as keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.save(str(tmp_path / "saved"))  # INFO "Assets written to" (TensorFlow's)
    keras.models.load_model(str(tmp_path / "saved"))  # WARNING "No training configuration ..."
    absl_logging.info("tftrain's own line")
    absl_logging.warning("tftrain's own warning")
    absl_logging.warning("tftrain's own warning")
    messages = [r.getMessage() for r in shown.records]
    assert not [m for m in messages if "No training configuration found" in m], messages
    assert not [r for r in shown.records if r.levelno < logging.WARNING
                and "tftrain's own" not in r.getMessage()], messages
    assert shown.messages("tftrain's own line") == ["tftrain's own line"]
    # de-duplication is for the libraries' warnings only: ours are said as often as logged
    assert len(shown.messages("tftrain's own warning")) == 2


def test_the_same_library_records_all_show_without_the_filter(tmp_path, verbose_libraries):
    """What `-v 1` gives: no QuietFilter, so the chatter and every repetition are there."""
    import tf_keras as keras

    verbose_libraries(absl_logging.DEBUG)
    handler = collecting()
    try:
        keras.optimizers.Adam(lr=0.01)
        keras.optimizers.Adam(lr=0.01)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.save(str(tmp_path / "saved"))
        keras.models.load_model(str(tmp_path / "saved"))
    finally:
        logging.getLogger().removeHandler(handler)
    assert len(handler.messages("`lr` is deprecated")) == 2
    assert handler.messages("No training configuration found in save file")
    assert handler.messages("Assets written to")  # a library INFO line


def test_install_puts_one_filter_on_absl_handler(monkeypatch):
    handler = absl_logging.get_absl_handler()
    before = list(handler.filters)
    monkeypatch.setattr(quiet_start, "HIDE_NATIVE_CHATTER", False)
    verbosity = absl_logging.get_verbosity()
    try:
        with warnings.catch_warnings():
            log_filter.install()
            log_filter.install()  # a second command in one process adds no second filter
            assert any(f[1] is not None and "Using new converter" in f[1].pattern
                       for f in warnings.filters)  # the converter's UserWarning, hidden
        assert sum(isinstance(f, log_filter.QuietFilter) for f in handler.filters) == 1
        assert quiet_start.HIDE_NATIVE_CHATTER
        assert absl_logging.get_verbosity() == absl_logging.INFO
    finally:
        for f in list(handler.filters):
            if f not in before:
                handler.removeFilter(f)
        absl_logging.set_verbosity(verbosity)


def test_kerass_slow_callback_warning_is_chatter():
    """On a table's millisecond batches Keras calls tftrain's own callbacks slow: nothing the
    user can act on. Other tf_keras warnings still show."""
    from tftrain.log_filter import QuietFilter

    def record(message):
        return logging.LogRecord("absl", logging.WARNING,
                                 "/venv/site-packages/tf_keras/src/callbacks.py", 376, message,
                                 None, None)

    quiet = QuietFilter()
    assert not quiet.filter(record(
        "Callback method `on_train_batch_end` is slow compared to the batch time (batch time: "
        "0.0013s vs `on_train_batch_end` time: 0.0026s). Check your callbacks."))
    assert quiet.filter(record("Callback method `on_train_batch_end` is missing"))
