"""`tftrain` commands in processes forked from a server that imported TensorFlow once.

A new interpreter spends seconds of CPU importing TensorFlow before a command starts. Here each
command runs in a child forked from multiprocessing's forkserver, which imported TensorFlow and
tftrain's command modules once (`tftrain.cli.preload`; no TensorFlow op has run in it, so forking
is safe, as it is for the converter's workers). `tftrain launch` starts its workers, and starts
them again after a failure, this way.

The child is otherwise what `tftrain <args>` started from a shell is: its own process and
session (a process group to signal), the given working directory, environment (exactly the one
given) and stdin/stdout/stderr, `tftrain.cli.run` as the entry point, SIGINT raising
KeyboardInterrupt and SIGTERM at its default, stdout unbuffered when PYTHONUNBUFFERED is set,
non-daemon threads and atexit handlers run at exit, and the exit code (or -signal) reported as
`subprocess` reports it. What differs: environment variables that TensorFlow reads while it is
imported (`TF_CPP_MIN_LOG_LEVEL`, `TF_USE_LEGACY_KERAS`) take the values the server started with.
"""
from __future__ import annotations

import atexit
import importlib
import io
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from multiprocessing import reduction
from typing import Optional

from tftrain import host

# What the server imports once: TensorFlow, then the command modules and what they import.
PRELOAD = ["tftrain.cli.preload"]
ENTRY_POINT = "tftrain.cli:run"  # the console script's entry point: run(["tftrain", *args])

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


def _context(preload: list[str] = PRELOAD):
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(preload)
    return context


def _run_in_child(argv, entry, cwd, env, fds, started, with_parent: bool,
                  cpu: Optional[int]) -> None:
    """The child's body: becomes `tftrain <argv>` started from a shell, runs it, exits.
    `started` is closed once the child is set up (as `subprocess.Popen` returns after exec)."""
    os.setsid()
    if with_parent:  # the parent is the server, which exits once the caller and its children
        host.die_with_parent()  # have: it is alive while this child holds its "alive" pipe
    host.leave_forkserver()
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = open(0, encoding="utf-8", closefd=False)
    if env.get("PYTHONUNBUFFERED"):  # as the interpreter opens stdout for it
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True,
                                      encoding=sys.stdout.encoding, errors=sys.stdout.errors)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # chosen again from this environment's TMPDIR, as a new process does
    sys.argv = list(argv)
    os.close(started)
    code = 0
    try:
        from tftrain import quiet_start

        with quiet_start.hiding_start_up_chatter():  # as a fresh process lists its devices
            import tensorflow as tf

            tf.config.list_physical_devices()
        module, function = entry.split(":")
        getattr(importlib.import_module(module), function)(list(argv))
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


def start_server(preload: list[str] = PRELOAD) -> bool:
    """Starts the server now (its imports of `preload` run in the background); True when this
    call started it, False when this process already had one (one per process: multiprocessing
    has a single forkserver, whose preload is that of whoever started it).

    A process that is itself what a server is (`preload` imported, one thread, no TensorFlow
    runtime or GPU started: a command forked from a server, before it runs anything) becomes
    the server by forking, instead of starting an interpreter that imports it all again."""
    from multiprocessing import forkserver

    _context(preload)
    server = forkserver._forkserver  # noqa: SLF001
    had_one = server._forkserver_pid is not None
    if not had_one and _is_like_a_server(preload):
        _fork_server(server)
    else:
        forkserver.ensure_running()
    return not had_one


def _is_like_a_server(preload: list[str]) -> bool:
    """Whether this process could serve as the server of `preload` as it is."""
    if not all(name in sys.modules for name in preload):
        return False
    try:
        if len(os.listdir("/proc/self/task")) > 1:
            return False
    except OSError:  # no /proc (not Linux): the threads cannot be counted
        return False
    import tensorflow as tf
    from tensorflow.python.eager import context

    started = context.context_safe()
    return not (started and started._initialized) and not tf.config.list_physical_devices("GPU")


# The longest path an AF_UNIX socket takes (sun_path: 108 bytes with the final NUL, on Linux).
SOCKET_PATH_MAX = 107


def _listener_address(address: str) -> str:
    """`address` (multiprocessing's, in its temporary directory under TMPDIR) when a socket can
    take it; under a TMPDIR too deep for one, a socket in a private directory of /tmp (mode
    0700, as `mkdtemp` makes it), removed when this process ends."""
    if len(os.fsencode(address)) <= SOCKET_PATH_MAX:
        return address
    import shutil
    from multiprocessing import util

    directory = tempfile.mkdtemp(prefix="tftrain-", dir="/tmp")
    util.Finalize(None, shutil.rmtree, args=(directory,), kwargs={"ignore_errors": True},
                  exitpriority=-100)
    return os.path.join(directory, "listener")


def _fork_server(server) -> None:
    """What `forkserver.ensure_running` does, with a fork of this process as the server (its
    file descriptors but the server's closed, its signal handlers back at their defaults, as
    in a new interpreter), so that the server's imports are the ones this process made."""
    from multiprocessing import connection, forkserver, resource_tracker, util

    resource_tracker.ensure_running()
    listener = socket.socket(socket.AF_UNIX)
    address = _listener_address(connection.arbitrary_address("AF_UNIX"))
    listener.bind(address)
    if not util.is_abstract_socket_namespace(address):
        os.chmod(address, 0o600)
    listener.listen()
    alive_r, alive_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            kept = {0, 1, 2, listener.fileno(), alive_r}
            for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
                if fd not in kept:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            for number in signal.valid_signals():
                if callable(signal.getsignal(number)):
                    signal.signal(number, signal.SIG_DFL)
            forkserver.main(listener.fileno(), alive_r, [])
        except SystemExit:  # every client gone: the server's normal end
            code = 0
        finally:
            os._exit(code)
    os.close(alive_r)
    listener.close()
    server._forkserver_address = address
    server._forkserver_alive_fd = alive_w
    server._forkserver_pid = pid


def stop_server() -> None:
    """Stops this process's server and waits for it (its children must have ended), so that no
    server outlives the command that started it and its CPU is counted to that command."""
    from multiprocessing import forkserver

    forkserver._forkserver._stop()  # noqa: SLF001  (multiprocessing has no public stop)


class Popen:
    """`tftrain <args>` in a forked child, with the part of `subprocess.Popen` callers use.

    `args` start after `tftrain` (`["train", "--config=digits"]`). stdout is PIPE, DEVNULL, an
    open file or None (the caller's); stderr the same or STDOUT. `die_with_parent`: the child is
    killed when the server, and so the caller, dies. `cpu`: the one CPU the child may run on.
    `entry`: "module:function" called with `["tftrain", *args]` (tests run their own scripts).
    Returns once the child is in its own session, directory and environment.
    """

    def __init__(self, args: list[str], cwd=None, env: Optional[dict] = None, stdout=None,
                 stderr=None, text: bool = True, die_with_parent: bool = False,
                 cpu: Optional[int] = None, entry: str = ENTRY_POINT):
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
        fds = tuple(_InheritedFd(fd) for fd in (devnull, out, err))
        self._process = _context().Process(
            target=_run_in_child, daemon=False,
            args=(self.args, entry, os.fspath(cwd or os.getcwd()), environment, fds,
                  _InheritedFd(started), die_with_parent, cpu))
        try:
            self._process.start()
        finally:
            for fd in set(to_close):
                os.close(fd)
        self.pid = self._process.pid
        with os.fdopen(started_read, "rb") as set_up:
            set_up.read()  # EOF: the child is set up (or died trying: poll() says so)

    def poll(self) -> Optional[int]:
        """The exit code (-N: killed by signal N), or None while it runs."""
        if self.returncode is None and not self._process.is_alive():
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        """The exit code once it ends; subprocess.TimeoutExpired after `timeout` seconds."""
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
