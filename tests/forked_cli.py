"""`tftrain` commands as real processes that do not import TensorFlow again.

A test that needs the process itself (a signal, SIGKILL and resume, several workers, a server)
starts `tftrain` here instead of through `subprocess`: each command runs in a child forked from
a server that imported TensorFlow and tftrain's command modules once (multiprocessing's
forkserver, as the converter's workers are; no TensorFlow op has run in it, so forking is safe).
A child costs milliseconds instead of the ~5 s of CPU an import of TensorFlow takes.

The child is otherwise what `tftrain <args>` started from a shell is: its own process and
session (a process group to signal), the caller's working directory, environment (exactly the
one given) and stdin/stdout/stderr, `tftrain.cli.run` as the entry point, SIGINT raising
KeyboardInterrupt and SIGTERM at its default, non-daemon threads and atexit handlers run at exit,
and the exit code (or -signal) reported as `subprocess` reports it.

What it cannot be used for: import order (what a command imports before TensorFlow), the
installed console script, and environment variables that TensorFlow reads while it is imported
(`TF_USE_LEGACY_KERAS`, `TF_CPP_MIN_LOG_LEVEL`): those tests start a fresh interpreter.
"""
from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import threading
from multiprocessing import reduction

# What the server imports once. The converter's preload is among them: the converter shares
# this process's one forkserver when a test runs it in-process.
PRELOAD = ["tests.forked_cli_preload"]

PIPE = subprocess.PIPE
STDOUT = subprocess.STDOUT
DEVNULL = subprocess.DEVNULL


class _InheritedFd:
    """An open file descriptor of the caller, duplicated into the child when pickled there."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        return (_InheritedFd._detach, (reduction.DupFd(self.fd),))

    @staticmethod
    def _detach(duplicated) -> int:
        return duplicated.detach()


def _context():
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def _run_in_child(argv, cwd, env, stdin, stdout, stderr, started) -> None:
    """The child's body: becomes `tftrain <argv>` started from a shell, runs it, exits.
    `started` is closed once the child is set up (as `subprocess.Popen` returns after exec)."""
    os.setsid()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = open(0, encoding="utf-8", closefd=False)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # chosen again from this environment's TMPDIR, as a new process does
    sys.argv = list(argv)
    os.close(started)
    code = 0
    try:
        from tftrain import quiet_start
        from tftrain.cli import run

        with quiet_start.hiding_start_up_chatter():  # as a fresh process lists its devices
            import tensorflow as tf

            tf.config.list_physical_devices()
        run(list(argv))
    except SystemExit as exited:
        code = _exit_code(exited.code)
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # noqa: BLE001  (what an interpreter prints for an uncaught error)
        import traceback

        traceback.print_exc()
        code = 1
    threading._shutdown()  # as an interpreter exiting: wait for non-daemon threads, then atexit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


class Popen:
    """A `tftrain` command in a forked child, with the part of `subprocess.Popen` tests use.

    `args` start after `tftrain` (`["train", "--config=digits"]`). stdout is PIPE, DEVNULL, an
    open file or None (the caller's); stderr the same or STDOUT.
    """

    def __init__(self, args: list[str], cwd=None, env: dict | None = None, stdout=None,
                 stderr=None, text: bool = True):
        self.args = ["tftrain", *args]
        self.returncode = None
        self.stdout = self.stderr = None
        to_close = []

        def target_fd(stream, default: int):
            if stream is None:
                return os.dup(default)
            if stream == DEVNULL:
                return os.open(os.devnull, os.O_WRONLY)
            if stream == PIPE:
                read, write = os.pipe()
                to_close.append(write)
                return read, write
            return os.dup(stream if isinstance(stream, int) else stream.fileno())

        out = target_fd(stdout, 1)
        if isinstance(out, tuple):
            self.stdout = os.fdopen(out[0], "r" if text else "rb")
            out = out[1]
        else:
            to_close.append(out)
        if stderr == STDOUT:
            err = os.dup(out)
        else:
            err = target_fd(stderr, 2)
            if isinstance(err, tuple):
                self.stderr = os.fdopen(err[0], "r" if text else "rb")
                err = err[1]
        to_close.append(err)
        devnull = os.open(os.devnull, os.O_RDONLY)
        to_close.append(devnull)
        started_read, started = os.pipe()
        to_close.append(started)
        environment = dict(os.environ if env is None else env)
        self._process = _context().Process(
            target=_run_in_child, daemon=False,
            args=(self.args, os.fspath(cwd or os.getcwd()), environment, _InheritedFd(devnull),
                  _InheritedFd(out), _InheritedFd(err), _InheritedFd(started)))
        try:
            self._process.start()
        finally:
            for fd in set(to_close):
                os.close(fd)
        self.pid = self._process.pid
        with os.fdopen(started_read, "rb") as set_up:
            set_up.read()  # EOF: the child is in its own session, in `cwd`, with `env`

    def poll(self):
        if self.returncode is None and not self._process.is_alive():
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def run(args: list[str], cwd=None, env: dict | None = None,
        timeout: float | None = None) -> subprocess.CompletedProcess:
    """`subprocess.run(["tftrain", *args], capture_output=True, text=True, timeout=...)` in a
    forked child: the output is read while the command runs; a command still running after
    `timeout` seconds is killed (with its process group) and TimeoutExpired raised."""
    process = Popen(args, cwd=cwd, env=env, stdout=PIPE, stderr=PIPE)
    captured = {}

    def read(name, stream):
        captured[name] = stream.read()
        stream.close()

    readers = [threading.Thread(target=read, args=(name, getattr(process, name)), daemon=True)
               for name in ("stdout", "stderr")]
    for reader in readers:
        reader.start()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        kill_group(process.pid)
        process.wait(30)
        raise
    finally:
        for reader in readers:
            reader.join(30)
    return subprocess.CompletedProcess(process.args, process.returncode,
                                       captured.get("stdout", ""), captured.get("stderr", ""))


def kill_group(pid: int) -> None:
    """SIGKILL to `pid`'s process group (the child and what it started), if it still exists."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
