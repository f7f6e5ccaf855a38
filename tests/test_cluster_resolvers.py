"""runtime.cluster: TF_CONFIG, SLURM and Kubernetes through TensorFlow's own cluster resolvers.

The source is chosen and checked from environment variables before TensorFlow starts
(tftrain.runtime.cluster); the resolver is built with the strategy
(tftrain.runtime.distribute) and must agree.
SLURM is tested end to end with two real `tftrain train` processes that carry the environment
a 2-task, 1-node `srun` gives its tasks, on loopback. Kubernetes is tested with a fake API client
passed as TensorFlow's `override_client` (what TensorFlow's own resolver tests do); a real
cluster is not.
"""
import json
import os
import socket
import stat
import types

import numpy as np
import pytest

from tests.launch_testutil import Running
from tftrain import config as config_lib
from tftrain.runtime import cluster
from tftrain.errors import ConfigError, TftrainError
from tftrain.runtime.launch import free_ports

BOUND = 420  # seconds a 2-worker run here may take before the test calls it a hang
EPOCHS = 2


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """No cluster variables from the machine running the tests; runtime.cluster back to auto."""
    for name in list(os.environ):
        if name.startswith("SLURM") or name in (cluster.TF_CONFIG, cluster.K8S_INDEX,
                                                cluster.K8S_NUM_WORKERS, cluster.K8S_SELECTOR):
            monkeypatch.delenv(name)
    monkeypatch.setitem(cluster._chosen, "cluster", "auto")


def srun_env(rank: int, tasks: int = 2, node: str = "127.0.0.1") -> dict:
    """What `srun --ntasks=<tasks>` on one node sets in task `rank` (the variables that matter)."""
    return {
        "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "tftrain", "SLURM_JOB_NUM_NODES": "1",
        "SLURM_JOB_NODELIST": node, "SLURM_NNODES": "1", "SLURM_NODELIST": node,
        "SLURM_NTASKS": str(tasks), "SLURM_NPROCS": str(tasks), "SLURM_TASKS_PER_NODE": str(tasks),
        "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NUM_TASKS": str(tasks),
        "SLURM_STEP_TASKS_PER_NODE": str(tasks), "SLURM_STEP_NODELIST": node,
        "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "SLURM_NODEID": "0",
        "SLURMD_NODENAME": node,
    }


def set_env(monkeypatch, env: dict) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)


# --- choosing the source, without TensorFlow --------------------------------------------------

def test_auto_is_one_machine_without_cluster_variables():
    assert cluster.membership() == cluster.Membership()
    assert cluster.num_workers() == 1 and cluster.task() == ("worker", 0) and cluster.is_chief()


def test_auto_picks_slurm_inside_a_multi_task_srun_step(monkeypatch):
    set_env(monkeypatch, srun_env(rank=1))
    assert cluster.membership() == cluster.Membership("slurm", 2, "worker", 1, False)
    assert cluster.num_workers() == 2 and cluster.task() == ("worker", 1) and not cluster.is_chief()
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert cluster.is_chief()


def test_auto_stays_on_one_machine_for_one_task_or_a_batch_step(monkeypatch):
    set_env(monkeypatch, srun_env(rank=0, tasks=1))
    assert cluster.membership().source == ""
    # `sbatch --ntasks=2` runs its script once, outside any srun step: one machine (and a warning).
    for name in ("SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_NODELIST"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("SLURM_NTASKS", "2")
    assert cluster.membership().source == ""


def test_tf_config_wins_over_slurm_under_auto_and_tf_config_ignores_slurm(monkeypatch):
    set_env(monkeypatch, srun_env(rank=1))
    monkeypatch.setenv("TF_CONFIG", cluster.make_tf_config(["a:1", "b:2", "c:3"], 2))
    assert cluster.membership() == cluster.Membership("tf_config", 3, "worker", 2, False)
    monkeypatch.delenv("TF_CONFIG")
    assert cluster.use("tf_config") == cluster.Membership()  # srun tasks as independent runs


def test_explicit_slurm_names_what_is_missing_or_wrong(monkeypatch):
    with pytest.raises(ConfigError, match="needs SLURM_PROCID, SLURM_STEP_NUM_TASKS, "
                       "SLURM_STEP_TASKS_PER_NODE, SLURM_STEP_NODELIST .* srun"):
        cluster.use("slurm")
    set_env(monkeypatch, srun_env(rank=0))
    monkeypatch.delenv("SLURM_STEP_NODELIST")
    with pytest.raises(ConfigError, match=r"needs SLURM_STEP_NODELIST in"):
        cluster.membership()
    set_env(monkeypatch, srun_env(rank=2))
    with pytest.raises(ConfigError, match=r"SLURM_PROCID=2 is not a task of SLURM_STEP_NUM_TASKS"):
        cluster.membership()
    monkeypatch.setenv("SLURM_PROCID", "one")
    with pytest.raises(ConfigError, match=r"SLURM_PROCID='one' is not an integer"):
        cluster.membership()
    set_env(monkeypatch, srun_env(rank=0))
    monkeypatch.setenv("TF_CONFIG", cluster.make_tf_config(["a:1", "b:2"], 0))
    with pytest.raises(ConfigError, match="runtime.cluster=slurm but TF_CONFIG is set too"):
        cluster.membership()


def test_explicit_kubernetes_without_its_client_or_variables(monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "kubernetes" else find_spec(name, *a))
    with pytest.raises(ConfigError, match="needs the kubernetes Python client .* pip install "
                       "kubernetes, or run the workers as a Kubeflow TFJob"):
        cluster.use("kubernetes")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    with pytest.raises(ConfigError, match="needs JOB_COMPLETION_INDEX, TFTRAIN_NUM_WORKERS"):
        cluster.membership()
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "1")
    monkeypatch.setenv("TFTRAIN_NUM_WORKERS", "3")
    assert cluster.membership() == cluster.Membership("kubernetes", 3, "worker", 1, False)


def test_config_checks_the_choice_and_the_port():
    with pytest.raises(ConfigError, match=r"runtime.cluster='slrum' is not one of .*'slurm'"):
        config_lib.build_config("digits", {}, "runtime.cluster=slrum")
    with pytest.raises(ConfigError, match="runtime.cluster_port must be 0"):
        config_lib.build_config("digits", {}, "runtime.cluster_port=70000")
    assert config_lib.build_config("digits", {}, "").runtime.cluster == "auto"
    with pytest.raises(ConfigError, match="is not one of"):
        cluster.use("slrum")


def test_train_refuses_a_bad_slurm_step_before_training(monkeypatch, tmp_path, cli, capsys):
    set_env(monkeypatch, srun_env(rank=0))
    monkeypatch.delenv("SLURM_STEP_TASKS_PER_NODE")
    code = cli("train", f"--model_dir={tmp_path}/run", "--params_override=runtime.cluster=slurm")
    assert code == ConfigError.exit_code
    assert "runtime.cluster=slurm needs SLURM_STEP_TASKS_PER_NODE" in capsys.readouterr().err
    set_env(monkeypatch, srun_env(rank=0))
    assert cli("train") == ConfigError.exit_code
    assert "multi-worker training (2 workers) needs --model_dir" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


# --- TensorFlow's resolvers ------------------------------------------------------------------

def test_slurm_resolver_agrees_with_the_environment(monkeypatch):
    from tftrain.runtime import distribute

    set_env(monkeypatch, srun_env(rank=1))
    resolver = distribute.cluster_resolver(cluster.membership(), port=9300)
    assert resolver.cluster_spec().as_dict() == {"worker": ["127.0.0.1:9300", "127.0.0.1:9301"]}
    assert (resolver.task_type, resolver.task_id) == ("worker", 1)
    assert resolver.num_accelerators() == {}  # no GPU here: one CPU replica per worker
    # TF's default port base, 8888, when runtime.cluster_port is 0.
    default = distribute.cluster_resolver(cluster.membership())
    assert default.cluster_spec().as_dict() == {"worker": ["127.0.0.1:8888", "127.0.0.1:8889"]}


def test_slurm_resolver_refuses_to_put_a_task_on_another_node(monkeypatch):
    """TensorFlow numbers tasks node by node in sorted node order: with n9,n10 it would give
    task 0 (running on n9) the address of n10, and every worker would wait on the wrong peer."""
    from tftrain.runtime import distribute

    set_env(monkeypatch, srun_env(rank=0))
    set_env(monkeypatch, {"SLURM_STEP_NODELIST": "n[9-10]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
                          "SLURMD_NODENAME": "n9"})
    with pytest.raises(ConfigError, match=r"gives task 0 the address n10:8888, but it runs on n9"):
        distribute.cluster_resolver(cluster.membership())
    # A node list whose tasks do not add up is TensorFlow's error, named with the variables.
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "1")
    with pytest.raises(ConfigError, match=r"cannot resolve this SLURM step .*Requested 2 tasks "
                       r"but only 1 were assigned.*SLURM_STEP_TASKS_PER_NODE='1'"):
        distribute.cluster_resolver(cluster.membership())


class FakeKubernetesClient:
    """Answers `list_pod_for_all_namespaces` as the API server would (all TF's resolver uses)."""

    def __init__(self, pods):
        self.pods, self.selectors = pods, []

    def list_pod_for_all_namespaces(self, label_selector):
        self.selectors.append(label_selector)
        return types.SimpleNamespace(items=[
            types.SimpleNamespace(metadata=types.SimpleNamespace(name=name),
                                  status=types.SimpleNamespace(phase=phase, host_ip=ip))
            for name, phase, ip in self.pods])


def test_kubernetes_resolver_with_a_fake_api_client(monkeypatch):
    from tftrain.runtime import distribute

    monkeypatch.setenv("TFTRAIN_K8S_SELECTOR", "job-name=digits")
    member = cluster.Membership("kubernetes", 2, "worker", 1, False)
    client = FakeKubernetesClient([("digits-1-xyz", "Running", "10.0.0.2"),
                                   ("digits-0-abc", "Running", "10.0.0.1")])
    resolver = distribute.cluster_resolver(member, port=2222, kubernetes_client=client)
    assert client.selectors[0] == "job-name=digits"
    assert resolver.cluster_spec().as_dict() == {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]}
    assert (resolver.task_type, resolver.task_id) == ("worker", 1)
    three = cluster.Membership("kubernetes", 3, "worker", 1, False)
    with pytest.raises(TftrainError, match=r"sees 2 worker\(s\) .* but the environment says 3"):
        distribute.cluster_resolver(three, kubernetes_client=client)
    pending = FakeKubernetesClient([("digits-0-abc", "Running", "10.0.0.1"),
                                    ("digits-1-xyz", "Pending", None)])
    with pytest.raises(TftrainError, match='cannot list the workers: Pod "digits-1-xyz" is not'):
        distribute.cluster_resolver(member, kubernetes_client=pending)


# --- two SLURM tasks on loopback -------------------------------------------------------------

def free_port_pair() -> int:
    """A port p with p and p+1 free on 127.0.0.1 (SLURM task i of a node listens on base+i)."""
    for _ in range(50):
        (port,) = free_ports(1)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two consecutive free ports on 127.0.0.1")


def test_two_srun_tasks_train_one_model(tmp_path):
    """Two `tftrain train` processes with the environment of `srun --ntasks=2` on one node (and no
    TF_CONFIG) form one MultiWorkerMirrored cluster through SlurmClusterResolver."""
    # A stand-in `scontrol` that answers `scontrol show hostnames LIST` and logs every call: TF 2.21
    # expands SLURM_STEP_NODELIST itself, so the log must stay empty.
    bin_dir, calls = tmp_path / "bin", tmp_path / "scontrol_calls"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n'
                        '[ "$1 $2" = "show hostnames" ] && echo 127.0.0.1 && exit 0\nexit 1\n')
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IEXEC)
    weights, worker_tmp = tmp_path / "weights", tmp_path / "worker_tmp"
    worker_tmp.mkdir()
    base = free_port_pair()
    args = ["train", f"--model_dir={tmp_path / 'run'}",
            f"--params_override=train.epochs={EPOCHS},runtime.cluster_port={base}"]
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONUNBUFFERED": "1",
           "TFTRAIN_DUMP_WEIGHTS_DIR": str(weights), "TMPDIR": str(worker_tmp)}
    workers = [Running(args, cwd=tmp_path, env={**env, **srun_env(rank)}) for rank in range(2)]
    try:
        codes = [w.wait(BOUND) for w in workers]
    finally:
        for w in workers:
            w.kill_all()
    assert codes == [0, 0], workers[0].tail() + "\n-----\n" + workers[1].tail()

    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert summary["strategy"] == "multi_worker_mirrored"
    assert summary["num_workers"] == 2 and summary["num_replicas"] == 2
    assert summary["epochs"] == EPOCHS and summary["eval"]["accuracy"] > 0.9
    assert f"multi-worker (slurm): worker 1 of 2 workers {{'worker': ['127.0.0.1:{base}', " \
           f"'127.0.0.1:{base + 1}']}}" in workers[1].output
    assert "worker 1 of 2 done; the chief writes the run's files" in workers[1].output
    # Both report the same (all-reduced) test metrics; only the chief converted and wrote files.
    results = [[line for line in w.lines if line.startswith("test split:")] for w in workers]
    assert len(results[0]) == 1 and results[0] == results[1]
    assert [line for line in workers[1].lines if "converting its embedded data with pipeline" in line] == []
    assert list(tmp_path.glob("run/export/*/saved_model.pb"))
    # worker 1's temporary saves were removed (Python's __pycache__ of the modules AutoGraph
    # generates in TMPDIR is not tftrain's: it is there whenever bytecode is written)
    assert [name for name in os.listdir(worker_tmp) if name != "__pycache__"] == []
    chief, other = np.load(weights / "worker-0.npz"), np.load(weights / "worker-1.npz")
    assert len(chief.files) == len(other.files) > 0
    for name in chief.files:
        np.testing.assert_array_equal(chief[name], other[name])
    assert not calls.exists(), calls.read_text()
