"""One conversion at a time per output directory.

Two conversions into one directory would delete each other's shards and could leave a manifest
that describes the other run's files. On a local filesystem the converter holds an exclusive
`flock` on `<output>/.convert.lock` while it writes; the kernel releases it when the process
ends, however it ends (kill -9 included), so a lock is never stale. The file itself stays (an
unlinked lock file could be locked twice). Object stores (gs://, s3://) have no such lock
through tf.io.gfile: there, running two conversions into one path is left to the user.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from typing import Iterator

from absl import logging

from tftrain.errors import TftrainError

LOCK_NAME = ".convert.lock"


@contextlib.contextmanager
def exclusive(output_dir: str) -> Iterator[None]:
    """Holds the conversion lock of the (existing) `output_dir`; one clear error if it is taken."""
    if "://" in output_dir:
        logging.info("%s is remote: no lock is taken, so do not run two conversions into it at "
                     "once", output_dir)
        yield
        return
    fd = os.open(os.path.join(output_dir, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 256, 0).decode("utf-8", "replace").strip() or "another process"
            raise TftrainError(
                f"another conversion ({holder}) is writing into {output_dir}; wait for it to "
                "finish or stop it, then run this one again.") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
        yield
    finally:
        os.close(fd)
