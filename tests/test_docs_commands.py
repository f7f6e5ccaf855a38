"""Every `tftrain` command in a code block of README.md and docs/ names a real command, only that command's
flags with values it accepts, and (train, check, doctor) a config that builds with its
overrides: a renamed flag or config key fails here, not in a user's terminal.

These are checked, not run: README's `$` examples, the `make demo` recipe and every shipped
config's header commands run as written in tests/test_documented_commands.py; running each
page's commands too (trainings, TPU and GPU hosts, a user's own files) does not fit the suite's
budget (docs/testing.md).
"""
import glob
import importlib
import os
import re
import shlex

import pytest
from absl import flags

from tests.conftest import REPO
from tftrain import config as config_lib
from tftrain.cli import COMMANDS

ABSL_FLAGS = {"v", "verbosity", "logtostderr", "alsologtostderr", "log_dir"}
SYNOPSIS = re.compile(r"\[|\bPATH_OR_NAME\b|\.\.\.|\bHOST:")  # "[--steps=100]", "PATH_OR_NAME"


def docs_commands() -> list[tuple[str, str]]:
    """(page, command) for each `tftrain ...` line of a fenced code block in README.md and
    docs/, with its continuation lines joined and a trailing `# comment` dropped; synopses
    and examples of a refusal (the error line follows) left out."""
    found = []
    pages = [os.path.join(REPO, "README.md")] + sorted(
        glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True))
    for path in pages:
        lines, in_code, i = open(path, encoding="utf-8").read().splitlines(), False, 0
        while i < len(lines):
            text = lines[i].strip()
            if text.startswith("```"):
                in_code = not in_code
            elif in_code and re.match(r"^(\$ )?(PYTHONPATH=\S+ )?tftrain [a-z_]+", text):
                command = text[text.index("tftrain "):]
                while command.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    command = command[:-1].rstrip() + " " + lines[i].strip()
                command = re.sub(r"\s+#\s.*$", "", command)
                shows_its_error = i + 1 < len(lines) and ": error: " in lines[i + 1]
                if not (SYNOPSIS.search(command) or shows_its_error
                        or re.match(r"tftrain \w+: error", command)):
                    found.append((os.path.relpath(path, REPO), command))
            i += 1
    return found


COMMANDS_IN_DOCS = docs_commands()


def test_the_docs_show_commands():
    assert len(COMMANDS_IN_DOCS) >= 40, COMMANDS_IN_DOCS


@pytest.mark.parametrize("page,command", COMMANDS_IN_DOCS,
                         ids=[f"{page}:{i}" for i, (page, _) in enumerate(COMMANDS_IN_DOCS)])
def test_a_docs_command_names_real_flags_and_a_config_that_builds(page, command):
    args = shlex.split(command)[1:]
    name, args = args[0], args[1:]
    assert name in COMMANDS, f"{page}: {command}"
    module = importlib.import_module(f"tftrain.cli.{name}")
    own = {f.name for f in flags.FLAGS.get_key_flags_for_module(module)} | ABSL_FLAGS
    given = args[:args.index("--")] if "--" in args else args
    values = {}
    positional = getattr(module, "ACCEPTS_ARGUMENTS", False)
    for arg in given:
        if positional and not arg.startswith("-"):
            continue
        assert arg.startswith("--"), f"{page}: {command}: {arg!r} is not a --flag"
        key, _, value = arg[2:].partition("=")
        assert key in own, f"{page}: {command}: --{key} is not a flag of `tftrain {name}`"
        values[key] = flags.FLAGS[key].parser.parse(value) if value else True
    if name in ("train", "check", "doctor"):
        flag_values = {f"runtime.{key}": values[key] for key in ("strategy", "tpu", "mesh")
                       if key in values}
        config_lib.build_config(values.get("config", "digits"), flag_values,
                                values.get("params_override", ""))
    if name == "launch":  # the worker command after `--` is a command of its own
        assert args[args.index("--") + 1] in COMMANDS, f"{page}: {command}"
