"""The absl CLI: command listing, per-command help, absl's own flags, one-line errors."""
import json
import os
import subprocess

import pytest

from tests.conftest import PYTHON, REPO
from tftrain.cli import COMMANDS


def run_subprocess(*args, timeout=60):
    return subprocess.run([PYTHON, "-c", "import sys; from tftrain.cli import run; run(sys.argv)", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_help_lists_commands_without_importing_tensorflow():
    probe = ("import sys; from tftrain.cli import run\n"
             "try:\n    run(['tftrain', *sys.argv[1:]])\nexcept SystemExit as e:\n"
             "    print('TF-IMPORTED' if 'tensorflow' in sys.modules else 'NO-TF', e.code)\n")
    for args in ([ "--help"], ["train", "--help"], ["convert", "--help"], ["evaluate", "--help"],
                 ["inspect", "--help"]):
        result = subprocess.run([PYTHON, "-c", probe, *args], cwd=REPO, capture_output=True,
                                text=True, timeout=60)
        assert result.stdout.strip().endswith("NO-TF 0"), (args, result.stdout, result.stderr)
    top = run_subprocess("--help").stdout
    for command in ("train", "evaluate", "convert", "inspect"):
        assert f"\n  {command} " in top
    train_help = run_subprocess("train", "--help").stdout
    for flag in ("--config", "--params_override", "--model_dir", "--strategy", "--tpu"):
        assert flag in train_help


def test_flag_and_config_errors_come_before_tensorflow_starts():
    probe = ("import sys; from tftrain.cli import run\n"
             "try:\n    run(['tftrain', *sys.argv[1:]])\nexcept SystemExit as e:\n"
             "    print('TF-IMPORTED' if 'tensorflow' in sys.modules else 'NO-TF', e.code)\n")
    for args in (["train", "--params_override=train.bogus=1"], ["prune"], ["inspect"],
                 ["quantize", "--model_dir=x"], ["evaluate", "--model=x"],
                 ["convert", "--pipeline=digits"], ["launch", "--num_workers=2"]):
        result = subprocess.run([PYTHON, "-c", probe, *args], cwd=REPO, capture_output=True,
                                text=True, timeout=60)
        assert result.stdout.strip().endswith("NO-TF 2"), (args, result.stdout, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)


def test_absl_flags_keep_working(tmp_path):
    helpfull = run_subprocess("train", "--helpfull")
    assert "--flagfile" in helpfull.stdout and "--verbosity" in helpfull.stdout
    flagfile = tmp_path / "flags.txt"
    flagfile.write_text("--params_override=train.epoch=1\n")
    result = run_subprocess("train", f"--flagfile={flagfile}", "-v", "1")
    # the flag file was read: its bad key is what the error names
    assert result.returncode == 2 and "train.epoch" in result.stderr


def test_bad_input_is_one_line_and_nonzero(tmp_path):
    cases = [
        (("trian",), "unknown command 'trian' (did you mean 'train'?)"),
        (("train", "--epochs=3"), "Unknown command line flag 'epochs'"),
        (("train", "--config=missing"), "config 'missing' not found"),
        (("train", "--strategy=magic"), "value should be one of"),
        (("train", "--params_override=model.name=vgg"), "unknown model 'vgg'"),
        (("train", "--params_override=data.batch_size=x"), "must be of type int"),
        (("evaluate", "--data=/nonexistent"), "missing required flag(s): --model"),
        (("inspect", "--data=x", "stray"), "unexpected arguments ['stray']: every option is a --flag"),
        (("train", "epochs=3"), "unexpected arguments ['epochs=3']"),
    ]
    for args, message in cases:
        result = run_subprocess(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)


def test_errors_after_tensorflow_loads_stand_alone(tmp_path, digits_dir):
    """TensorFlow's C++ start-up lines (oneDNN, CUDA stubs) do not precede or follow the error,
    not even from the converter's forkserver, which outlives a command that fails early."""
    cases = [
        (("inspect", f"--data={tmp_path}"), 1, "dataset.json is missing"),
        (("convert", "--pipeline=digits", f"--output={digits_dir}"), 1, "already holds a complete"),
        (("evaluate", f"--model={tmp_path}", f"--data={digits_dir}"), 1, "is not a SavedModel directory"),
    ]
    for args, code, message in cases:
        result = run_subprocess(*args)  # waits for every process holding its stderr
        assert result.returncode == code, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)
        assert message in result.stderr, (args, result.stderr)


def test_tensorflow_start_up_chatter_is_recognized(monkeypatch):
    from tftrain import quiet_start

    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")  # tftrain's default

    chatter = [
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "I0000 00:00:1796046621.007206   27097 port.cc:153] oneDNN custom operations are on.",
        "I0000 00:00:1796046621.007727   27097 cudart_stub.cc:31] Could not find cuda drivers",
        "W0000 00:00:1796046621.007727   27097 cpu_feature_guard.cc:227] This TensorFlow binary",
    ]
    kept = ["E0000 00:00:1796046621.1   27097 some_op.cc:12] a real error",
            "Traceback (most recent call last):", "tftrain train: error: something"]
    assert all(quiet_start.is_chatter(line) for line in chatter)
    assert not any(quiet_start.is_chatter(line) for line in kept)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")  # the user asked to see everything
    assert not any(quiet_start.is_chatter(line) for line in chatter[1:])


def test_in_process_cli_resets_flags_between_runs(cli, digits_dir, tmp_path, capsys):
    assert cli("inspect", f"--data={digits_dir}") == 0
    out = capsys.readouterr().out
    manifest = json.loads(open(f"{digits_dir}/dataset.json").read())
    assert f"train: {manifest['splits']['train']['num_examples']} examples" in out
    assert cli("inspect", f"--data={tmp_path}") == 1  # not a dataset: no dataset.json
    assert "dataset.json is missing" in capsys.readouterr().err


def test_every_command_module_loads_beside_the_others():
    # Tests run several commands in one process: their flags must not collide.
    probe = ("import importlib; from tftrain.cli import COMMANDS\n"
             "for name in COMMANDS:\n    importlib.import_module(f'tftrain.cli.{name}')\nprint('ok')")
    result = subprocess.run([PYTHON, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "ok", result.stderr[-2000:]


@pytest.mark.parametrize("order", ["listed", "reversed"])
def test_every_command_module_imports_beside_the_others(order):
    """One process may import several commands (a test process, an embedding program): no flag
    is defined twice, whichever order they come in (generate before convert raised
    DuplicateFlagError on their shared --seed)."""
    names = list(COMMANDS) if order == "listed" else list(reversed(COMMANDS))
    probe = "; ".join(f"import tftrain.cli.{name}" for name in names) + "; print('imported')"
    result = subprocess.run([PYTHON, "-c", probe], cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert result.stdout.strip() == "imported", result.stderr[-2000:]


def test_an_unexpected_error_is_one_line_and_its_traceback_comes_with_v(monkeypatch, capsys):
    """An error tftrain does not know (a bug, here or in a library) ends in one line naming it
    and where it was raised, exit 1; `-v 1` shows the traceback for a report."""
    from tests.conftest import run_cli
    from tftrain.cli import inspect as inspect_command

    def broken(argv):
        raise KeyError("a node the writer did not know")

    monkeypatch.setattr(inspect_command, "main", broken)
    assert run_cli("inspect", "--data=x") == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "unexpected KeyError: 'a node the writer did not know' (raised in test_cli.py:" in err
    assert "-v 1 for the traceback" in err
    with pytest.raises(KeyError):
        run_cli("inspect", "--data=x", "-v", "1")


@pytest.mark.parametrize("args", [["train", "--help"], ["--help"], ["inspect", "--data=DIGITS"]])
def test_output_to_a_closed_pipe_ends_quietly(args, digits_dir):
    """`tftrain train --help | head` and the like: the reader went away before the output
    came; the command ends as a Unix tool does (141, as after SIGPIPE), saying nothing."""
    from tests import forked_cli
    from tftrain import cli

    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command writes
    try:
        process = forked_cli.Popen([arg.replace("DIGITS", digits_dir) for arg in args],
                                   stdout=write, stderr=forked_cli.PIPE)
    finally:
        os.close(write)
    process.wait(120)
    assert (process.returncode, process.stderr.read()) == (cli.CLOSED_PIPE_EXIT, "")
    assert cli.CLOSED_PIPE_EXIT == 141
