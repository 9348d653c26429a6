"""Asynchronous operations on kolo's work queue: issue order against blocking calls, buffers that
overlap, sends and receives, Ctrl-C while a blocking call waits for queued work, and what a
completion callback may not do."""

import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import kolo
from conftest import ok, run_ranks


def test_blocking_call_runs_after_the_queued_ones():
    # The all-gather reads x after the queued all-reduce has written it, on every rank.
    def body(c):
        x = np.array([c.rank + 1.0], np.float64)
        w = c.all_reduce(x, async_op=True)
        g = c.all_gather(x)
        return w.is_completed(), g.ravel().tolist()

    for done, g in ok(run_ranks(3, body)):
        assert done and g == [6.0, 6.0, 6.0]


@pytest.mark.parametrize("async_op", [False, True])
def test_all_to_all_in_place(async_op):
    # send and recv are one buffer: kolo reads a copy of it (without one, the parts received first
    # overwrite parts not yet sent).
    size, n = 3, 2

    def body(c):
        x = (np.arange(n * size, dtype=np.int64) + 100 * c.rank).copy()
        w = c.all_to_all(x, x, async_op=async_op)
        if async_op:
            w.wait(10)
        return x

    for r, got in enumerate(ok(run_ranks(size, body))):
        want = np.concatenate([np.arange(r * n, (r + 1) * n) + 100 * q for q in range(size)])
        np.testing.assert_array_equal(got, want)


def test_async_in_place_all_gather_reads_its_slot_when_it_runs():
    # The input is this rank's slot of the output, written by the all-reduce queued before: the
    # copy kolo reads is taken when the all-gather runs (every row 6), not when it was issued
    # (rows 1, 2, 3).
    def body(c):
        out = np.full((c.size, 3), c.rank + 1, np.float32)
        c.all_reduce(out, async_op=True)
        c.all_gather(out[c.rank], out, async_op=True).wait(10)
        return out

    for got in ok(run_ranks(3, body)):
        np.testing.assert_array_equal(got, np.full((3, 3), 6, np.float32))


def test_async_receives_before_sends_and_in_message_order():
    # Both ranks post their receives first (a blocking receive would wait forever), and two
    # receives from one rank with one tag get the messages in the order they were sent.
    def body(c):
        peer = 1 - c.rank
        a, b = np.zeros(3, np.int32), np.zeros(3, np.int32)
        wa = c.recv(a, peer, tag=5, async_op=True)
        wb = c.recv(b, peer, tag=5, async_op=True)
        c.send(np.full(3, 10 * c.rank + 1, np.int32), peer, tag=5, async_op=True).wait(10)
        c.send(np.full(3, 10 * c.rank + 2, np.int32), peer, tag=5)
        wa.wait(10)
        wb.wait(10)
        return a.tolist(), b.tolist()

    res = ok(run_ranks(2, body))
    for r, (a, b) in enumerate(res):
        peer = 1 - r
        assert a == [10 * peer + 1] * 3 and b == [10 * peer + 2] * 3


def test_async_send_runs_after_the_queued_collective():
    # The send's data is the all-reduce's result: it runs after the collective issued before it
    # (which cannot complete before rank 1, late, joins it).
    def body(c):
        x = np.array([c.rank + 1.0], np.float32)
        if c.rank == 1:
            time.sleep(0.3)
        c.all_reduce(x, async_op=True)
        if c.rank == 0:
            c.send(x, 1, async_op=True).wait(10)
            return None
        got = np.zeros(1, np.float32)
        c.recv(got, 0)
        return got.tolist()

    assert ok(run_ranks(2, body))[1] == [3.0]


def test_blocking_call_in_a_completion_raises_instead_of_waiting_for_itself():
    seen = []

    def body(c):
        done = threading.Event()

        def callback(err):
            try:
                c._c.barrier()
            except RuntimeError as e:
                seen.append(str(e))
            done.set()

        c._c.all_reduce(np.ones(2, np.float32), "sum", done=callback)
        assert done.wait(10), "the completion did not finish"

    ok(run_ranks(1, body, timeout=15))
    assert seen and "completion callback" in seen[0]


def test_closed_communicator_refuses_async_work():
    (c,) = kolo.local_world(1)
    w = c.all_reduce(np.ones(2, np.float32), async_op=True)
    c.close()
    assert w.is_completed()  # close() waited for it
    with pytest.raises(RuntimeError, match="closed"):
        c.all_reduce(np.ones(2, np.float32), async_op=True)
    with pytest.raises(RuntimeError, match="closed"):
        c.send(np.ones(2, np.float32), 0, async_op=True)


def test_ctrl_c_while_a_blocking_call_waits_for_queued_work():
    # Rank 0 queues an all-reduce rank 1 never joins, then calls a blocking barrier, which waits
    # for it; SIGINT raises KeyboardInterrupt there within a fraction of a second (not after the
    # communicator's 60 s timeout).
    script = textwrap.dedent(
        """
        import os, signal, threading, time
        import numpy as np
        import kolo
        # Python's own handler, whatever the parent left (a shell's background job ignores
        # SIGINT, and its children inherit that).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        c0, c1 = kolo.local_world(2, timeout=60)
        c0.all_reduce(np.ones(4, np.float32), async_op=True)
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        start = time.monotonic()
        try:
            c0.barrier()
        except KeyboardInterrupt:
            print(f"interrupted after {time.monotonic() - start:.2f} s", flush=True)
        c0.abort("done")
        """
    )
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=50)
    assert p.returncode == 0, p.stderr
    assert "interrupted after" in p.stdout, (p.stdout, p.stderr)
    assert float(p.stdout.split("after ")[1].split()[0]) < 5


def test_one_table_of_names():
    from kolo import _kolo

    assert kolo.DTYPES == _kolo.DTYPES and "bfloat16" in kolo.DTYPES
    assert kolo.REDUCE_OPS == _kolo.REDUCE_OPS == ("sum", "prod", "min", "max", "avg")
    assert _kolo.REDUCE_OP_NAMES["product"] == "prod" and _kolo.DTYPE_NAMES["half"] == "float16"

    def body(c):
        x = np.full(2, c.rank + 2, np.int64)
        c._c.all_reduce(x, "PRODUCT")
        return x.tolist()

    assert ok(run_ranks(2, body)) == [[6, 6], [6, 6]]
