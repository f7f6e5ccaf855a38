"""Running `tftrain launch` (and other tftrain commands) as real processes, cleaned up after.

Each command is a child forked from the test process's forkserver (`tests/forked_cli.py`): a
real process of its own, which does not import TensorFlow again."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time

from tests import forked_cli


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pids, timeout: float = 30) -> bool:
    """True once none of `pids` is alive (waits up to `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.2)
    return not any(pid_alive(p) for p in pids)


def group_gone(pgid: int, timeout: float = 30) -> bool:
    """True once no process is left in process group `pgid` (waits up to `timeout` seconds): a
    forked command runs in its own session, so what it started and left behind is there."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def chief_backup(model_dir) -> int:
    """When the chief last wrote its backup: the modification time (ns) of its checkpoint
    index, 0 when there is none. The other workers' saves do not count: they are not what a
    restart reads."""
    try:
        return os.stat(os.path.join(model_dir, "backup", "chief", "checkpoint")).st_mtime_ns
    except FileNotFoundError:
        return 0


def wait_for_a_new_chief_backup(run, model_dir, timeout: float) -> None:
    """Returns once the chief has written a backup after this call (polling its index, which
    each backup rewrites); fails the test after `timeout` seconds."""
    backed_up = chief_backup(model_dir)
    deadline = time.monotonic() + timeout
    while chief_backup(model_dir) == backed_up and time.monotonic() < deadline:
        time.sleep(0.02)
    assert chief_backup(model_dir) != backed_up, run.tail()


class Running:
    """A forked tftrain process whose output is collected line by line in the background."""

    def __init__(self, args: list[str], cwd, env: dict | None = None,
                 entry: str = forked_cli.ENTRY_POINT):
        self.lines: list[str] = []
        self.process = forked_cli.Popen(args, cwd=cwd, env={**os.environ, **(env or {})},
                                        stdout=forked_cli.PIPE, stderr=forked_cli.STDOUT,
                                        entry=entry)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for_line(self, pattern: str, timeout: float) -> str:
        """The first output line matching `pattern`; fails the test after `timeout` seconds."""
        return self.lines[self.wait_for_index(pattern, timeout)]

    def wait_for_index(self, pattern: str, timeout: float, start: int = 0) -> int:
        """The index of the first output line from `start` on that matches `pattern`; fails the
        test after `timeout` seconds."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = start
        while True:
            ended = self.process.poll() is not None and not self._reader.is_alive()
            for index in range(seen, len(self.lines)):
                if regex.search(self.lines[index]):
                    return index
                seen = index + 1
            if ended or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        raise AssertionError(f"no line matching {pattern!r} within {timeout}s; output:\n{self.tail()}")

    def worker_pids(self) -> dict[int, int]:
        """Worker index -> pid, from the launcher's `[launch] worker i: pid N` lines."""
        found = {}
        for line in self.lines:
            match = re.match(r"\[launch\] worker (\d+): pid (\d+)", line)
            if match:
                found[int(match.group(1))] = int(match.group(2))
        return found

    def wait(self, timeout: float) -> int:
        """The exit code; a process still running after `timeout` seconds fails the test."""
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout}s; output:\n{self.tail()}") from None
        self._reader.join(10)
        return code

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.lines[-n:])

    def kill_all(self) -> None:
        """Kills the process and every worker it reported (test cleanup)."""
        pids = list(self.worker_pids().values())
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        for pid in pids:
            if pid_alive(pid):
                os.killpg(pid, signal.SIGKILL)
