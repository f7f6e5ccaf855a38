"""`tftrain check`'s memory plan through the CLI: exact for the weights and the optimizer
state of a real run (one device and a DTensor mesh with sharded Adafactor state), the JSON
report, and suggestions that fit when re-checked."""
import json

from tests.dtensor_runs import ADAFACTOR_SHARDED, dtensor_adafactor_run  # noqa: F401


def _plan(cli, tmp_path, *args) -> tuple[int, dict]:
    path = tmp_path / "plan.json"
    code = cli("check", *args, f"--json={path}")
    return code, json.loads(path.read_text())


def test_the_plan_is_what_a_one_device_run_holds(cli, tmp_path, digits_dir, capsys):
    # 2 steps: the weights and the optimizer's slots exist, at their size, from the first one.
    overrides = (f"--params_override=data.dir={digits_dir},train.steps=2,"
                 "train.validation_steps=1,train.test_steps=1")
    run = tmp_path / "run"
    assert cli("train", "--config=digits", f"--model_dir={run}", overrides) == 0
    measured = json.loads((run / "summary.json").read_text())["memory"]
    code, report = _plan(cli, tmp_path, "--config=digits", "--target=cpu", overrides)
    assert code == 0, report["findings"]
    planned = report["memory"]
    assert planned["parts"]["weights"] == measured["weights_bytes_per_device"]
    assert planned["parts"]["optimizer_state"] == measured["optimizer_bytes_per_device"]
    assert planned["fits"] and planned["target"] == "this host's memory"
    assert planned["bytes_per_device"] == sum(
        v for k, v in planned["parts"].items() if k != "activations_without_remat")
    memory_lines = [f for f in report["findings"] if f["family"] == "memory"]
    assert len(memory_lines) == 1 and memory_lines[0]["kind"] == "ok"
    assert any(line.startswith("ok     memory    fits: ~")
               for line in capsys.readouterr().out.splitlines())


def test_the_plan_is_what_a_dtensor_run_with_sharded_adafactor_state_holds(
        cli, tmp_path, digits_dir, dtensor_adafactor_run):
    """The run is the one tests/test_optimizer_state.py resumes (`tests.dtensor_runs`), trained
    in a process of its own (the mesh needs 4 CPU devices, this process has 2); the plan is
    made for the same config and overrides."""
    overrides = f"--params_override=data.dir={digits_dir},{ADAFACTOR_SHARDED}"
    measured = json.loads((dtensor_adafactor_run / "summary.json").read_text())["memory"]
    code, report = _plan(cli, tmp_path, "--config=digits_dtensor", "--target=cpu", overrides)
    assert code == 0, report["findings"]
    planned = report["memory"]
    assert planned["devices"] == 4 and planned["micro_batch"] == 16  # batch 32 over batch:2
    assert planned["parts"]["weights"] == measured["weights_bytes_per_device"]
    assert planned["parts"]["optimizer_state"] == measured["optimizer_bytes_per_device"]


def test_a_model_too_big_for_the_gpu_gets_changes_that_fit(cli, tmp_path, digits_dir):
    """An mlp of 3.4 billion parameters with Adam on a 40 GiB A100: 50 GiB of state. (Neither
    it nor the change fits half this machine's memory: the check plans it and skips the step.)"""
    big = (f"--params_override=data.dir={digits_dir},model.name=mlp,"
           "model.params={hidden_units: [40960, 40960, 40960]}")
    code, report = _plan(cli, tmp_path, "--config=digits", "--target=gpu",
                         "--gpu_type=a100-40gb", big)
    planned = report["memory"]
    assert code == 1 and not planned["fits"]
    assert planned["device_bytes"] == 40 << 30
    error = next(f for f in report["findings"] if f["family"] == "memory")
    assert error["kind"] == "error" and error["text"].startswith("does not fit: ")
    assert planned["suggestions"], planned
    first = planned["suggestions"][0]
    assert first["override"] == "train.optimizer=adafactor", planned["suggestions"]
    assert first["bytes_per_device"] < planned["device_bytes"] < planned["bytes_per_device"]
    assert first["override"] in error["fix"]
    # Re-checked with the change, as a user pastes it: it fits, at the planned bytes.
    code, report = _plan(cli, tmp_path, "--config=digits", "--target=gpu",
                         "--gpu_type=a100-40gb", f"{big},{first['override']}")
    assert report["memory"]["fits"], report["memory"]
    assert report["memory"]["bytes_per_device"] == first["bytes_per_device"]


def test_gpu_type_is_for_gpu_targets(cli, capsys):
    assert cli("check", "--config=digits", "--target=cpu", "--gpu_type=a100-40gb") == 2
    assert "--gpu_type is for --target=gpu" in capsys.readouterr().err
