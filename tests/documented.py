"""Documented commands that a test of their own subject runs as written.

A command of README.md, docs/ or a config header whose question another test already asks
(a launch that heals, a Beam conversion, pipeline stages on two workers) runs there, once, as
the user copies it: the test takes its arguments from `args(COMMAND)`, with COMMAND the text
the docs show, and changes only what it states next to the call (where it writes, the
session's data converted the default way, fewer steps; files the test generates in place of
a user's paths; a free port; for two, another model size: pipeline stages on two workers a
smaller one, so that the run can be compared with one device's, and digits_dtensor's doctor
a wider one, so that its verdict is clear on a shared machine; for the ImageNet recipe, whose
generated records hold 72 small JPEGs, a batch of 8 and, but for its checks, 64x64 images).
tests/test_docs_commands.py counts these as run, checks that each is still shown and that the
test named here calls `args` with it; tests/test_documented_commands.py does not run them
again.
"""
import shlex

# {command as shown: "tests/test_file.py::the test or fixture that calls args(command)"}
RUN_BY = {
    "tftrain data_service --dispatcher --port=5050": "tests/test_data_service.py::service",
    "tftrain data_service --worker --dispatcher_address=localhost:5050":
        "tests/test_data_service.py::service",
    "tftrain train --config=digits --strategy=mirrored --params_override=runtime.cpu_devices=2":
        "tests/test_train_digits.py::test_new_run_dir_and_mirrored_on_two_cpus",
    "tftrain train --config=digits_dtensor":
        "tests/test_dtensor.py::test_digits_dtensor_resume_export_and_optimize",
    "tftrain train --config=digits --model_dir=runs/ema --params_override=train.ema_decay=0.99":
        "tests/test_ema.py::averaged_run",
    "tftrain train --config=digits --model_dir=runs/smoothed "
    "--params_override=task.label_smoothing=0.1": "tests/test_label_smoothing.py::smoothed_run",
    "tftrain evaluate --model=runs/ema/export --data=data/digits --split=test":
        "tests/test_ema.py::test_a_run_validates_tests_and_exports_the_average",
    "tftrain train --config=diabetes --model_dir=runs/diabetes":
        "tests/test_regression.py::test_mlp_on_diabetes_is_within_10_percent_of_ridge",
    "tftrain evaluate --model=runs/diabetes/export --data=data/diabetes --split=test":
        "tests/test_regression.py::test_mlp_on_diabetes_is_within_10_percent_of_ridge",
    "tftrain quantize --model_dir=runs/diabetes --mode=dynamic,float16":
        "tests/test_regression.py::test_mlp_on_diabetes_is_within_10_percent_of_ridge",
    "tftrain train --config=text_classification --model_dir=runs/text_classification":
        "tests/test_text_classification.py::text_run",
    "tftrain evaluate --model=runs/text_classification/export --data=data/text_classification "
    "--split=test": "tests/test_text_classification.py::test_tftrain_evaluate_on_the_export",
    "tftrain train --config=text_lm_subword --model_dir=runs/text_lm_subword":
        "tests/test_subwords.py::subword_run",
    "tftrain evaluate --model=runs/text_lm_subword/export --data=data/text_lm_subword "
    "--split=test": "tests/test_subwords.py::test_evaluate_and_generate_on_subwords",
    'tftrain generate --model_dir=runs/text_lm_subword --prompt="The " --max_tokens=40 --seed=1':
        "tests/test_subwords.py::test_evaluate_and_generate_on_subwords",
    "tftrain train --config=text_lm --model_dir=runs/text_lm": "tests/shared_runs.py::text_lm_run",
    'tftrain generate --model_dir=runs/text_lm --prompt="The " --max_tokens=80 --seed=1':
        "tests/test_language_model.py::test_generate_continues_the_prompt_greedily_and_by_sampling",
    "tftrain evaluate --model=runs/text_lm/export --data=data/text_lm --split=test":
        "tests/test_language_model.py::"
        "test_the_export_loads_predicts_and_evaluates_with_the_task_metrics",
    "tftrain train --config=text_lm --model_dir=runs/text_lm_pipeline --strategy=pipeline":
        "tests/test_pipeline.py::test_text_lm_on_two_stages_reaches_the_one_device_bar",
    "tftrain train --config=text_lm --strategy=pipeline --model_dir=runs/text_lm_interleaved "
    "--params_override=model.params.num_layers=4,runtime.pipeline_schedule=interleaved,"
    "runtime.virtual_stages=2":
        "tests/test_pipeline.py::test_an_interleaved_run_records_its_chunks_and_their_adam_state",
    "tftrain launch --num_workers=2 -- train --config=digits --model_dir=runs/mw":
        "tests/test_multiworker.py::two_worker_run",
    "tftrain launch --num_workers=2 --max_restarts=3 --hang_timeout=600 -- train "
    "--config=digits --model_dir=runs/mw":
        "tests/test_launch_restarts.py::test_two_sigkills_are_healed_and_the_run_finishes",
    "tftrain launch --num_workers=2 --max_restarts=3 -- train --config=text_lm "
    "--model_dir=runs/text_lm_workers --strategy=pipeline":
        "tests/test_pipeline_workers.py::killed_and_resumed",
    "tftrain doctor --config=digits_dtensor":
        "tests/test_dtensor.py::test_doctor_measures_a_dtensor_run",
    "tftrain doctor --config=digits --params_override=data.cache=decoded --json=doctor.json":
        "tests/test_doctor.py::test_compute_bound_run_says_so_and_suggests_nothing_for_the_input",
    "tftrain convert --pipeline=digits --output=data/digits --runner=beam "
    "--beam_options='--runner=DirectRunner --direct_num_workers=2'":
        "tests/test_convert_beam.py::test_beam_cli_and_errors",
    "tftrain train --config=imagenet_resnet50 --model_dir=runs/resnet50 "
    "--params_override=data.dir=/data/imagenet": "tests/test_imagenet_recipe.py::recipe_run",
    "tftrain evaluate --model=runs/resnet50/export":
        "tests/test_imagenet_recipe.py::test_evaluate_and_quantize_as_the_header_shows",
    "tftrain quantize --model_dir=runs/resnet50 --mode=int8":
        "tests/test_imagenet_recipe.py::test_evaluate_and_quantize_as_the_header_shows",
    "tftrain check --config=imagenet_resnet50 --target=tpu --params_override=data.dir=/data/imagenet":
        "tests/test_imagenet_recipe_check.py::test_check_passes_for_the_claimed_targets",
    "tftrain check --config=imagenet_resnet50 --target=gpu --params_override=data.dir=/data/imagenet":
        "tests/test_imagenet_recipe_check.py::test_check_passes_for_the_claimed_targets",
    "tftrain convert --pipeline=lmdb --input=/data/faces_lmdb --output=data/faces "
    "--pipeline_options=labels=/data/faces_labels.csv,image_size=112":
        "tests/test_pipeline_lmdb.py::test_trains_on_a_converted_image_lmdb",
}


def args(command: str) -> list[str]:
    """The arguments after `tftrain` of `command`, a documented command listed in `RUN_BY`."""
    assert command in RUN_BY, f"list {command!r} in tests/documented.py's RUN_BY"
    words = shlex.split(command)
    assert words[0] == "tftrain", command
    return words[1:]


def replaced(arguments: list[str], **values: str) -> list[str]:
    """`arguments` with each `--name=...` given in `values` set to its value instead (a flag
    the command does not give is an error: the test would not run the command as written)."""
    result, found = [], set()
    for arg in arguments:
        name = arg[2:].partition("=")[0] if arg.startswith("--") else None
        if name in values:
            found.add(name)
            arg = f"--{name}={values[name]}"
        result.append(arg)
    assert found == set(values), f"{sorted(set(values) - found)} not in {arguments}"
    return result
