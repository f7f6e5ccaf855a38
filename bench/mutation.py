"""Mutation testing of tftrain's pure, central logic (`make mutation`; docs/mutation.md).

    .venv/bin/python bench/mutation.py            # mutmut over SCOPE, then the table
    .venv/bin/python bench/mutation.py --report   # the table of the last run (from mutants/)

mutmut 3 (its settings: setup.cfg's [mutmut]) plants one small bug at a time (a `<` for a
`<=`, a `+ 1`, a dropped argument, a string changed) in the functions of SCOPE and runs their
fast unit tests against it; a mutant that no test fails on *survived*. The table gives, per
module, the mutants, how many the tests killed (a mutant whose tests hang or crash counts as
killed), and the survivors, each either EQUIVALENT (a change no input can observe, with the
reason) or a test missing. Exits 1 when a survivor is not known to be equivalent, or a mutant
was not tested.

SCOPE names the functions as mutmut keys them: `x_name` for a function, `xǁClassǁmethod` for a
method (fnmatch patterns). A whole module (`*`) where all of it is pure; in the modules that
also drive TensorFlow (prune, runs), only the gate functions.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.table import markdown_table  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEP = "ǁ"  # mutmut's class separator in function keys

SCOPE = {
    # split and shard assignment
    "tftrain/data/splits.py": ["*"],
    "tftrain/data/shard_plan.py": ["*"],
    # record framing
    "tftrain/data/record_file.py": ["*"],
    # shard order and resume positions
    "tftrain/data/order.py": ["*"],
    # step plans
    "tftrain/training/steps.py": ["*"],
    # the prune / quantize gates
    "tftrain/optimize/prune.py": ["x_finetune_epochs", "x_check_target_sparsity",
                                  "x_parse_m_by_n", "x_make_schedule", "x_m_by_n_ok",
                                  "x_check_sparsity_reached"],
    "tftrain/optimize/runs.py": ["x_check_gate", "x__gate_line", f"x{SEP}PruneOptions{SEP}*",
                                 f"x{SEP}QuantizeOptions{SEP}*", "x__pruning_report",
                                 "x__prune_gate", "x__quantized_report", "x__write_and_gate"],
    "tftrain/optimize/quantize.py": ["x_check_mode"],
    # the task metrics (and the measure's change the gates bound)
    "tftrain/tasks/base.py": ["*"],
    "tftrain/tasks/classification.py": ["x_predicted_classes", "x_count_correct",
                                        "x_cross_entropy",
                                        f"x{SEP}ClassificationTask{SEP}evaluate"],
    "tftrain/tasks/regression.py": ["x_regression_metrics", "x_huber",
                                    f"x{SEP}RegressionTask{SEP}__init__",
                                    f"x{SEP}RegressionTask{SEP}evaluate"],
    "tftrain/tasks/language_model.py": ["x_next_token_metrics", "x_metric_classes",
                                        "x_perplexity_metric", "x_bits_per_byte_metric",
                                        f"x{SEP}LanguageModelTask{SEP}evaluate"],
    "tftrain/tasks/r2_metric.py": ["*"],
}

# Survivors no test can kill (docs/mutation.md lists them): (function, the mutated line as
# `mutmut show` prints it, stripped) -> why no input tells the mutant from the original.
_REFUSED_BEFORE = "the huber branch runs after regression_metrics(outputs, labels), which " \
    "refuses empty outputs or labels and labels that do not fit the outputs first"
_UNIT_TF = "for a local path tf.io.gfile gives what os.path gives (both follow links); only " \
    "remote paths need gfile, and the ram:// tests cover that branch"
_READ_FIRST = "the first header always reads a window: b'XXXX' is too short for a header, and " \
    "a window start after offset 0 makes `at` negative"
_AT = "`at` is never negative (a window starts at or before the offset walked) and is 0 only " \
    "at the first header, which reads a window anyway"
EQUIVALENT: dict[tuple[str, str], str] = {
    # splits
    ("x_parse_splits", "fraction = -2.0"):
        "any value outside (0, 1] marks the part unreadable: -2 is refused as -1 is",
    ("x_parse_splits", "if not fractions or abs(sum(fractions.values()) - 1.0) >= 1e-6:"):
        "a sum near 1 minus 1.0 is exact and a multiple of 2^-53; the double 1e-6 is not, so "
        "the two are never equal",
    ("x_unit_hash", 'return int.from_bytes(digest[:8], ) / 2.0**64'):
        "int.from_bytes takes byteorder 'big' by default since Python 3.11 (on 3.10 the call "
        "raises TypeError, which every splits test would catch)",
    # shard_plan
    ("x_take_sample", "for row in itertools.islice(rows, None):"):
        "the loop returns at row SAMPLE_ROWS + 1 itself; the islice bound is never reached",
    ("x_take_sample", "for row in itertools.islice(rows, SAMPLE_ROWS + 2):"):
        "the loop returns at row SAMPLE_ROWS + 1 itself; the islice bound is never reached",
    ("x_source_bytes",
     'entries = [n.lstrip("/") for n in tf.io.gfile.listdir(source) if not n.startswith(".")]'):
        "listed names never begin with '/'; a folder's trailing '/' (GCS) is taken alike by "
        "split_from_name and posixpath.join, stripped or not",
    ("x__tree_bytes",
     "if not (os.path.isdir(path) if (local) and False else tf.io.gfile.isdir(path)):"): _UNIT_TF,
    ("x__tree_bytes",
     "return os.path.getsize(path) if (local) and False else tf.io.gfile.stat(path).length"):
        _UNIT_TF,
    ("x__tree_bytes",
     "size = os.path.getsize if (local) and False else (lambda f: tf.io.gfile.stat(f).length)"):
        _UNIT_TF,
    ("x_check_args", "def check_args(*, num_shards=None, shard_size_mb=None, workers=None, "
                     "max_bad_fraction=1.0) -> None:"):
        "the default is only checked against [0, 1]: 1.0 passes as 0.0 does (callers pass "
        "their own)",
    ("x_choose", 'shares = ""'): "`shares` is only tested for truth: '' is false as None is",
    # record_file
    ("xǁRecordFileǁwrite", 'length = struct.pack("<q", len(data))'):
        "signed and unsigned 64-bit lengths are the same bytes below 2^63",
    ("x_check_frames", 'with open(path, "rb", ) as f:'):
        "only the file's descriptor is used (os.fstat, os.pread), never its buffer",
    ("x_check_frames", 'with open(path, "rb", buffering=1) as f:'):
        "only the file's descriptor is used (os.fstat, os.pread), never its buffer (line "
        "buffering, which a binary file lacks, only adds a RuntimeWarning)",
    ("x_check_frames", 'window, window_start = b"XXXX", 0'): _READ_FIRST,
    ("x_check_frames", 'window, window_start = b"", 1'): _READ_FIRST,
    ("x_check_frames", "if at <= 0 or at + 12 > len(window):"): _AT,
    ("x_check_frames", "if at < 1 or at + 12 > len(window):"): _AT,
    # order
    ("x_stream", "piece = piece.skip(skip) if (skip) or True else piece"):
        "skip(0) yields the same dataset",
    ("x__count_records", "return int(tf.data.TFRecordDataset(path).reduce(tf.constant(0, None), "
                         "lambda n, _: n + 1))"):
        "an int32 counter counts the same up to 2^31 - 1 records in one file",
    ("x__count_records", "return int(tf.data.TFRecordDataset(path).reduce(tf.constant(0, ), "
                         "lambda n, _: n + 1))"):
        "an int32 counter counts the same up to 2^31 - 1 records in one file",
    # prune
    ("x_m_by_n_ok", "rows = np.moveaxis(kernel, -1, 0).reshape(-1, )"):
        "the next line cuts blocks of n from the same flat [out, ..., in] order: the shape in "
        "between does not matter",
    # tasks
    ("xǁTaskǁchange", "return (after - before) / before if before else after + before"):
        "that branch runs only when before is 0: after - 0 == after + 0",
    ("x_predicted_classes", "return outputs.reshape(len(outputs), -1).argmax(axis=+1)"):
        "the outputs were just made 2-D: axis 1 is axis -1",
    ("xǁClassificationTaskǁevaluate", "classes = outputs.reshape(len(outputs), -2).shape[-1]"):
        "NumPy (2.x) takes any negative size in reshape as the one to infer, as it takes -1",
    ("x_count_correct", "labels = np.asarray(labels).reshape(-1).astype(None)"):
        "class ids compare equal to the predictions as floats or as ints (a label with a "
        "fraction is not a class id)",
    ("x_regression_metrics",
     'with np.errstate(divide=None, invalid="ignore"):  # a constant label has no R² (nan)'):
        "nothing in the block divides by zero (the inner np.where puts 1.0 where the spread is "
        "0): no warning to silence",
    ("x_regression_metrics", 'with np.errstate(invalid="ignore"):  # a constant label has no '
                             'R² (nan)'):
        "nothing in the block divides by zero (the inner np.where puts 1.0 where the spread is "
        "0): no warning to silence",
    ("x_regression_metrics",
     'with np.errstate(divide="ignore", invalid=None):  # a constant label has no R² (nan)'):
        "nothing in the block is invalid for finite labels (0/0 is kept out by the inner "
        "np.where): no warning to silence",
    ("x_regression_metrics", 'with np.errstate(divide="ignore", ):  # a constant label has no '
                             'R² (nan)'):
        "nothing in the block is invalid for finite labels (0/0 is kept out by the inner "
        "np.where): no warning to silence",
    ("x_regression_metrics", "r2 = np.where(total > 0, 1.0 - residual / np.where(total >= 0, "
                             "total, 1.0), np.nan)"):
        "where the spread is 0 the outer np.where gives nan whatever the inner one divided by",
    ("x_regression_metrics", "r2 = np.where(total > 0, 1.0 - residual / np.where(total > 0, "
                             "total, 2.0), np.nan)"):
        "where the spread is 0 the outer np.where gives nan whatever the inner one divided by",
    ("x_huber", "small = np.abs(errors) < delta"):
        "Huber is continuous where abs(error) = delta: both branches give delta² / 2 there",
    ("xǁRegressionTaskǁ__init__",
     "if len(self.mean) not in (1, 1, self.size) or len(self.std) != len(self.mean):"):
        "without a mean the statistics end up () either way (a std without a mean fails the "
        "second test)",
    ("xǁRegressionTaskǁevaluate", 'predicted = as_rows(outputs, None)'): _REFUSED_BEFORE,
    ("xǁRegressionTaskǁevaluate", 'predicted = as_rows(outputs, "XXoutputsXX")'): _REFUSED_BEFORE,
    ("xǁRegressionTaskǁevaluate", 'predicted = as_rows(outputs, "OUTPUTS")'): _REFUSED_BEFORE,
    ("xǁRegressionTaskǁevaluate",
     'errors = predicted - as_rows(labels, "labels").reshape(None)'): _REFUSED_BEFORE,
    ("xǁRegressionTaskǁevaluate",
     'errors = predicted - as_rows(labels, None).reshape(predicted.shape)'): _REFUSED_BEFORE,
    ("xǁRegressionTaskǁevaluate",
     'errors = predicted - as_rows(labels, "XXlabelsXX").reshape(predicted.shape)'):
        _REFUSED_BEFORE,
    ("xǁRegressionTaskǁevaluate",
     'errors = predicted - as_rows(labels, "LABELS").reshape(predicted.shape)'): _REFUSED_BEFORE,
    ("xǁClassificationTaskǁevaluate", "classes = outputs.reshape(len(outputs), -1).shape[+1]"):
        "the outputs were just made 2-D: axis 1 is axis -1",
    ("x_metric_classes",
     "self.token_bytes = np.asarray(token_bytes, np.float64).reshape(None)"):
        "token_bytes is the manifest's list, one number per id: 1-D already, and reshape(None) "
        "keeps its shape",
    ("x_metric_classes", "tf.constant(math.nan, None))"):
        "tf.constant of a Python float is float32 already",
    ("x_metric_classes", "tf.constant(math.nan, ))"):
        "tf.constant of a Python float is float32 already",
    ("x_next_token_metrics", "uniform += float((log_norm - shifted.mean(axis=None)).sum())"):
        "every row has the vocabulary's length: the rows' means summed are the number of rows "
        "times the mean of all",
    ("x_next_token_metrics", "chunk = logits[start:start + 65536].astype(None)"):
        "astype(None) is astype(float64)",
    ("x_next_token_metrics", "size = float(np.asarray(token_bytes, None)[labels].sum())"):
        "the bytes are summed and made a float: ints or floats, the same sum",
    ("x_next_token_metrics", "size = float(np.asarray(token_bytes, )[labels].sum())"):
        "the bytes are summed and made a float: ints or floats, the same sum",
    ("xǁR2ǁupdate_state", "return tf.group(None)"):
        "in TF2 the assign_adds run when called, eagerly or in a tf.function (automatic control "
        "dependencies): the returned group does not make them run",
}


def _negative_size(original: str, mutated: str) -> bool:
    """A size of -1 made -2 inside a reshape(...) call."""
    for i in (i for i in range(len(mutated)) if mutated.startswith("-2", i)):
        if mutated[:i] + "-1" + mutated[i + 2:] != original:
            continue
        start = mutated.rfind("reshape(", 0, i)
        inside = mutated[start + len("reshape("):i]
        return start >= 0 and inside.count("(") >= inside.count(")")
    return False


# Equivalent by a rule rather than by one line: (the rule, the reason).
RULES = [(_negative_size, "NumPy (2.x) takes any negative size in reshape as the one to "
                          "infer, as it takes -1")]

DETECTED = ("killed", "timeout", "suspicious", "segfault")  # the tests stopped the mutant


def module_of(path: str) -> str:
    return path[:-len(".py")].replace("/", ".")


def patterns() -> list[str]:
    """SCOPE as mutant-name patterns for `mutmut run`."""
    return [f"{module_of(path)}.{function}__mutmut_*" for path, functions in SCOPE.items()
            for function in functions]


def function_of(name: str) -> str:
    """`x_name` or `xǁClassǁmethod` of a mutant's name."""
    return name.rpartition(".")[2].partition("__mutmut_")[0]


def in_scope(path: str, key: str) -> bool:
    return any(fnmatch.fnmatchcase(function_of(key), p) for p in SCOPE[path])


def statuses() -> dict[str, dict[str, str]]:
    """{source path: {mutant name: status}} of the mutants in SCOPE, from mutmut's .meta files."""
    from mutmut.stats import status_by_exit_code

    result = {}
    for path in SCOPE:
        meta = os.path.join(REPO, "mutants", path + ".meta")
        with open(meta) as f:
            codes = json.load(f)["exit_code_by_key"]
        result[path] = {key: status_by_exit_code[code] for key, code in codes.items()
                        if in_scope(path, key)}
    return result


def diff_of(name: str, path: str) -> str:
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    return get_diff_for_mutant(name, path=path)


def why_equivalent(name: str, path: str) -> str | None:
    """The reason a survivor is equivalent, or None: from EQUIVALENT, else from RULES."""
    lines = diff_of(name, path).splitlines()
    removed = [line[1:].strip() for line in lines if line.startswith("-")
               and not line.startswith("---")]
    added = [line[1:].strip() for line in lines if line.startswith("+")
             and not line.startswith("+++")]
    if not added:
        return None
    reason = EQUIVALENT.get((function_of(name), added[0]))
    if reason is None and len(removed) == len(added) == 1:
        reason = next((why for rule, why in RULES if rule(removed[0], added[0])), None)
    return reason


def percent(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole else "-"


def report() -> int:
    """Prints the table and the survivors; returns the exit status: 1 when a survivor is not
    known to be equivalent, or a mutant was not tested."""
    rows, unexplained, equivalent, untested = [], [], [], []
    totals = [0] * 5
    for path, mutants in statuses().items():
        killed = sum(s == "killed" for s in mutants.values())
        stopped = sum(s in DETECTED[1:] for s in mutants.values())
        explained = 0
        for name in sorted(n for n, s in mutants.items() if s == "survived"):
            reason = why_equivalent(name, path)
            if reason:
                equivalent.append((name, reason))
                explained += 1
            else:
                unexplained.append((name, path))
        untested += [(name, s) for name, s in mutants.items()
                     if s not in DETECTED and s != "survived"]
        survived = sum(s == "survived" for s in mutants.values())
        counts = (len(mutants), killed, stopped, survived, explained)
        totals = [t + n for t, n in zip(totals, counts)]
        rows.append([f"`{module_of(path)}`", *counts, percent(killed + stopped, len(mutants)),
                     percent(killed + stopped, len(mutants) - explained)])
    total, killed, stopped, survived, explained = totals
    rows.append(["all", *totals, percent(killed + stopped, total),
                 percent(killed + stopped, total - explained)])
    print(markdown_table(["module", "mutants", "killed", "timeout / crash", "survived",
                          "equivalent", "score", "score w/o equivalent"],
                         rows, ["l"] + ["r"] * 7))
    print(f"\n{killed + stopped} of {total} mutants killed ({stopped} by a timeout or a crash); "
          f"of the {survived} survivors, {explained} equivalent (docs/mutation.md):")
    for name, reason in equivalent:
        print(f"  {name}: {reason}")
    for name, status in untested:
        print(f"  {status.upper()}: {name}")
    for name, path in unexplained:
        print(f"\nSURVIVED, no test fails on it (`.venv/bin/mutmut show {name}`):")
        print(diff_of(name, path))
    return 1 if unexplained or untested else 0


def check_config() -> None:
    """SCOPE's files are exactly setup.cfg's `only_mutate` (mutmut mutates those files)."""
    import configparser

    parser = configparser.ConfigParser()
    parser.read(os.path.join(REPO, "setup.cfg"))
    files = set(parser.get("mutmut", "only_mutate").split())
    if files != set(SCOPE):
        sys.exit(f"setup.cfg [mutmut] only_mutate and bench/mutation.py SCOPE differ: "
                 f"{sorted(files ^ set(SCOPE))}")


def run(max_children: int) -> None:
    """`mutmut run` over SCOPE, from a fresh mutants/ (so no result of an older source stays)."""
    check_config()
    shutil.rmtree(os.path.join(REPO, "mutants"), ignore_errors=True)
    mutmut = os.path.join(os.path.dirname(sys.executable), "mutmut")
    done = subprocess.run([mutmut, "run", f"--max-children={max_children}", *patterns()],
                          cwd=REPO)
    if done.returncode:
        sys.exit(f"mutmut run failed (exit status {done.returncode}): see its output above")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", action="store_true", help="only the table of the last run")
    parser.add_argument("--max-children", type=int, default=1,
                        help="mutants tested at once (default 1: the machine is shared)")
    args = parser.parse_args()
    os.chdir(REPO)
    if not args.report:
        start = time.monotonic()
        run(args.max_children)
        print(f"\nmutmut run: {time.monotonic() - start:.0f} s")
    return report()


if __name__ == "__main__":
    sys.exit(main())
