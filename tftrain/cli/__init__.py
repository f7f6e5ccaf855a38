"""`tftrain <command> [flags]`: the absl entry point.

Each command is one module `tftrain.cli.<name>` whose docstring is its help, which defines its
absl flags at module level and a `main(argv)`. Adding a command is adding one module and one
line to COMMANDS. Only the chosen command's module is imported, and none of them imports
TensorFlow at module level, so `--help` is fast; a command starts TensorFlow with
`quiet_start.import_tensorflow()` once its flags are checked, so bad flags fail fast too.
"""
from __future__ import annotations

import difflib
import errno
import importlib
import io
import os
import re
import signal
import sys

from absl import app, flags

import tftrain
from tftrain import log_filter
from tftrain.errors import ConfigError, TftrainError

COMMANDS = {
    "convert": "Convert a raw dataset (images, CSV, NumPy, TFDS, JSONL) into sharded TFRecords.",
    "inspect": "Show a TFRecord dataset's schema, splits and labels; --verify checks every record.",
    "train": "Train a model from a YAML experiment config (strategy, data, model, fit, export).",
    "evaluate": "Evaluate a SavedModel or .tflite model on a dataset split.",
    "predict": "Predict on new raw files (images, CSV, text) with a trained model: CSV or JSONL out.",
    "prune": "Prune a trained model (magnitude, m:n) and measure it against the float model.",
    "quantize": "Quantize to TFLite (dynamic, int8, float16, qat), evaluated and gated on accuracy.",
    "launch": "Run a command (train) as N local multi-worker processes on loopback: launch -- train ...",
    "data_service": "Run a tf.data service dispatcher and/or worker (data.service_address).",
    "check": "Dry-run a config for a target (tpu, gpu, cpu): every check that needs no hardware.",
    "report": "Compare runs: one table of their metrics, sizes and speed; a PNG of their curves.",
    "doctor": "Say why a run is slow: input alone, model alone, both; the costliest stage; the fix.",
    "generate": "Write text with a trained language model: its export continues --prompt.",
}

HELP_ARGS = ("-h", "--help", "-?", "--helpshort")
PROG = "tftrain"


def usage() -> str:
    """The top-level help: the commands, one line each."""
    width = max(map(len, COMMANDS))
    lines = [f"usage: {PROG} <command> [flags]", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, text in COMMANDS.items()]
    lines += ["", f"`{PROG} <command> --help` lists a command's flags; `{PROG} <command> --helpfull` "
              "adds absl's own (--flagfile, -v/--verbosity, ...)."]
    return "\n".join(lines)


def fail(message: str, code: int = 2) -> None:
    """Prints one error line and exits with `code`."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(code)


def command_help(name: str, module) -> str:
    """A command's docstring and its flags (its own and the shared ones it declares)."""
    flag_help = flags.FLAGS.module_help(module)
    return f"usage: {PROG} {name} [flags]\n\n{(module.__doc__ or '').strip()}\n\nflags:\n{flag_help}"


def run(argv: list[str] | None = None) -> None:
    """The console script: dispatches to a command and exits with its code; quietly with
    CLOSED_PIPE_EXIT when the reader of its output goes away (`tftrain train --help | head`)."""
    try:
        try:
            _dispatch(list(sys.argv if argv is None else argv))
        finally:
            sys.stdout.flush()  # a closed pipe is met here, not by Python at exit
    except BrokenPipeError:
        _end_on_closed_pipe()


# What a shell reports for a Unix tool whose reader went away (killed by SIGPIPE: 128 + 13).
CLOSED_PIPE_EXIT = 128 + signal.SIGPIPE


def _end_on_closed_pipe() -> None:
    """Exits with CLOSED_PIPE_EXIT, saying nothing, as a Unix tool does when its output pipe is
    closed: no traceback, and nothing left to flush (Python would complain about the pipe at
    exit), so stdout and stderr go to /dev/null."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        try:
            os.dup2(devnull, stream.fileno())
        except (OSError, ValueError, io.UnsupportedOperation):
            pass  # not a file descriptor (a test capturing the output in memory)
    os.close(devnull)
    sys.exit(CLOSED_PIPE_EXIT)


def _dispatch(argv: list[str]) -> None:
    """Runs the command `argv` names (see `run`)."""
    args = argv[1:]
    if not args or args[0] in HELP_ARGS + ("help",):
        print(usage())
        sys.exit(0 if args else 2)
    name = args[0]
    if name.startswith("-"):
        fail(f"{name!r} given before a command; write `{PROG} <command> {name}`.\n\n{usage()}")
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        fail(f"unknown command {name!r}{hint}; commands: {', '.join(COMMANDS)}")
    before_separator = args[1: args.index("--")] if "--" in args else args[1:]
    wants_help = any(arg in HELP_ARGS for arg in before_separator)
    if not wants_help:
        _refuse_keras_3()
    module = importlib.import_module(f"tftrain.cli.{name}")
    if wants_help:
        print(command_help(name, module))
        sys.exit(0)
    app.run(_guarded(name, module), argv=[f"{PROG} {name}"] + args[1:],
            flags_parser=lambda command_argv: _parse_flags(name, command_argv))


def _refuse_keras_3() -> None:
    """Exits with one line when the environment selects Keras 3 (TF_USE_LEGACY_KERAS=0, ...).

    Checked before a command starts, so before TensorFlow is imported. Refused rather than
    forced to 1: the user set the variable on purpose, for their whole environment, and their
    own code that tftrain runs (a `--pipeline=my.module`, a model builder) would otherwise get a
    different `tf.keras` under tftrain than everywhere else; one line saying so costs one `unset`.
    """
    problem = tftrain.legacy_keras_problem()
    if problem:
        fail(problem, ConfigError.exit_code)


def _parse_flags(name: str, argv: list[str]) -> list[str]:
    flags.FLAGS.unparse_flags()  # in-process reruns start from the defaults
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        fail(f"{e}. `{PROG} {name} --help` lists the flags.")


def _guarded(name: str, module):
    """Runs a command's main; a TftrainError becomes one line on stderr and its exit code.

    Positional arguments are refused here, once for every command, unless the command module
    sets `ACCEPTS_ARGUMENTS = True` (`launch -- train ...`).
    """

    def guarded_main(argv):
        if not flags.FLAGS["verbosity"].present:  # -v N shows every library's lines again
            log_filter.install()
        reader = sys.modules.get("tftrain.data.reader")
        if reader:  # a command run in-process after another: name only the datasets it reads
            reader.OPENED.clear()
        try:
            if len(argv) > 1 and not getattr(module, "ACCEPTS_ARGUMENTS", False):
                raise ConfigError(f"unexpected arguments {argv[1:]}: every option is a --flag")
            return module.main(argv)
        except TftrainError as e:
            print(f"{PROG} {name}: error: {shortened(str(e))}", file=sys.stderr)
            return e.exit_code
        except KeyboardInterrupt:
            print(f"{PROG} {name}: interrupted", file=sys.stderr)
            return 130
        except BrokenPipeError:  # its output's reader went away: `run` ends quietly
            raise
        except Exception as e:  # noqa: BLE001  (a full disk or a damaged record: one line)
            message = (disk_full_message(name, e) if is_disk_full(e)
                       else damaged_record_message(e) or content_error_message(e)
                       or system_error_message(name, e))
            if message is None:
                if flags.FLAGS["verbosity"].present:  # -v: the traceback, for a bug report
                    raise
                message = unexpected_error_message(e)
            print(f"{PROG} {name}: error: {message}", file=sys.stderr)
            return 1

    return guarded_main


MAX_LINE = 2000  # characters of one error line: a message may quote a value from the input


def unexpected_error_message(error: BaseException) -> str:
    """One line for an error tftrain does not know (a bug here or in a library): what, where
    it was raised, and how to get the traceback."""
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    where = (f" (raised in {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})"
             if frames else "")
    text = " ".join(str(error).split())[:300]
    return (f"unexpected {type(error).__name__}: {text}{where}; rerun the same command with "
            "-v 1 for the traceback, and report it")


def shortened(message: str) -> str:
    """`message` with each line longer than MAX_LINE cut in its middle (a 200 KB value quoted
    from a bad input would bury the line that says what to do)."""
    def cut(line: str) -> str:
        if len(line) <= MAX_LINE:
            return line
        keep = MAX_LINE // 2
        return f"{line[:keep]} ... [{len(line) - 2 * keep:,} characters left out] ... {line[-keep:]}"

    return "\n".join(cut(line) for line in message.split("\n"))


def is_disk_full(error: BaseException) -> bool:
    """True for 'no space left on device', from Python's I/O (ENOSPC) or from TensorFlow's."""
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return True
    return (type(error).__module__.startswith("tensorflow")
            and "No space left on device" in str(error))


def damaged_record_message(error: BaseException) -> str | None:
    """One line for a damaged TFRecord met while reading a dataset (`tftrain.data.reader`)."""
    reader = sys.modules.get("tftrain.data.reader")  # no dataset was read unless it is loaded
    return reader.damaged_record_message(error) if reader else None


def content_error_message(error: BaseException) -> str | None:
    """One line for a record the model cannot take (`tftrain.data.reader`)."""
    reader = sys.modules.get("tftrain.data.reader")
    return reader.content_error_message(error) if reader else None


_TOO_LONG = "File name too long"
_UNHEALTHY = re.compile(r"tasks are unhealthy|stopped sending heartbeats")
_PEER = re.compile(r"/job:worker/replica:0/task:(\d+)")


def system_error_message(command: str, error: BaseException) -> str | None:
    """One line for what the machine or the cluster refused while a command ran: a path too
    long, not writable or not found, memory exhausted, a peer worker lost; None for other
    errors."""
    text = str(error).splitlines()[0] if str(error) else ""
    path = getattr(error, "filename", None) or ""
    kind = type(error).__name__
    if (isinstance(error, OSError) and error.errno == errno.ENAMETOOLONG) or _TOO_LONG in str(error):
        return (f"a path is too long for the file system{f': {path[:80]}...' if path else ''} "
                "(a name over 255 bytes, or a path over 4096): choose a shorter --model_dir, "
                "data.dir or --output")
    if isinstance(error, PermissionError) or kind == "PermissionDeniedError":
        where = path or text.split(";")[0]
        return (f"permission denied: {where}. Write somewhere you may write (--model_dir, "
                "--output), or fix the directory's permissions")
    if kind == "NotFoundError" or isinstance(error, FileNotFoundError):
        where = path or text.split(";")[0]
        return (f"not found: {where} (no such file or directory, or a place where none can be "
                f"made): check the paths `{PROG} {command}` was given (--model_dir, data.dir, "
                "--output, --model) and that nothing removed them while it ran")
    if kind == "ResourceExhaustedError" or isinstance(error, MemoryError):
        return (f"out of memory while `{PROG} {command}` ran ({kind}): `{PROG} check "
                "--config=... --target=...` plans the memory a run needs and suggests a change "
                "that fits (a smaller data.batch_size, train.grad_accum_steps, "
                "model.params.remat, runtime.mixed_precision)")
    if kind in _LOST_PEER_KINDS and command == "train" and (
            _UNHEALTHY.search(str(error)) or "Collective" in str(error)
            or "CoordinationService" in str(error)):
        return _lost_peer_message(str(error))
    return None


# How TensorFlow reports a peer it lost: the coordination service's verdict (Unavailable), a
# collective aborted or cancelled, or, on a worker cut off from the others (a network
# partition), its heartbeat or collective RPC past its deadline.
_LOST_PEER_KINDS = ("UnavailableError", "AbortedError", "CancelledError", "DeadlineExceededError")


def _lost_peer_message(text: str) -> str:
    """The one line of every worker of a run that lost a peer (`text`: TensorFlow's error).

    It names the peer when TensorFlow does: the unhealthy tasks are listed after its words; a
    task named elsewhere (in the op's own device, say) counts unless it is this worker."""
    from tftrain.runtime import cluster  # no TensorFlow

    unhealthy = _UNHEALTHY.search(text)
    own = cluster.task()[1]
    named = [int(i) for i in _PEER.findall(text[unhealthy.end():] if unhealthy else text)]
    peers = named if unhealthy else [i for i in named if i != own]
    who = f"worker {peers[0]}" if peers else "a peer worker"
    return (f"{who} stopped answering (lost or unhealthy, or the network between the workers "
            "cut: TensorFlow's coordination service saw no heartbeat, or a collective failed or "
            "ran out of time). Training stopped at the last backup; run the same command on "
            "every worker again to resume from it (`tftrain launch --max_restarts=N` does this "
            "by itself)")


def disk_full_message(command: str, error: BaseException) -> str:
    """One line for a full disk: where (when known), that nothing half-written is trusted, and
    what to do."""
    where = getattr(error, "filename", None)
    if not where:  # TensorFlow names the file in its message: '... ; No space left on device'
        text = re.sub(r"\{\{[^}]*\}\}\s*", "", str(error).splitlines()[0] if str(error) else "")
        where = text.split(";")[0].strip() if ";" in text else ""
    after = {"convert": "the partial output was removed",
             "train": "the run resumes from its last backup",
             }.get(command, "nothing half-written is kept as complete")
    return (f"no space left on device{f' writing {where}' if where else ''}: {after}. Free space "
            "(or write elsewhere) and run the same command again.")
