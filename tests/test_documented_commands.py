"""Every command a user is shown runs, exactly as written, on the data its default path creates.

- each shipped config's header commands (`# Run: tftrain ...`, continued with `\\`);
- README's `$ tftrain ...` examples, whose following lines are the output they must print;
- the `make demo` recipe;
- guides' commands on the data the headers converted (`GUIDE_COMMANDS`);
- others, run where their subject is tested (tests/documented.py), are left to those tests.

They run as the user runs them: each its own process entering `tftrain.cli.run` (the console
script's entry point; forked from a server that imported TensorFlow once, `tests/forked_cli.py`;
tests/test_wheel.py runs the installed script itself), in a fresh directory (so the first
command converts `data/digits` the way the default path does), with only their steps lowered
(`FEWER_STEPS` for `train`, `DOCTOR_STEPS` for `doctor`, fewer demo epochs: `DEMO_EPOCHS`).
Commands that need a Cloud TPU VM and a bucket (`YOUR_BUCKET`) run too, and must stop with the
one-line error of a machine without a TPU. A `tftrain check` must pass its target
(`assert_check_passes`); where it checks a shipped config as shipped on a target the config
claims (`shipped_check`), it also answers tests/test_check.py's question for that pair.
"""
import csv
import glob
import json
import os
import re
import shlex
import subprocess

import pytest
import yaml

from tests import documented, forked_cli
from tests.conftest import REPO
from tests.test_docs_commands import after_the_demo

# A `train` command runs 2 steps of 1 epoch (then validates, tests and exports as written),
# unless it sets its own train.steps; a `doctor` command times 10 steps per measurement instead
# of 100 (the same code makes its tables; tests/test_doctor.py asks what they say).
FEWER_STEPS = "train.epochs=1,train.steps_per_epoch=2"
DOCTOR_STEPS = "--steps=10"
# `make demo` trains digits for 6 of its 15 epochs: its prune (the default 1,200 fine-tuning
# steps, as written) and quantize must pass their gates on that model. Measured on the 2-core
# VM (test accuracy, then the examples of 189 that pruning lost): 4 epochs 0.952 (pruning then
# gains 4: an unsettled model makes the gate easy), 5 0.968 (0), 6 0.984 (0), 8 0.984 (1),
# 15 0.989 (1); int8 and float16 lost none from 4 epochs on. The prune gate fails at 2 lost.
DEMO_EPOCHS = 6
TIMEOUT = 420
# Configs whose model is too big for the suite: their commands run here on a one-block model
# with the same settings otherwise (remat included); bench/big_model.py runs them as written.
# (Two blocks of width 128 cost each check ~3 CPU-s more, mostly XLA compiling the steps.)
SMALLER = {"lm_1b.yaml": "model.params={width: 64, num_layers: 1, num_heads: 4, "
                         "mlp_width: 128, remat: true}"}


def header_commands(path: str) -> list[str]:
    """The `tftrain ...` commands in a config's leading comment, continuation lines joined."""
    commands, current = [], None
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.startswith("#"):
                break
            text = line[1:].strip()
            if current is not None:
                current += " " + text
            elif re.search(r"(^|:\s+)tftrain ", text):
                current = text[text.index("tftrain "):]
            else:
                continue
            if current.endswith("\\"):
                current = current[:-1].rstrip()
            else:
                if current.endswith(")") and "(" not in current:  # "(dry run: tftrain ...)"
                    current = current[:-1].rstrip()
                commands.append(current)
                current = None
    return commands


def readme_examples() -> list[tuple[str, list[str]]]:
    """README's `$ tftrain ...` lines, each with the output lines shown under it."""
    examples, block, in_code = [], None, False
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        for line in f.read().splitlines():
            if line.startswith("```"):
                in_code, block = not in_code, None
                continue
            if in_code and line.startswith("$ tftrain "):
                block = (line[2:], [])
                examples.append(block)
            elif in_code and block is not None and line.strip():
                block[1].append(line)
    return examples


def demo_commands() -> list[str]:
    """The commands of the Makefile's `demo` recipe, with `$(BIN)/` as this venv's bin."""
    commands, in_demo = [], False
    with open(os.path.join(REPO, "Makefile"), encoding="utf-8") as f:
        for line in f:
            if re.match(r"^demo\s*:", line):
                in_demo = True
            elif in_demo and line.startswith("\t"):
                commands.append(line.strip().split("  #")[0].replace("$(BIN)/", ""))
            elif in_demo:
                break
    return commands


def with_fewer_steps(args: list[str], fewer: str | None = FEWER_STEPS,
                     doctor_steps: str | None = DOCTOR_STEPS) -> list[str]:
    """`args` with fewer steps: a `tftrain train` command with `fewer` added to its overrides
    (unless it sets train.steps itself), a `tftrain doctor` command with `doctor_steps` (unless
    it gives --steps)."""
    if args[:2] == ["tftrain", "train"] and fewer and not any(
            arg.startswith("--params_override=") and "train.steps=" in arg for arg in args):
        return with_override(args, fewer)
    if args[:2] == ["tftrain", "doctor"] and doctor_steps and not any(
            arg.startswith("--steps") for arg in args):
        return args + [doctor_steps]
    return args


def with_override(args: list[str], override: str) -> list[str]:
    """`args` with `override` added to (or as) their --params_override."""
    for i, arg in enumerate(args):
        if arg.startswith("--params_override="):
            return args[:i] + [f"{arg},{override}"] + args[i + 1:]
    return args + [f"--params_override={override}"]


def run(command: str, cwd, fewer: str | None = FEWER_STEPS, doctor_steps: str | None = DOCTOR_STEPS,
        smaller: str | None = None) -> subprocess.CompletedProcess:
    args = with_fewer_steps(shlex.split(command), fewer, doctor_steps)
    if smaller and args[1] in ("train", "check"):
        args = with_override(args, smaller)
    assert args[0] == "tftrain", command
    return forked_cli.run(args[1:], cwd=cwd, timeout=TIMEOUT,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory):
    """One fresh working directory for all commands, as a user's checkout would be."""
    return tmp_path_factory.mktemp("user")


CONFIG_COMMANDS = [(os.path.basename(path), command)
                   for path in sorted(glob.glob(os.path.join(REPO, "configs", "*.yaml")))
                   for command in header_commands(path)]
def check_target(config: str, args: list[str]) -> str:
    """The target kind that `tftrain check <args>` checks shipped `config` (a file name) on: its
    --target, else the one its config's runtime.strategy implies (as --target's help says: tpu,
    multi_worker for multi_worker_mirrored, else cpu). The command's summary line must name the
    same kind (`assert_check_passes`)."""
    for arg in args:
        if arg.startswith("--target="):
            return arg.split("=", 1)[1]
    from tftrain import config as config_lib

    runtime = config_lib.build_config(config[:-len(".yaml")]).runtime
    if runtime.strategy == "tpu" or (runtime.strategy == "auto" and runtime.tpu):
        return "tpu"
    return "multi_worker" if runtime.strategy == "multi_worker_mirrored" else "cpu"


# The flags of a `tftrain check` that leave the shipped config as it is: which config, which
# target, which TPU (generation, cores); and of --params_override only data.dir (where the
# data is: a config whose data.dir is a gs:// placeholder is checked on a local copy).
UNCHANGED_CONFIG_FLAGS = ("--config=", "--target=", "--tpu_type=", "--tpu_cores=")


def shipped_check(config: str, command: str) -> str | None:
    """The target on which header `command` of `config` checks that config as shipped, or None
    for any other command (another config; a setting changed: a batch size, a precision, the
    replicas). tests/test_check.py leaves these (config, target) pairs to this file."""
    args = shlex.split(command)
    if (args[:2] != ["tftrain", "check"] or f"--config={config[:-len('.yaml')]}" not in args
            or "YOUR_BUCKET" in command):  # a placeholder: such a command must fail here
        return None
    for arg in args[2:]:
        if arg.startswith("--params_override="):
            overrides = arg.split("=", 1)[1].split(",")
            if not all(override.startswith("data.dir=") for override in overrides):
                return None
        elif not arg.startswith(UNCHANGED_CONFIG_FLAGS):
            return None
    return check_target(config, args)


def assert_check_passes(stdout: str, stderr: str, target: str) -> None:
    """What `tftrain check` prints when its config passes `target` (cpu, gpu, tpu or
    multi_worker): ok and advice lines only, a summary of 0 errors for that kind of target, the
    real train step run (so the data were there) and, on a GPU, compiled with XLA as `train`
    would; Keras's warning that this machine has no GPU for mixed_float16 hidden."""
    from tftrain.check import DEVICE_WARNING

    lines = stdout.strip().splitlines()
    assert lines and lines[-1].startswith("summary: 0 errors,"), lines
    assert re.search(rf" ok for {target}[ ,]", lines[-1]), (target, lines[-1])
    assert all(line.split()[0] in ("ok", "advice") for line in lines[:-1]), lines
    assert any(line.startswith("ok     xla       train step") for line in lines), lines
    assert DEVICE_WARNING not in stderr and "mixed_float16 may run slowly" not in stderr, stderr
    if target == "gpu":  # runtime.jit_compile=auto: train compiles with XLA on a GPU
        assert any("as `train` compiles it on a GPU with runtime.jit_compile=auto" in line
                   for line in lines), lines


def test_every_shipped_config_shows_how_to_run_it():
    shipped = {os.path.basename(p) for p in glob.glob(os.path.join(REPO, "configs", "*.yaml"))}
    assert shipped and shipped == {name for name, _ in CONFIG_COMMANDS}


@pytest.mark.slow
@pytest.mark.parametrize("config,command", [
    pytest.param(name, command, id=f"{name}:{i}")
    for i, (name, command) in enumerate(CONFIG_COMMANDS)
    if command not in documented.RUN_BY])
def test_config_header_command_runs_as_written(config, command, user_dir):
    result = run(command, user_dir, smaller=SMALLER.get(config))
    output = result.stdout + result.stderr
    if "YOUR_BUCKET" in command:  # for a Cloud TPU VM: here it must fail cleanly, in one line
        assert result.returncode == 1, output
        assert result.stderr.strip().splitlines() == [
            line for line in result.stderr.strip().splitlines() if "cannot reach TPU" in line], output
        return
    assert result.returncode == 0, f"{command}\n{output[-3000:]}"
    assert "Traceback" not in output
    if command.startswith("tftrain train"):
        assert re.search(r"test split: .*(accuracy|rmse)=\d+\.\d+", result.stdout), output[-2000:]
    if command.startswith("tftrain check"):  # on the data the commands before it converted
        target = check_target(config, shlex.split(command))
        assert_check_passes(result.stdout, result.stderr, target)


# Guides' commands in the same directory after the headers, on the data they converted
# (data/digits, data/lm_1b; data/text_lm is converted on first use by the first text_lm
# training below, as the default path converts it), in this order, as written (lm_1b on its
# smaller model, as its header's checks; a `train` with FEWER_STEPS): {command: its page}.
GUIDE_COMMANDS = {
    "tftrain check --config=digits --target=multi_worker --replicas=2":
        "guides/check-and-doctor.md",
    "tftrain check --config=lm_1b --target=cpu --json=plan.json": "guides/check-and-doctor.md",
    "tftrain train --config=text_lm --model_dir=runs/text_lm_gpus --params_override="
    "runtime.mixed_precision=mixed_bfloat16,data.batch_size=512": "guides/lm-on-gpus.md",
    "tftrain check --config=text_lm --target=gpu --gpu_type=a100-40gb --replicas=8 "
    "--params_override=runtime.mixed_precision=mixed_bfloat16": "guides/lm-on-gpus.md",
    "tftrain check --config=text_lm --target=multi_worker --replicas=16": "guides/lm-on-gpus.md",
    "tftrain check --config=text_lm --params_override=runtime.strategy=pipeline "
    "--json=plan.json": "guides/pipeline-stages.md",
    "tftrain train --config=text_lm --model_dir=runs/text_lm_1f1b --strategy=pipeline "
    "--params_override=runtime.pipeline_stages=2,runtime.microbatches=8,"
    "runtime.pipeline_schedule=1f1b,runtime.stage_rules=block_0_mlp_residual":
        "guides/pipeline-stages.md",
    "tftrain train --config=digits --model_dir=runs/demo --params_override='train.optimizer=sgd,"
    "train.lr_schedule=cosine,train.warmup_steps=100,train.grad_accum_steps=4,"
    "train.backup_every_steps=200'": "training.md",
}


@pytest.mark.slow
@pytest.mark.parametrize("command", GUIDE_COMMANDS, ids=lambda command: command[8:70])
def test_guide_command_runs_as_written(command, user_dir):
    from tests.test_docs_commands import COMMANDS_IN_DOCS

    assert (GUIDE_COMMANDS[command], command) in {
        (page.split("docs/")[-1], c) for page, c in COMMANDS_IN_DOCS}, command
    args = shlex.split(command)
    config = args[2].split("=")[1] + ".yaml"
    (user_dir / "plan.json").unlink(missing_ok=True)  # the plan read below is this command's
    result = run(command, user_dir, smaller=SMALLER.get(config))
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{command}\n{output[-3000:]}"
    assert "Traceback" not in output
    if args[1] == "check":
        assert_check_passes(result.stdout, result.stderr, check_target(config, args))
    if "--json=" in command:
        plan = json.loads((user_dir / "plan.json").read_text())["memory"]
        assert plan["fits"] and plan["bytes_per_device"] > 0, plan
        assert plan["remat"] == (config == "lm_1b.yaml"), plan
        assert bool(plan.get("stages")) == ("runtime.strategy=pipeline" in command), plan
    if args[1] == "train":
        assert re.search(r"test split: .*accuracy=\d+\.\d+", result.stdout), output[-2000:]
        run_dir = user_dir / next(a.split("=", 1)[1] for a in args if a.startswith("--model_dir="))
        _assert_trained_as_written(command, json.loads((run_dir / "summary.json").read_text()),
                                   yaml.safe_load((run_dir / "params.yaml").read_text()))


def _assert_trained_as_written(command: str, summary: dict, params: dict) -> None:
    """What the run's summary.json and params.yaml say of the settings `command` (one of
    GUIDE_COMMANDS) asks for."""
    if "mixed_bfloat16" in command:
        assert summary["mixed_precision"] == "mixed_bfloat16", summary
        assert params["data"]["batch_size"] == 512, params["data"]
    if "runtime.stage_rules=block_0_mlp_residual" in command:
        pipeline = summary["pipeline"]
        assert (pipeline["schedule"], pipeline["microbatches"]) == ("1f1b", 8), pipeline
        assert pipeline["stages"][0]["layers"][-1] == "block_0_mlp_residual", pipeline
        assert pipeline["max_in_flight"] == [2, 1], pipeline
    if "train.grad_accum_steps=4" in command:
        assert summary["grad_accum_steps"] == 4, summary
        assert (params["train"]["optimizer"], params["train"]["lr_schedule"],
                params["train"]["warmup_steps"]) == ("sgd", "cosine", 100), params["train"]


AFTER_DEMO = "runs/demo"  # README examples on the demo's run: checked after `make demo`


@pytest.mark.parametrize("command,shown", [(c, s) for c, s in readme_examples()
                                           if AFTER_DEMO not in c], ids=lambda x: str(x)[:40])
def test_readme_example_prints_what_readme_shows(command, shown, tmp_path):
    result = run(command, tmp_path, fewer=None)  # as shown (a doctor times fewer steps)
    printed = (result.stdout + result.stderr).splitlines()
    for line in shown:
        assert line in printed, f"{command}: README shows {line!r}; it printed {printed}"


def test_readme_has_examples_to_check():
    assert readme_examples()


@pytest.mark.slow
def test_make_demo_recipe_runs_as_written(tmp_path):
    commands = demo_commands()
    assert [c.split()[1] for c in commands] == ["train", "prune", "quantize"]
    for command in commands:  # as written, fewer epochs: the defaults must meet their own bars
        result = run(command, tmp_path, fewer=f"train.epochs={DEMO_EPOCHS}")
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"{command}\n{output[-3000:]}"
        assert not chatter(output), f"{command}: library chatter shown: {chatter(output)}"
        assert (f"Epoch {DEMO_EPOCHS}/{DEMO_EPOCHS}" in output
                or not command.startswith("tftrain train")), output[-3000:]
    assert "| int8 |" in result.stdout and "| pruned |" in result.stdout
    summary = json.loads((tmp_path / "runs/demo/summary.json").read_text())
    assert summary["eval"]["accuracy"] >= 0.95
    pruned = json.loads((tmp_path / "runs/demo/pruned/report.json").read_text())
    assert pruned["sparsity"] >= 0.79 and pruned["accuracy_drop"] <= 0.01 + 1e-9, pruned
    for command, shown in readme_examples():  # README's examples on the demo run
        if AFTER_DEMO in command:
            result = run(command, tmp_path)
            assert result.returncode == 0, result.stderr[-2000:]
            printed = result.stdout.splitlines()
            for line in shown[:2]:  # the table's columns (its numbers vary from run to run)
                assert line in printed, f"{command}: README shows {line!r}; it printed {printed}"
    readme = {command for command, _ in readme_examples()}
    for command in [c for c in after_the_demo() if c not in readme]:  # the docs' pages
        result = run(command, tmp_path)
        assert result.returncode == 0, f"{command}\n{result.stderr[-2000:]}"
        if " evaluate " in f" {command} ":  # the export, or its int8 model: the demo's bar
            accuracy = float(re.search(r"\baccuracy=(\d\.\d+)", result.stdout).group(1))
            assert accuracy >= 0.95, f"{command}: {result.stdout}"
        elif " predict " in f" {command} ":  # every test record answered, as evaluate scores
            _assert_predicted_the_demo_split(command, result.stdout, tmp_path)
        else:  # inspect: the demo's dataset, every split with its examples
            assert all(re.search(rf"\b{split}\b.*\d", result.stdout)
                       for split in ("train", "validation", "test")), result.stdout


def _assert_predicted_the_demo_split(command: str, stdout: str, cwd) -> None:
    """A predict on data/digits's test split: a row per record, none bad, the classes right as
    often as the demo's bar (0.95) against the records' labels."""
    import tensorflow as tf

    from tftrain.data import manifest as manifest_lib

    data = str(cwd / "data/digits")
    files = manifest_lib.shard_files(data, manifest_lib.read(data), "test")
    labels = [str(tf.train.Example.FromString(r).features.feature["image/class/label"]
                  .int64_list.value[0]) for r in tf.data.TFRecordDataset(files).as_numpy_iterator()]
    output = cwd / next(a.split("=", 1)[1] for a in shlex.split(command)
                        if a.startswith("--output="))
    text = output.read_text()
    rows = ([json.loads(line) for line in text.splitlines()] if output.suffix == ".jsonl"
            else list(csv.DictReader(text.splitlines())))
    assert [row["input"] for row in rows] == [str(i) for i in range(len(labels))], command
    assert f"predicted {len(labels):,} rows" in stdout and "none bad" in stdout, stdout
    correct = sum(row["class"] == label for row, label in zip(rows, labels))
    assert correct >= 0.95 * len(labels), f"{command}: {correct} of {len(labels)}"


def chatter(output: str) -> list[str]:
    """TensorFlow's, tf-keras's, TFMOT's and TFLite's internal lines found in `output`."""
    from tftrain.log_filter import CHATTER

    native = ("signature_serialization.py", "functional_saver.py", "fingerprinting_utils.py",
              "INFO: Created TensorFlow Lite", "fully_quantize:", "UserWarning")
    return [line for line in output.splitlines()
            if any(p.search(line) for p in CHATTER) or any(n in line for n in native)]


def test_verbose_flag_shows_the_library_lines_again(tmp_path, digits_dir):
    """`-v 1` is the way back to everything the libraries say, in train, prune and quantize."""
    run_dir = tmp_path / "run"
    trained = run(f"tftrain train -v 1 --model_dir={run_dir} --params_override=data.dir="
                  f"{digits_dir},train.steps_per_epoch=5", tmp_path, fewer="train.epochs=1")
    assert trained.returncode == 0, trained.stderr[-2000:]
    # on the run just trained, one fine-tuning epoch (its 5 steps): the cheapest prune there is
    pruned = run(f"tftrain prune -v 1 --model_dir={run_dir} --epochs=1", tmp_path)
    quantized = run(f"tftrain quantize -v 1 --model_dir={run_dir} --mode=dynamic", tmp_path)
    assert pruned.returncode == 0, pruned.stderr[-2000:]
    assert quantized.returncode == 0, quantized.stderr[-2000:]
    saving = ("Sharding callback duration", "Writing fingerprint")  # a SavedModel written
    each_shows = {  # each command its own lines (quantize alone shows all the train lines too)
        "train": (trained, saving),
        "prune": (pruned, saving + ("Found untraced", "Assets written to",
                                    "No training configuration found")),
        "quantize": (quantized, saving + ("Assets written to",
                                          "No training configuration found")),
    }
    for command, (result, lines) in each_shows.items():
        shown = chatter(result.stdout + result.stderr)
        for expected in lines:
            assert any(expected in line for line in shown), f"{command} -v 1 hides {expected!r}"
