"""`bits_per_byte` of language models: the test split's cross-entropy in bits over the UTF-8
bytes its targets stand for (`info["token_bytes"]`), in summary.json, `tftrain evaluate` and
`tftrain report`, checked against an independent numpy computation on the exported model; one
run on one device and one under MirroredStrategy on the test process's 2 CPU devices.
A dataset without `token_bytes` gets no such metric, and a SavedModel compiled with it loads."""
import glob
import json
import math

import numpy as np
import pytest

from tests.conftest import run_cli
from tests.pipeline_testutil import load_all
from tests.shared_runs import text_lm_run  # noqa: F401  (a fixture)
from tftrain import config as config_lib
from tftrain.callbacks import curves
from tftrain.tasks.language_model import LanguageModelTask

# 5 steps, validated on 2 batches: the question is how bits_per_byte is computed (under
# MirroredStrategy), not how well the model learns; after 5 steps the model's NLL already varies
# by token (test perplexity 57 measured, uniform 105), and summary, numpy and identity agree to
# 1e-6 (5.825101, 5.825102, 5.825101). The test split is still evaluated whole.
STEPS = "train.epochs=1,train.steps_per_epoch=5,train.validation_steps=2"




def train_run(text_dir, run, overrides: str = ""):
    """`tftrain train --config=text_lm` for 5 steps on `text_dir` into `run`."""
    override = f"data.dir={text_dir},{STEPS}" + (f",{overrides}" if overrides else "")
    assert run_cli("train", "--config=text_lm", f"--model_dir={run}",
                   f"--params_override={override}") == 0
    return run


@pytest.fixture(scope="module")
def lm_run(text_lm_run):
    """text_lm on one device: the run tests/test_language_model.py asks questions of too
    (`tests/shared_runs.py`: 60 steps; read-only)."""
    return text_lm_run


@pytest.fixture(scope="module")
def mirrored_run(text_dir, tmp_path_factory):
    return train_run(text_dir, tmp_path_factory.mktemp("bpb") / "mirrored",
                     "runtime.strategy=mirrored,runtime.cpu_devices=2")


def token_bytes(text_dir) -> np.ndarray:
    return np.asarray(json.loads((text_dir / "dataset.json").read_text())["info"]["token_bytes"])


def numpy_bits_per_byte(run, text_dir) -> tuple[float, int, float]:
    """`(bits per byte, targets, bytes)` of the run's exported model on the test split, from
    its serving signature's logits: summed NLL / ln 2 over the summed bytes of the targets."""
    import tensorflow as tf

    (version,) = glob.glob(str(run / "export" / "[0-9]*"))
    serve = tf.saved_model.load(version).signatures["serving_default"]
    inputs, targets = load_all(text_dir, "test", 256)
    nats = 0.0
    for start in range(0, len(inputs), 256):
        logits = serve(inputs=tf.constant(inputs[start:start + 256]))["logits"].numpy()
        logits = logits.astype(np.float64).reshape(-1, logits.shape[-1])
        truth = targets[start:start + 256].reshape(-1)
        top = logits.max(axis=1)
        log_sum = top + np.log(np.exp(logits - top[:, None]).sum(axis=1))
        nats += float((log_sum - logits[np.arange(len(truth)), truth]).sum())
    size = float(token_bytes(text_dir)[targets.reshape(-1)].sum())
    return nats / math.log(2) / size, targets.size, size


@pytest.mark.parametrize("which", ["lm_run", "mirrored_run"])
def test_summary_bits_per_byte_is_the_models_nll_in_bits_per_byte_of_text(which, text_dir,
                                                                          request):
    run = request.getfixturevalue(which)
    summary = json.loads((run / "summary.json").read_text())
    test = summary["eval"]
    assert {"loss", "perplexity", "bits_per_byte", "accuracy"} <= set(test)
    assert "bits_per_byte" in summary["validation"]
    expected, targets, size = numpy_bits_per_byte(run, text_dir)
    # the identity: mean nats per target -> bits per target -> bits per byte
    identity = test["loss"] / math.log(2) * targets / size
    print(f"{which}: test bits_per_byte {test['bits_per_byte']:.6f}, numpy {expected:.6f}, "
          f"loss/ln2*targets/bytes {identity:.6f} ({targets} targets, {size:.0f} bytes), "
          f"perplexity {test['perplexity']:.3f}")
    assert test["bits_per_byte"] == pytest.approx(expected, rel=1e-4)
    assert test["bits_per_byte"] == pytest.approx(identity, rel=1e-4)
    assert size > targets  # the embedded text has a few multi-byte characters
    assert "val_bits_per_byte" in curves.read_history(str(run))[-1]


def test_evaluate_prints_it_and_report_shows_it(lm_run, text_dir, tmp_path, capsys):
    capsys.readouterr()
    output = tmp_path / "eval_test.json"
    assert run_cli("evaluate", f"--model={lm_run / 'export'}", f"--data={text_dir}",
                   "--split=test", f"--output={output}") == 0
    printed = capsys.readouterr().out
    assert "perplexity=" in printed and "bits_per_byte=" in printed, printed
    evaluated = json.loads(output.read_text())
    summary = json.loads((lm_run / "summary.json").read_text())
    assert evaluated["bits_per_byte"] == pytest.approx(summary["eval"]["bits_per_byte"], rel=1e-4)

    assert run_cli("report", str(lm_run), f"--output={tmp_path / 'report.png'}") == 0
    header, _, row = capsys.readouterr().out.splitlines()[:3]
    columns = [cell.strip() for cell in header.strip("|").split("|")]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert {"test bits_per_byte", "val bits_per_byte", "test perplexity"} <= set(columns)
    shown = float(cells[columns.index("test bits_per_byte")])
    assert shown == pytest.approx(summary["eval"]["bits_per_byte"], abs=1e-4)


def test_monitor_accepts_bits_per_byte(text_dir):
    for monitor in ("val_bits_per_byte", "bits_per_byte"):
        config = config_lib.build_config(
            "text_lm", overrides=f"data.dir={text_dir},train.monitor={monitor}")
        assert config.train.monitor == monitor
        assert LanguageModelTask.mode(monitor) == "min"


def test_no_token_bytes_no_metric_and_a_saved_model_keeps_it(tmp_path):
    import tf_keras as keras

    info = {"vocab_size": 6, "label_stats": {"kind": "tokens"}}
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 6))
    labels = rng.integers(0, 6, size=(3, 5))
    without = LanguageModelTask(info)
    assert "bits_per_byte" not in [m.name for m in without.metrics()]
    assert "bits_per_byte" not in without.evaluate(logits, labels)

    sizes = [0.0, 1.5, 1.0, 2.0, 1.0, 3.0]
    task = LanguageModelTask({**info, "token_bytes": sizes})
    result = task.evaluate(logits, labels)
    assert result["bits_per_byte"] == pytest.approx(
        result["loss"] / math.log(2) * labels.size / np.take(sizes, labels).sum())

    inputs = keras.Input((5,), dtype="int32")
    model = keras.Model(inputs, keras.layers.Dense(6)(keras.layers.Embedding(6, 4)(inputs)))
    model.compile(loss=task.loss(), metrics=task.metrics())
    before = model.evaluate(labels, labels, verbose=0, return_dict=True)
    model.save(str(tmp_path / "saved"), save_format="tf")
    loaded = keras.models.load_model(str(tmp_path / "saved"))
    after = loaded.evaluate(labels, labels, verbose=0, return_dict=True)
    assert after["bits_per_byte"] == pytest.approx(before["bits_per_byte"], rel=1e-6)
    outputs = model.predict(labels, verbose=0)
    assert before["bits_per_byte"] == pytest.approx(
        task.evaluate(outputs, labels)["bits_per_byte"], rel=1e-5)
    (metric,) = [m for m in loaded.metrics if m.name == "bits_per_byte"]
    assert type(metric).__name__ == "BitsPerByte"  # the class, not a generic stand-in
    assert metric.get_config()["token_bytes"] == sizes


def test_monitoring_bits_per_byte_on_a_dataset_without_token_bytes_is_one_line(text_dir):
    from tftrain import tasks
    from tftrain.errors import ConfigError

    manifest = json.loads((text_dir / "dataset.json").read_text())
    del manifest["info"]["token_bytes"]
    config = config_lib.build_config("text_lm", overrides="train.monitor=val_bits_per_byte")
    with pytest.raises(ConfigError, match="train.monitor=val_bits_per_byte needs the bytes"):
        tasks.resolve(config, manifest)
