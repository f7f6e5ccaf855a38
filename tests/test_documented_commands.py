"""Every command a user is shown runs, exactly as written, on the data its default path creates.

- each shipped config's header commands (`# Run: tftrain ...`, continued with `\\`);
- README's `$ tftrain ...` examples, whose following lines are the output they must print;
- the `make demo` recipe.

They run as the user runs them: each its own process entering `tftrain.cli.run` (the console
script's entry point; forked from a server that imported TensorFlow once, `tests/forked_cli.py`;
tests/test_wheel.py runs the installed script itself), in a fresh directory (so the first
command converts `data/digits` the way the default path does), with only the epoch count
lowered (`train.epochs`). Commands that need a Cloud TPU VM and a bucket
(`YOUR_BUCKET`) run too, and must stop with the one-line error of a machine without a TPU.
"""
import glob
import json
import os
import re
import shlex
import subprocess

import pytest

from tests import forked_cli
from tests.conftest import REPO

EPOCHS = "train.epochs=1"
TIMEOUT = 420
# Configs whose model is too big for the suite: their commands run here on a model of a few
# million parameters with the same settings otherwise; bench/big_model.py runs them as written.
SMALLER = {"lm_1b.yaml": "model.params={width: 128, num_layers: 2, num_heads: 4, "
                         "mlp_width: 512, remat: true}"}


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


def with_fewer_epochs(args: list[str], epochs: str | None = EPOCHS) -> list[str]:
    """`args` of a `tftrain train` command with `train.epochs` lowered by override."""
    if args[:2] != ["tftrain", "train"] or not epochs:
        return args
    return with_override(args, epochs)


def with_override(args: list[str], override: str) -> list[str]:
    """`args` with `override` added to (or as) their --params_override."""
    for i, arg in enumerate(args):
        if arg.startswith("--params_override="):
            return args[:i] + [f"{arg},{override}"] + args[i + 1:]
    return args + [f"--params_override={override}"]


def run(command: str, cwd, epochs: str | None = EPOCHS,
        smaller: str | None = None) -> subprocess.CompletedProcess:
    args = with_fewer_epochs(shlex.split(command), epochs)
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


def test_every_shipped_config_shows_how_to_run_it():
    shipped = {os.path.basename(p) for p in glob.glob(os.path.join(REPO, "configs", "*.yaml"))}
    assert shipped and shipped == {name for name, _ in CONFIG_COMMANDS}


@pytest.mark.slow
@pytest.mark.parametrize("config,command", CONFIG_COMMANDS,
                         ids=[f"{name}:{i}" for i, (name, _) in enumerate(CONFIG_COMMANDS)])
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


AFTER_DEMO = "runs/demo"  # README examples on the demo's run: checked after `make demo`


@pytest.mark.parametrize("command,shown", [(c, s) for c, s in readme_examples()
                                           if AFTER_DEMO not in c], ids=lambda x: str(x)[:40])
def test_readme_example_prints_what_readme_shows(command, shown, tmp_path):
    result = run(command, tmp_path, epochs=None)  # exactly as shown
    printed = (result.stdout + result.stderr).splitlines()
    for line in shown:
        assert line in printed, f"{command}: README shows {line!r}; it printed {printed}"


def test_readme_has_examples_to_check():
    assert readme_examples()


@pytest.mark.slow
def test_make_demo_recipe_runs_as_written(tmp_path):
    commands = demo_commands()
    assert [c.split()[1] for c in commands] == ["train", "prune", "quantize"]
    for command in commands:  # exactly as written: the defaults must meet their own bars
        result = run(command, tmp_path, epochs=None)
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"{command}\n{output[-3000:]}"
        assert not chatter(output), f"{command}: library chatter shown: {chatter(output)}"
        assert "Epoch 15/15" in output or not command.startswith("tftrain train")
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
                  f"{digits_dir},train.steps_per_epoch=5", tmp_path)
    assert trained.returncode == 0, trained.stderr[-2000:]
    # on the run just trained, one fine-tuning epoch (its 5 steps): the cheapest prune there is
    pruned = run(f"tftrain prune -v 1 --model_dir={run_dir} --epochs=1", tmp_path)
    quantized = run(f"tftrain quantize -v 1 --model_dir={run_dir} --mode=dynamic", tmp_path)
    assert pruned.returncode == 0, pruned.stderr[-2000:]
    assert quantized.returncode == 0, quantized.stderr[-2000:]
    shown = chatter(trained.stdout + trained.stderr + quantized.stdout + quantized.stderr)
    for expected in ("Sharding callback duration", "Writing fingerprint", "Using new converter",
                     "No training configuration found"):
        assert any(expected in line for line in shown), f"-v 1 hides {expected!r}"
    shown_by_prune = chatter(pruned.stdout + pruned.stderr)
    for expected in ("Sharding callback duration", "Writing fingerprint", "Found untraced",
                     "Using new converter", "No training configuration found"):
        assert any(expected in line for line in shown_by_prune), f"prune -v 1 hides {expected!r}"
