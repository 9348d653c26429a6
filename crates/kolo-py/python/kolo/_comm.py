"""The Python face of kolo's communicator: numpy arrays, buffers and torch tensors in place,
asynchronous operations as `Work`, and collectives of picklable objects."""

import functools
import pickle
import threading
from array import array

from . import _kolo

# kolo's names, from the one table the native module keeps (``_kolo.DTYPE_NAMES`` and
# ``_kolo.REDUCE_OP_NAMES`` map every accepted spelling to these).
REDUCE_OPS = _kolo.REDUCE_OPS
DTYPES = _kolo.DTYPES

# What bad input raises: the errors that end the communicator on every rank (see `aborts`).
BAD_INPUT = (TypeError, ValueError, NotImplementedError)


def _buffer(x, arg):
    """`x` as (an object with the buffer protocol, kolo element type or None). Torch CPU
    tensors become numpy views of their memory (bfloat16 through int16, which numpy lacks)."""
    x = _unwrapped(x)
    mod = type(x).__module__ or ""
    if mod.startswith("torch"):
        return _tensor_buffer(x, arg)
    if _foreign_numpy(x):
        raise TypeError(
            f"{arg}: unsupported element type {x.dtype} (numpy): kolo reduces {', '.join(DTYPES)} "
            "(broadcast, the gathers, scatter, all-to-all and send/recv move any dtype)"
        )
    return x, None


def _unwrapped(x):
    """The buffer of mpi4py's ``[buffer, datatype]`` form; `x` itself otherwise."""
    if isinstance(x, (list, tuple)) and x and not isinstance(x[0], (int, float)):
        return x[0]
    return x


def _foreign_numpy(x):
    """Whether `x` is a numpy array of a dtype kolo does not reduce."""
    return (type(x).__module__ or "").startswith("numpy") and getattr(
        getattr(x, "dtype", None), "name", DTYPES[0]
    ) not in DTYPES


def _moved(x, arg):
    """`x` for a call that only moves data (broadcast, the gathers, scatter, all-to-all,
    send/recv): (buffer, kolo element type or None, buffer elements per element of `x`). What
    kolo reduces as `_buffer` gives it; a numpy array of any other dtype (int16, int8, bool,
    complex, a structured one) as its bytes, as mpi4py moves any buffer."""
    x = _unwrapped(x)
    if _foreign_numpy(x):
        if not x.flags.c_contiguous:
            raise ValueError(f"{arg}: the array is not contiguous: pass np.ascontiguousarray(a)")
        return x.reshape(-1).view("u1"), "uint8", x.itemsize
    b, dt = _buffer(x, arg)
    return b, dt, 1


def _scaled(counts, scale):
    """Per-rank element counts as counts of the buffer's elements (bytes for `_moved`'s)."""
    return None if counts is None else [int(c) * scale for c in counts]


def check_tensor(t, arg):
    """Raises (TypeError/ValueError) unless `t` is a tensor kolo can work on in place: on the
    CPU, contiguous, of one of kolo's element types (or bool)."""
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{arg}: expected a tensor or a buffer, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(
            f"{arg}: the tensor is on {t.device}; kolo's Python communicator works on CPU tensors"
        )
    if not t.is_contiguous():
        raise ValueError(f"{arg}: the tensor is not contiguous: pass tensor.contiguous()")
    if t.is_complex():
        raise TypeError(f"{arg}: complex tensors are not supported (torch.view_as_real first)")
    if t.dtype != torch.bool and str(t.dtype).removeprefix("torch.") not in DTYPES:
        raise TypeError(
            f"{arg}: unsupported tensor dtype {t.dtype}: kolo reduces {', '.join(DTYPES)}"
        )


def _tensor_buffer(t, arg):
    import torch

    check_tensor(t, arg)
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).reshape(-1).numpy(), "bfloat16"
    if t.dtype == torch.bool:
        return t.view(torch.uint8).reshape(-1).numpy(), None
    return t.reshape(-1).numpy(), None


def aborts(method):
    """Bad input on one rank ends the communicator on every rank (the others get an error naming
    this rank and the cause at once, instead of waiting for a call that will not come): a
    `TypeError`/`ValueError`/`NotImplementedError` raised by the method aborts the native
    communicator (``self._c``) before it propagates. For kolo's communicator and the torch
    backend's process group alike."""

    @functools.wraps(method)
    def checked(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except BAD_INPUT as e:
            # The error says which rank aborted ("aborted by rank r"); the reason names the call
            # as the user made it (`allreduce`, not the private `_allreduce` behind it).
            self._c.abort(f"{method.__name__.lstrip('_')}: {e}")
            raise

    return checked


class Work:
    """An operation in flight (or several, issued together: `parts`). `wait()` blocks until it
    finishes, then returns its result or raises its error; `is_completed()` polls. `after`, if
    given, runs once every part has succeeded, before the work completes (a copy out of a
    scratch buffer); its exception is the work's error. The torch backend's work is this class
    too, with torch's `Work` as a second base."""

    def __init__(self, result=None, after=None, parts=1):
        super().__init__()
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._parts = parts
        self._error = None
        self._result = result
        self._after = after
        if parts <= 0:
            self._finish()

    def _done(self, error):
        """A part completed (called by kolo when an operation finishes, with the GIL): the work
        completes with the last, failing with the first error."""
        with self._lock:
            if self._parts <= 0:
                return  # already complete (a part failed to issue)
            if error is not None and self._error is None:
                self._error = error
            self._parts -= 1
            if self._parts > 0:
                return
        self._finish()

    def _fail(self, error):
        """Completes the work with `error` at once (the parts not yet complete are ignored)."""
        with self._lock:
            if self._parts <= 0:
                return
            self._parts = 0
            if self._error is None:
                self._error = error
        self._finish()

    def _finish(self):
        if self._error is None and self._after is not None:
            try:
                self._after()
            except Exception as e:  # noqa: BLE001 - a copy-out that failed is the work's failure
                self._error = e
        self._completed(self._error)
        self._event.set()

    def _completed(self, error):
        """Runs as the work completes, before waiters wake (the torch backend sets its future)."""

    def is_completed(self):
        return self._event.is_set()

    def is_success(self):
        return self._event.is_set() and self._error is None

    def wait(self, timeout=None):
        if not self._event.wait(timeout):
            raise TimeoutError(f"the operation did not finish within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result

    def result(self):
        Work.wait(self)
        return self._result

    def exception(self):
        """The error the finished operation raised, or None."""
        return self._error if self._event.is_set() else None


def _numpy():
    try:
        import numpy
    except ImportError as e:  # pragma: no cover - numpy is optional
        raise ImportError(
            "this call allocates its output with numpy: install numpy or pass the output buffer"
        ) from e
    return numpy


class Communicator:
    """A group of ranks and their collectives. Buffers are updated in place and returned (or a
    `Work` with ``async_op=True``); every rank of the group must make the same calls in the same
    order, and a rank that does not (or dies) makes the others raise an error naming it."""

    def __init__(self, native):
        self._c = native

    # -- who -------------------------------------------------------------------------------
    @property
    def rank(self):
        return self._c.rank

    @property
    def size(self):
        return self._c.size

    @property
    def local_rank(self):
        return self._c.local_rank

    @property
    def local_size(self):
        return self._c.local_size

    @property
    def transport(self):
        return self._c.transport

    def __repr__(self):
        return repr(self._c)

    def failure(self):
        """Why this communicator failed (a string), or None."""
        return self._c.failure()

    def dump_flight_record(self, reason="on demand"):
        """Writes this rank's flight record — the last collectives and point-to-point operations
        of its world, with their state and caller, and the Python threads' stacks — into the trace
        directory (``KOLO_TRACE_DIR``, else the job's under the temporary directory); returns the
        record's path. ``kolo diagnose DIR`` reads every rank's together."""
        from . import _flight

        return _flight.dump(self._c, reason)

    def abort(self, reason="aborted"):
        """Fails every rank's pending and later operations with an error naming this rank."""
        self._c.abort(str(reason))

    def close(self):
        self._c.close()

    # -- running ---------------------------------------------------------------------------
    def _run(self, call, result, async_op):
        if not async_op:
            call(None)
            return result
        work = Work(result)
        call(work._done)
        return work

    # -- collectives on buffers --------------------------------------------------------------
    @aborts
    def barrier(self, async_op=False):
        return self._run(lambda d: self._c.barrier(done=d), None, async_op)

    @aborts
    def monitored_barrier(self, timeout=30.0):
        """A barrier that raises, naming the ranks that did not arrive within `timeout` s."""
        self._c.monitored_barrier(float(timeout))

    @aborts
    def broadcast(self, buf, root=0, async_op=False):
        b, dt, _ = _moved(buf, "buf")
        return self._run(lambda d: self._c.broadcast(b, root, dtype=dt, done=d), buf, async_op)

    @aborts
    def all_reduce(self, buf, op="sum", async_op=False):
        b, dt = _buffer(buf, "buf")
        return self._run(lambda d: self._c.all_reduce(b, op, dtype=dt, done=d), buf, async_op)

    @aborts
    def reduce(self, buf, root=0, op="sum", async_op=False):
        b, dt = _buffer(buf, "buf")
        return self._run(lambda d: self._c.reduce(b, root, op, dtype=dt, done=d), buf, async_op)

    def _out(self, like, rows):
        np = _numpy()
        src = like if hasattr(like, "shape") else np.frombuffer(like, dtype=np.uint8)
        return np.empty((rows,) + tuple(src.shape), dtype=src.dtype)

    @aborts
    def all_gather(self, send, recv=None, async_op=False):
        """Every rank's `send` in rank order into `recv` (allocated `[size, *send.shape]` when
        not given)."""
        recv = self._out(send, self.size) if recv is None else recv
        s, dt, _ = _moved(send, "send")
        r, _, _ = _moved(recv, "recv")
        return self._run(lambda d: self._c.all_gather(s, r, dtype=dt, done=d), recv, async_op)

    @aborts
    def all_gather_v(self, send, recv, counts, async_op=False):
        s, dt, scale = _moved(send, "send")
        r, _, _ = _moved(recv, "recv")
        counts = _scaled(counts, scale)
        return self._run(
            lambda d: self._c.all_gather(s, r, counts, dtype=dt, done=d), recv, async_op
        )

    @aborts
    def reduce_scatter(self, send, recv, op="sum", async_op=False):
        s, dt = _buffer(send, "send")
        r, _ = _buffer(recv, "recv")
        return self._run(
            lambda d: self._c.reduce_scatter(s, r, op, dtype=dt, done=d), recv, async_op
        )

    @aborts
    def gather(self, send, recv=None, root=0, counts=None, async_op=False):
        """Every rank's `send` into `recv` on `root` (allocated there when not given); None
        elsewhere."""
        if recv is None and self.rank == root and counts is None:
            recv = self._out(send, self.size)
        s, dt, scale = _moved(send, "send")
        r = None if recv is None or self.rank != root else _moved(recv, "recv")[0]
        counts = _scaled(counts, scale)
        return self._run(
            lambda d: self._c.gather(s, r, root, counts=counts, dtype=dt, done=d),
            recv if self.rank == root else None,
            async_op,
        )

    @aborts
    def scatter(self, send, recv, root=0, counts=None, async_op=False):
        """`root`'s `send` in equal parts (or `counts` per rank) into every rank's `recv`."""
        r, dt, scale = _moved(recv, "recv")
        s = None if send is None or self.rank != root else _moved(send, "send")[0]
        counts = _scaled(counts, scale)
        return self._run(
            lambda d: self._c.scatter(s, r, root, counts=counts, dtype=dt, done=d), recv, async_op
        )

    @aborts
    def all_to_all(self, send, recv, send_counts=None, recv_counts=None, async_op=False):
        s, dt, scale = _moved(send, "send")
        r, _, _ = _moved(recv, "recv")
        send_counts, recv_counts = _scaled(send_counts, scale), _scaled(recv_counts, scale)
        return self._run(
            lambda d: self._c.all_to_all(s, r, send_counts, recv_counts, dtype=dt, done=d),
            recv,
            async_op,
        )

    @aborts
    def send(self, buf, dest, tag=0, async_op=False):
        b, dt, _ = _moved(buf, "buf")
        return self._run(lambda d: self._c.send(b, dest, tag, dtype=dt, done=d), None, async_op)

    @aborts
    def recv(self, buf, src, tag=0, async_op=False):
        b, dt, _ = _moved(buf, "buf")
        return self._run(lambda d: self._c.recv(b, src, tag, dtype=dt, done=d), buf, async_op)

    # -- objects (pickled; only exchange them with ranks you trust, as with mpi4py) -----------
    # Python pickles (nothing else can pickle any Python object) and kolo's serde object
    # collectives move the bytes (``broadcast_bytes`` & co. are kolo's broadcast_object,
    # all_gather_object and gather_object on them). kolo has no scatter_object: that one is
    # composed here of buffer collectives.
    @aborts
    def broadcast_object(self, obj, root=0):
        data = self._c.broadcast_bytes(pickle.dumps(obj) if self.rank == root else None, root)
        return obj if self.rank == root else pickle.loads(data)

    @aborts
    def all_gather_object(self, obj):
        return [pickle.loads(b) for b in self._c.all_gather_bytes(pickle.dumps(obj))]

    @aborts
    def gather_object(self, obj, root=0):
        every = self._c.gather_bytes(pickle.dumps(obj), root)
        return None if every is None else [pickle.loads(b) for b in every]

    @aborts
    def scatter_object(self, objs, root=0):
        if self.rank == root:
            if objs is None or len(objs) != self.size:
                got = "None" if objs is None else f"{len(objs)} objects"
                raise ValueError(f"the root needs one object per rank ({self.size}), got {got}")
            parts = [pickle.dumps(o) for o in objs]
            lens = array("q", [len(p) for p in parts])
        else:
            parts, lens = None, array("q", bytes(8 * self.size))
        self._c.broadcast(lens, root)
        buf = bytearray(lens[self.rank])
        send = b"".join(parts) if parts is not None else None
        self._c.scatter(send, buf, root, counts=list(lens))
        return pickle.loads(buf)

    @aborts
    def send_object(self, obj, dest, tag=0):
        self._c.send(pickle.dumps(obj), dest, tag)

    @aborts
    def recv_object(self, src, tag=0):
        return pickle.loads(self._c.recv_bytes(src, tag))

    # -- groups --------------------------------------------------------------------------------
    def split(self, color, key=0):
        """Ranks with the same `color` form a new communicator (ordered by `key`); None joins
        none and gets None."""
        sub = self._c.split(color, key)
        return None if sub is None else Communicator(sub)

    def new_group(self, ranks):
        sub = self._c.new_group([int(r) for r in ranks])
        return None if sub is None else Communicator(sub)


def init():
    """This process's communicator, from the launcher's environment (`kolo run`, torchrun,
    `srun`, or kolo's KOLO_* variables); a world of one without a launcher."""
    from . import _flight

    c = _kolo.init()
    _flight.watch(c)
    return Communicator(c)


def local_world(size, timeout=None):
    """`size` communicators of one world whose ranks are threads of this process (one per
    thread): for tests and experiments."""
    return [Communicator(c) for c in _kolo.local_communicators(size, timeout)]
