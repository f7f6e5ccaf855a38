"""The forked-CLI server (`tests/forked_cli.py`): its children are `tftrain` as a shell starts it."""
import json
import os
import subprocess
import sys

from tests import forked_cli


def test_a_child_runs_in_the_given_directory_and_reports_its_exit_code(tmp_path):
    done = forked_cli.run(["inspect", "--data=no_such_dataset"], cwd=tmp_path, timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [line for line in done.stderr.splitlines()
                                        if line.startswith("tftrain inspect: error: ")]
    converted = forked_cli.run(["convert", "--pipeline=digits", "--output=data/digits"],
                               cwd=tmp_path, timeout=120)
    assert converted.returncode == 0, converted.stderr[-2000:]
    assert (tmp_path / "data/digits/dataset.json").exists()  # relative to the given directory


def test_a_child_sees_exactly_the_environment_given(tmp_path):
    """A variable of the test process that the caller left out is not there: an invalid
    TF_CONFIG given fails the run in one line; the same run without it gets past that check."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    bad = forked_cli.run(["check", "--config=digits", "--target=cpu"], cwd=tmp_path,
                         env={**env, "TF_CONFIG": "{not json"}, timeout=120)
    assert bad.returncode != 0 and "TF_CONFIG" in bad.stderr, bad.stderr
    os.environ["TF_CONFIG"] = "{not json"
    try:
        good = forked_cli.run(["check", "--config=digits", "--target=cpu"], cwd=tmp_path,
                              env=env, timeout=120)
    finally:
        del os.environ["TF_CONFIG"]
    assert "TF_CONFIG" not in good.stderr, good.stderr


def test_a_child_is_its_own_session_and_dies_by_the_signal_sent(tmp_path):
    process = forked_cli.Popen(["data_service", "--dispatcher", "--port=0"], cwd=tmp_path,
                               stdout=forked_cli.PIPE, stderr=forked_cli.STDOUT)
    try:
        assert os.getsid(process.pid) == process.pid
        assert process.poll() is None
    finally:
        os.killpg(process.pid, 9)
    assert process.wait(60) == -9
    process.stdout.close()


def test_a_timed_out_child_is_killed(tmp_path):
    try:
        forked_cli.run(["data_service", "--dispatcher", "--port=0"], cwd=tmp_path, timeout=0.5)
    except subprocess.TimeoutExpired:
        return
    raise AssertionError("a dispatcher that never ends returned")


PRELOAD_PROBE = """
import gc, json, sys
import tftrain.cli.preload
from tensorflow.python.eager import context
print(json.dumps({
    "runtime_started": context.context()._context_handle is not None,
    "command_modules": sorted(m for m in sys.modules if m.startswith("tftrain.cli.")
                              and m != "tftrain.cli.preload"),
    "tensorflow": "tensorflow" in sys.modules, "engine": "tftrain.engine.train" in sys.modules,
    "tfmot": "tensorflow_model_optimization" in sys.modules, "keras_3": "keras" in sys.modules,
    "collector": [gc.isenabled(), gc.get_freeze_count() > 300_000, len(gc.get_objects()) < 1000],
}))
"""


def test_the_server_imports_tensorflow_and_the_engine_but_runs_nothing_and_defines_no_flags():
    """Forking is safe only while no TensorFlow runtime exists; a command module preloaded would
    define its flags in every child (`tftrain convert --task_index=1` accepted). TFMOT is
    imported without Keras 3, which it would load only to fail (`tftrain.optimize.tfmot_lib`).
    What it imported is frozen out of the garbage collector's walks, which stays on."""
    done = subprocess.run([sys.executable, "-c", PRELOAD_PROBE], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {
        "runtime_started": False, "command_modules": [], "tensorflow": True, "engine": True,
        "tfmot": True, "keras_3": False, "collector": [True, True, True]}


def test_a_child_knows_only_its_own_commands_flags(tmp_path):
    done = forked_cli.run(["convert", "--task_index=1", "--pipeline=digits", "--output=d"],
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Unknown command line flag 'task_index'" in done.stderr, done.stderr
    assert not (tmp_path / "d").exists()


def test_a_tmpdir_too_deep_for_a_socket_moves_the_servers_socket_to_a_private_dir_of_tmp():
    """AF_UNIX paths end at 107 bytes: under a deep TMPDIR (a test's, a cluster's scratch) the
    server's socket goes to a directory of /tmp's that only this user can enter."""
    import stat

    from tftrain import forked

    fits = "/tmp/pymp-x/listener-y"
    assert forked._listener_address(fits) == fits
    moved = forked._listener_address("/tmp/" + "deep/" * 24 + "pymp-x/listener-y")
    directory = os.path.dirname(moved)
    assert len(os.fsencode(moved)) <= forked.SOCKET_PATH_MAX
    assert directory.startswith("/tmp/tftrain-") and not os.listdir(directory)
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
