"""All training state resumes: a run preempted by a real SIGTERM (delivered to this process while
`fit` runs) and run again continues early stopping, reduce-on-plateau, the best checkpoint's
value, the learning-rate schedule and the step timer exactly where the backup left them, so it
ends as the uninterrupted run does.

The monitored metric is made flat on purpose (a learning rate of 1e-9 leaves val_accuracy
unchanged), so that the uninterrupted run's stopping epoch and learning rates are known
exactly and do not depend on the data order a resumed epoch reads.
"""
import json
import os
import signal
import threading
import time

import pytest

from tftrain import config as config_lib
from tftrain.engine import train
from tftrain.callbacks.callback_state import CallbackState
from tftrain.callbacks.preemption import Preempted, SigtermHandler
from tftrain.callbacks.step_timer import StepTimer

SMALL = ("model.name=mlp,model.params={hidden_units: [16]},data.batch_size=16,"
         "train.steps_per_epoch=4,train.monitor=val_accuracy")
# Flat metric: best at epoch 1; plateau halves the rate at epochs 3 and 5; early stop at 6.
FLAT = ("train.epochs=12,train.learning_rate=1.0e-9,train.early_stopping_patience=5,"
        "train.lr_schedule=plateau,train.plateau_patience=2,train.lr_decay_rate=0.5")


def _config(digits_dir, overrides):
    return config_lib.build_config("digits", overrides=f"data.dir={digits_dir},{SMALL},{overrides}")


class SigtermWhen:
    """Sends SIGTERM to this process once `path` exists (a backup of the running `fit`)."""

    def __init__(self, path, timeout=120):
        self.path, self.timeout, self.sent = path, timeout, False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self):
        deadline = time.monotonic() + self.timeout
        while not self._done.is_set() and time.monotonic() < deadline:
            if os.path.exists(self.path):
                self.sent = True
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.01)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join(5)
        return False


def curve(model_dir, key):
    """One key of every epoch in the run's curves.json."""
    with open(os.path.join(model_dir, "curves.json")) as f:
        return [epoch[key] for epoch in json.load(f)["epochs"]]


def _sigterm_during_validation(epoch: int):
    """A callback that sends this process SIGTERM as epoch `epoch`'s validation begins."""
    import tf_keras as keras

    class SigtermInValidation(keras.callbacks.Callback):
        sent = False

        def on_epoch_begin(self, index, logs=None):
            self.epoch = index

        def on_test_batch_begin(self, batch, logs=None):
            if self.epoch == epoch and not self.sent:
                SigtermInValidation.sent = True
                os.kill(os.getpid(), signal.SIGTERM)

    return SigtermInValidation()


@pytest.mark.parametrize("when", ["after_epoch_4_backup", "in_epoch_5_validation"])
def test_early_stopping_plateau_and_best_checkpoint_resume(tmp_path, digits_dir, monkeypatch,
                                                           when):
    # What the uninterrupted run does on the flat metric (see test_train_features for early
    # stopping and plateau on flat metrics): best at epoch 1, the rate halved after epochs 3
    # and 5 (the logged rate is the one the epoch trained with), early stop after epoch 6.
    # A SIGTERM during validation waits for the epoch's end: backed up mid-validation, the
    # resumed run would skip that epoch's validation and stop an epoch late.
    uninterrupted_epochs, uninterrupted_rates = 6, [1e-9, 1e-9, 1e-9, 5e-10, 5e-10, 2.5e-10]
    model_dir = str(tmp_path / "run")
    best = os.path.join(model_dir, "checkpoints", "best.index")
    marker = os.path.join(model_dir, "backup", "chief", "ckpt-4.index")  # after epoch 4
    if when == "in_epoch_5_validation":
        trigger = _sigterm_during_validation(epoch=4)
        make_callbacks = train.make_callbacks
        monkeypatch.setattr(train, "make_callbacks",
                            lambda *a, **k: make_callbacks(*a, **k) + [trigger])
        with pytest.raises(Preempted):
            train.train(_config(digits_dir, FLAT), model_dir)
        monkeypatch.setattr(train, "make_callbacks", make_callbacks)
        assert trigger.sent
    else:
        with SigtermWhen(marker) as sigterm, pytest.raises(Preempted):
            train.train(_config(digits_dir, FLAT), model_dir)
        assert sigterm.sent
    best_before = (os.stat(best).st_mtime_ns, open(best, "rb").read())
    summary = train.train(_config(digits_dir, FLAT), model_dir)

    assert summary["resumed_from"] is not None and summary["resumed_from"][0] >= 4
    # Patience counted before the kill still counts: the same stopping epoch. Without the
    # restored counters it would stop at epoch 10 (a fresh `best` at the first resumed epoch).
    assert summary["epochs"] == uninterrupted_epochs
    # Plateau: the same rates, epoch by epoch (its `wait` came back too: the second halving
    # comes after epoch 5, not 2 epochs after the resume), and the lowered rate is kept.
    assert curve(model_dir, "learning_rate") == pytest.approx(uninterrupted_rates)
    # The best checkpoint (epoch 1) is not overwritten by the resumed, not better, epochs.
    assert (os.stat(best).st_mtime_ns, open(best, "rb").read()) == best_before
    assert summary["seconds_per_step"] > 0


def test_learning_rate_schedule_position_resumes(tmp_path, digits_dir):
    # Staircase decay at each epoch end, preempted in the middle of epoch 2: the schedule is a
    # function of optimizer.iterations, which the backup restores.
    overrides = ("train.epochs=2,train.optimizer=sgd,train.learning_rate=0.01,"
                 "train.lr_schedule=step,train.lr_decay_epochs=1,train.lr_decay_rate=0.5,"
                 "train.backup_every_steps=2")
    model_dir = str(tmp_path / "run")
    marker = os.path.join(model_dir, "backup", "chief", "ckpt-3.index")  # epoch 2, step 2
    with SigtermWhen(marker) as sigterm, pytest.raises(Preempted):
        train.train(_config(digits_dir, overrides), model_dir)
    assert sigterm.sent
    summary = train.train(_config(digits_dir, overrides), model_dir)
    assert summary["resumed_from"] is not None
    assert summary["steps"] == 8  # no update lost or repeated
    assert curve(model_dir, "learning_rate") == pytest.approx([0.01, 0.005])


def test_a_run_killed_after_stopping_early_trains_no_more(tmp_path, digits_dir):
    # Preempted during the final export, after early stopping (best at 1, stop after 2): the
    # backup of the stopping epoch says training had stopped, so the rerun trains no epoch 3.
    overrides = "train.epochs=12,train.learning_rate=1.0e-9,train.early_stopping_patience=1"
    model_dir = str(tmp_path / "run")
    with SigtermWhen(os.path.join(model_dir, "export")) as sigterm, pytest.raises(Preempted):
        train.train(_config(digits_dir, overrides), model_dir)
    assert sigterm.sent and not os.path.exists(os.path.join(model_dir, "summary.json"))
    summary = train.train(_config(digits_dir, overrides), model_dir)
    assert summary["epochs"] == 2 and summary["steps"] == 8
    assert curve(model_dir, "epoch") == [1, 2]


def test_step_timer_adds_up_the_attempts():
    first = StepTimer(examples_per_step=10)
    first.epochs = [(4, 4.0), (4, 0.4), (4, 0.4)]  # a slow first (tracing) epoch, then 0.1 s/step
    resumed = StepTimer(examples_per_step=10)
    resumed.set_state(first.get_state())
    resumed.epochs = [(4, 2.0), (4, 0.8)]  # its own slow first epoch, then 0.2 s/step
    assert resumed.timed
    # Warm epochs of both attempts: (0.4 + 0.4 + 0.8) / 12 steps.
    assert resumed.seconds_per_step() == pytest.approx(1.6 / 12)
    assert resumed.examples_per_second() == pytest.approx(10 / (1.6 / 12))


def test_callback_state_round_trip_and_old_backups():
    import tf_keras as keras

    stopper = keras.callbacks.EarlyStopping(monitor="val_accuracy", mode="max", patience=3)
    stopper.wait, stopper.best, stopper.stopped_epoch, stopper.best_epoch = 2, 0.75, 0, 1
    timer = StepTimer(1)
    state = CallbackState([keras.callbacks.TerminateOnNaN(), stopper, timer])
    assert not state.load()  # nothing saved yet (a backup of an older tftrain): left alone
    model = keras.Sequential()
    model.stop_training = False
    state.save(model)
    stopper.wait, stopper.best = 0, -float("inf")
    assert state.load()
    assert (stopper.wait, stopper.best, type(stopper.wait)) == (2, 0.75, int)
    assert not state.loaded_stopped


def test_a_sigterm_after_the_last_step_stops_the_run_with_its_backup(tmp_path, digits_dir):
    """The signal arrives while the last epoch ends (after its last step, no step left to act
    on it): `fit` raises `Preempted` with the last epoch backed up, and the run trains no more."""
    import tf_keras as keras

    from tftrain.callbacks.backup import Backup, steps_done
    from tftrain.callbacks.preemption import PreemptionCallback
    from tftrain.data import load

    class SigtermAtTheLastEpochEnd(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == self.params["epochs"] - 1:
                os.kill(os.getpid(), signal.SIGTERM)

    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(10)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    dataset = load(digits_dir, "train", 16, training=True, repeat=True, seed=0)
    backup_dir = str(tmp_path / "backup")
    backup = Backup(backup_dir)
    with pytest.raises(Preempted, match="epoch 2 step 3"), SigtermHandler() as handler:
        model.fit(dataset, epochs=2, steps_per_epoch=3, verbose=0,
                  callbacks=[SigtermAtTheLastEpochEnd(), backup, PreemptionCallback(handler, backup)])
    assert handler.received and steps_done(backup_dir, 3) == 6


def test_a_sigterm_that_c_code_reports_as_another_error_is_still_preempted():
    """Raised from the handler inside TensorFlow's C code (tracing the export), CPython can turn
    the Preempted into `SystemError: ... bad argument to internal function` with the Preempted
    as its context (seen in this file's tests): the run still ends as preempted (exit 143), not
    in a traceback. An error of its own is left as it is."""

    with pytest.raises(Preempted, match="stopped by SIGTERM") as raised:
        with SigtermHandler():
            try:
                raise Preempted("stopped by SIGTERM; run the same command again to resume")
            except Preempted:
                raise SystemError("Objects/listobject.c:338: bad argument to internal function")
    assert raised.value.exit_code == 143
    with pytest.raises(SystemError):
        with SigtermHandler():
            raise SystemError("not a signal")


def test_a_sigterm_swallowed_on_the_way_still_ends_the_run_as_preempted():
    """A broad `except Exception` between the signal and the handler (a library's, or a
    fallback of ours) does not turn a preempted run into a finished one."""
    with pytest.raises(Preempted, match="run the same command again"):
        with SigtermHandler():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
            except Exception:
                pass
