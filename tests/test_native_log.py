"""The filter of a multi-worker run's stderr (tftrain.native_log) on the lines TensorFlow 2.21's
runtime wrote when a peer was lost (copied from the two workers of tests/test_partition.py's
run without the filter), and on the lines around them that must pass, as they come.

The whole path (two workers cut apart, each ending in one line) is tests/test_partition.py."""
import os
import select
import subprocess
import sys
import threading

from tftrain import native_log

# Worker 0 (its peer lost), then worker 1 (cut off), as TensorFlow logged them.
CHIEF_DUMP = [
    "E0000 00:00:1796551695.221775   29153 base_collective_executor.cc:252] "
    "BaseCollectiveExecutor::StartAbort UNAVAILABLE: Error reported from /job:worker/task:1: "
    "The following tasks are unhealthy (stopped sending heartbeats):",
    "/job:worker/replica:0/task:1",
    "The tasks have crashed. Check the task logs for an earlier error, or scheduler events "
    "(e.g. preemption, eviction) to debug further. "
    "[type.googleapis.com/tensorflow.CoordinationServiceError='\"']",
    "E0000 00:00:1796551695.221909   29153 ring_alg.cc:291] Aborting RingReduce with "
    "UNAVAILABLE: Collective ops is aborted by: Error reported from /job:worker/task:1: The "
    "following tasks are unhealthy (stopped sending heartbeats):",
    "/job:worker/replica:0/task:1",
    "The error could be from a previous operation. Restart your program to reset. "
    "[type.googleapis.com/tensorflow.DerivedStatus='']",
]
CUT_OFF_DUMP = [
    "E0000 00:00:1796551696.201723   29323 base_collective_executor.cc:252] "
    "BaseCollectiveExecutor::StartAbort DEADLINE_EXCEEDED: Deadline Exceeded",
    "",
    "RPC: /tensorflow.CoordinationService/Heartbeat",
    "E0000 00:00:1796551696.3   29323 coordination_service_agent.cc:1421] Failed to send "
    "heartbeat. Additional GRPC error information from remote target "
    "/job:worker/replica:0/task:0 while calling /tensorflow.CoordinationService/Heartbeat:",
    ":{\"created\":\"@1796551696.3\",\"description\":\"Error received from peer\","
    "\"grpc_status\":4}",
]
EPOCH = "Epoch 4/8"
PYTHON_RECORD = ("W1206 10:08:01.299413 140661861313408 reader.py:453] split 'train' has 1 "
                 "shard files for 2 input pipelines")
ERROR_LINE = "tftrain train: error: worker 1 stopped answering (lost or unhealthy, ...)"
FATAL = ("F0000 00:00:1796551697.0   29323 coordination_service_agent.cc:99] Check failed: "
         "agent != nullptr")
OTHER_NATIVE_ERROR = ("E0000 00:00:1796551697.0   29323 cuda_executor.cc:99] failed to "
                      "allocate 2.00G")


def kept(lines):
    dump = native_log.LostPeerDump()
    return [line for line in lines if dump.keep(line)]


def test_the_runtimes_dump_of_a_lost_peer_is_dropped_and_the_rest_kept():
    assert kept([EPOCH, *CHIEF_DUMP, ERROR_LINE]) == [EPOCH, ERROR_LINE]
    assert kept([EPOCH, *CUT_OFF_DUMP, ERROR_LINE]) == [EPOCH, ERROR_LINE]
    # a log record of Python (absl) ends a dump's continuation lines as tftrain's own line does
    assert kept([*CHIEF_DUMP, PYTHON_RECORD, "its own continuation"]) == [
        PYTHON_RECORD, "its own continuation"]
    # a crash's reason and the other native errors are never dropped, nor what follows them
    assert kept([*CUT_OFF_DUMP, FATAL, "  @ the stack"]) == [FATAL, "  @ the stack"]
    assert kept([OTHER_NATIVE_ERROR, "its detail"]) == [OTHER_NATIVE_ERROR, "its detail"]


def _through_the_filter():
    """(writer fd, reader fd, thread) around `native_log.filter_stream` in a thread."""
    into, to_filter = os.pipe()
    from_filter, out = os.pipe()

    def run():
        native_log.filter_stream(into, out)
        os.close(out)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return to_filter, from_filter, thread


def _read_some(fd) -> bytes:
    ready, _, _ = select.select([fd], [], [], 60)  # a bound: the filter answers at once
    assert ready, "nothing came out of the filter"
    return os.read(fd, 1 << 16)


def test_the_stream_passes_lines_as_they_come_and_ends_with_its_input():
    to_filter, from_filter, thread = _through_the_filter()
    os.write(to_filter, f"{EPOCH}\n".encode())
    assert _read_some(from_filter) == f"{EPOCH}\n".encode()
    # a line still without its newline (a progress bar redrawn with \r) is not held back
    os.write(to_filter, b"\r 3/10 [====")
    assert _read_some(from_filter) == b"\r 3/10 [===="
    dump = "\n".join(CHIEF_DUMP).encode()
    os.write(to_filter, b"==] done\n" + dump + b"\n" + ERROR_LINE.encode())  # no last newline
    os.close(to_filter)
    rest = b""
    while chunk := os.read(from_filter, 1 << 16):
        rest += chunk
    thread.join(60)
    assert rest == b"==] done\n" + ERROR_LINE.encode()
    os.close(from_filter)


def test_install_sends_stderr_through_a_filter_process_that_outlives_its_writer(tmp_path):
    """A process that installs the filter, writes a dump and dies at once (os._exit, as an
    abort would): every other line still arrives, through the filter process."""
    probe = ("import os, sys\nfrom tftrain import native_log\nnative_log.install()\n"
             f"sys.stderr.write({chr(10).join([EPOCH, *CUT_OFF_DUMP, ERROR_LINE])!r} + '\\n')\n"
             "sys.stderr.flush()\nos._exit(3)\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path, check=False)
    assert result.returncode == 3
    assert result.stderr.splitlines() == [EPOCH, ERROR_LINE], result.stderr
