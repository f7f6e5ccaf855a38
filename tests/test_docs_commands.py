"""Every `tftrain` command in a code block of README.md and docs/ names a real command, only that command's
flags with values it accepts, and (train, check, doctor) a config that builds with its
overrides: a renamed flag or config key fails here, not in a user's terminal.

These are checked, not run, here; `run_by_tests` says which tests run them as written, and
the rest are listed, with why, in docs/testing.md (TPU and GPU hosts, a bucket, a download, a
user's own files).
"""
import ast
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
# "[--steps=100]", "PATH_OR_NAME" (not a YAML list in an override: `{hidden_units: [64]}`)
SYNOPSIS = re.compile(r"\[--|\bPATH_OR_NAME\b|\.\.\.|\bHOST:")


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


# --- which of them run, and where -----------------------------------------------------------

NOT_RUN_SECTION = "## Documented commands the suite does not run"
# read the demo's run and data: cheap
AFTER_DEMO_KINDS = ("evaluate", "inspect", "report", "predict")


def after_the_demo() -> list[str]:
    """The docs' commands that only read `make demo`'s run (runs/demo) or its data (data/digits):
    tests/test_documented_commands.py runs them, as written, after the demo recipe (but those
    that a test of their subject runs, `tests/documented.py`: e.g. an evaluate of another run
    on the demo's data)."""
    from tests import documented

    return sorted({c for _, c in COMMANDS_IN_DOCS if c.split()[1] in AFTER_DEMO_KINDS
                   and re.search(r"(^|[ =])(runs/demo|data/digits)\b", c)
                   and c not in documented.RUN_BY})


def run_by_tests() -> set[str]:
    """Commands the suite runs as written: config headers, README's examples, the demo recipe,
    the docs' commands on the demo's run and the guides' (tests/test_documented_commands.py),
    the own-data guide's (tests/test_own_data_guide.py), the reference pages' conversions
    (tests/test_docs_conversions.py) and those a test of their subject runs
    (tests/documented.py)."""
    from tests import documented
    from tests import test_documented_commands as shown
    from tests.test_docs_conversions import COMMANDS as conversions
    from tests.test_own_data_guide import guide_commands

    return ({c for _, c in shown.CONFIG_COMMANDS} | set(shown.demo_commands())
            | {c for c, _ in shown.readme_examples()} | set(after_the_demo())
            | set(shown.GUIDE_COMMANDS) | set(guide_commands()) | set(conversions)
            | set(documented.RUN_BY))


def calls_of_args(path: str, function: str) -> set[str]:
    """The constant commands that `function` (a test or fixture) in the test file at `path`
    passes to `documented.args`."""
    tree = ast.parse(open(os.path.join(REPO, path), encoding="utf-8").read())
    (node,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
    return {call.args[0].value for call in ast.walk(node) if isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute) and call.func.attr == "args"
            and isinstance(call.func.value, ast.Name) and call.func.value.id == "documented"
            and call.args and isinstance(call.args[0], ast.Constant)}


def test_a_command_left_to_a_test_is_shown_and_that_test_runs_it():
    from tests import documented
    from tests.test_documented_commands import CONFIG_COMMANDS

    shown = {c for _, c in COMMANDS_IN_DOCS} | {c for _, c in CONFIG_COMMANDS}
    for command, where in documented.RUN_BY.items():
        assert command in shown, f"no page or config header shows {command!r} any more"
        path, function = where.split("::")
        assert command in calls_of_args(path, function), \
            f"{where} does not run documented.args({command!r})"


def without_defaults(command: str) -> str:
    """`command` without the --flags it gives at their defaults (`tftrain prune
    --target_sparsity=0.8` is `tftrain prune`) and, for `train`, without its --model_dir on
    the local disk (where the run is written, not what it trains): the same run."""
    args = shlex.split(command)
    if args[1] not in COMMANDS:  # the other test names it; no module is imported by its text
        return command
    module = importlib.import_module(f"tftrain.cli.{args[1]}")
    kept = args[:2]
    for arg in args[2:]:
        key, _, value = arg[2:].partition("=")
        if args[1] == "train" and key == "model_dir" and "://" not in value:
            continue
        if arg.startswith("--") and value and key in flags.FLAGS \
                and flags.FLAGS[key] in flags.FLAGS.get_key_flags_for_module(module) \
                and flags.FLAGS[key].parser.parse(value) == flags.FLAGS[key].default:
            continue
        kept.append(arg)
    return shlex.join(kept)


def not_run() -> dict[str, str]:
    """{command: why} from the table in docs/testing.md that lists the documented commands the
    suite does not run."""
    text = open(os.path.join(REPO, "docs", "testing.md"), encoding="utf-8").read()
    section = text.split(NOT_RUN_SECTION, 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(tftrain [^`]+)` \| (.+?) \|$", section, re.MULTILINE)
    return dict(rows)


def test_every_docs_command_is_run_by_a_test_or_listed_with_why():
    ran = run_by_tests()
    same_runs = {without_defaults(c) for c in ran}
    listed = not_run()
    unaccounted = sorted({c for _, c in COMMANDS_IN_DOCS if c not in ran
                          and without_defaults(c) not in same_runs and c not in listed})
    assert not unaccounted, "run these in a test or list them, with why, in docs/testing.md " \
                            f"under {NOT_RUN_SECTION!r}:\n" + "\n".join(unaccounted)
    shown = {c for _, c in COMMANDS_IN_DOCS}
    assert not [c for c in listed if c not in shown], "listed but no longer in the docs"
    assert not [c for c in listed if c in ran], "listed as not run, but a test runs it"
    assert all(len(why.split()) >= 3 for why in listed.values()), listed


def test_a_flag_at_its_default_is_the_same_run():
    assert without_defaults("tftrain prune --model_dir=runs/demo --target_sparsity=0.8") == \
        "tftrain prune --model_dir=runs/demo"
    assert without_defaults("tftrain prune --model_dir=runs/demo --target_sparsity=0.5") == \
        "tftrain prune --model_dir=runs/demo --target_sparsity=0.5"
    assert without_defaults("tftrain train --config=text_lm --model_dir=runs/lm") == \
        "tftrain train --config=text_lm"
    assert without_defaults("tftrain train --model_dir=gs://b/r") == "tftrain train --model_dir=gs://b/r"
