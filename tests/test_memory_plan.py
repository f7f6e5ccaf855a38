"""`tftrain check`'s memory plan through the CLI: exact for the weights and the optimizer
state of a real run (one device and a DTensor mesh with sharded Adafactor state), the JSON
report, and suggestions that fit when re-checked; pipeline stages planned from the model's
shapes in a graph (no data, no training), each holding the micro-batches its schedule keeps."""
import json

import pytest

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


# -- pipeline stages: the micro-batches each schedule keeps in flight -----------------------

TEXT_LM_VOCAB = 100  # the model's shapes only: any vocabulary (the text pipeline's is ~100)


def _text_lm_pipeline(overrides: str = ""):
    """text_lm on 2 stages, 8 micro-batches of 8 examples (batch 64)."""
    from tftrain import config as config_lib

    return config_lib.build_config("text_lm", {"runtime.strategy": "pipeline"},
                                   ",".join(filter(None, ["runtime.microbatches=8", overrides])))


@pytest.fixture(scope="module")
def text_lm_stages():
    """text_lm's shapes cut into 2 stages, built in a graph once (the plan varies the batch,
    micro-batches and schedule, which do not change them)."""
    from tftrain import models
    from tftrain.check import memory

    config = _text_lm_pipeline()
    length = config.data.pipeline_options["sequence_length"]
    return memory.shapes_of(config, lambda params: models.build_model(
        config.model.name, params, (length,), TEXT_LM_VOCAB,
        dataset_info={"vocab_size": TEXT_LM_VOCAB, "sequence_length": length}))


def test_each_stage_plans_the_activations_its_schedule_keeps_in_flight(text_lm_stages):
    """gpipe: both stages hold all 8 micro-batches (the whole batch); 1f1b: stage 0 holds
    min(2 - 0, 8) = 2, stage 1 holds 1. So gpipe's activations are 4x and 8x 1f1b's."""
    from tftrain.check import memory
    from tftrain.rules.report import Target

    shapes = text_lm_stages
    assert len(shapes.stages) == 2
    plans = {kind: memory.plan(shapes, _text_lm_pipeline(f"runtime.pipeline_schedule={kind}"),
                               Target("gpu", 1), "float32") for kind in ("gpipe", "1f1b")}
    gpipe, one_f_one_b = ([s["activations"] for s in plans[k].stages] for k in plans)
    assert gpipe[0] == 4 * one_f_one_b[0] and gpipe[1] == 8 * one_f_one_b[1], plans
    # gpipe holds the whole batch: 64 examples x 4 bytes per element kept.
    assert gpipe == [64 * 4 * stage.per_example for stage in shapes.stages]
    planned = plans["1f1b"].to_json()
    assert planned["micro_batch"] == 8
    assert [(s["schedule"], s["microbatches_in_flight"]) for s in planned["stages"]] == [
        ("1f1b", 2), ("1f1b", 1)]
    assert [s["microbatches_in_flight"] for s in plans["gpipe"].stages] == [8, 8]
    assert planned["bytes_per_device"] == max(s["bytes"] for s in planned["stages"])
    what = memory.check(plans["1f1b"], shapes).what
    assert "+ activations of 2 micro-batches of 8 examples in flight (1f1b) " in what, what
    assert "; stage 0: ~" in what and "activations of 2 micro-batches in flight (1f1b) " in what
    assert "; stage 1: ~" in what and "activations of 1 micro-batch in flight (1f1b) " in what


def test_a_gpipe_run_too_big_for_the_gpu_is_told_to_switch_to_1f1b(text_lm_stages):
    """Batch 65536 (8 micro-batches of 8192) on a 16 GiB T4, float32: gpipe keeps the whole
    batch's activations on each stage (~23 GiB), 1f1b a quarter of them on stage 0 (~6 GiB)."""
    from tftrain.check import memory
    from tftrain.rules import precision
    from tftrain.rules.report import ERROR, Target

    shapes, target, batch = text_lm_stages, Target("gpu", 1), "data.batch_size=65536"
    config = _text_lm_pipeline(f"{batch},runtime.pipeline_schedule=gpipe")
    policy = precision.policy_for(config, target)
    found = memory.plan(shapes, config, target, policy, "t4")
    assert not found.fits and found.device_bytes == 16 << 30
    found.suggestions = memory.suggest(shapes, config, target, policy, found, "t4")
    first = found.suggestions[0]
    assert first["override"] == "runtime.pipeline_schedule=1f1b", found.suggestions
    finding = memory.check(found, shapes)
    assert finding.status == ERROR
    assert '--params_override="runtime.pipeline_schedule=1f1b"' in finding.fix, finding.fix
    # Re-planned with the change, as a user pastes it: it fits, at the planned bytes.
    switched = memory.plan(shapes, _text_lm_pipeline(f"{batch},{first['override']}"), target,
                           policy, "t4")
    assert switched.fits and switched.bytes_per_device == first["bytes_per_device"]


def test_when_1f1b_alone_is_not_enough_the_advice_adds_more_micro_batches(text_lm_stages):
    """Batch 262176 = 32 x 8193 on a T4, gpipe: no single change fits (1f1b's stage 0 still
    holds a quarter of the batch, ~23 GiB; the batch splits into 8 micro-batches only once
    halved, and halving it or its precision leaves gpipe ~47 GiB). 1f1b with 16 micro-batches
    holds an eighth (~11.5 GiB): the first pair."""
    from tftrain.check import memory
    from tftrain.rules.report import Target

    shapes, target, batch = text_lm_stages, Target("gpu", 1), "data.batch_size=262176"
    config = _text_lm_pipeline(f"{batch},runtime.pipeline_schedule=gpipe")
    found = memory.plan(shapes, config, target, "float32", "t4")
    found.suggestions = memory.suggest(shapes, config, target, "float32", found, "t4")
    first = found.suggestions[0]["override"]
    assert first == "runtime.pipeline_schedule=1f1b,runtime.microbatches=16", found.suggestions
    assert first in memory.check(found, shapes).fix
    assert not memory.plan(shapes, _text_lm_pipeline(f"{batch},runtime.pipeline_schedule=1f1b"),
                           target, "float32", "t4").fits
    assert memory.plan(shapes, _text_lm_pipeline(f"{batch},{first}"), target, "float32",
                       "t4").fits


def test_a_replica_of_a_pipeline_is_planned_with_its_share_of_the_batch(text_lm_stages):
    """runtime.pipeline_replicas=R: each copy of a stage runs batch / (M x R) examples per
    micro-batch, so a device holds 1/R of the activations of one pipeline over the batch."""
    from tftrain.check import memory
    from tftrain.rules.report import Target

    one, two = (memory.plan(text_lm_stages, _text_lm_pipeline(f"runtime.pipeline_replicas={r}"),
                            Target("gpu", 1), "float32") for r in (1, 2))
    assert two.micro_batch * 2 == one.micro_batch == 8
    assert two.parts["activations"] * 2 == one.parts["activations"] > 0


def test_an_interleaved_stage_holds_its_chunks_weights_and_their_micro_batches_in_flight():
    """runtime.pipeline_schedule=interleaved, 2 stages x 2 chunks (text_lm cut into 4, chunk c
    on stage c % 2), 8 micro-batches: a stage's weights are its 2 chunks', its activations the
    most its chunks' micro-batches in flight add up to (each counting its own chunk's layers),
    counted over the schedule training runs."""
    from tftrain import models
    from tftrain.check import memory
    from tftrain.rules.report import Target
    from tftrain.runtime import pipeline_schedule

    config = _text_lm_pipeline("runtime.pipeline_schedule=interleaved,runtime.virtual_stages=2")
    length = config.data.pipeline_options["sequence_length"]
    shapes = memory.shapes_of(config, lambda params: models.build_model(
        config.model.name, params, (length,), TEXT_LM_VOCAB,
        dataset_info={"vocab_size": TEXT_LM_VOCAB, "sequence_length": length}))
    assert len(shapes.stages) == 4
    found = memory.plan(shapes, config, Target("gpu", 1), "float32")
    assert [s["chunks"] for s in found.stages] == [[0, 2], [1, 3]]
    weights = {w.path: w.size * w.itemsize for w in shapes.weights}
    for stage in found.stages:
        assert stage["weights"] == sum(weights[p] for c in stage["chunks"]
                                       for p in shapes.stages[c].paths)
    assert sum(s["weights"] for s in found.stages) == sum(weights.values())
    actions = pipeline_schedule.schedule("interleaved", 2, 8, 2)
    held = {0: 0, 1: 0}
    most = {0: 0, 1: 0}
    for action in actions:  # by hand: bytes of each chunk's micro-batches held, per stage
        nbytes = 8 * 4 * shapes.stages[action.chunk(2)].per_example
        held[action.stage] += nbytes if action.kind == "forward" else -nbytes
        most[action.stage] = max(most[action.stage], held[action.stage])
    assert [s["activations"] for s in found.stages] == [most[0], most[1]]
    assert [s["microbatches_in_flight"] for s in found.stages] == (
        pipeline_schedule.max_in_flight(actions, 2)) == [5, 3]
    assert found.bytes_per_device == max(s["bytes"] for s in found.stages)
