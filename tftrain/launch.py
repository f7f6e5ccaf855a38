"""`tftrain launch`: N local worker processes of one multi-worker run, on loopback.

Each worker is `tftrain <command...>` with its own TF_CONFIG (free 127.0.0.1 ports). Every
line a worker prints is shown prefixed with `[worker i]`. The launch ends with the chief's
(worker 0's) exit code once it finishes. It never waits silently: when a worker dies or cannot
start, when `timeout` seconds pass, or on Ctrl-C/SIGTERM, the launcher stops every worker
(SIGTERM, then SIGKILL after `grace` seconds), names the worker and shows its last lines, and
exits non-zero.

Security: TensorFlow's gRPC servers have no authentication. The addresses here are loopback
ones; on a real cluster, run workers only on a private network.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Optional

from tftrain import cluster

LAUNCHER = "[launch]"
TAIL_LINES = 15
TIMEOUT_EXIT_CODE = 124
# The command each worker runs: the tftrain CLI with the launch's arguments.
WORKER_MAIN = "import sys; from tftrain.cli import run; run(['tftrain'] + sys.argv[1:])"


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct TCP ports that are free on `host` right now."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclasses.dataclass
class Worker:
    """One launched worker process and the last lines it printed."""

    index: int
    process: subprocess.Popen
    tail: collections.deque
    reader: threading.Thread

    def describe_exit(self) -> str:
        """'exited with code 3' or 'was killed by SIGKILL'."""
        code = self.process.returncode
        if code is not None and code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with code {code}"

    def last_lines(self) -> str:
        """The worker's last lines, indented, for an error message."""
        if not self.tail:
            return "    (no output)"
        return "\n".join(f"    {line}" for line in self.tail)


class Launcher:
    """Starts, watches and stops the workers of one launch (see the module docstring)."""

    def __init__(self, command: list[str], num_workers: int, *, timeout: Optional[float] = None,
                 host: str = "127.0.0.1", grace: float = 10.0, pin_cpus: bool = False,
                 out: IO[str] = None, env: Optional[dict] = None):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.command = list(command)
        self.num_workers = num_workers
        self.timeout = timeout
        self.host = host
        self.grace = grace
        self.pin_cpus = pin_cpus
        self.out = out or sys.stdout
        self.env = dict(os.environ if env is None else env)
        self.workers: list[Worker] = []
        self._lock = threading.Lock()
        self._stop_signal: Optional[int] = None

    def say(self, text: str) -> None:
        """Prints a launcher line (several lines each get the prefix)."""
        with self._lock:
            for line in text.splitlines() or [""]:
                self.out.write(f"{LAUNCHER} {line}\n")
            self.out.flush()

    def run(self) -> int:
        """Runs the launch to its end; returns the exit code (the chief's when all went well)."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            hosts = [f"{self.host}:{port}" for port in free_ports(self.num_workers, self.host)]
            self.say(f"{self.num_workers} worker(s) on {', '.join(hosts)}: tftrain "
                     f"{' '.join(self.command)}")
            try:
                for index in range(self.num_workers):
                    self.workers.append(self._start(index, hosts))
            except OSError as e:
                self.say(f"worker {len(self.workers)} failed to start: {e}; stopping the others")
                self.stop_all()
                return 1
            return self._watch()
        finally:
            self.stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum, frame) -> None:
        self._stop_signal = signum

    def _start(self, index: int, hosts: list[str]) -> Worker:
        env = dict(self.env, TF_CONFIG=cluster.make_tf_config(hosts, index), PYTHONUNBUFFERED="1")
        cpus = sorted(os.sched_getaffinity(0))
        core = cpus[index % len(cpus)] if self.pin_cpus else None

        def preexec():  # runs in the child, before it starts Python
            _die_with_parent()
            if core is not None:
                os.sched_setaffinity(0, {core})

        process = subprocess.Popen(
            [sys.executable, "-c", WORKER_MAIN, *self.command], env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=preexec)
        tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
        reader = threading.Thread(target=self._relay, args=(index, process.stdout, tail),
                                  name=f"worker-{index}-output", daemon=True)
        reader.start()
        self.say(f"worker {index}: pid {process.pid}" + (f", cpu {core}" if self.pin_cpus else ""))
        return Worker(index, process, tail, reader)

    def _relay(self, index: int, stream, tail: collections.deque) -> None:
        prefix = f"[worker {index}] "
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            # Progress bars redraw with \r: keep what the line finally shows.
            line = line.rsplit("\r", 1)[-1]
            tail.append(line)
            with self._lock:
                self.out.write(prefix + line + "\n")
                self.out.flush()
        stream.close()

    def _watch(self) -> int:
        started = time.monotonic()
        chief = self.workers[0]
        while True:
            if self._stop_signal is not None:
                name = signal.Signals(self._stop_signal).name
                self.say(f"received {name}: stopping all workers")
                self.stop_all()
                return 128 + self._stop_signal
            for worker in self.workers:
                code = worker.process.poll()
                if code is not None and code != 0:
                    self._drain(worker)
                    self.say(f"worker {worker.index} {worker.describe_exit()}; stopping the other "
                             f"workers. Its last lines:\n{worker.last_lines()}")
                    self.stop_all()
                    return code if code > 0 else 128 - code
            if chief.process.returncode == 0:
                return self._finish_after_chief()
            if self.timeout is not None and time.monotonic() - started > self.timeout:
                running = [w for w in self.workers if w.process.poll() is None]
                details = "\n".join(f"  worker {w.index}, last lines:\n{w.last_lines()}" for w in running)
                self.say(f"timeout: --timeout={self.timeout:g}s passed with worker(s) "
                         f"{', '.join(str(w.index) for w in running)} still running; stopping "
                         f"them.\n{details}")
                self.stop_all()
                return TIMEOUT_EXIT_CODE
            time.sleep(0.2)

    def _finish_after_chief(self) -> int:
        """The chief succeeded: the others should end too; wait `grace` seconds for them."""
        deadline = time.monotonic() + self.grace
        for worker in self.workers[1:]:
            try:
                worker.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say(f"worker {worker.index} still runs {self.grace:g}s after the chief "
                         "finished; stopping it")
            if worker.process.poll() not in (None, 0):
                self._drain(worker)
                self.say(f"worker {worker.index} {worker.describe_exit()} after the chief "
                         f"finished. Its last lines:\n{worker.last_lines()}")
        self.stop_all()
        self._drain(self.workers[0])
        self.say("chief finished with exit code 0")
        return 0

    def _drain(self, worker: Worker) -> None:
        worker.reader.join(timeout=5)

    def stop_all(self) -> None:
        """SIGTERM to every running worker's process group, SIGKILL after `grace` seconds."""
        running = [w for w in self.workers if w.process.poll() is None]
        for worker in running:
            _signal_group(worker.process, signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        for worker in running:
            try:
                worker.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say(f"worker {worker.index} did not stop within {self.grace:g}s of SIGTERM: "
                         "SIGKILL")
                _signal_group(worker.process, signal.SIGKILL)
                worker.process.wait()
        for worker in running:
            self._drain(worker)


def _die_with_parent() -> None:
    """Linux: the worker gets SIGKILL if the launcher itself is killed (no orphaned workers)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass


def launch(command: list[str], num_workers: int, **kwargs) -> int:
    """Runs `tftrain <command>` as `num_workers` local workers; returns the launch's exit code.

    Keyword arguments are those of `Launcher` (timeout, host, grace, pin_cpus, out, env).
    """
    return Launcher(command, num_workers, **kwargs).run()
