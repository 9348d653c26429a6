"""kolo's guarantees and its bad-input errors in Python: a mismatched or dead rank raises on
every rank, naming it; unusable buffers, types and operators are clear exceptions before
anything is sent."""

import time

import numpy as np
import pytest

import kolo
from conftest import run_ranks


def test_mismatch_raises_on_every_rank():
    def body(c):
        x = np.ones(4, np.float32)
        if c.rank == 0:
            c.all_reduce(x)
        else:
            c.broadcast(x, root=0)

    start = time.monotonic()
    res = run_ranks(2, body)
    assert time.monotonic() - start < 5
    for r, e in enumerate(res):
        assert isinstance(e, kolo.MismatchError), (r, e)
        assert isinstance(e, kolo.KoloError)
        assert e.rank == r and e.peer == 1 - r
        assert "all_reduce" in str(e) and "broadcast" in str(e)


def test_rank_that_aborts_is_named():
    def body(c):
        if c.rank == 1:
            c.abort("rank 1 gives up")
            return "aborted"
        c.all_reduce(np.ones(3, np.float32))

    e = run_ranks(2, body)[0]
    assert isinstance(e, kolo.PeerError), e
    assert e.peer == 1 and "rank 1 gives up" in str(e)


def test_bad_input_on_one_rank_fails_the_others_at_once():
    # Rank 0 passes a non-contiguous array: it raises ValueError, and rank 1, already waiting in
    # the all-reduce, gets an error naming rank 0 and the cause within seconds (not its timeout).
    def body(c):
        if c.rank == 0:
            c.all_reduce(np.ones((4, 4), np.float32)[:, 0])
        else:
            c.all_reduce(np.ones(4, np.float32))

    start = time.monotonic()
    res = run_ranks(2, body, comm_timeout=60)
    assert time.monotonic() - start < 10
    assert isinstance(res[0], ValueError) and "contiguous" in str(res[0])
    assert isinstance(res[1], kolo.PeerError) and res[1].peer == 0
    assert "contiguous" in str(res[1])


def test_scatter_object_without_one_object_per_rank():
    res = run_ranks(2, lambda c: c.scatter_object([1, 2, 3] if c.rank == 0 else None))
    assert isinstance(res[0], ValueError) and "one object per rank" in str(res[0])
    assert isinstance(res[1], kolo.PeerError) and "one object per rank" in str(res[1])


@pytest.mark.parametrize(
    "make, exc, words",
    [
        (lambda: np.ones((4, 4), np.float32)[:, 0], ValueError, "contiguous"),
        (lambda: np.ones(4, np.complex64), TypeError, "element type"),
        (lambda: np.ones(4, np.int16), TypeError, "element type"),
        (lambda: np.ones(4, bool), TypeError, "element type"),
        (lambda: b"read only", ValueError, "read-only"),
        (lambda: [1, 2, 3], TypeError, "buffer protocol"),
    ],
)
def test_unusable_buffers(make, exc, words):
    (c,) = kolo.local_world(1)
    with pytest.raises(exc, match=words):
        c.all_reduce(make())
    assert words in c.failure()


def test_a_huge_timeout_means_no_deadline():
    # 1e20 s does not fit a Duration: no deadline, never a panic (and inf alike).
    for t in [1e20, float("inf")]:
        comms = kolo.local_world(2, timeout=t)
        out = [None, None]

        def body(c):
            v = np.full(3, c.rank + 1.0, dtype=np.float32)
            c.all_reduce(v)
            c.monitored_barrier(1e20)
            out[c.rank] = v

        import threading
        ts = [threading.Thread(target=body, args=(c,)) for c in comms]
        for th in ts:
            th.start()
        for th in ts:
            th.join(30)
        for c in comms:
            c.close()
        assert all(o is not None and (o == 3.0).all() for o in out), (t, out)
    for bad in [0.0, -1.0, float("nan")]:
        with pytest.raises(ValueError, match="timeout"):
            kolo.local_world(2, timeout=bad)


def test_unsupported_op_and_dtype_names():
    (c,) = kolo.local_world(1)
    with pytest.raises(ValueError, match="unsupported reduction"):
        c.all_reduce(np.ones(2, np.float32), op="xor")
    (c,) = kolo.local_world(1)
    with pytest.raises(TypeError, match="unsupported element type"):
        c._c.all_reduce(np.ones(2, np.int16), "sum", dtype="int8")
    with pytest.raises(TypeError, match="cannot be read as"):
        c._c.all_reduce(np.ones(2, np.float32), "sum", dtype="bfloat16")


def test_wrong_lengths_and_ranks_are_argument_errors():
    # An argument error ends the communicator (see above): a fresh one for each check.
    (c,) = kolo.local_world(1)
    with pytest.raises(kolo.ArgumentError, match="recv"):
        c.all_gather(np.ones(3, np.float32), np.empty(2, np.float32))
    assert "recv" in c.failure()
    with pytest.raises(kolo.KoloError, match="failed earlier"):
        c.barrier()
    (c,) = kolo.local_world(1)
    with pytest.raises(kolo.ArgumentError, match="root"):
        c.broadcast(np.ones(3, np.float32), root=5)
    (c,) = kolo.local_world(1)
    with pytest.raises(TypeError, match="cannot be read as"):
        c.all_gather(np.ones(3, np.float32), np.empty(3, np.float64))


@pytest.mark.parametrize("arg", ["root", "src", "dest"])
def test_a_negative_rank_is_an_argument_error_naming_the_argument(arg):
    (c,) = kolo.local_world(1)
    x = np.ones(3, np.float32)
    call = {
        "root": lambda: c.broadcast(x, root=-1),
        "src": lambda: c.recv(x, src=-1),
        "dest": lambda: c.send(x, dest=-2),
    }[arg]
    with pytest.raises(kolo.ArgumentError, match=f"^{arg} -[12]: not a rank"):
        call()


def test_closed_communicator_raises():
    (c,) = kolo.local_world(1)
    c.close()
    with pytest.raises(RuntimeError, match="closed"):
        c.barrier()


def test_async_error_reaches_wait():
    def body(c):
        w = c.all_reduce(np.ones(2, np.float32), async_op=True) if c.rank == 0 else c.barrier(async_op=True)
        with pytest.raises(kolo.MismatchError):
            w.wait(10)
        return type(w.exception()).__name__

    assert run_ranks(2, body) == ["MismatchError", "MismatchError"]


def test_exiting_with_an_operation_completing_is_clean(tmp_path):
    # The main thread exits while an asynchronous operation's completion is still running Python
    # code (which releases the GIL): kolo's atexit shutdown lets it finish instead of CPython
    # ending the thread mid-call (which aborted the process, or panicked in the worker).
    import subprocess
    import sys

    script = tmp_path / "exit.py"
    script.write_text(
        "import time\n"
        "import numpy as np\n"
        "import kolo\n"
        "(c,) = kolo.local_world(1)\n"
        "def done(err):\n"
        "    time.sleep(0.5)\n"
        "    print('callback finished', flush=True)\n"
        "c._c.all_reduce(np.ones(4, np.float32), 'sum', done=done)\n"
    )
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "callback finished" in p.stdout
    assert "panicked" not in p.stderr and "terminate" not in p.stderr


@pytest.mark.parametrize("engine", ["mpi", "nccl"])
def test_an_engine_this_build_lacks_is_named_with_how_to_get_it(engine):
    # The wheel is built without the engines (the suite's Rust tests run with them on): asking for
    # one is a configuration error that says which feature to build with.
    import os
    import subprocess
    import sys

    code = "import kolo\ntry:\n    kolo.init()\nexcept kolo.KoloError as e:\n    print(e)\n"
    env = dict(os.environ, KOLO_BACKEND=engine)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=env)
    assert p.returncode == 0, p.stderr
    assert f'KOLO_BACKEND = "{engine}"' in p.stdout, p.stdout + p.stderr
    assert f"--features {engine}" in p.stdout, p.stdout + p.stderr
