"""`tftrain check`: every check failed on purpose and passed, the shipped configs on the targets
their headers claim, and `train --strategy=tpu` stopping before it connects.

Real TensorFlow throughout: real tf.data graphs, real XLA compiles on the CPU, real models.
"""
import dataclasses
import os
import re
import subprocess
import sys

import pytest

from pipelines import load_pipeline
from tests import forked_cli
from tests.conftest import REPO
from tests.launch_testutil import Running
from tests.test_documented_commands import (CONFIG_COMMANDS, SMALLER, assert_check_passes,
                                             shipped_check)
from tftrain import check, models, rules
from tftrain import config as config_lib
from tftrain.check import memory
from tftrain.rules import batch, hardware, input_pipeline, precision, storage
from tftrain.rules.report import ADVICE, ERROR, OK, Target
from tftrain.data import reader
from tftrain.data.manifest import Manifest, Split
from tftrain.data.writer import write_dataset
from tftrain.errors import ConfigError

TPU_VM = Target("tpu", 8, "v5e", "local")
TPU_NODE = Target("tpu", 8, "v3", "grpc://10.0.0.2:8470")
CPU = Target("cpu", 1)
PY_MODEL = "model.name=tests.check_fixtures:py_function_model,model.params={}"


def _config(overrides: str = "", name: str = "digits"):
    return config_lib.build_config(name, {}, overrides)


def _statuses(findings):
    return [f.status for f in findings]


@pytest.fixture(scope="module")
def own_data(tmp_path_factory):
    """`own_data(name)`: the dataset of shipped config `name`, converted by its own default path
    (`prepare.ensure_dataset` on its data section, into a temporary data.dir), once per module for
    each distinct conversion (pipeline, source, options): the digits configs share one."""
    from tftrain.engine import prepare

    root, converted = tmp_path_factory.mktemp("own_data"), {}

    def convert(name: str) -> str:
        data = config_lib.build_config(name).data
        key = (data.format, data.pipeline, data.source, repr(data.pipeline_options))
        if key not in converted:
            path = str(root / f"{len(converted)}-{data.pipeline}")
            prepare.ensure_dataset(dataclasses.replace(data, dir=path))
            converted[key] = path
        return converted[key]

    return convert


@pytest.fixture(scope="module")
def default_digits(own_data):
    """digits converted as `train` converts it on first use (one shard per small split)."""
    return own_data("digits")


@pytest.fixture(scope="module")
def python_decode_dir(tmp_path_factory):
    """digits converted with tests.check_fixtures, whose decode calls tf.py_function."""
    path = str(tmp_path_factory.mktemp("check") / "python_decode")
    write_dataset(load_pipeline("tests.check_fixtures"), "", path, workers=1, progress=False)
    return path


@pytest.fixture(autouse=True)
def _no_accelerator_type(monkeypatch):
    monkeypatch.delenv(hardware.ACCELERATOR_ENV, raising=False)


# -- storage --------------------------------------------------------------------------------

def test_storage_fails_for_local_paths_on_a_tpu_node():
    findings = storage.check(_config("data.dir=data/digits"), TPU_NODE, "runs/x")
    assert _statuses(findings) == [ERROR, ERROR]
    assert "data.dir=data/digits is on this machine's disk" in findings[0].line()
    assert "grpc://10.0.0.2:8470" in findings[0].line() and "gs://" in findings[0].fix
    assert "--model_dir=runs/x is local" in findings[1].line()


def test_storage_passes_gcs_everywhere_and_local_paths_that_exist_on_a_tpu_vm():
    config = _config("data.dir=gs://bucket/digits")
    assert _statuses(storage.check(config, TPU_NODE, "gs://bucket/run")) == [OK, OK]
    vm = storage.check(_config(), TPU_VM, "gs://bucket/run")
    assert vm[0].status == OK and "converted on first use" in vm[0].what
    # a dataset nothing converts: it is there only if copied, which the check cannot know
    copied = storage.check(_config("data.pipeline=csv"), TPU_VM, None)
    assert copied[0].status == ADVICE and "only if you copy it" in copied[0].what
    assert copied[1].status == ADVICE and "deleted with the VM" in copied[1].what


def test_missing_embedded_data_is_advice_with_the_convert_command_that_matches(tmp_path):
    """text and jsonl convert data of their own on first use, like digits: no error; the fix
    converts with the config's pipeline options (else it would make another dataset)."""
    config = config_lib.build_config("lm_1b", {}, f"data.dir={tmp_path / 'lm'}")
    assert "Python's own documentation" in storage.converts_on_first_use(config.data)
    report = check.Report(Target("cpu", 1))
    assert rules.read_manifest(config, report) is None
    (finding,) = report.findings
    assert finding.status == ADVICE and "holds no dataset yet" in finding.what
    assert ("--pipeline_options=sequence_length=128,tokenizer=sentencepiece,vocab_size=1024"
            in finding.fix)


# -- precision ------------------------------------------------------------------------------

def test_precision_fails_float16_on_tpu():
    (finding,) = precision.check(_config("runtime.mixed_precision=mixed_float16"), TPU_VM)
    assert finding.status == ERROR
    assert "no fast float16" in finding.what and "mixed_bfloat16" in finding.fix


def test_precision_passes_bfloat16_on_tpu_and_advises_elsewhere():
    assert _statuses(precision.check(_config("runtime.mixed_precision=mixed_bfloat16"),
                                     TPU_VM)) == [OK]
    assert _statuses(precision.check(_config("runtime.mixed_precision=auto"), TPU_VM)) == [OK]
    assert precision.policy_for(_config("runtime.mixed_precision=auto"), TPU_VM) == "mixed_bfloat16"
    assert _statuses(precision.check(_config(), TPU_VM)) == [ADVICE]  # float32
    (gpu,) = precision.check(_config("runtime.mixed_precision=mixed_bfloat16"), Target("gpu", 1))
    assert gpu.status == ADVICE and "Ampere" in gpu.what


def test_precision_on_a_cpu_without_16_bit_units_advises_float32(monkeypatch):
    from tftrain import host

    # The flags of an AVX2-only CPU, whatever this machine has: bf16 is converted, no faster.
    monkeypatch.setattr(host, "cpu_flags", lambda: {"sse4_2", "avx", "avx2", "fma"})
    assert host.low_precision_units("mixed_bfloat16") == []
    here = Target("cpu", 1)
    (bf16,) = precision.check(_config("runtime.mixed_precision=mixed_bfloat16"), here)
    assert bf16.status == ADVICE
    assert "no 16-bit matmul units (amx_bf16 or avx512_bf16)" in bf16.what
    assert host.cpu_name() in bf16.what and host.cpu_name().endswith(" (avx2, fma)")
    assert bf16.fix == "runtime.mixed_precision=float32"
    (fp16,) = precision.check(_config("runtime.mixed_precision=mixed_float16"), here)
    assert fp16.status == ADVICE and "(amx_fp16 or avx512_fp16)" in fp16.what
    (fp32,) = precision.check(_config(), here)
    assert fp32.status == OK and fp32.what.endswith("float32 on CPU")


def test_precision_on_a_cpu_with_amx_advises_bf16_and_no_xla(monkeypatch):
    from tftrain import host

    # The flags an AMX CPU (Sapphire Rapids) reports, whatever this machine has.
    monkeypatch.setattr(host, "cpu_flags", lambda: {"avx512f", "avx512_bf16", "amx_bf16"})
    assert host.low_precision_units("mixed_bfloat16") == ["amx_bf16", "avx512_bf16"]
    here = Target("cpu", 1)
    (fp32,) = precision.check(_config(), here)
    assert fp32.status == ADVICE and "amx_bf16" in fp32.what and "mixed_bfloat16" in fp32.fix
    (bf16,) = precision.check(_config("runtime.mixed_precision=mixed_bfloat16"), here)
    assert bf16.status == OK and "avx512_bf16" in bf16.what
    units, xla = precision.check(_config("runtime.mixed_precision=mixed_bfloat16,"
                                         "runtime.jit_compile=true"), here)
    assert units.status == OK and xla.status == ADVICE
    assert "XLA" in xla.what and xla.fix.startswith("runtime.jit_compile=auto")
    (fp16,) = precision.check(_config("runtime.mixed_precision=mixed_float16"), here)
    assert fp16.status == ADVICE and "amx_fp16" in fp16.what  # bf16 units do not run float16


# -- batch ----------------------------------------------------------------------------------

def test_batch_fails_when_it_does_not_split_over_the_cores():
    finding = batch.split(_config("data.batch_size=100"), TPU_VM)
    assert finding.status == ERROR
    assert "(100)" in finding.what and "(8)" in finding.what and "use 96 or 104" in finding.what


def test_batch_passes_an_even_split_and_explains_steps_per_execution():
    config = _config("data.batch_size=128")
    assert batch.split(config, TPU_VM).what.startswith("data.batch_size=128 over 8 TPU chips: 16")
    manifest = Manifest("digits", {}, {}, {"train": Split(1426, ())})
    assert batch.steps_per_execution(config, manifest).status == ADVICE  # 1: back to the host
    config.train.steps_per_execution = 11
    finding = batch.steps_per_execution(config, manifest)
    assert finding.status == OK and "an epoch of 11 steps takes 1 host call" in finding.what


def test_batch_fails_an_evaluation_split_smaller_than_one_batch():
    manifest = Manifest("digits", {}, {}, {"validation": Split(182, ()), "test": Split(189, ())})
    findings = batch.partial_batches(_config("data.batch_size=256"), manifest)
    assert _statuses(findings) == [ERROR, ERROR]
    assert "nothing of it is evaluated" in findings[0].what
    findings = batch.partial_batches(_config("data.batch_size=26"), manifest)
    assert _statuses(findings) == [OK, ADVICE]  # 182 = 7 x 26; 189 leaves 7 out
    assert "7 examples are not evaluated" in findings[1].what


# -- input pipeline -------------------------------------------------------------------------

def test_input_fails_a_python_decode_on_a_tpu_node(python_decode_dir):
    config = _config(f"data.dir={python_decode_dir},data.pipeline=tests.check_fixtures")
    findings = input_pipeline.check(config, TPU_NODE)
    assert findings[0].status == ERROR
    assert "tf.py_function (EagerPyFunc) in Dataset.map(parse_and_decode)" in findings[0].what
    assert findings[1].status == OK  # its shapes are static
    on_a_vm = input_pipeline.check(config, TPU_VM)[0]  # the VM's own process runs the pipeline
    assert on_a_vm.status == ADVICE and "GIL" in on_a_vm.what
    with_service = _config(f"data.dir={python_decode_dir},data.pipeline=tests.check_fixtures,"
                           "data.service_address=localhost:5050")
    assert input_pipeline.check(with_service, CPU)[0].status == ERROR


def test_input_passes_the_digits_pipeline(digits_dir):
    findings = input_pipeline.check(_config(f"data.dir={digits_dir}"), TPU_NODE)
    assert _statuses(findings) == [OK, OK]
    assert "(4, 8, 8, 1) float32, (4,) int32" in findings[1].what  # digits: 32 over 8 cores


def test_input_graph_scan_names_every_kind_of_python_function():
    import numpy as np
    import tensorflow as tf

    def build():
        generated = tf.data.Dataset.from_generator(lambda: iter([1.0]), output_signature=(
            tf.TensorSpec([], tf.float32)))
        return generated.map(lambda x: tf.numpy_function(np.square, [x], tf.float32))

    found = input_pipeline.graph_python_ops(build)
    assert ("GeneratorDataset", "Dataset.from_generator") in found
    assert any(op == "PyFunc" and where.startswith("Dataset.map(") for op, where in found), found
    plain = input_pipeline.graph_python_ops(lambda: tf.data.Dataset.range(3).map(lambda x: x * 2))
    assert plain == []


def test_input_source_scan_finds_the_python_call_without_tensorflow_ops():
    found = input_pipeline.source_python_calls(load_pipeline("tests.check_fixtures"))
    assert found == [("py_function", "tests.check_fixtures.Pipeline.decode -> scale_in_python")]
    assert input_pipeline.source_python_calls(load_pipeline("digits")) == []


def test_input_fails_dynamic_batch_shapes_and_passes_static_ones(digits_dir):
    dynamic = reader.load(digits_dir, "train", 8, training=True, drop_remainder=False)
    findings = input_pipeline.static_shape_findings(dynamic.element_spec)  # images and labels
    assert _statuses(findings) == [ERROR, ERROR]
    assert all(f.fix == "batch with drop_remainder=True" for f in findings)
    assert "element[0] has shape (None, 8, 8, 1)" in findings[0].what
    static = reader.load(digits_dir, "train", 8, training=True)
    assert _statuses(input_pipeline.static_shape_findings(static.element_spec)) == [OK]


# -- memory ---------------------------------------------------------------------------------

def _plan(config, target):
    policy = precision.policy_for(config, target)
    shapes = memory.shapes_of(config, lambda params: models.build_model(
        config.model.name, params, (8, 8, 1), 10))  # in a graph: any size is cheap
    found = memory.plan(shapes, config, target, policy)
    found.suggestions = memory.suggest(shapes, config, target, policy, found)
    return found, shapes


def test_memory_fails_a_large_model_with_a_large_batch_on_v2():
    config = _config("model.name=mlp,model.params={hidden_units: [8192, 8192, 8192]},"
                     "data.batch_size=262144")
    target = Target("tpu", 8, "v2", "local")
    found, shapes = _plan(config, target)
    assert shapes.parameters == 134_848_522 and found.micro_batch == 32768
    params = shapes.parameters
    assert found.parts["weights"] == found.parts["gradients"] == 4 * params
    assert found.parts["optimizer_state"] == 8 * params  # Adam's two moments
    finding = memory.check(found, shapes)
    assert finding.status == ERROR and "does not fit" in finding.what
    assert "of the 8.00 GiB of a v2 TPU core" in finding.what
    # What would fit, each re-planned: the batch split into accumulated micro-batches.
    assert found.suggestions and all(s["bytes_per_device"] <= 8 * memory.GIB
                                     for s in found.suggestions)
    assert any("train.grad_accum_steps" in s["override"] for s in found.suggestions)
    assert found.suggestions[0]["override"] in finding.fix


def test_memory_passes_the_digits_cnn_on_v5e():
    config = _config("model.name=cnn,runtime.mixed_precision=mixed_bfloat16")
    found, shapes = _plan(config, TPU_VM)
    finding = memory.check(found, shapes)
    assert finding.status == OK and finding.what.startswith("fits: ~")
    assert "of the 16.00 GiB of a v5e TPU chip" in finding.what
    assert found.parts["compute_copies"] == 2 * shapes.parameters


# -- hardware -------------------------------------------------------------------------------

def test_accelerator_types_name_replicas_as_tpu_strategy_counts_them(monkeypatch):
    assert hardware.parse_accelerator_type("v3-8") == ("v3", 8)  # cores
    assert hardware.parse_accelerator_type("v4-8") == ("v4", 4)  # 8 TensorCores = 4 chips
    assert hardware.parse_accelerator_type("v5p-16") == ("v5p", 8)
    assert hardware.parse_accelerator_type("v5litepod-8") == ("v5e", 8)  # chips
    with pytest.raises(ConfigError, match="not a TPU accelerator type"):
        hardware.parse_accelerator_type("v9-8")
    assert hardware.tpu_from_environment()[:2] == ("", 8)
    monkeypatch.setenv(hardware.ACCELERATOR_ENV, "v4-8")
    assert hardware.tpu_from_environment() == ("v4", 4, "")


# -- the command ----------------------------------------------------------------------------

def _shipped_targets():
    for name in sorted(f[:-5] for f in os.listdir(config_lib.CONFIG_DIR) if f.endswith(".yaml")):
        with open(os.path.join(config_lib.CONFIG_DIR, name + ".yaml")) as f:
            header = [line for line in f.read().splitlines() if line.startswith("#")]
        claims = [re.match(r"# Targets: ([\w, ]+)", line) for line in header]
        targets = next((m.group(1) for m in claims if m), "")
        assert targets, f"configs/{name}.yaml claims no targets (# Targets: ...)"
        for target in targets.replace(",", " ").split():
            yield name, target


def _policy(name: str, target: str) -> str:
    return precision.policy_for(config_lib.build_config(name), Target(target, 1))


CLAIMED = list(_shipped_targets())


def _checked_by_their_headers() -> dict:
    """{(config, target): header command} for the claimed targets that a config's own header
    command checks with the config as shipped (`shipped_check`): test_documented_commands runs
    that command, as written, in its own process, on the data the commands before it converted
    the default way, and asserts what the test below asserts (`assert_check_passes`). Not the
    pairs whose policy is mixed_float16: that Keras's warning is logged (then hidden) is seen
    only in this process."""
    found = {}
    for config, command in CONFIG_COMMANDS:
        name, target = config[:-len(".yaml")], shipped_check(config, command)
        if (name, target) in CLAIMED and _policy(name, target) != "mixed_float16":
            found.setdefault((name, target), command)
    return found


CHECKED_BY_HEADERS = _checked_by_their_headers()
CHECKED_HERE = [pair for pair in CLAIMED if pair not in CHECKED_BY_HEADERS]


def test_every_claimed_target_is_checked_here_or_by_the_header_command_that_claims_it():
    """Each claimed pair once: by the test below, or by its config's header command, which
    test_documented_commands' test_config_header_command_runs_as_written runs and holds to
    `assert_check_passes` (every `tftrain check` command without the YOUR_BUCKET placeholder)."""
    assert sorted(CHECKED_HERE + list(CHECKED_BY_HEADERS)) == sorted(CLAIMED)
    for (name, target), command in CHECKED_BY_HEADERS.items():
        assert (f"{name}.yaml", command) in CONFIG_COMMANDS
        assert command.startswith("tftrain check") and "YOUR_BUCKET" not in command
        assert shipped_check(f"{name}.yaml", command) == target


@pytest.mark.parametrize("name,target", CHECKED_HERE)
def test_every_shipped_config_passes_the_targets_it_claims(name, target, own_data, cli, capfd,
                                                           monkeypatch):
    """On the data its own pipeline converts. Keras's warning that this CPU has no GPU for
    mixed_float16, logged where that is the policy, is hidden at the default verbosity. (The
    pairs that a header command checks as shipped: tests/test_documented_commands.py.)"""
    from tf_keras.src.mixed_precision import device_compatibility_check as device_check

    monkeypatch.setattr(device_check, "_logged_compatibility_check", False)
    smaller = SMALLER.get(f"{name}.yaml")  # lm_1b: bench/big_model.py checks it as shipped
    assert cli("check", f"--config={name}", f"--target={target}",
               f"--params_override=data.dir={own_data(name)}"
               + (f",{smaller}" if smaller else "")) == 0
    out, err = capfd.readouterr()
    assert_check_passes(out, err, target)
    if _policy(name, target) == "mixed_float16":
        assert device_check._logged_compatibility_check  # the warning was logged (and hidden)


def test_the_command_reports_every_failure_one_line_each(python_decode_dir, cli, capsys):
    code = cli("check", "--config=digits_tpu", "--tpu=grpc://10.0.0.2:8470", "--tpu_type=v3",
               "--model_dir=runs/x", f"--params_override=data.dir={python_decode_dir},"
               f"data.pipeline=tests.check_fixtures,data.batch_size=100,runtime.mixed_precision=mixed_float16,{PY_MODEL}")
    lines = capsys.readouterr().out.strip().splitlines()
    assert code == 1, lines
    errors = {line.split()[1] for line in lines if line.startswith("error")}
    assert errors == {"storage", "precision", "batch", "input", "xla"}, lines
    xla_line = next(line for line in lines if line.startswith("error  xla       train step"))
    assert "op EagerPyFunc (layer 'python_step' (Lambda)" in xla_line
    assert re.search(r"created at \S*tests/check_fixtures.py:\d+ in python_step; fix: ", xla_line)
    assert lines[-1].startswith("summary: 7 errors,") and "would fail" in lines[-1]
    assert "tpu v3 (grpc://10.0.0.2:8470), 8 TPU cores" in lines[-1]


def test_xla_compiles_for_a_gpu_unless_jit_compile_is_false(digits_dir):
    """runtime.jit_compile=auto (the default) is XLA on a GPU in `train`: the check compiles it."""
    gpu = Target("gpu", 1)
    auto = check.run(_config(f"data.dir={digits_dir},{PY_MODEL}"), gpu)
    steps = [f for f in auto.findings if f.family == "xla"]
    assert _statuses(steps) == [ERROR, ERROR], auto.lines()
    assert all("does not compile with XLA: op EagerPyFunc" in f.what for f in steps)
    off = check.run(_config(f"data.dir={digits_dir},{PY_MODEL},runtime.jit_compile=false"), gpu)
    steps = [f for f in off.findings if f.family == "xla"]
    assert _statuses(steps) == [OK, OK], off.lines()
    assert all("XLA compile skipped (runtime.jit_compile=false)" in f.what for f in steps)


def _documented_failing_check() -> tuple[str, list[str]]:
    """docs/tpu.md's failing `tftrain check` example: the command as written (continuation lines
    kept) and the lines shown under it."""
    with open(os.path.join(REPO, "docs", "tpu.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    start = next(i for i, line in enumerate(lines)
                 if line.startswith("    $ PYTHONPATH=. tftrain check"))
    end = start
    while lines[end].endswith("\\"):
        end += 1
    command = "\n".join(line[4:] for line in lines[start:end + 1])[2:]
    shown = []
    for line in lines[end + 1:]:
        if not line.strip():
            break
        shown.append(line[4:])
    return command, shown


def test_the_documented_failing_check_runs_as_written(digits_dir, tmp_path):
    """In a directory laid out like a checkout: tests/ and a converted data/digits."""
    command, shown = _documented_failing_check()
    (tmp_path / "data").mkdir()
    os.symlink(digits_dir, tmp_path / "data" / "digits")
    os.symlink(os.path.join(REPO, "tests"), tmp_path / "tests")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    printed = [line for line in done.stdout.splitlines() if line.startswith(("error", "summary"))]
    assert printed == shown, done.stdout
    # mixed_float16 is set: Keras's "no GPU here" warning is hidden at the default verbosity
    assert check.DEVICE_WARNING not in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_an_unreadable_bucket_skips_the_data_checks_and_says_so(cli, capsys, monkeypatch):
    monkeypatch.setenv(hardware.ACCELERATOR_ENV, "v4-8")  # as on the TPU VM: the default slice
    assert cli("check", "--config=digits_tpu") == 0  # gs://YOUR_BUCKET: a placeholder
    out = capsys.readouterr().out
    (data,) = [line for line in out.splitlines() if line.startswith("advice data")]
    # No network here: "cannot read ... from here"; with one, the bucket holds no dataset.
    assert "data.dir=gs://YOUR_BUCKET/data/digits" in data
    assert "skipped the checks that need the data" in data
    assert "ok     input     the decode of data.pipeline=digits, read from its source" in out
    assert out.strip().splitlines()[-1].endswith("for tpu v4 (local), 4 TPU chips: ready "
                                                 "(see the advice above)")


def test_bad_flags_exit_2(cli, capsys):
    assert cli("check", "--target=cpu", "--tpu_cores=4") == 2
    assert "--tpu_cores and --tpu_type are for --target=tpu" in capsys.readouterr().err
    assert cli("check", "--tpu_cores=0") == 2


# -- train --strategy=tpu -------------------------------------------------------------------

def test_train_on_tpu_stops_before_connecting(default_digits, tmp_path):
    run = Running(["train", "--config=digits_tpu", f"--model_dir={tmp_path / 'run'}",
                   f"--params_override=data.dir={default_digits},data.batch_size=100"],
                  cwd=tmp_path, env={hardware.ACCELERATOR_ENV: ""})
    try:
        code = run.wait(120)
    finally:
        run.kill_all()
    errors = [line for line in run.lines if line.startswith("tftrain train: error:")]
    assert code == 2 and len(errors) == 1, run.output
    assert "before connecting to the TPU: 8 TPU cores (assumed" in errors[0]
    assert "data.batch_size (100) must be divisible" in errors[0]
    assert "cannot reach TPU" not in run.output and not (tmp_path / "run").exists()


def test_train_on_tpu_stops_before_connecting_on_a_model_xla_cannot_compile(default_digits,
                                                                           tmp_path, cli, capfd):
    """The whole `tftrain check --target=tpu` runs in a child process first: the op is named."""
    code = cli("train", "--config=digits_tpu", f"--model_dir={tmp_path / 'run'}",
               f"--params_override=data.dir={default_digits},{PY_MODEL}")
    err = capfd.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("tftrain train: error:"))
    assert lines[first] == "tftrain train: error: before connecting to the TPU: 2 errors:", err
    errors = lines[first + 1:]
    assert len(errors) == 2 and all(line.startswith("error  xla       ") for line in errors), err
    assert all("op EagerPyFunc (layer 'python_step' (Lambda)" in line for line in errors), err
    assert "tftrain check --target=tpu, in a child process on the CPU" in err
    assert "cannot reach TPU" not in err and not (tmp_path / "run").exists()


def before_connecting_in_a_new_process(argv) -> None:
    """The body of the process below (a `tftrain.forked` entry point; `argv` is unused)."""
    from tensorflow.python.eager import context

    assert context.context()._context_handle is None, "started with the runtime running"
    c = config_lib.build_config("digits_tpu", {}, "data.pipeline=tests.check_fixtures")
    report = rules.before_connecting(c, "gs://b/run")
    assert report.target.replicas == 4, report.target  # from TPU_ACCELERATOR_TYPE
    assert any("py_function" in f.what for f in report.findings), report.findings
    assert context.context()._context_handle is None, "the runtime started"


def test_the_check_before_connecting_runs_no_tensorflow_op(tmp_path):
    """The TPU must be initialized first: the eager context is still unstarted afterwards. In a
    process of its own, forked from the server that imported TensorFlow and ran no op
    (`tests/forked_cli.py`; a fresh interpreter would import TensorFlow again for nothing)."""
    output = tmp_path / "output"
    with open(output, "w") as out:
        process = forked_cli.Popen([], cwd=REPO, stdout=out, stderr=forked_cli.STDOUT,
                                   env={**os.environ, hardware.ACCELERATOR_ENV: "v4-8"},
                                   entry=f"{__name__}:before_connecting_in_a_new_process")
    try:
        code = process.wait(120)
    finally:
        forked_cli.kill_group(process.pid)
    assert code == 0, output.read_text()[-3000:]
