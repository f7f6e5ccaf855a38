"""Model parallelism with DTensor (`runtime.strategy: dtensor`).

The pytest process has 2 CPU devices (conftest); a 2x2 mesh needs 4, which must be configured
before TensorFlow starts, so every 4-device check runs in a process of its own with a timeout:
a `tftrain` command in a child of the forked-CLI server (`tests/forked_cli.py`, which has not
touched the devices), a script of the test's own in another child of that server
(`tests/dtensor_forked.py`).
"""
import json
import os
import signal
import subprocess
import time

import pytest

from tests import documented, dtensor_forked, forked_cli
from tests.conftest import PYTHON, REPO
from tests.launch_testutil import Running
from tftrain import config as config_lib
from tftrain.runtime import dtensor_layouts as layouts
from tftrain.errors import ConfigError

TIMEOUT = 600
MESH = {"batch": 2, "model": 2}


def _env():
    return {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}


def _config(overrides: str):
    return config_lib.build_config("digits_dtensor", {}, overrides)


# --- Config-time checks (no devices needed) -----------------------------------------------------

@pytest.mark.parametrize("overrides, message", [
    ("runtime.mesh=''", "needs runtime.mesh (or --mesh)"),
    ("runtime.mesh='batch:2,data:2'", "unknown dimension 'data'"),
    ("runtime.mesh='batch:x'", "bad entry 'batch:x'"),
    ("runtime.cpu_devices=2", "needs 4 devices but runtime.cpu_devices=2"),
    ("data.batch_size=33", "data.batch_size (33) must be divisible by the mesh's batch dim"),
    ("runtime.mixed_precision=mixed_float16", "float32 only"),
    ("train.grad_accum_steps=2", "does not accumulate gradients"),
    ("runtime.jit_compile=true", "does not compile its steps with XLA"),
    ('runtime.layout_rules={"dense.*kernel": "unsharded,weights"}', "has 'weights'"),
    ('runtime.layout_rules={"dense.*kernel": "model,model"}', "uses a mesh dimension twice"),
    ('runtime.layout_rules={"dense[": "unsharded,model"}', "not a valid regex"),
])
def test_config_errors(overrides, message):
    with pytest.raises(ConfigError) as error:
        _config(overrides)
    assert message in str(error.value)


def test_mesh_flag_and_defaults():
    config = config_lib.build_config("digits_dtensor", {"runtime.mesh": "model:4"}, "")
    assert layouts.parse_mesh(config.runtime.mesh) == {"batch": 1, "model": 4}
    assert config.runtime.strategy == "dtensor" and config.runtime.layout_rules == {}


MLP = [  # the weights of registry `mlp` on 8x8x1 inputs, 10 classes, as the rules see them
    layouts.Weight("dense.kernel", (64, 256), "Dense"),
    layouts.Weight("dense.bias", (256,), "Dense"),
    layouts.Weight("dense_1.kernel", (256, 128), "Dense"),
    layouts.Weight("dense_1.bias", (128,), "Dense"),
    layouts.Weight("logits.kernel", (128, 10), "Dense"),
    layouts.Weight("logits.bias", (10,), "Dense"),
]
CONV = [layouts.Weight("conv2d.kernel", (3, 3, 1, 32), "Conv2D"),
        layouts.Weight("conv2d.bias", (32,), "Conv2D")] + MLP[4:]


def test_default_rules_split_dense_layers():
    plan = layouts.resolve(MLP, layouts.make_rules("mlp", {}, MESH), MESH)
    assert plan == {"dense.kernel": ("unsharded", "model"), "dense.bias": ("model",),
                    "dense_1.kernel": ("unsharded", "model"), "dense_1.bias": ("model",),
                    "logits.kernel": ("model", "unsharded")}
    # cnn: the conv weights stay replicated by default.
    plan = layouts.resolve(CONV, layouts.make_rules("cnn", {}, MESH), MESH)
    assert set(plan) == {"logits.kernel"}


def test_user_rules_come_first():
    rules = layouts.make_rules("mlp", {r"dense_1\.kernel": "model,unsharded",
                                       r"dense\.bias": "unsharded"}, MESH)
    plan = layouts.resolve(MLP, rules, MESH)
    assert plan["dense_1.kernel"] == ("model", "unsharded") and "dense.bias" not in plan
    assert plan["dense.kernel"] == ("unsharded", "model")  # defaults still apply to the rest


@pytest.mark.parametrize("rules, weights, message", [
    ({"decoder.*kernel": "unsharded,model"}, MLP,
     "rule 'decoder.*kernel' -> 'unsharded,model' matches no weight"),
    ({r"logits\.kernel": "unsharded,model"}, MLP,
     "weight logits.kernel (shape [128, 10]) has size 10, which does not divide by mesh "
     "dimension model=4"),
    ({r"logits\.bias": "unsharded,model"}, MLP, "but the spec has 2 entries"),
    ({r"conv2d\.kernel": "unsharded,unsharded,unsharded,model"}, CONV, "cannot shard convolutions"),
])
def test_rule_errors_name_rule_and_weight(rules, weights, message):
    mesh = {"batch": 1, "model": 4}
    with pytest.raises(ConfigError) as error:
        layouts.resolve(weights, layouts.make_rules("mlp", rules, mesh), mesh)
    assert message in str(error.value)


def test_memory_report_counts_shards():
    plan = layouts.resolve(MLP, layouts.make_rules("mlp", {}, MESH), MESH)
    report = layouts.memory_report(MLP, plan, MESH, optimizer="adam")
    params = 64 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10
    assert report["bytes_one_device"] == params * 4 * 3
    assert report["sharded_params"] == params - 10 and report["replicated_params"] == 10
    assert report["bytes_per_device"] == ((params - 10) // 2 + 10) * 4 * 3


# --- On a 2x2 mesh of virtual CPU devices (processes of their own) ----------------------------

# The first compiled step (the first execution of the train function: tf-keras's optimizer
# update lost it on TF 2.21, docs/dtensor.md) equals the single-device step.

ONE_STEP = dtensor_forked.MLP_ON_MESH + r'''
variables = dtensor_runtime.named_variables(sharded)
found = {path: dtensor.fetch_layout(v).sharding_specs for path, v in variables.items()}
local_shape = {path: dtensor.unpack(v.read_value())[0].shape.as_list()
               for path, v in variables.items()}
sharded.compile(optimizer=dtensor_runtime.make_optimizer(config.train, steps.StepPlan(2, 1, 2), mesh),
                loss=loss)
model.compile(optimizer=keras.optimizers.SGD(0.5), loss=loss)


class Snapshot(keras.callbacks.Callback):
    """The gathered weights just before the step."""

    def on_train_batch_begin(self, batch, logs=None):
        if batch == 0:
            self.weights = {p: dtensor_runtime.gather(v).numpy() for p, v in variables.items()}


snapshot = Snapshot()
sharded.fit(dataset, epochs=1, steps_per_epoch=1, verbose=0, callbacks=[snapshot])
for path, variable in dtensor_runtime.named_variables(model).items():
    variable.assign(snapshot.weights[path])
model.train_on_batch(x, y)  # the same step on one device
after = {p: dtensor_runtime.gather(variables[p]).numpy() for p in variables}
diffs = {p: float(np.abs(after[p] - v.numpy()).max())
         for p, v in dtensor_runtime.named_variables(model).items()}
moved = {p: float(np.abs(snapshot.weights[p] - after[p]).max()) for p in after}
dtensor_runtime.copy_weights(sharded, model)
replicated = dtensor.relayout(sharded(dtensor.relayout(
    dtensor.copy_to_mesh(x, dtensor.Layout.replicated(mesh, 4)),
    dtensor.Layout.batch_sharded(mesh, "batch", 4))), dtensor.Layout.replicated(mesh, 2))
prediction_diff = float(np.abs(dtensor.unpack(replicated)[0].numpy() - model(x).numpy()).max())
print("RESULT " + json.dumps({
    "plan": {p: list(s) for p, s in plan.items()}, "layouts": found, "local_shape": local_shape,
    "diffs": diffs, "moved": moved, "prediction_diff": prediction_diff,
    "devices": len(tf.config.list_logical_devices("CPU"))}))
'''


def test_kernels_sharded_and_one_step_matches_single_device(digits_dir):
    out = dtensor_forked.run_script(
        ONE_STEP, [digits_dir, "train.optimizer=sgd,train.momentum=0,train.learning_rate=0.5"],
        env=_env(), cwd=REPO, timeout=TIMEOUT)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    result = json.loads(lines[0][len("RESULT "):])
    assert result["devices"] == 4
    # The kernels really are sharded: their DTensor layouts, and each device's piece.
    assert result["layouts"]["dense.kernel"] == ["unsharded", "model"]
    assert result["local_shape"]["dense.kernel"] == [64, 128]  # 256 units / model:2
    assert result["layouts"]["dense_1.kernel"] == ["unsharded", "model"]
    assert result["local_shape"]["dense_1.kernel"] == [256, 64]
    assert result["layouts"]["logits.kernel"] == ["model", "unsharded"]
    assert result["local_shape"]["logits.kernel"] == [64, 10]
    assert result["layouts"]["logits.bias"] == ["unsharded"]
    assert {p: s for p, s in result["layouts"].items() if "model" in s} == result["plan"]
    # One SGD step on the mesh = the same step on one device, from the same weights.
    assert all(moved > 1e-3 for moved in result["moved"].values()), result["moved"]
    assert max(result["diffs"].values()) < 1e-5, result["diffs"]
    # The ordinary copy computes what the sharded model computes.
    assert result["prediction_diff"] < 1e-5


def _wait_for_backup(process, run, timeout=TIMEOUT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        backup = run / "backup"
        # the state file, written once a backup's files are complete: an .index alone may be a
        # backup still being written, which a rerun rightly does not trust
        if backup.exists() and any(f.name == "checkpoint" for f in backup.rglob("*")):
            return
        if process.poll() is not None:
            raise AssertionError(f"training ended before its first backup: {process.returncode}")
        time.sleep(0.5)
    raise AssertionError("no backup appeared")


def interrupted_then_resumed(command: list, run) -> dict:
    """Runs `tftrain <command>` until its first backup, SIGTERMs it (it backs up and exits
    143), runs the same command again to the end; returns the finished run's summary."""
    first = Running(command, cwd=REPO, env=_env())
    try:
        _wait_for_backup(first.process, run)
        first.process.send_signal(signal.SIGTERM)
        code = first.wait(TIMEOUT)
    finally:
        if first.process.poll() is None:
            first.process.kill()
    assert code == 143, first.output[-3000:]
    assert not (run / "summary.json").exists()
    out = forked_cli.run(command, env=_env(), cwd=REPO, timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads((run / "summary.json").read_text())


def test_digits_dtensor_resume_export_and_optimize(cli, tmp_path, digits_dir, capsys):
    run = tmp_path / "run"
    # digits_dtensor's `Run:` header command as written (its 2x2 mesh is the config's), with
    # where it writes, the session's digits and 4 epochs.
    command = [*documented.args("tftrain train --config=digits_dtensor"), f"--model_dir={run}",
               f"--params_override=data.dir={digits_dir},train.epochs=4"]
    summary = interrupted_then_resumed(command, run)
    assert summary["strategy"] == "dtensor" and summary["num_replicas"] == 2
    assert summary["resumed_from"] and summary["resumed_from"][0] >= 1
    assert summary["epochs"] == 4
    assert summary["eval"]["accuracy"] >= 0.9, summary
    assert summary["dtensor"]["mesh"] == "batch:2,model:2"
    assert summary["dtensor"]["layouts"]["dense.kernel"] == "unsharded,model"
    memory = summary["dtensor"]["memory"]
    assert memory["bytes_per_device"] < 0.55 * memory["bytes_one_device"]
    # Measured from the trained variables' layouts: the weights the layout report counts
    # (weights + 2 Adam slots, split alike over `model`) are what one device held.
    measured = summary["memory"]
    assert measured["weights_bytes_per_device"] * 3 == memory["bytes_per_device"]
    assert measured["optimizer_bytes_per_device"] == 2 * measured["weights_bytes_per_device"]
    assert list(run.glob("checkpoints/best*"))

    # The export is an ordinary SavedModel: evaluate, quantize and prune take it as is.
    assert cli("evaluate", f"--model={run}/export", f"--data={digits_dir}", "--split=test") == 0
    evaluated = json.loads((run / "eval_test.json").read_text())
    for metric in ("accuracy", "top5_accuracy"):  # the metrics built on the mesh count right
        assert abs(evaluated[metric] - summary["eval"][metric]) < 1e-6, metric
    assert cli("quantize", f"--model_dir={run}", "--mode=dynamic", "--max_accuracy_drop=0.05") == 0
    assert list(run.glob("quantized/*.tflite"))
    # Pruning fine-tunes under a tf.distribute strategy, which a dtensor run has to name.
    assert cli("prune", f"--model_dir={run}", "--epochs=1", "--target_sparsity=0.5",
               "--strategy=one_device") == 0
    assert (run / "pruned" / "saved_model.pb").exists()


def test_cli_mesh_flag_errors_before_tensorflow(tmp_path):
    probe = ("import sys\nfrom tftrain.cli import run\ntry:\n    run(['tftrain'] + sys.argv[1:])\n"
             "except SystemExit as e:\n    print('EXIT', e.code, 'tensorflow' in sys.modules)")
    out = subprocess.run([PYTHON, "-c", probe, "train", "--config=digits_dtensor",
                          "--mesh=batch:2,model:3", f"--model_dir={tmp_path}/run",
                          "--params_override=runtime.cpu_devices=4"],
                         env=_env(), cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT)
    assert "needs 6 devices but runtime.cpu_devices=4" in out.stderr
    # A config error (exit 2), refused before TensorFlow was imported.
    assert out.stdout.split()[-3:] == ["EXIT", "2", "False"], (out.stdout, out.stderr[-3000:])


def test_doctor_measures_a_dtensor_run(tmp_path, digits_dir):
    """digits_dtensor's `Why slow:` header command as written, but for the session's digits,
    12 timed steps and its MLP made 4x wider: the run `train` would start on the 2x2 mesh (the
    same `engine.prepare`), timed three ways; the mesh's replicas are what it reports. The wider
    MLP keeps it compute-bound by a wide margin (measured: the model alone at ~0.2x the input
    alone; ~0.5-0.8x with the shipped widths, too close to the 1.25x line on a shared
    machine)."""
    out = tmp_path / "doctor.json"
    args = documented.args("tftrain doctor --config=digits_dtensor")
    done = forked_cli.run([*args, "--steps=12", f"--json={out}",
                           f"--params_override=data.dir={digits_dir},"
                           "model.params={hidden_units: [1024, 1024]}"],
                          env=_env(), cwd=REPO, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["strategy"] == "dtensor" and result["num_replicas"] == 2, result
    rates = result["examples_per_second"]
    assert all(rate > 0 for rate in rates.values()), result
    assert result["verdict"] == "compute-bound", rates
    assert rates["model_alone"] <= 0.5 * rates["input_alone"], rates
    assert "verdict: compute-bound" in done.stdout and "Traceback" not in done.stderr
