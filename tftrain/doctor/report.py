"""The doctor's result as text: two tables, the verdict and the advice. No TensorFlow here."""
from __future__ import annotations


def _rate(value) -> str:
    return "-" if value is None else f"{value:,.0f}"


def text(result: dict) -> str:
    """The readable report of `tftrain.doctor.run`'s result."""
    rates = result["examples_per_second"]
    per_step = result["examples_per_step"]
    lines = [
        f"data {result['data_dir']}, strategy {result['strategy']} x{result['num_replicas']}, "
        f"{result['mixed_precision']}, {per_step} examples per step; {result['steps']} timed steps "
        f"per measurement, the best of {result['rounds']} interleaved rounds",
        "",
        "| run | examples/s | ms/step |",
        "|---|---|---|",
    ]
    for key, what in (("input_alone", "input alone (the distributed training input)"),
                      ("model_alone", "model alone (batches replayed from memory)"),
                      ("combined", "input + model (what train runs)")):
        lines.append(f"| {what} | {_rate(rates[key])} | {1e3 * per_step / rates[key]:.1f} |")
    lines += ["", f"waiting on input: {result['input_wait']:.0%} of the step time "
              "(1 - combined / model alone)", "",
              "| input stage (timed uncached, in this process) | examples/s up to it "
              "| us/example it adds | share |", "|---|---|---|---|"]
    for stage in result["stages"]:
        if stage["seconds_per_example"] is None:
            lines.append(f"| {stage['description']} | - | - | {stage['note']} |")
            continue
        lines.append(f"| {stage['description']} | {_rate(stage['examples_per_second'])} | "
                     f"{1e6 * stage['seconds_per_example']:.1f} | {stage['share']:.0%} |")
    ratio = rates["model_alone"] / rates["input_alone"]
    lines += ["", f"costliest input stage: {result['costliest_stage']}",
              f"verdict: {result['verdict']} (the model alone is {ratio:.2f}x the input alone; "
              f"input-bound from {result['input_bound_margin']:.2f}x)"]
    for trial in result["tried"]:
        lines.append(f"tried {trial['change']}: {trial['measured']} {_rate(trial['before'])} -> "
                     f"{_rate(trial['after'])} examples/s ({trial['speedup']:.2f}x)")
    lines += _utilization(result.get("utilization"))
    if result["suggestions"]:
        lines.append("suggestions:")
        lines += [f"  {i}. {s['line']}" for i, s in enumerate(result["suggestions"], 1)]
    else:
        lines.append("suggestions: none" + (" for the input: the model's step is the limit"
                                            if result["verdict"] == "compute-bound" else ""))
    return "\n".join(lines)


def _utilization(usage: dict | None) -> list[str]:
    """The MFU line and what holds it down."""
    if not usage or usage["mfu"] is None:
        return [f"model FLOPs utilization: unknown ({usage['peak_source']})"] if usage else []
    lines = [f"model FLOPs utilization: {usage['mfu']:.2%} (input + model), "
             f"{usage['mfu_model_alone']:.2%} (model alone) of "
             f"{usage['peak_flops_per_second'] / 1e12:,.3g} TFLOP/s "
             f"({usage['peak_source']}); {usage['model_flops_per_example'] / 1e6:,.2f} "
             "MFLOP per example"]
    lines += [f"  held down by {why}" for why in usage["held_down_by"]]
    return lines
