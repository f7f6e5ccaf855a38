"""Packaging: constraints.txt is what `make constraints` makes of pyproject.toml, and the venv
`make` installed holds it; the `tpu` extra resolves on PyPI; the command refuses a Keras 3
environment, the Python API forces tf-keras (and says so).

The `tpu` tests ask PyPI with `pip install --dry-run --ignore-installed` (nothing is installed;
they need the network, which CI has). See docs/tpu.md for why the extra is the 2.20 set a TPU VM
installs in place of the tensorflow/tf-keras pins, not on top of them.
"""
import json
import os
import subprocess
import sys

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import PYTHON, REPO

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib

TFTRAIN = os.path.join(os.path.dirname(sys.executable), "tftrain")
PIP_TIMEOUT = 600
FIX = ("`pip index versions tensorflow-tpu` lists its releases; pin one that exists, with the "
       "libtpu and the tf-keras of the same TensorFlow version, in the tpu extra of "
       "pyproject.toml, and update the commands in docs/tpu.md")


def _tpu_extra() -> dict:
    """The `tpu` extra of pyproject.toml: {canonical name: Requirement}."""
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        extra = tomllib.load(f)["project"]["optional-dependencies"]["tpu"]
    return {canonicalize_name(r.name): r for r in map(Requirement, extra)}


def _dry_run(*requirements, no_deps=False, extra_args=()):
    """`pip install --dry-run` against the index; returns (result, {name: metadata} or None)."""
    command = [PYTHON, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--report", "-", *(["--no-deps"] if no_deps else []), *extra_args, *requirements]
    result = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT,
                            stdin=subprocess.DEVNULL, check=False)
    if result.returncode != 0:
        return result, None
    report = json.loads(result.stdout)
    return result, {canonicalize_name(item["metadata"]["name"]): item["metadata"]
                    for item in report["install"]}


def _errors(result) -> str:
    lines = [line for line in result.stderr.splitlines() if "is ignored" not in line]
    return "\n".join(lines[-15:])


def locked_versions() -> dict:
    """constraints.txt's versions for this interpreter: {canonical name: version}."""
    locked = {}
    with open(os.path.join(REPO, "constraints.txt"), encoding="utf-8") as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                requirement = Requirement(line.strip())
                if requirement.marker is None or requirement.marker.evaluate():
                    (pin,) = requirement.specifier
                    assert pin.operator == "==", line  # a lock: exact versions only
                    locked[canonicalize_name(requirement.name)] = pin.version
    return locked


def test_constraints_are_what_make_constraints_makes_of_pyproject(tmp_path):
    """uv resolves pyproject.toml (the dev extra, every Python it supports) to exactly the
    versions of constraints.txt: no requirement changed without the lock."""
    lock = tmp_path / "constraints.txt"
    with open(os.path.join(REPO, "constraints.txt"), encoding="utf-8") as f:
        committed = f.read()
    lock.write_text(committed, encoding="utf-8")  # uv keeps the versions there that still fit
    uv = os.path.join(os.path.dirname(sys.executable), "uv")
    command = [uv, "pip", "compile", "pyproject.toml", "--extra", "dev", "--universal",
               "--no-annotate", "--quiet", "--custom-compile-command", "make constraints",
               "-o", str(lock)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False,
                            timeout=PIP_TIMEOUT, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-3000:]
    assert lock.read_text(encoding="utf-8") == committed, (
        "constraints.txt is stale against pyproject.toml: run `make constraints` and commit it")


def test_the_venv_holds_exactly_the_constrained_versions():
    """The venv these tests run in (`make install`: uv with -c constraints.txt) has every
    package of constraints.txt at its version."""
    from importlib import metadata
    differ = {}
    for name, version in locked_versions().items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = None
        if installed != version:
            differ[name] = (installed, version)
    assert not differ, (f"{{package: (installed, constraints.txt)}}: {differ}; `make install` "
                        "installs constraints.txt")


def test_tpu_extra_resolves_on_pypi_without_the_cpu_tensorflow():
    """tensorflow-tpu and libtpu resolve together; tf-keras accepts that TensorFlow version."""
    extra = _tpu_extra()
    assert "tensorflow-tpu" in extra, "the tpu extra of pyproject.toml names no tensorflow-tpu"
    tpu, libtpu, tf_keras = extra["tensorflow-tpu"], extra.get("libtpu"), extra.get("tf-keras")
    result, installed = _dry_run(*(str(r) for r in (tpu, libtpu) if r))
    assert installed is not None, f"{tpu} ({libtpu}) does not resolve:\n{_errors(result)}\n{FIX}"
    assert libtpu and tf_keras, (
        "the tpu extra must pin libtpu (an unpinned one can be too new: libtpu 0.0.32+ aborts "
        "`import tensorflow` with tensorflow-tpu 2.20) and tf-keras (installed --no-deps)")
    assert "tensorflow" not in installed, (
        f"{tpu} pulls in tensorflow {installed.get('tensorflow', {}).get('version')} too: the two "
        "install the same files; a TPU VM must have only the TPU build")
    assert installed["libtpu"]["version"] in libtpu.specifier, installed["libtpu"]
    tf_version = installed["tensorflow-tpu"]["version"]

    result, keras = _dry_run(str(tf_keras), no_deps=True)
    assert keras is not None, f"{tf_keras} is not on the index:\n{_errors(result)}\n{FIX}"
    needs = [Requirement(r) for r in keras["tf-keras"].get("requires_dist", [])]
    needs = [r for r in needs if canonicalize_name(r.name) == "tensorflow"]
    assert needs and all(r.specifier.contains(tf_version) for r in needs), (
        f"{tf_keras} requires {[str(r) for r in needs]}, which tensorflow-tpu {tf_version} does "
        f"not satisfy. {FIX}")


def test_tpu_extra_never_installs_two_tensorflow_builds():
    """`pip install '.[tpu]'` refuses (the extra's tf-keras against the tf-keras pin,
    pyproject.toml), so it never installs tensorflow-tpu over tensorflow (the same files)."""
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        pins = map(Requirement, tomllib.load(f)["project"]["dependencies"])
    (keras_pin,) = [r for r in pins if canonicalize_name(r.name) == "tf-keras"]
    assert keras_pin.specifier != _tpu_extra()["tf-keras"].specifier  # what pip refuses
    result, installed = _dry_run(f"{REPO}[tpu]", extra_args=("--no-build-isolation",))
    assert installed is None, (
        f"pip install '.[tpu]' resolves, to tensorflow "
        f"{installed.get('tensorflow', {}).get('version')} and tensorflow-tpu "
        f"{installed.get('tensorflow-tpu', {}).get('version')}: the tpu extra must not add "
        "tensorflow-tpu on top of the tensorflow pin (the same files; docs/tpu.md installs it "
        "in place of tensorflow), and `pip install '.[tpu]'` must stay refused")
    assert "ResolutionImpossible" in result.stderr and "tftrain[tpu]" in result.stderr, (
        f"pip install '.[tpu]' failed, but not on the expected tf-keras conflict:\n"
        f"{_errors(result)}")


def _env(**values):
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env.update(values)
    return env


@pytest.mark.parametrize("value", ["0", "false"])
def test_command_refuses_a_keras_3_environment_in_one_line(value, tmp_path):
    """TF_USE_LEGACY_KERAS=0: one line about the variable, exit 2, before TensorFlow starts."""
    result = subprocess.run([TFTRAIN, "inspect", "--data=/nonexistent"], capture_output=True,
                            text=True, timeout=120, cwd=tmp_path, stdin=subprocess.DEVNULL,
                            env=_env(TF_USE_LEGACY_KERAS=value), check=False)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"TF_USE_LEGACY_KERAS={value!r}" in lines[0], result.stderr
    assert "set TF_USE_LEGACY_KERAS=1" in lines[0] and "dataset" not in lines[0], lines[0]

    probe = ("import sys\nfrom tftrain.cli import run\ntry:\n    run(['tftrain', 'inspect', "
             "'--data=/nonexistent'])\nexcept SystemExit as e:\n    print(e.code, "
             "'tensorflow' in sys.modules)")
    result = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path, env=_env(TF_USE_LEGACY_KERAS=value), check=False)
    assert result.stdout.split() == ["2", "False"], result  # refused before importing TensorFlow


def test_import_under_a_keras_3_environment_forces_tf_keras_and_says_so_once(tmp_path):
    """The Python API: TF_USE_LEGACY_KERAS=0 is forced to 1, with one warning when TensorFlow
    is imported; unset is set silently; TensorFlow imported first with Keras 3 is an ImportError."""
    probe = ("import json, os, sys, warnings, tftrain\n"
             "before = [os.environ['TF_USE_LEGACY_KERAS'], 'tensorflow' in sys.modules]\n"
             "import tensorflow as tf, tf_keras\n"
             "from tftrain.data import reader\n"
             "import tensorflow\n"
             "print(json.dumps(before + [tf._tf_uses_legacy_keras,\n"
             "                 tf.keras.layers.Dense is tf_keras.layers.Dense]))")
    result = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path, env=_env(TF_USE_LEGACY_KERAS="0"), check=False)
    assert result.returncode == 0, result
    assert json.loads(result.stdout) == ["1", False, True, True], result
    warned = [line for line in result.stderr.splitlines() if "LegacyKerasWarning" in line]
    assert len(warned) == 1, result.stderr  # once, naming the variable, its value and why
    assert "TF_USE_LEGACY_KERAS='0'" in warned[0] and "set TF_USE_LEGACY_KERAS=1" in warned[0]
    assert "tensorflow-model-optimization need tf-keras" in warned[0], warned[0]

    quiet = ("import json, os, sys, tftrain; print(json.dumps([os.environ['TF_USE_LEGACY_KERAS'], "
             "tftrain.legacy_keras_problem(), 'tensorflow' in sys.modules]))")
    result = subprocess.run([PYTHON, "-c", quiet], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path, env=_env(), check=False)
    assert json.loads(result.stdout) == ["1", None, False], result  # unset: tftrain sets it
    assert result.stderr == "", result.stderr

    # TensorFlow imported first (Keras 3 as tf.keras): the data API works as usual; building
    # a model says why it cannot, in one ImportError.
    late = ("import tensorflow\nimport tftrain.data\nfrom pipelines import load_pipeline\n"
            "from tftrain.data.writer import write_dataset\nfrom tftrain import models\n"
            "write_dataset(load_pipeline('digits'), '', 'digits')\n"
            "inputs, labels = next(iter(tftrain.data.load('digits', 'train', 8, training=True)))\n"
            "print(tuple(inputs.shape), tuple(labels.shape))\n"
            "models.build_model('mlp', {}, (4,), 2)")
    result = subprocess.run([PYTHON, "-c", late], capture_output=True, text=True, timeout=300,
                            cwd=tmp_path, env=_env(), check=False)
    assert result.returncode == 1, result
    assert result.stdout.strip().splitlines()[-1] == "(8, 8, 8, 1) (8,)", result
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("ImportError: TensorFlow was imported before tftrain without "
                            "TF_USE_LEGACY_KERAS=1, so its tf.keras is Keras 3"), result.stderr
    assert "import tftrain before tensorflow" in error


def test_command_runs_when_the_variable_selects_tf_keras(tmp_path):
    """TF_USE_LEGACY_KERAS=true (a value TensorFlow takes for tf-keras) is not refused."""
    result = subprocess.run([TFTRAIN, "inspect", "--data=/nonexistent"], capture_output=True,
                            text=True, timeout=300, cwd=tmp_path, stdin=subprocess.DEVNULL,
                            env=_env(TF_USE_LEGACY_KERAS="true"), check=False)
    assert result.returncode == 1 and "dataset.json is missing" in result.stderr, result.stderr
    assert "TF_USE_LEGACY_KERAS" not in result.stderr
