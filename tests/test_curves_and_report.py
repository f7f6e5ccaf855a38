"""curves.png in every run (also after a SIGKILL and resume), and `tftrain report RUN [RUN...]`."""
import io
import json
import os
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest
from PIL import Image

from tests import forked_cli
from tests.conftest import PYTHON, REPO, run_cli
from tftrain import report, run_dir
from tftrain.callbacks import curves

pytestmark = pytest.mark.slow


def _train(model_dir, digits_dir, overrides):
    code = run_cli("train", f"--model_dir={model_dir}",
                   f"--params_override=data.dir={digits_dir},{overrides}")
    assert code == 0
    return str(model_dir)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, digits_dir):
    """Two finished digits runs: `cnn3` (the digits CNN, 3 epochs) and `mlp2` (an MLP, 2)."""
    root = tmp_path_factory.mktemp("runs")
    return (_train(root / "cnn3", digits_dir, "train.epochs=3"),
            _train(root / "mlp2", digits_dir,
                   "train.epochs=2,model.name=mlp,model.params={hidden_units: [32]}"))


def check_png(png: bytes, plots: list, title: str = "") -> None:
    """`png` decodes to an image of the size of `plots`, and inside each subplot's box there is
    a plot (pixels vary) with pixels of each of its lines' colors."""
    image = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    height, width = image.shape[:2]
    assert (width, height) == curves.image_size(len(plots))
    fig = curves.figure(plots, title)  # the same layout: where each subplot is, in pixels
    fig.canvas.draw()
    assert len(fig.axes) == len(plots)
    for ax, panel in zip(fig.axes, plots):
        box = ax.get_window_extent()
        inside = image[height - int(box.y1) + 2: height - int(box.y0) - 2,
                       int(box.x0) + 2: int(box.x1) - 2]
        assert inside.size and inside.reshape(-1, 3).var(axis=0).sum() > 0, panel.title
        assert len(ax.get_lines()) == len(panel.lines) > 0
        for line in ax.get_lines():
            rgb = np.array([int(255 * c) for c in _rgb(line.get_color())])
            near = np.abs(inside - rgb).sum(axis=-1) < 30
            assert near.sum() > 10, (panel.title, line.get_label(), line.get_color())


def _rgb(color):
    from matplotlib.colors import to_rgb

    return to_rgb(color)


def _read_png(path):
    with open(path, "rb") as f:
        return f.read()


def test_every_run_writes_curves_png_of_each_epoch(runs):
    run = runs[0]
    history = curves.read_history(run)
    assert [e["epoch"] for e in history] == [1, 2, 3]
    for key in ("loss", "accuracy", "val_loss", "val_accuracy", "learning_rate"):
        assert all(np.isfinite(e[key]) for e in history), key
    plots = curves.panels(history)
    assert [p.title for p in plots] == ["loss", "accuracy", "top5_accuracy", "learning rate"]
    assert [line.label for line in plots[0].lines] == ["train", "validation"]
    check_png(_read_png(os.path.join(run, run_dir.CURVES_PNG)), plots, "cnn3")
    # the last epoch's validation metrics are the summary's
    with open(os.path.join(run, "summary.json")) as f:
        assert json.load(f)["validation"]["accuracy"] == pytest.approx(history[-1]["val_accuracy"])


def test_a_resumed_run_reads_its_earlier_epochs_back(runs, tmp_path, monkeypatch):
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copy(os.path.join(runs[0], run_dir.CURVES_JSON), resumed)
    before = curves.read_history(str(resumed))
    # Resumed at the third epoch (index 2): epochs 1-2 come from disk, epoch 3 is run again.
    callback = curves.Curves(str(resumed))
    callback.on_train_begin()
    callback.on_epoch_begin(2)
    assert callback.history == before[:2]
    callback.on_epoch_end(2, {"loss": 0.5, "accuracy": 0.9, "val_loss": 0.6,
                              "val_accuracy": 0.8, "learning_rate": 1e-3})
    after = curves.read_history(str(resumed))
    assert [e["epoch"] for e in after] == [1, 2, 3] and after[:2] == before[:2]
    assert after[2]["val_accuracy"] == 0.8
    assert not (resumed / run_dir.CURVES_PNG).exists()  # drawn when training ends (or 30 s later)
    callback.on_train_end()
    check_png(_read_png(resumed / run_dir.CURVES_PNG), curves.panels(after), "resumed")
    # After REDRAW_SECONDS, an epoch end draws too.
    drawn = (resumed / run_dir.CURVES_PNG).stat().st_mtime_ns
    monkeypatch.setattr(curves, "REDRAW_SECONDS", 0.0)
    callback.on_epoch_end(3, {"loss": 0.4, "accuracy": 0.9, "val_loss": 0.5,
                              "val_accuracy": 0.85, "learning_rate": 1e-3})
    assert (resumed / run_dir.CURVES_PNG).stat().st_mtime_ns != drawn
    check_png(_read_png(resumed / run_dir.CURVES_PNG),
              curves.panels(curves.read_history(str(resumed))), "resumed")
    # A fresh start (epoch 0) ignores what an earlier run left; a non-chief worker writes nothing.
    fresh = curves.Curves(str(resumed))
    fresh.on_epoch_begin(0)
    assert fresh.history == []
    other = tmp_path / "worker"
    other.mkdir()
    worker = curves.Curves(str(other), chief=False)
    worker.on_epoch_begin(0)
    worker.on_epoch_end(0, {"loss": 1.0})
    assert os.listdir(other) == []


def test_sigkill_then_resume_keeps_every_epoch_in_the_picture(tmp_path, digits_dir):
    model_dir = tmp_path / "killed"
    command = ["train", f"--model_dir={model_dir}",
               f"--params_override=data.dir={digits_dir},train.epochs=4,train.steps_per_epoch=8,"
               "model.name=mlp,model.params={hidden_units: [16]},data.batch_size=16"]
    with open(tmp_path / "first.log", "w") as log:
        first = forked_cli.Popen(command, stdout=log, stderr=forked_cli.STDOUT)
        try:
            deadline = time.monotonic() + 180
            while len(_epochs(model_dir)) < 2 and first.poll() is None:
                assert time.monotonic() < deadline, "no second epoch in curves.json"
                time.sleep(0.02)
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    assert not (model_dir / "summary.json").exists(), "the run finished before it was killed"
    rerun = forked_cli.run(command, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "resumed from epoch" in rerun.stdout + rerun.stderr
    history = curves.read_history(str(model_dir))
    assert [e["epoch"] for e in history] == [1, 2, 3, 4]
    check_png(_read_png(model_dir / run_dir.CURVES_PNG), curves.panels(history), "killed")


def _epochs(model_dir):
    try:
        with open(model_dir / run_dir.CURVES_JSON) as f:
            return json.load(f)["epochs"]
    except (OSError, ValueError):
        return []


def test_report_compares_runs_in_a_table_and_a_png(runs, tmp_path, capsys):
    cnn, mlp = runs
    # A quantized model of one run: its accuracy and size get a column.
    report.optimize_report.write_quantized_report(mlp, {
        "mode": "int8", "source": "export", "accuracy": 0.9, "tflite_bytes": 4096,
        "gzip_bytes": 2048, "latency_ms": 0.01, "float_accuracy": 0.91,
        "float_tflite_bytes": 8192, "float_gzip_bytes": 7168, "float_latency_ms": 0.02})
    unfinished = tmp_path / "unfinished"  # params and curves only: killed during its 3rd epoch
    unfinished.mkdir()
    for name in ("params.yaml", run_dir.CURVES_JSON):
        shutil.copy(os.path.join(cnn, name), unfinished)
    output = tmp_path / "out" / "report.png"
    assert run_cli("report", cnn, mlp, str(unfinished), f"--output={output}") == 0
    printed = capsys.readouterr().out
    header, rule, *rows = [line for line in printed.splitlines() if line.startswith("|")]
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert columns[:2] == ["run", "epochs"]
    for column in ("test accuracy", "test loss", "val accuracy", "val loss", "steps/s",
                   "strategy", "precision", "int8: accuracy, gzip KiB"):
        assert column in columns, column
    cells = {row.split("|")[1].strip(): [c.strip() for c in row.strip("|").split("|")]
             for row in rows}
    assert set(cells) == {"cnn3", "mlp2", "unfinished (unfinished)"}
    at = {name: columns.index(name) for name in columns}
    assert cells["cnn3"][at["epochs"]] == "3" and cells["mlp2"][at["epochs"]] == "2"
    assert cells["mlp2"][at["int8: accuracy, gzip KiB"]] == "0.9000, 2.0"
    assert cells["cnn3"][at["int8: accuracy, gzip KiB"]] == "-"
    assert cells["cnn3"][at["strategy"]].startswith("one_device x1")
    assert float(cells["cnn3"][at["steps/s"]]) > 0
    assert cells["unfinished (unfinished)"][at["test accuracy"]] == "-"
    assert float(cells["unfinished (unfinished)"][at["val accuracy"]]) > 0
    assert str(output) in printed
    loaded = [report.load_run(path) for path in (cnn, mlp, str(unfinished))]
    plots = report.validation_panels(loaded)
    assert [p.title for p in plots] == ["validation loss", "validation accuracy",
                                        "validation top5_accuracy"]
    assert [line.label for line in plots[0].lines] == ["cnn3", "mlp2", "unfinished"]
    check_png(_read_png(output), plots)


def test_report_has_a_top5_column_with_a_dash_for_runs_without_it(runs, tmp_path, capsys):
    cnn, _ = runs
    earlier = tmp_path / "earlier"  # a 10-class run of a tftrain without top-5 accuracy
    earlier.mkdir()
    for name in ("params.yaml", run_dir.CURVES_JSON, "summary.json"):
        shutil.copy(os.path.join(cnn, name), earlier)
    summary = json.loads((earlier / "summary.json").read_text())
    for section in ("eval", "validation"):
        del summary[section]["top5_accuracy"]
    (earlier / "summary.json").write_text(json.dumps(summary))
    assert run_cli("report", cnn, str(earlier), f"--output={tmp_path / 'r.png'}") == 0
    header, _, *rows = [line for line in capsys.readouterr().out.splitlines()
                        if line.startswith("|")]
    columns = [c.strip() for c in header.strip("|").split("|")]
    cells = {row.split("|")[1].strip(): [c.strip() for c in row.strip("|").split("|")]
             for row in rows}
    with open(os.path.join(cnn, "summary.json")) as f:
        top5 = json.load(f)["eval"]["top5_accuracy"]
    assert cells["cnn3"][columns.index("test top5_accuracy")] == f"{top5:.4f}"
    assert cells["earlier"][columns.index("test top5_accuracy")] == "-"
    assert cells["earlier"][columns.index("val top5_accuracy")] == "-"
    assert cells["earlier"][columns.index("test accuracy")] != "-"


def test_report_bad_input_is_one_line(tmp_path, digits_dir, capsys):
    for args, code, text in [((str(tmp_path / "missing"),), 1, "is not a tftrain run directory"),
                             ((digits_dir,), 1, "is not a tftrain run directory"),
                             ((), 2, "no run directories given")]:
        assert run_cli("report", *args, f"--output={tmp_path / 'r.png'}") == code
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and text in err[0], err
    assert not (tmp_path / "r.png").exists()


def test_report_help_imports_neither_tensorflow_nor_matplotlib():
    probe = ("import sys; from tftrain.cli import run\n"
             "try:\n    run(['tftrain', 'report', '--help'])\nexcept SystemExit as e:\n"
             "    print(sorted(m for m in ('tensorflow', 'matplotlib') if m in sys.modules),"
             " e.code)\n")
    result = subprocess.run([PYTHON, "-c", probe], cwd=REPO, capture_output=True, text=True,
                            timeout=60)
    assert result.stdout.strip().endswith("[] 0"), (result.stdout, result.stderr)
    assert "tftrain report" in result.stdout and "--output" in result.stdout
