"""Recomputation (`model.params.remat`): the same training, through the CLI as a user runs it,
with each Transformer block's activations recomputed in the backward pass."""
import json
import os

import numpy as np
import pytest
import tf_keras as keras

from tests import forked_cli
from tftrain.engine.export import saved_model_dir
from tftrain.models.transformer import recomputed_block_class

TIMEOUT = 600
# 3 steps; the validation and the final test on one batch each: the tests ask whether a
# recomputed model trains, exports and keeps its layouts, not how well it learns.
STEPS = "train.steps=3,train.validation_steps=1,train.test_steps=1"


def trained(cwd, name: str, config: str, overrides: str, *flags, load: bool = True) -> list:
    """Trains `config` into runs/<name> in its own process (op determinism and the DTensor
    mesh's logical devices are process-wide: `tests/forked_cli.py`); returns the exported
    model's weights, loaded by tf-keras (`load=False`: does not load it, returns [])."""
    done = forked_cli.run(["train", f"--config={config}", f"--model_dir=runs/{name}",
                           f"--params_override={overrides}", *flags], cwd=cwd,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    if not load:
        return []
    recomputed_block_class()  # registered, for loading the export
    model = keras.models.load_model(saved_model_dir(str(cwd / "runs" / name / "export")),
                                    compile=False)
    return model.get_weights()


def assert_same_weights(recomputed: list, kept: list) -> None:
    assert [w.shape for w in recomputed] == [w.shape for w in kept]
    for a, b in zip(recomputed, kept):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("name", ["transformer_lm", "transformer"])
def test_recomputed_blocks_train_to_the_same_weights(name):
    """From the same weights, five steps of the run's Adam: the same weights
    (recomputation changes what is kept, not what is computed). A CLI run of each draws its
    blocks' initial weights in another order, so the runs are compared from equal weights.
    The steps run eagerly: `tf.recompute_grad` recomputes the block in the backward pass there
    as in a graph, and the two models cost ~1 s of steps instead of ~5 s of tracing each (the
    CLI runs below train the recomputed blocks in a graph)."""
    import tensorflow as tf

    from tftrain import config as config_lib, models
    from tftrain.training import optimizers

    train_config = config_lib.build_config("text_lm", {}, "").train
    trained_weights = []
    for remat in (False, True):
        keras.utils.set_random_seed(0)
        model = models.build_model(name, {"width": 32, "num_layers": 2, "num_heads": 4,
                                          "mlp_width": 64, "dropout": 0.0, "remat": remat},
                                   (16,), 50, {"vocab_size": 50, "sequence_length": 16})
        if trained_weights:
            model.set_weights(start)
        start = model.get_weights()
        model.compile(optimizers.make_optimizer(train_config, 5, 5),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      run_eagerly=True)
        ids = np.random.default_rng(0).integers(1, 50, (8, 16))
        labels = ids if name == "transformer_lm" else ids[:, 0] % 50
        for _ in range(5):
            model.train_on_batch(tf.constant(ids, tf.int32), labels)
        trained_weights.append(model.get_weights())
    kept, recomputed = trained_weights
    assert any(np.abs(a - b).max() > 1e-3 for a, b in zip(kept, start))  # it trained
    assert_same_weights(recomputed, kept)


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory, text_dir):
    """text_lm with recomputation and deterministic ops, on the session's converted text
    (converted as text_lm's default data path converts it). Its export is not loaded into
    tf-keras here (its weights were never read): `generate` loads it through its signatures,
    and test_a_recomputed_model_on_a_dtensor_mesh loads a recomputed model's export (the same
    ordinary model, its weights gathered from the mesh) into tf-keras."""
    cwd = tmp_path_factory.mktemp("user")
    trained(cwd, "remat", "text_lm", f"data.dir={text_dir},{STEPS},train.deterministic=true,"
            "model.params.remat=true", load=False)
    return cwd


def test_a_recomputed_language_model_trains_exports_and_generates(lm_run, cli, capsys):
    cwd = lm_run
    summary = json.loads((cwd / "runs/remat/summary.json").read_text())
    assert summary["steps"] == 3 and np.isfinite(summary["eval"]["loss"])
    params = (cwd / "runs/remat/params.yaml").read_text()
    assert "remat: true" in params and "width: 64" in params  # the config's model, recomputed
    capsys.readouterr()
    code = cli("generate", f"--model_dir={cwd / 'runs/remat'}", "--prompt=The ",
               "--max_tokens=5", "--seed=1")
    generated = capsys.readouterr()
    assert code == 0 and generated.out.startswith("The "), generated.err[-2000:]


def test_a_recomputed_model_on_a_dtensor_mesh(tmp_path, text_dir):
    """The blocks' weights keep their Megatron layouts inside a recomputed block."""
    weights = trained(tmp_path, "remat-dtensor", "text_lm",
                      f"data.dir={text_dir},{STEPS},model.params.remat=true,"
                      "runtime.strategy=dtensor", "--mesh=batch:2,model:2")
    assert all(np.isfinite(w).all() for w in weights)
    summary = json.loads((tmp_path / "runs/remat-dtensor/summary.json").read_text())
    layouts = summary["dtensor"]["layouts"]
    assert layouts["block_0.attention._query_dense.kernel"] == "unsharded,model,unsharded"
    assert layouts["block_1.mlp_out.kernel"] == "model,unsharded"
    assert summary["memory"]["weights_bytes_per_device"] == (
        summary["dtensor"]["memory"]["weights_bytes_per_device"])


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
