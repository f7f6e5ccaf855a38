"""`tftrain launch`: N local worker processes of one multi-worker run, on loopback.

Each worker is `tftrain <command...>` with its own TF_CONFIG (free 127.0.0.1 ports), forked
from a server that imported TensorFlow once (`tftrain.forked`): a worker, and a restarted one,
starts in a fraction of a second instead of importing TensorFlow again. Every line a worker
prints is shown prefixed with `[worker i]`. The launch ends with the chief's (worker 0's) exit
code once it finishes. It never waits silently: when a worker dies or cannot
start, when `timeout` seconds pass, or on Ctrl-C/SIGTERM, the launcher stops every worker
(SIGTERM, then SIGKILL after `grace` seconds), names the worker and shows its last lines, and
exits non-zero.

Restarts (`max_restarts`, default 0): when a worker dies (a non-zero exit, the preemption exit
code 143 included, or a signal) or the run hangs (no progress for `hang_timeout` seconds), all
workers are stopped and the same command starts again on fresh ports, so `tftrain train`
resumes from its backup; after `max_restarts` restarts the launch fails as above. Progress is
any output line from any worker, or a new position in any worker's heartbeat file (the
`Heartbeat` callback rewrites it during `fit`, at most once a second): steps that print nothing
count, and so do phases outside `fit` that log (conversion, evaluation). The workers learn the
causes of the restarts so far from `TFTRAIN_LAUNCH_RESTARTS` (a JSON list), which the run's
summary.json reports (`restarts`, `restart_causes`). `timeout` bounds the whole launch, restarts
included.

Security: TensorFlow's gRPC servers have no authentication. The addresses here are loopback
ones; on a real cluster, run workers only on a private network.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Optional

from absl import logging

from tftrain import forked
from tftrain.runtime import cluster

LAUNCHER = "[launch]"
TAIL_LINES = 15
TIMEOUT_EXIT_CODE = 124
HANG_EXIT_CODE = TIMEOUT_EXIT_CODE  # a hang that outlived the restarts is a timeout too
# What the launcher tells each worker: the causes of the restarts so far (a JSON list of
# strings), and the heartbeat file its `Heartbeat` callback rewrites (only with hang_timeout).
RESTARTS_ENV = "TFTRAIN_LAUNCH_RESTARTS"
HEARTBEAT_ENV = "TFTRAIN_HEARTBEAT_FILE"


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


def restart_summary() -> dict:
    """The summary.json fields of a launch's restarts: `restarts` (how many) and
    `restart_causes` (one line each); 0 and [] outside `tftrain launch`."""
    raw = os.environ.get(RESTARTS_ENV, "")
    try:
        causes = json.loads(raw) if raw else []
    except ValueError:
        causes = None
    if not isinstance(causes, list) or not all(isinstance(c, str) for c in causes):
        # Not worth failing a finished run over: this only describes how it got here.
        logging.warning("%s=%r is not the JSON list of strings `tftrain launch` sets; the summary "
                        "reports no restarts", RESTARTS_ENV, raw)
        causes = []
    return {"restarts": len(causes), "restart_causes": causes}


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


@dataclasses.dataclass
class Worker:
    """One launched worker process, the last lines it printed and its heartbeat file."""

    index: int
    process: forked.Popen
    tail: collections.deque
    reader: threading.Thread
    heartbeat: Optional[str] = None
    beat_seen: Optional[int] = None  # the heartbeat file's mtime (ns) when last looked at

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

    def beat(self) -> bool:
        """True when the heartbeat file changed since the last look."""
        try:
            mtime = os.stat(self.heartbeat).st_mtime_ns if self.heartbeat else None
        except FileNotFoundError:
            mtime = None
        changed = mtime is not None and mtime != self.beat_seen
        self.beat_seen = mtime
        return changed

    def position(self) -> str:
        """Where the heartbeat last put training ('epoch 3 step 12'), or ''."""
        try:
            with open(self.heartbeat) as f:  # the launcher's own local file; no TensorFlow here
                return f.read().strip()
        except (OSError, TypeError):
            return ""


class Launcher:
    """Starts, watches, restarts and stops the workers of one launch (see the module docstring)."""

    def __init__(self, command: list[str], num_workers: int, *, timeout: Optional[float] = None,
                 host: str = "127.0.0.1", grace: float = 10.0, pin_cpus: bool = False,
                 out: IO[str] = None, env: Optional[dict] = None, max_restarts: int = 0,
                 hang_timeout: Optional[float] = None):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
        if hang_timeout is not None and hang_timeout <= 0:
            raise ValueError(f"hang_timeout must be > 0 seconds, got {hang_timeout}")
        self.command = list(command)
        self.num_workers = num_workers
        self.timeout = timeout
        self.host = host
        self.grace = grace
        self.pin_cpus = pin_cpus
        self.out = out or sys.stdout
        self.env = dict(os.environ if env is None else env)
        self.max_restarts = max_restarts
        self.hang_timeout = hang_timeout
        self.restarts: list[str] = []  # the cause of each restart so far
        self.workers: list[Worker] = []
        self._lock = threading.Lock()
        self._stop_signal: Optional[int] = None
        self._started = 0.0
        self._progress_at = 0.0  # monotonic time of the last output line or heartbeat
        self._heartbeats: Optional[str] = None  # the directory of the heartbeat files

    def say(self, text: str) -> None:
        """Prints a launcher line (several lines each get the prefix)."""
        with self._lock:
            for line in text.splitlines() or [""]:
                self.out.write(f"{LAUNCHER} {line}\n")
            self.out.flush()

    def run(self) -> int:
        """Runs the launch to its end; returns the exit code (the chief's when all went well)."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        self._started = time.monotonic()
        own_server = False
        if self.hang_timeout is not None:
            self._heartbeats = tempfile.mkdtemp(prefix="tftrain-launch-")
        try:
            own_server = forked.start_server()  # one TensorFlow import for every (re)start
            while True:
                code, cause = self._attempt()
                if cause is None:
                    return code
                if self._stop_signal is not None:
                    self.say(f"{cause}; received {signal.Signals(self._stop_signal).name}: "
                             "not restarting")
                    return 128 + self._stop_signal
                if self._timed_out():
                    self.say(f"{cause}; --timeout={self.timeout:g}s has passed: not restarting")
                    return TIMEOUT_EXIT_CODE
                if len(self.restarts) >= self.max_restarts:
                    if self.max_restarts:
                        self.say(f"{cause}; restarts exhausted ({len(self.restarts)} of "
                                 f"--max_restarts={self.max_restarts} used): giving up")
                    return code
                self.restarts.append(cause)
                resumes = " (the run resumes from its backup)" if self.command[0] == "train" else ""
                self.say(f"{cause}; restart {len(self.restarts)} of {self.max_restarts}: starting "
                         f"all {self.num_workers} workers again on fresh ports{resumes}")
        finally:
            self.stop_all()
            if own_server:
                forked.stop_server()
            if self._heartbeats:
                shutil.rmtree(self._heartbeats, ignore_errors=True)
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _attempt(self) -> tuple[int, Optional[str]]:
        """Starts every worker and watches them: the exit code, and the cause of a failure that
        a restart may cure (None when the launch is over)."""
        self.workers = []
        hosts = [f"{self.host}:{port}" for port in free_ports(self.num_workers, self.host)]
        self.say(f"{self.num_workers} worker(s) on {', '.join(hosts)}: tftrain "
                 f"{' '.join(self.command)}")
        self._progress_at = time.monotonic()
        try:
            for index in range(self.num_workers):
                self.workers.append(self._start(index, hosts))
        except (OSError, EOFError) as e:  # EOFError: the server of forked workers died
            self.say(f"worker {len(self.workers)} failed to start: {e}; stopping the others")
            self.stop_all()
            return 1, None
        return self._watch()

    def _on_signal(self, signum, frame) -> None:
        self._stop_signal = signum

    def _start(self, index: int, hosts: list[str]) -> Worker:
        env = dict(self.env, TF_CONFIG=cluster.make_tf_config(hosts, index), PYTHONUNBUFFERED="1")
        env[RESTARTS_ENV] = json.dumps(self.restarts)
        heartbeat = None
        if self._heartbeats:
            heartbeat = env[HEARTBEAT_ENV] = os.path.join(self._heartbeats, f"worker-{index}")
            if os.path.exists(heartbeat):
                os.remove(heartbeat)  # the last attempt's
        cpus = sorted(os.sched_getaffinity(0))
        core = cpus[index % len(cpus)] if self.pin_cpus else None
        process = forked.Popen(self.command, env=env, stdout=forked.PIPE, stderr=forked.STDOUT,
                               text=False, die_with_parent=True, cpu=core)
        tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
        reader = threading.Thread(target=self._relay, args=(index, process.stdout, tail),
                                  name=f"worker-{index}-output", daemon=True)
        reader.start()
        self.say(f"worker {index}: pid {process.pid}" + (f", cpu {core}" if self.pin_cpus else ""))
        return Worker(index, process, tail, reader, heartbeat)

    def _relay(self, index: int, stream, tail: collections.deque) -> None:
        prefix = f"[worker {index}] "
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            # Progress bars redraw with \r: keep what the line finally shows.
            line = line.rsplit("\r", 1)[-1]
            tail.append(line)
            with self._lock:
                self._progress_at = time.monotonic()
                self.out.write(prefix + line + "\n")
                self.out.flush()
        stream.close()

    def _watch(self) -> tuple[int, Optional[str]]:
        """Watches the running workers (see `_attempt`)."""
        chief = self.workers[0]
        while True:
            if self._stop_signal is not None:
                name = signal.Signals(self._stop_signal).name
                self.say(f"received {name}: stopping all workers")
                self.stop_all()
                return 128 + self._stop_signal, None
            failed = self._failed_worker()
            if failed is not None:
                code = failed.process.returncode
                cause = f"worker {failed.index} {failed.describe_exit()} at {_now()}"
                self._drain(failed)
                self.say(f"worker {failed.index} {failed.describe_exit()}; stopping the other "
                         f"workers. Its last lines:\n{failed.last_lines()}")
                cause += self._where()
                self.stop_all()
                return (code if code > 0 else 128 - code), cause
            if chief.process.returncode == 0:
                return self._finish_after_chief(), None
            if self._timed_out():
                running = [w for w in self.workers if w.process.poll() is None]
                self.say(f"timeout: --timeout={self.timeout:g}s passed with worker(s) "
                         f"{', '.join(str(w.index) for w in running)} still running; stopping "
                         f"them.\n{_last_lines_of(running)}")
                self.stop_all()
                return TIMEOUT_EXIT_CODE, None
            if self._hung():
                cause = (f"no progress for {self.hang_timeout:g}s (--hang_timeout) at "
                         f"{_now()}{self._where()}")
                running = [w for w in self.workers if w.process.poll() is None]
                self.say(f"{cause}: no worker printed a line or moved its heartbeat; stopping "
                         f"all workers.\n{_last_lines_of(running)}")
                self.stop_all()
                return HANG_EXIT_CODE, cause
            time.sleep(0.2)

    def _failed_worker(self) -> Optional[Worker]:
        """A worker that ended with an error, or None. One killed by a signal comes first: its
        peers lose their collectives to it and often exit with an error a moment before the
        launcher sees it gone."""
        failed = [w for w in self.workers if w.process.poll() not in (None, 0)]
        failed.sort(key=lambda w: w.process.returncode > 0)
        return failed[0] if failed else None

    def _timed_out(self) -> bool:
        return self.timeout is not None and time.monotonic() - self._started > self.timeout

    def _hung(self) -> bool:
        if self.hang_timeout is None:
            return False
        now = time.monotonic()
        beat = [worker.beat() for worker in self.workers]  # looks at every file, to remember it
        with self._lock:
            if any(beat):
                self._progress_at = now
            return now - self._progress_at > self.hang_timeout

    def _where(self) -> str:
        """' (worker 0 at epoch 3 step 12, ...)' from the heartbeats, or ''."""
        positions = [(w.index, w.position()) for w in self.workers]
        seen = [f"worker {index} at {where}" for index, where in positions if where]
        return f" ({', '.join(seen)})" if seen else ""

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


def _last_lines_of(workers: list[Worker]) -> str:
    return "\n".join(f"  worker {w.index}, last lines:\n{w.last_lines()}" for w in workers)


def _signal_group(process: forked.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass


def launch(command: list[str], num_workers: int, **kwargs) -> int:
    """Runs `tftrain <command>` as `num_workers` local workers; returns the launch's exit code.

    Keyword arguments are those of `Launcher` (timeout, host, grace, pin_cpus, out, env,
    max_restarts, hang_timeout).
    """
    return Launcher(command, num_workers, **kwargs).run()
