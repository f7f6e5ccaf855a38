"""runtime.pipeline_replicas: S stages x R data-parallel copies of the pipeline on one host.

2 stages x 2 replicas need 4 devices and the pytest process has 2 (fixed at its first op, see
conftest), so the training runs in one process of their own, forked from the forked-CLI server
(`tests/dtensor_forked.py`), which splits its CPU into 4 and reports what the tests assert:
transformer_lm trained on 2 x 2 equals one device within 1e-5 and every replica's copy of a
stage equals replica 0's (weights and, for a ResNet, BatchNormalization's moving statistics),
each copy's variables on its device; the backend, built from a config as a run builds it,
records the replicas in its part of summary.json (a whole `train` through the engine, with its
evaluation and export, cost ~5 CPU-s more). The config check runs here.
"""
import json
import os

import pytest

from tests import dtensor_forked
from tests.conftest import REPO
from tftrain import config as config_lib
from tftrain.errors import ConfigError

TIMEOUT = 600

SCRIPT = r'''
import json, sys
import tftrain  # noqa: F401
from tftrain.runtime import distribute

distribute.configure_cpu_devices(4)
import numpy as np
import tf_keras as keras

from tests.test_pipeline import (gathered, image_batch, image_model, lm, lm_batch,
                                 max_difference, twin)
from tftrain import config as config_lib
from tftrain.engine import backend_choice
from tftrain.runtime import pipeline_model, pipeline_stages
from tftrain.training import steps

DEVICES = [f"/device:CPU:{i}" for i in range(4)]  # replica r's stage s on r * 2 + s


def replicated(model, optimizer):
    """`model` cut into 2 stages, 2 copies on the 4 devices, 2 micro-batches per replica."""
    stages = pipeline_stages.build(model, pipeline_stages.plan(model, 2), DEVICES)
    trainer = pipeline_model.PipelineModel(stages, DEVICES, 2, replicas=2)
    trainer.compile(optimizer=optimizer,
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return stages, trainer


def copies_differ(stages):
    """The largest difference between replica 1's copy of a stage and replica 0's, over every
    variable (weights and BatchNormalization's moving statistics)."""
    return max(float(np.abs(a.numpy() - b.numpy()).max())
               for s in range(2) for a, b in zip(stages[s].variables, stages[2 + s].variables))


def sgd():
    return keras.optimizers.SGD(0.1, momentum=0.9)


result = {}
# transformer_lm (one block) on 2 x 2, 3 steps of SGD with momentum (per-copy slots) on batches
# of 8 (each replica 4, in 2 micro-batches of 2), beside a one-device twin on the same batches.
model = lm(num_layers=1)
reference = twin(model)
reference.compile(optimizer=sgd(),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
stages, trainer = replicated(model, sgd())
for step in range(3):
    x, y = lm_batch(seed=step)
    trainer.train_on_batch(x, y)
    reference.train_on_batch(x, y)
trained = gathered(model, trainer.replica(0)[0])
result["lm"] = {"to_one_device": max_difference(trained, reference),
                "moved": max_difference(trained, model), "copies_differ": copies_differ(stages),
                "misplaced": [v.name for i, stage in enumerate(stages) for v in stage.variables
                              if not v.device.endswith(f"CPU:{i}")]}

# The backend builds a tiny ResNet on 2 x 2 from a config: each copy's BatchNormalization sees
# its own slice, the copies stay equal; the backend's part of summary.json.
config = config_lib.build_config(
    "digits", {"runtime.strategy": "pipeline"},
    f"data.dir={sys.argv[1]},model.name=resnet,model.params={{depth: 1, width: 8, stages: 2}},"
    "runtime.pipeline_replicas=2,runtime.microbatches=2")
backend = backend_choice.create(config)
backend.set_up(config)
_, trainer = backend.build(config, json.load(open(f"{sys.argv[1]}/dataset.json")),
                           steps.StepPlan(2, 1, 2))
for step in range(2):
    trainer.train_on_batch(*image_batch(seed=step))
result["resnet"] = {"copies_differ": copies_differ(trainer.stages)}
result["summary"] = backend.summary(trainer)
print("RESULT " + json.dumps(result))
'''


@pytest.fixture(scope="module")
def replicas_run(digits_dir):
    """What the 4-device process reports (see SCRIPT)."""
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}
    out = dtensor_forked.run_script(SCRIPT, [digits_dir], cwd=REPO, env=env, timeout=TIMEOUT)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    return json.loads(lines[0][len("RESULT "):])


def test_two_stages_by_two_replicas_train_as_one_device_with_equal_copies(replicas_run):
    lm = replicas_run["lm"]
    assert lm["to_one_device"] < 1e-5, lm
    assert lm["moved"] > 1e-3, lm  # it did train
    assert lm["copies_differ"] == 0.0, lm  # one averaged gradient, applied to every copy
    assert lm["misplaced"] == [], lm
    assert replicas_run["resnet"]["copies_differ"] == 0.0, replicas_run["resnet"]


def test_the_backend_summary_records_the_replicas_and_their_devices(replicas_run):
    summary = replicas_run["summary"]
    pipeline = summary["pipeline"]
    assert summary["num_replicas"] == pipeline["replicas"] == 2
    assert pipeline["replica_devices"] == [["/device:CPU:0", "/device:CPU:1"],
                                           ["/device:CPU:2", "/device:CPU:3"]]
    assert [s["device"] for s in pipeline["stages"]] == ["/device:CPU:0", "/device:CPU:1"]


@pytest.mark.parametrize("overrides,message", [
    ("runtime.strategy=pipeline,runtime.pipeline_replicas=3",
     "data.batch_size=32 must split into runtime.pipeline_replicas=3 x runtime.microbatches=4 "
     "= 12 equal micro-batches: make it a multiple of 12"),
    ("runtime.strategy=pipeline,runtime.pipeline_replicas=0",
     "runtime.pipeline_replicas must be >= 1, got 0"),
    ("runtime.strategy=mirrored,runtime.pipeline_replicas=2",
     "runtime.pipeline_replicas=2 copies pipeline stages: it needs runtime.strategy=pipeline"),
])
def test_a_batch_that_does_not_split_into_replicas_by_microbatches_is_refused(overrides,
                                                                            message):
    with pytest.raises(ConfigError) as refused:
        config_lib.build_config("digits", {}, overrides)
    assert str(refused.value) == message
