"""An installed wheel works: built from this checkout, installed into a fresh venv, run elsewhere.

The wheel is built the way a release is (`python -m build`: an sdist, then the wheel from that
sdist) and installed with `pip install --no-deps` into a new venv. Installing TensorFlow there
afresh would take minutes and about 2 GB, so the new venv sees this venv's already installed,
pinned dependencies through a `.pth` line that puts them after its own site-packages: the
wheel's `tftrain` and `pipelines` come first, and `pip check` there tests the wheel's declared
requirements against them. Every command runs from a temporary directory, never the checkout.

What the wheel asks of an environment is checked with pip's resolver against the index
(`pip install --dry-run`, nothing installed): the ranges of its requirements alone (what a
user's `pip install` resolves), and with constraints.txt (the exact set `make` installs).
"""
import json
import os
import site
import subprocess
import sys
import sysconfig
import zipfile

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.conftest import REPO
from tests.test_packaging import _dry_run, _errors, locked_versions

pytestmark = pytest.mark.slow

PACKAGE_ROOTS = ("tftrain", "pipelines")


def _run(command, timeout, cwd=None, env=None):
    """Runs `command` bounded by `timeout` seconds; returns the CompletedProcess (text)."""
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, check=False)


def _check(result, what):
    assert result.returncode == 0, (f"{what} exited {result.returncode}\nstdout:\n"
                                    f"{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}")
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel built from this checkout, through its sdist, by the project's own backend."""
    out = tmp_path_factory.mktemp("dist")
    result = _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), REPO],
                  timeout=300)
    if "No module named build" in result.stderr:
        pytest.fail("`python -m build` is missing: the dev extra in pyproject.toml installs it "
                    "(`make install`)")
    _check(result, "python -m build")
    (path,) = out.glob("*.whl")
    return str(path)


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
    """A fresh venv with the wheel installed; returns (bin dir, its site-packages, env)."""
    venv = tmp_path_factory.mktemp("venv")
    _check(_run([sys.executable, "-m", "venv", str(venv)], timeout=180), "python -m venv")
    python = str(venv / "bin" / "python")
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = _check(_run([python, "-c", where], timeout=60), "the venv's python").stdout.strip()
    # A plain path line: appended after the new site-packages, and the .pth files of the project
    # venv (its editable-install finder among them) are not run.
    dependencies = [p for p in site.getsitepackages() + [sysconfig.get_paths()["purelib"]]
                    if os.path.isdir(p)]
    with open(os.path.join(purelib, "project_dependencies.pth"), "w", encoding="utf-8") as f:
        f.write("\n".join(dict.fromkeys(dependencies)) + "\n")
    _check(_run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", wheel],
                timeout=300), "pip install --no-deps WHEEL")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return str(venv / "bin"), purelib, env


def test_wheel_ships_every_module_and_the_configs(wheel):
    """Every module of tftrain/ and pipelines/ and every configs/*.yaml is in the wheel."""
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    expected = set()
    for root in PACKAGE_ROOTS:
        for folder, dirs, files in os.walk(os.path.join(REPO, root)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            expected |= {os.path.relpath(os.path.join(folder, f), REPO).replace(os.sep, "/")
                         for f in files if f.endswith(".py")}
    missing = sorted(expected - names)
    packages = sorted({os.path.dirname(name).replace("/", ".") for name in missing})
    assert not missing, (f"not in the wheel: {missing}; add {packages} to [tool.setuptools] "
                         "packages in pyproject.toml")
    configs = sorted(f for f in os.listdir(os.path.join(REPO, "configs")) if f.endswith(".yaml"))
    assert configs and {f"tftrain/configs/{f}" for f in configs} <= names, (
        "the configs/*.yaml are not in the wheel as tftrain/configs/ (pyproject.toml: "
        "[tool.setuptools.package-dir] and package-data for tftrain.configs)")
    top_level = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert top_level == set(PACKAGE_ROOTS), f"the wheel installs other top-level names: {top_level}"


def test_installed_wheel_runs_from_its_own_venv(installed, tmp_path):
    """The new venv imports the wheel's code, finds its configs and passes `pip check`."""
    bin_dir, purelib, env = installed
    python = os.path.join(bin_dir, "python")
    probe = ("import json, pipelines, tftrain, tftrain.config as c; print(json.dumps([tftrain."
             "__file__, pipelines.__file__, c.CONFIG_DIR, c.resolve_config_path('digits')]))")
    paths = json.loads(_check(_run([python, "-c", probe], timeout=120, cwd=tmp_path, env=env),
                              "import tftrain").stdout.strip().splitlines()[-1])
    for path in paths:
        assert path.startswith(purelib + os.sep), f"{path} is not inside the new venv's {purelib}"
    assert paths[2] == os.path.join(purelib, "tftrain", "configs")
    _check(_run([python, "-m", "pip", "check"], timeout=180, cwd=tmp_path, env=env), "pip check")

    tftrain = os.path.join(bin_dir, "tftrain")
    shown = _check(_run([tftrain, "--help"], timeout=120, cwd=tmp_path, env=env), "tftrain --help")
    assert "usage: tftrain <command>" in shown.stdout and "train" in shown.stdout, shown.stdout

    unknown = _run([tftrain, "train", "--config=no_such_config"], timeout=120, cwd=tmp_path,
                   env=env)
    assert unknown.returncode == 2, unknown.stderr
    assert "shipped configs: diabetes, digits, digits_dtensor, digits_tpu" in unknown.stderr, unknown.stderr

    own = tmp_path / "mine.yaml"  # a user's own config path is read (its bad key is reported)
    own.write_text("train:\n  epoch: 1\n", encoding="utf-8")
    result = _run([tftrain, "train", f"--config={own}"], timeout=120, cwd=tmp_path, env=env)
    assert result.returncode == 2 and "train.epochs" in result.stderr, result.stderr


@pytest.mark.timeout(1200)
def test_installed_wheel_trains_and_inspects_in_another_directory(installed, tmp_path):
    """`tftrain train` with the default config converts data/digits and trains where it runs."""
    bin_dir, _, env = installed
    tftrain = os.path.join(bin_dir, "tftrain")
    _check(_run([tftrain, "train", "--params_override=train.epochs=1", "--model_dir=runs/wheel"],
                timeout=900, cwd=tmp_path, env=env), "tftrain train")
    assert (tmp_path / "data" / "digits" / "dataset.json").is_file()
    run_dir = tmp_path / "runs" / "wheel"
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    assert summary["epochs"] == 1 and summary["data_dir"] == "data/digits", summary
    # It learned: 10 digit classes (chance 0.1); one epoch measured 0.83 on the test split.
    assert summary["eval"]["split"] == "test" and summary["eval"]["accuracy"] >= 0.5, summary
    assert list(run_dir.glob("export/*/saved_model.pb"))

    shown = _check(_run([tftrain, "inspect", "--data=data/digits"], timeout=300, cwd=tmp_path,
                        env=env), "tftrain inspect")
    assert "dataset data/digits: 1,797 examples" in shown.stdout, shown.stdout
    for split, examples in (("train", 1426), ("validation", 182), ("test", 189)):
        assert f"{split}: {examples} examples" in shown.stdout, shown.stdout


def _requirements(wheel) -> dict:
    """The wheel's own requirements (no extra's): {canonical name: Requirement}."""
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        lines = archive.read(metadata).decode("utf-8").splitlines()
    requirements = [Requirement(line.split(":", 1)[1]) for line in lines
                    if line.startswith("Requires-Dist:")]
    return {canonicalize_name(r.name): r for r in requirements
            if not (r.marker and "extra" in str(r.marker))}


def _minor(version: str) -> tuple:
    return Version(version).release[:2]


def test_the_wheel_declares_ranges_and_pip_resolves_them(wheel):
    """No exact pin: a TensorFlow 2.21.x patch release a user has fits; the resolver picks one
    TensorFlow minor version for tensorflow, tf-keras and tensorflow-text."""
    requirements = _requirements(wheel)
    pinned = sorted(str(r) for r in requirements.values()
                    if any(s.operator in ("==", "===") for s in r.specifier))
    assert not pinned, (f"the wheel pins {pinned}: declare ranges in pyproject.toml; exact "
                        "versions belong in constraints.txt")
    for name, accepts, refuses in (("tensorflow", ["2.21.0", "2.21.7"], ["2.20.1", "2.22.0"]),
                                   ("tf-keras", ["2.21.0", "2.21.7"], ["2.20.1", "2.22.0"]),
                                   # 2.21.0's wheel fails to import (an undefined ICU symbol)
                                   ("tensorflow-text", ["2.21.1", "2.21.7"],
                                    ["2.21.0", "2.20.1", "2.22.0"])):
        specifier = requirements[name].specifier
        assert [v for v in accepts + refuses if specifier.contains(v)] == accepts, (
            name, str(specifier))

    result, chosen = _dry_run(wheel)
    assert chosen is not None, f"pip install WHEEL does not resolve:\n{_errors(result)}"
    minors = {name: _minor(chosen[name]["version"])
              for name in ("tensorflow", "tf-keras", "tensorflow-text")}
    assert set(minors.values()) == {(2, 21)}, minors
    for name, requirement in requirements.items():
        if requirement.marker is None or requirement.marker.evaluate():
            assert requirement.specifier.contains(chosen[name]["version"], prereleases=True), (
                name, chosen[name]["version"])


def test_the_wheel_with_the_constraints_installs_exactly_the_locked_versions(wheel):
    """`pip install WHEEL -c constraints.txt` resolves, and every package it would install has
    the version constraints.txt gives it (none floats)."""
    locked = locked_versions()
    result, chosen = _dry_run(wheel, extra_args=("-c", f"{REPO}/constraints.txt"))
    assert chosen is not None, (f"pip install WHEEL -c constraints.txt does not resolve:\n"
                                f"{_errors(result)}\nregenerate it: make constraints")
    chosen.pop("tftrain")
    assert len(chosen) > 50, sorted(chosen)  # TensorFlow's dependencies, not only the wheel's
    differ = {name: (metadata["version"], locked.get(name))
              for name, metadata in chosen.items() if metadata["version"] != locked.get(name)}
    assert not differ, f"{{name: (resolved, constraints.txt)}}: {differ}; make constraints"
