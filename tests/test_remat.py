"""Recomputation (`model.params.remat`): the same training, through the CLI as a user runs it,
with each Transformer block's activations recomputed in the backward pass. A pure memory
switch: the same seed gives the same weights, names and checkpoints either way."""
import json
import os

import numpy as np
import pytest
import tf_keras as keras

from tests import forked_cli
from tests.conftest import Crash, crash_at
from tftrain.engine.export import saved_model_dir
from tftrain.models.recompute import recomputed_model_class

TIMEOUT = 600
# 3 steps; the validation and the final test on one batch each: the tests ask whether a
# recomputed model trains, exports and keeps its layouts, not how well it learns.
STEPS = "train.steps=3,train.validation_steps=1,train.test_steps=1"
# lm_run: recomputed, deterministic, backed up every step (a plain run resumes from its backups)
LM_RUN = f"{STEPS},train.deterministic=true,train.backup_every_steps=1,model.params.remat=true"


def trained(cwd, name: str, config: str, overrides: str) -> None:
    """Trains `config` into runs/<name> in its own process (op determinism is process-wide:
    `tests/forked_cli.py`)."""
    done = forked_cli.run(["train", f"--config={config}", f"--model_dir=runs/{name}",
                           f"--params_override={overrides}"], cwd=cwd,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]


def assert_same_weights(recomputed: list, kept: list) -> None:
    assert [w.shape for w in recomputed] == [w.shape for w in kept]
    for a, b in zip(recomputed, kept):
        np.testing.assert_allclose(a, b, atol=1e-5)


def _built(name: str, remat: bool):
    """The model `name` with (or without) recomputation, from seed 0."""
    from tftrain import models

    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    return models.build_model(name, {"width": 32, "num_layers": 2, "num_heads": 4,
                                     "mlp_width": 64, "dropout": 0.0, "remat": remat},
                              (16,), 50, {"vocab_size": 50, "sequence_length": 16})


def _compiled(model):
    """`model` compiled with text_lm's Adam."""
    from tftrain import config as config_lib
    from tftrain.training import optimizers

    train_config = config_lib.build_config("text_lm", {}, "").train
    model.compile(optimizers.make_optimizer(train_config, 20, 20),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), run_eagerly=True)
    return model


@pytest.mark.parametrize("name,steps", [("transformer_lm", 20), ("transformer", 5)])
def test_recomputation_changes_no_weight_name_or_step(name, steps):
    """One seed, remat off and on: the same variables (names, values), then `steps` of the
    run's Adam to the same weights (recomputation changes what is kept, not what is computed).
    The steps run eagerly: `tf.recompute_grad` recomputes the block in the backward pass there
    as in a graph, for ~1 s of steps instead of ~5 s of tracing (the CLI runs below train the
    recomputed blocks in a graph)."""
    import tensorflow as tf

    ids = np.random.default_rng(0).integers(1, 50, (8, 16))
    labels = ids if name == "transformer_lm" else ids[:, 0] % 50
    runs = []
    for remat in (False, True):
        model = _compiled(_built(name, remat))
        start = [(w.name, w.numpy()) for w in model.weights]
        for _ in range(steps):
            model.train_on_batch(tf.constant(ids, tf.int32), labels)
        runs.append((start, model.get_weights()))
    (kept_start, kept), (recomputed_start, recomputed) = runs
    assert [n for n, _ in recomputed_start] == [n for n, _ in kept_start]
    assert "block_0_mlp_in/kernel:0" in [n for n, _ in kept_start]
    for (_, a), (_, b) in zip(recomputed_start, kept_start):
        np.testing.assert_array_equal(a, b)
    assert any(np.abs(a - b).max() > 1e-3 for a, b in zip(kept, [w for _, w in kept_start]))
    assert_same_weights(recomputed, kept)


def test_a_recomputed_models_checkpoint_restores_into_the_plain_model(tmp_path):
    """Weights and optimizer slots written by a recomputed model restore into the plain model
    (the other way, a backup of a plain run resumed with remat on, runs through the CLI below)."""
    import tensorflow as tf

    recomputed = _compiled(_built("transformer_lm", True))
    ids = np.random.default_rng(1).integers(1, 50, (4, 16))
    recomputed.train_on_batch(tf.constant(ids, tf.int32), ids)
    path = tf.train.Checkpoint(model=recomputed).write(str(tmp_path / "ckpt"))
    plain = _compiled(_built("transformer_lm", False))
    plain.optimizer.build(plain.trainable_variables)
    tf.train.Checkpoint(model=plain).read(path).assert_existing_objects_matched()
    saved = recomputed.optimizer.variables
    assert len(saved) == len(plain.optimizer.variables) > 2 * len(plain.trainable_variables)
    for a, b in zip(plain.optimizer.variables + plain.weights, saved + recomputed.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_a_plain_runs_backup_resumes_with_recomputation(lm_run, text_dir, monkeypatch,
                                                        restore_determinism):
    """text_lm without recomputation crashes after 2 of lm_run's 3 steps (backed up every
    step); the same command with model.params.remat=true resumes from the backup and exports
    lm_run's weights (the uninterrupted run, recomputed from the start) within 1e-5."""
    from tftrain import config as config_lib
    from tftrain.engine import train

    overrides = f"data.dir={text_dir},{LM_RUN}"
    run_dir = str(lm_run / "runs/plain-then-remat")
    make_callbacks = train.make_callbacks
    monkeypatch.setattr(train, "make_callbacks",
                        lambda *a, **k: make_callbacks(*a, **k) + [crash_at(2)])
    with pytest.raises(Crash):
        train.train(config_lib.build_config("text_lm", overrides=overrides
                                            + ",model.params.remat=false"), run_dir)
    monkeypatch.setattr(train, "make_callbacks", make_callbacks)
    summary = train.train(config_lib.build_config("text_lm", overrides=overrides), run_dir)
    assert summary["steps"] == 3 and summary["resumed_from"] == [0, 2], summary["resumed_from"]
    recomputed_model_class()  # registered, for loading the exports
    resumed, uninterrupted = (
        keras.models.load_model(saved_model_dir(os.path.join(path, "export")), compile=False)
        for path in (run_dir, str(lm_run / "runs/remat")))
    assert len(resumed.weights) == len(uninterrupted.weights) > 10
    for a, b in zip(resumed.weights, uninterrupted.weights):
        assert a.name == b.name
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5)


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory, text_dir):
    """text_lm with recomputation and deterministic ops, on the session's converted text
    (converted as text_lm's default data path converts it): the uninterrupted run that a plain
    run resumed with recomputation must equal, and the export `generate` reads."""
    cwd = tmp_path_factory.mktemp("user")
    trained(cwd, "remat", "text_lm", f"data.dir={text_dir},{LM_RUN}")
    return cwd


def test_a_recomputed_language_model_trains_exports_and_generates(lm_run, cli, capfd):
    cwd = lm_run
    summary = json.loads((cwd / "runs/remat/summary.json").read_text())
    assert summary["steps"] == 3 and np.isfinite(summary["eval"]["loss"])
    params = (cwd / "runs/remat/params.yaml").read_text()
    assert "remat: true" in params and "width: 64" in params  # the config's model, recomputed
    capfd.readouterr()
    code = cli("generate", f"--model_dir={cwd / 'runs/remat'}", "--prompt=The ",
               "--max_tokens=5", "--seed=1")
    generated = capfd.readouterr()
    assert code == 0 and generated.out.startswith("The "), generated.err[-2000:]
    # Loading the export restores each block's gradient function, quietly (120 warning lines
    # of TensorFlow's at 20 blocks before tftrain hid them)
    assert "unsaved custom gradients" not in generated.err, generated.err[-2000:]


def test_remat_with_dropout_is_refused_in_one_line(tmp_path, text_dir, cli, capfd):
    # With dropout (0.1, as text_classification ships), recomputation would draw other masks:
    # one line, raised while the model is built (in-process: no step runs before it).
    code = cli("train", "--config=text_lm", f"--model_dir={tmp_path / 'refused'}",
               f"--params_override=data.dir={text_dir},model.params.dropout=0.1,"
               "model.params.remat=true")
    err = capfd.readouterr().err
    assert code == 2, err[-2000:]
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in err, err[-2000:]
    assert "model.params.dropout=0" in errors[0] and "recomputed" in errors[0], errors


def test_a_recomputed_models_export_can_be_fine_tuned(lm_run):
    """The export keeps tf.recompute_grad's custom gradients: a model loaded from it takes
    gradients (saved without them, its recomputed blocks have none: `No gradient defined for
    operation IdentityN`), so fine-tuning from an export works."""
    import tensorflow as tf
    import tf_keras as keras

    from tftrain.engine.export import register_text_ops, saved_model_dir

    register_text_ops()
    model = keras.models.load_model(saved_model_dir(str(lm_run / "runs/remat/export")),
                                    compile=False)
    tokens = tf.ones((2, model.input_shape[1]), tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model(tokens, training=True))
    gradients = tape.gradient(loss, model.trainable_variables)
    assert gradients and all(g is not None for g in gradients)
