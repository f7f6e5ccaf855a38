"""Dry-run a config for a target before paying for it; never connects to a TPU.

Checks, on this machine's CPU: storage the target can read and write (data.dir, --model_dir),
the precision policy, the global batch over the replicas (and the partial last batch on TPU),
Python functions and dynamic shapes in the input pipeline, one replica's memory against its
HBM (TPU), and the real train and eval steps on one real batch (compiled by XLA whenever the
run would use it: TPU; GPU unless runtime.jit_compile=false). One line per finding (ok,
advice, error: what, where, the fix), then a summary; exit code 1 when anything would fail.
The data checks need the converted dataset; the check never
converts (pass --params_override=data.dir=<a local copy> to check a gs:// config here).
The memory line is a plan of one device's bytes by part (weights, compute copies, gradients,
optimizer state, activations with and without recomputation) against that device's memory
(--tpu_type's HBM, --gpu_type's memory, this host's RAM for cpu), for every backend (replicas,
DTensor layouts, sharded optimizer state); when it does not fit, the cheapest changes that
would, each with its planned bytes. --json=PATH writes the findings and the plan as JSON.
Example: tftrain check --config=digits_tpu --params_override=data.dir=data/digits --target=tpu
         --tpu_type=v4 --tpu_cores=4
         tftrain check --config=lm_1b --target=gpu --gpu_type=h100-80gb --replicas=8 --params_override=data.batch_size=64
"""
from absl import flags

from tftrain import quiet_start
from tftrain.cli.common import use_flags
from tftrain.rules import hardware

FLAGS = flags.FLAGS
use_flags(__name__, "config", "params_override", "model_dir", "tpu", "json")
flags.DEFINE_enum("target", None, ["tpu", "gpu", "cpu", "multi_worker"],
                  "Where the run would go (default: from runtime.strategy and runtime.tpu: tpu, "
                  "multi_worker for multi_worker_mirrored, else cpu).")
flags.DEFINE_integer("tpu_cores", 8, "--target=tpu: the TPUStrategy replicas, i.e. TPU cores on "
                     "v2/v3 (v3-8: 8) and chips from v4 on (v4-8: 4, v5litepod-8: 8). Default: "
                     "from TPU_ACCELERATOR_TYPE when it is set, else 8.", lower_bound=1)
flags.DEFINE_enum("tpu_type", "v5e", ["v2", "v3", "v4", "v5e", "v5p", "v6e"],
                  "--target=tpu: the TPU generation, for the memory per core (HBM). Default: from "
                  "TPU_ACCELERATOR_TYPE when it is set, else v5e.")
flags.DEFINE_enum("gpu_type", None, sorted(hardware.GPUS),
                  "--target=gpu: the GPU, for the memory per device (default: a100-80gb).")
flags.DEFINE_integer("replicas", None, "--target=gpu|cpu|multi_worker: the replica count (GPUs, "
                     "or workers x devices); default: 1, the mesh's batch dimension for dtensor, "
                     "runtime.cpu_devices for mirrored, the cluster's workers (runtime.cluster; "
                     "else 2) for multi_worker.", lower_bound=1)


def main(argv):
    import os

    from tftrain.rules import isolated

    # Before TensorFlow (a model module may import it): XLA reads its flags once per process.
    given = os.environ.get("XLA_FLAGS")
    os.environ["XLA_FLAGS"] = isolated.quick_compile_flags(given or "")
    try:
        return _check()
    finally:  # in-process callers (tests) keep their own environment
        if given is None:
            os.environ.pop("XLA_FLAGS", None)
        else:
            os.environ["XLA_FLAGS"] = given


def _check() -> int:
    """The check of the flags' config and target: prints the report, returns its exit code."""
    from tftrain import config as config_lib

    flag_values = {"runtime.tpu": FLAGS.tpu} if FLAGS.tpu is not None else {}
    config = config_lib.build_config(FLAGS.config, flag_values, FLAGS.params_override)
    from tftrain.runtime import cluster

    cluster.use(config.runtime.cluster)  # the workers of TF_CONFIG, SLURM, ... as train sees them
    target = make_target(config)
    quiet_start.import_tensorflow()  # only after the flags and config are valid
    from tftrain import check

    report = check.run(config, target, FLAGS.model_dir,
                       config_lib.conversion_allowed(config, FLAGS.params_override),
                       gpu_type=FLAGS.gpu_type or "")
    for line in report.lines():
        print(line)
    if FLAGS.json:
        import json

        from tftrain.fileio import write_atomic

        write_atomic(FLAGS.json, json.dumps(report.to_json(), indent=2) + "\n")
    return report.exit_code


def make_target(config):
    """The `Target` of the flags (and, by default, of the config's strategy)."""
    from tftrain.runtime import cluster, dtensor_layouts
    from tftrain.rules import hardware
    from tftrain.rules.report import Target
    from tftrain.errors import ConfigError

    runtime = config.runtime
    kind = FLAGS.target or (
        "tpu" if runtime.strategy == "tpu" or (runtime.strategy == "auto" and runtime.tpu) else
        "multi_worker" if runtime.strategy == "multi_worker_mirrored" else "cpu")
    if kind == "tpu":
        if FLAGS["replicas"].present:
            raise ConfigError("--replicas is for gpu, cpu and multi_worker; a TPU's replicas are "
                              "--tpu_cores")
        tpu_type, cores = FLAGS.tpu_type, FLAGS.tpu_cores
        env_type, env_cores, assumed = hardware.tpu_from_environment()
        if not assumed:  # TPU_ACCELERATOR_TYPE names the slice (on the TPU VM, on GKE)
            tpu_type = tpu_type if FLAGS["tpu_type"].present else env_type
            cores = cores if FLAGS["tpu_cores"].present else env_cores
        return Target("tpu", cores, tpu_type, runtime.tpu or "local")
    if FLAGS["gpu_type"].present and kind != "gpu":
        raise ConfigError(f"--gpu_type is for --target=gpu, not {kind}")
    if FLAGS["tpu_cores"].present or FLAGS["tpu_type"].present:
        raise ConfigError(f"--tpu_cores and --tpu_type are for --target=tpu, not {kind}; "
                          "give --replicas")
    replicas = FLAGS.replicas
    if replicas is None:
        if runtime.strategy == "dtensor":
            replicas = dtensor_layouts.parse_mesh(runtime.mesh)[dtensor_layouts.BATCH]
        elif runtime.strategy == "mirrored" and runtime.cpu_devices > 1:
            replicas = runtime.cpu_devices
        elif kind == "multi_worker":
            replicas = cluster.num_workers() if cluster.num_workers() > 1 else 2
        else:
            replicas = 1
    return Target(kind, replicas)
