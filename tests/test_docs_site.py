"""The docs site builds without a broken link or anchor, and its reference is the code's.

- `mkdocs build --strict` (mkdocs.yml: broken links, missing anchors and pages left out of the
  navigation are errors);
- docs/reference/config.md and cli.md are what `tools/gen_reference.py` generates from
  `tftrain/config_schema.py` and the commands' absl flags (regenerate them after changing a key
  or a flag: `python tools/gen_reference.py`);
- every config key and every flag of every command appears there, every key has an explanation,
  and the choices the reference lists are the ones the config validates;
- README stays a landing page.
"""
import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

GENERATOR = os.path.join(REPO, "tools", "gen_reference.py")


def _run(args, **kwargs):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, check=False, **kwargs)


def test_the_site_builds_strict(tmp_path):
    site = tmp_path / "site"
    done = _run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    for page in ("index.html", "benchmarks/index.html", "reference/config/index.html",
                 "reference/cli/index.html", "guides/own-data/index.html", "changelog/index.html"):
        assert (site / page).is_file(), page
    # the changelog page includes CHANGELOG.md itself
    assert "Keep a Changelog" in (site / "changelog" / "index.html").read_text(encoding="utf-8")


def test_the_generated_reference_is_current():
    done = _run([sys.executable, GENERATOR, "--check"])
    assert done.returncode == 0, (
        "docs/reference/ is stale: run `python tools/gen_reference.py`\n" + done.stdout[-4000:]
        + done.stderr[-2000:])


def _sections(text: str, prefix: str) -> dict[str, str]:
    """{heading text after `prefix`: the section's text} for the `## ` headings of a page."""
    parts = re.split(r"(?m)^## ", text)[1:]
    return {part.split("\n", 1)[0].removeprefix(prefix).strip("` "): part for part in parts}


def test_every_config_key_and_flag_is_in_the_reference():
    done = _run([sys.executable, GENERATOR, "--list"])
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    config_page = open(os.path.join(REPO, "docs", "reference", "config.md"), encoding="utf-8").read()
    missing = [key for key in listed["config_keys"] if f"| `{key}` |" not in config_page]
    assert listed["config_keys"] and not missing, missing
    cli_page = open(os.path.join(REPO, "docs", "reference", "cli.md"), encoding="utf-8").read()
    sections = _sections(cli_page, "tftrain ")
    assert set(sections) == set(listed["flags"]), sorted(sections)
    missing = [f"{command} --{flag}" for command, names in listed["flags"].items()
               for flag in names if f"| `--{flag}` |" not in sections[command]]
    assert not missing, missing


def test_every_key_is_explained_and_its_choices_are_the_validated_ones():
    from tftrain import config_schema

    keys = set(config_schema.all_keys())
    assert set(config_schema.KEY_DOCS) == keys
    assert all(text.strip() for text in config_schema.KEY_DOCS.values())
    from tftrain import config as config_lib
    from tftrain.errors import ConfigError

    for key, choices in config_schema.CHOICES.items():  # each listed value is the validated set
        if key == "task.loss":  # by task type: below
            continue
        with pytest.raises(ConfigError) as refused:
            config_lib.build_config("digits", overrides=f"{key}=bogus")
        assert f"{key}='bogus' is not one of {', '.join(choices)}" in str(refused.value), key
    losses = {loss for names in config_schema.TASK_LOSSES.values() for loss in names}
    assert set(config_schema.CHOICES["task.loss"]) == losses | {"auto"}


def test_readme_is_a_landing_page():
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    assert len(text.splitlines()) <= 200
    assert len(set(re.findall(r"\b20\d\d-\d\d-\d\d\b", text))) <= 2
    assert "VM" not in text.replace("TPU VM", ""), "a diary's VM (which machine on which day)"
    for link in re.findall(r"\]\(((?:docs/)?[\w/.-]+\.md)(?:#[\w-]*)?\)", text):
        assert os.path.exists(os.path.join(REPO, link)), link
