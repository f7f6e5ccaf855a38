"""One writer at a time per directory: an exclusive lock held while tftrain writes into it.

Two conversions into one dataset directory, or two trainings into one run directory, would
delete or overwrite each other's files. On a local filesystem the writer holds an exclusive
`flock` on a lock file inside the directory (`<output>/.convert.lock` for `tftrain convert`,
`<model_dir>/.tftrain-run.lock` for `tftrain train`, `prune` and `quantize`); the kernel releases
it when the process ends, however it ends (kill -9 included), so a lock is never stale. The file
itself stays (an unlinked lock file could be locked twice) and holds who took it, for the error
the next one gets. Within one process a lock is re-entrant (a failed in-process run may be
followed by another into the same directory). Object stores (gs://, s3://) have no such lock
through tf.io.gfile: there, running two writers into one path is left to the user.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import stat
from typing import Iterator

from absl import logging

from tftrain.errors import TftrainError

CONVERT_LOCK = ".convert.lock"  # a dataset directory, while `tftrain convert` writes it
RUN_LOCK = ".tftrain-run.lock"  # a run directory, while train, prune or quantize write it

_held: dict[str, int] = {}  # lock file (real path) -> its descriptor, held by this process


def _lock_path(directory: str, name: str) -> str:
    return os.path.join(os.path.realpath(directory), name)  # the lock file itself: never a link's target


def is_remote(directory: str) -> bool:
    """True for object-store paths (gs://, s3://, ...), where no lock can be taken."""
    return "://" in directory


def acquire(directory: str, name: str, command: str) -> None:
    """Takes the lock `name` of the (existing) `directory` for `command` (e.g. "tftrain train")
    until `release` or the end of the process; one clear error if another process holds it."""
    if is_remote(directory):
        logging.info("%s is remote: no lock is taken, so do not run two tftrain commands that "
                     "write into it at once", directory)
        return
    path = _lock_path(directory, name)
    if path in _held:
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as e:  # a symlink (ELOOP), a directory, a FIFO without reader (ENXIO), ...
        raise TftrainError(
            f"{os.path.join(directory, name)} is not tftrain's lock file ({e.strerror}): tftrain "
            "writes its lock only into a regular file it creates. Remove or move that entry and "
            "run the command again.") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise TftrainError(f"{os.path.join(directory, name)} is not a regular file, so it is not "
                           "tftrain's lock file; remove or move it and run the command again.")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 256, 0).decode("utf-8", "replace").strip()
        os.close(fd)
        what, _, who = holder.partition("; ")
        raise TftrainError(
            f"another {what or 'tftrain command'} ({who or 'another process'}) is writing into "
            f"{directory}; wait for it to finish or stop it, then run this one again.") from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{command}; pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
    _held[path] = fd


def release(directory: str, name: str) -> None:
    """Releases a lock taken by `acquire` (nothing happens if this process does not hold it)."""
    if is_remote(directory):
        return
    fd = _held.pop(_lock_path(directory, name), None)
    if fd is not None:
        os.close(fd)


@contextlib.contextmanager
def exclusive(directory: str, name: str, command: str) -> Iterator[None]:
    """Holds the lock `name` of `directory` for the block (see `acquire`); a lock this process
    already held stays held after it."""
    held = is_remote(directory) or _lock_path(directory, name) in _held
    acquire(directory, name, command)
    try:
        yield
    finally:
        if not held:
            release(directory, name)
