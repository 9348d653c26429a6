"""The torch.distributed backend ``"kolo"``: PyTorch's collectives on CPU tensors run on kolo
(shared memory between the processes of a host, TCP between hosts), so that unchanged PyTorch
programs — ``dist.init_process_group(backend="kolo")``, ``DistributedDataParallel``,
``DistributedSampler`` — get kolo's speed and its errors: a rank that dies or calls a different
collective makes the others raise an exception naming it instead of hanging.

The backend is registered when kolo is installed and torch is imported (torch loads the
``torch.backends`` entry point of the kolo package); ``import kolo.torch`` registers it too.
The ranks meet through the store torch hands the backend (torchrun's, or the one
``init_process_group`` makes from MASTER_ADDR/MASTER_PORT or an init_method).
"""

import datetime
import functools
import os
import secrets
import threading

import inspect

import torch
import torch.distributed as dist

from . import _kolo
from ._comm import _tensor_buffer


def _check_torch(d):
    """Raises ImportError naming what this torch lacks for the backend (a Python ProcessGroup
    subclass, Work, and register_backend with extended_api and devices)."""
    missing = []
    if not getattr(d, "is_available", lambda: False)():
        missing.append("torch.distributed (this torch was built without it)")
    else:
        for name in ("ProcessGroup", "Work", "Backend", "ReduceOp", "TCPStore"):
            if not hasattr(d, name):
                missing.append(f"torch.distributed.{name}")
        register = getattr(getattr(d, "Backend", None), "register_backend", None)
        if register is None:
            missing.append("torch.distributed.Backend.register_backend")
        else:
            params = inspect.signature(register).parameters
            for p in ("extended_api", "devices"):
                if p not in params:
                    missing.append(f"register_backend(..., {p}=...)")
    if missing:
        raise ImportError(
            f"kolo.torch: torch {getattr(torch, '__version__', '?')} lacks what the kolo backend "
            f"needs: {', '.join(missing)} (torch 2.4 or newer has it)"
        )


_check_torch(dist)

__all__ = ["ProcessGroupKolo", "register", "monitored_barrier"]

_REDUCE = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.PRODUCT: "prod",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.AVG: "avg",
}


def _op(reduce_op, tensor=None):
    for k, v in _REDUCE.items():
        if reduce_op == k:
            if tensor is not None and tensor.dtype == torch.bool:
                # As torch's NCCL backend: a logical or/and, so that the result stays a bool.
                bools = {"sum": "max", "max": "max", "prod": "min", "min": "min"}
                if v not in bools:
                    raise ValueError(f"kolo: {reduce_op} of bool tensors is not defined")
                return bools[v]
            return v
    raise ValueError(
        f"kolo: unsupported reduction {reduce_op}: the kolo backend reduces with SUM, PRODUCT, "
        "MIN, MAX and AVG"
    )


def _buf(t, arg):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"kolo: {arg}: expected a tensor, got {type(t).__name__}")
    return _tensor_buffer(t, f"kolo: {arg}")


def _one(tensors, op):
    if len(tensors) != 1:
        raise ValueError(
            f"kolo: {op} takes one tensor per process (got {len(tensors)}): one device per rank"
        )
    return tensors[0]


def _checked(method):
    """Bad input on one rank (a GPU or non-contiguous tensor, an unsupported dtype or reduction)
    raises there and ends the group's communicator, so that the other ranks, which may already
    wait in the collective, fail at once with an error naming this rank and the cause."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (TypeError, ValueError, NotImplementedError) as e:
            self._comm.abort(f"{method.__name__} on rank {self.rank()}: {e}")
            raise

    return wrapper


class _Work(dist.Work):
    """A kolo operation in flight, as torch's `Work`: its future completes with the list of
    tensors the operation wrote (what DDP's reducer expects), or with its exception."""

    def __init__(self, result, after=None):
        super().__init__()
        self._result = result
        self._after = after
        self._future = torch.futures.Future()
        self._event = threading.Event()
        self._error = None

    def _done(self, error):
        # Runs on kolo's worker thread, with the GIL.
        if error is None and self._after is not None:
            try:
                self._after()
            except Exception as e:  # a copy-out that failed is the operation's failure
                error = e
        self._error = error
        if error is None:
            self._future.set_result(self._result)
        else:
            self._future.set_exception(error)
        self._event.set()

    def wait(self, timeout=None):
        self._event.wait()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self):
        return self._event.is_set()

    def is_success(self):
        return self._event.is_set() and self._error is None

    def exception(self):
        return self._error

    def get_future(self):
        return self._future

    def result(self):
        self.wait()
        return self._result

    def synchronize(self):
        pass


class ProcessGroupKolo(dist.ProcessGroup):
    """A torch process group whose collectives run on a kolo communicator (CPU tensors, in
    place, asynchronous: every call returns a `Work` at once and kolo's worker thread runs the
    calls in order)."""

    def __init__(self, comm, rank, size, name="kolo"):
        super().__init__(rank, size)
        self._comm = comm
        self._group_name = name
        self._group_desc = ""

    # -- names torch asks for -----------------------------------------------------------------
    def getBackendName(self):
        return "kolo"

    def getGroupName(self):
        return self._group_name

    def setGroupName(self, name):
        self._group_name = name

    def getGroupDesc(self):
        return self._group_desc

    def setGroupDesc(self, desc):
        self._group_desc = desc

    @property
    def comm(self):
        """The kolo communicator (``kolo._kolo.Communicator``) under this group."""
        return self._comm

    def __repr__(self):
        return f"ProcessGroupKolo(rank={self.rank()}, size={self.size()}, {self._comm!r})"

    # -- machinery ------------------------------------------------------------------------------
    def _start(self, result, call, after=None, opts=None):
        """Runs `call(done)`: queued, with a `Work` that completes later, unless `opts` says the
        caller waits at once (``asyncOp`` false, as torch's synchronous calls set it): then it
        runs now, on this thread when nothing is queued, and the `Work` returned is complete."""
        work = _Work(result, after)
        if opts is not None and getattr(opts, "asyncOp", True) is False:
            try:
                call(None)
            except Exception as e:  # noqa: BLE001 - the work carries it, as a queued one would
                work._done(e)
            else:
                work._done(None)
        else:
            call(work._done)
        return work

    # -- collectives ----------------------------------------------------------------------------
    @_checked
    def allreduce(self, tensors, opts=None):
        op = _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, tensors[0] if tensors else None)
        bufs = [_buf(t, "allreduce") for t in tensors]

        def call(done):
            # Several tensors: one all-reduce each, completing the work with the last.
            for b, dt in bufs[:-1]:
                self._comm.all_reduce(b, op, dtype=dt)
            b, dt = bufs[-1]
            self._comm.all_reduce(b, op, dtype=dt, done=done)

        return self._start(tensors, call, opts=opts)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    @_checked
    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        b, dt = _buf(_one(tensors, "broadcast"), "broadcast")
        return self._start(tensors, lambda d: self._comm.broadcast(b, root, dtype=dt, done=d), opts=opts)

    @_checked
    def reduce(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        tensor = _one(tensors, "reduce")
        op = _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, tensor)
        b, dt = _buf(tensor, "reduce")
        return self._start(tensors, lambda d: self._comm.reduce(b, root, op, dtype=dt, done=d), opts=opts)

    @_checked
    def barrier(self, opts=None):
        return self._start([], lambda d: self._comm.barrier(done=d), opts=opts)

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        secs = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else 30.0
        self._comm.monitored_barrier(secs)

    # all-gather: into one tensor (both generations of names), into a list, coalesced
    @_checked
    def all_gather_single(self, output, input, opts=None):
        s, dt = _buf(input, "all_gather input")
        r, _ = _buf(output, "all_gather output")
        return self._start([output], lambda d: self._comm.all_gather(s, r, dtype=dt, done=d), opts=opts)

    _allgather_base = all_gather_single

    @_checked
    def allgather(self, output_tensors, input_tensors, opts=None):
        inp = _one(input_tensors, "allgather")
        outs = _one(output_tensors, "allgather")
        if len(outs) != self.size():
            raise ValueError(
                f"kolo: allgather needs {self.size()} output tensors, got {len(outs)}"
            )
        flat = torch.empty((self.size(),) + tuple(inp.shape), dtype=inp.dtype)
        s, dt = _buf(inp, "allgather input")
        r, _ = _buf(flat, "allgather output")

        def after():
            for o, part in zip(outs, flat):
                o.copy_(part)

        return self._start(
            output_tensors, lambda d: self._comm.all_gather(s, r, dtype=dt, done=d), after, opts=opts)

    @_checked
    def allgather_coalesced(self, output_lists, input_list, opts=None):
        works = [self.allgather([o], [i], opts) for o, i in zip(output_lists, input_list)]
        return _last(works, output_lists)

    @_checked
    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _last(works, outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    # reduce-scatter: from one tensor (both generations), from lists, coalesced
    @_checked
    def reduce_scatter_single(self, output, input, opts=None):
        op = _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, input)
        s, dt = _buf(input, "reduce_scatter input")
        r, _ = _buf(output, "reduce_scatter output")
        return self._start(
            [output], lambda d: self._comm.reduce_scatter(s, r, op, dtype=dt, done=d), opts=opts)

    _reduce_scatter_base = reduce_scatter_single

    @_checked
    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        out = _one(output_tensors, "reduce_scatter")
        ins = _one(input_tensors, "reduce_scatter")
        if len(ins) != self.size():
            raise ValueError(
                f"kolo: reduce_scatter needs {self.size()} input tensors, got {len(ins)}"
            )
        flat = torch.cat([t.reshape(-1) for t in ins])
        return self.reduce_scatter_single(out, flat, opts)

    @_checked
    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _last(works, outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # gather / scatter
    @_checked
    def gather(self, output_tensors, input_tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        inp = _one(input_tensors, "gather")
        s, dt = _buf(inp, "gather input")
        if self.rank() != root:
            return self._start([], lambda d: self._comm.gather(s, None, root, dtype=dt, done=d), opts=opts)
        outs = _one(output_tensors, "gather")
        flat = torch.empty((self.size(),) + tuple(inp.shape), dtype=inp.dtype)
        r, _ = _buf(flat, "gather output")

        def after():
            for o, part in zip(outs, flat):
                o.copy_(part)

        return self._start(
            output_tensors, lambda d: self._comm.gather(s, r, root, dtype=dt, done=d), after, opts=opts)

    @_checked
    def gather_single(self, output, input, opts=None):
        root = opts.rootRank if opts is not None else 0
        s, dt = _buf(input, "gather input")
        r = _buf(output, "gather output")[0] if self.rank() == root else None
        return self._start([output], lambda d: self._comm.gather(s, r, root, dtype=dt, done=d), opts=opts)

    gather_into_tensor = gather_single

    @_checked
    def scatter(self, output_tensors, input_tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        out = _one(output_tensors, "scatter")
        r, dt = _buf(out, "scatter output")
        s = None
        if self.rank() == root:
            ins = _one(input_tensors, "scatter")
            flat = torch.cat([t.reshape(-1) for t in ins])
            s = _buf(flat, "scatter input")[0]
        return self._start(
            output_tensors, lambda d: self._comm.scatter(s, r, root, dtype=dt, done=d), opts=opts)

    # all-to-all
    @_checked
    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        s, dt = _buf(input, "all_to_all input")
        r, _ = _buf(output, "all_to_all output")
        if output_split_sizes or input_split_sizes:
            n = self.size()
            ins = list(input_split_sizes) or [input.shape[0] // n] * n
            outs = list(output_split_sizes) or [output.shape[0] // n] * n
            row_in = input[0].numel() if input.dim() > 0 and input.shape[0] else 1
            row_out = output[0].numel() if output.dim() > 0 and output.shape[0] else 1
            sc = [c * row_in for c in ins]
            rc = [c * row_out for c in outs]
            call = lambda d: self._comm.all_to_all(s, r, sc, rc, dtype=dt, done=d)  # noqa: E731
        else:
            call = lambda d: self._comm.all_to_all(s, r, dtype=dt, done=d)  # noqa: E731
        return self._start([output], call, opts=opts)

    alltoall_base = all_to_all_single

    @_checked
    def alltoall(self, output_tensors, input_tensors, opts=None):
        flat_in = torch.cat([t.reshape(-1) for t in input_tensors])
        counts_in = [t.numel() for t in input_tensors]
        counts_out = [t.numel() for t in output_tensors]
        flat_out = torch.empty(sum(counts_out), dtype=flat_in.dtype)
        s, dt = _buf(flat_in, "alltoall input")
        r, _ = _buf(flat_out, "alltoall output")

        def after():
            at = 0
            for o, n in zip(output_tensors, counts_out):
                o.copy_(flat_out[at : at + n].reshape(o.shape))
                at += n

        return self._start(
            output_tensors,
            lambda d: self._comm.all_to_all(s, r, counts_in, counts_out, dtype=dt, done=d),
            after, opts=opts)

    # point to point
    @_checked
    def send(self, tensors, dst, tag=0):
        b, dt = _buf(_one(tensors, "send"), "send")
        return self._start(tensors, lambda d: self._comm.send(b, dst, tag, dtype=dt, done=d))

    @_checked
    def recv(self, tensors, src, tag=0):
        b, dt = _buf(_one(tensors, "recv"), "recv")
        return self._start(tensors, lambda d: self._comm.recv(b, src, tag, dtype=dt, done=d))

    @_checked
    def recv_anysource(self, tensors, tag=0):
        raise NotImplementedError(
            "kolo: receiving from any source is not supported: name the source rank"
        )


def _last(works, result):
    """One work for several: kolo runs them in order, so the last one finishing means all have;
    its future completes with `result` (every output) or the error."""
    work = _Work(result)
    if not works:
        work._done(None)
        return work

    def finish(fut):
        try:
            fut.value()
        except Exception as e:  # noqa: BLE001 - handed to the combined work
            work._done(e)
        else:
            work._done(None)

    works[-1].get_future().add_done_callback(finish)
    return work


def _store_host(store):
    """Host of the TCPStore under `store` (through PrefixStores), else MASTER_ADDR, else None."""
    s = store
    for _ in range(16):
        inner = getattr(s, "underlying_store", None)
        if inner is None:
            break
        s = inner
    if isinstance(s, dist.TCPStore):
        return s.host
    return os.environ.get("MASTER_ADDR")


def _timeout_seconds(timeout):
    """The group's timeout for kolo, unless it is torch's default (then kolo's own,
    KOLO_TIMEOUT or 300 s, applies)."""
    if not isinstance(timeout, datetime.timedelta):
        return None
    default = getattr(dist.distributed_c10d, "default_pg_timeout", None)
    if default is not None and timeout == default:
        return None
    secs = timeout.total_seconds()
    return secs if secs > 0 else None


def _create(dist_backend_opts, backend_options=None):
    store = dist_backend_opts.store
    rank, size = dist_backend_opts.group_rank, dist_backend_opts.group_size
    # A name for this communicator's keys and shared memory, unique to this run: rank 0 draws it,
    # the others read it from the (group's) store.
    if rank == 0:
        token = secrets.token_hex(6)
        store.set("kolo/token", token)
    else:
        token = store.get("kolo/token").decode()
    group = str(getattr(dist_backend_opts, "group_id", "") or "default")
    comm = _kolo.init_with_store(
        store,
        rank,
        size,
        job=f"torch-{token}/{group}",
        timeout=_timeout_seconds(dist_backend_opts.timeout),
        host=_store_host(store),
    )
    return ProcessGroupKolo(comm, rank, size, group)


def register():
    """Registers the ``"kolo"`` backend with torch.distributed (once; later calls do nothing)."""
    if "kolo" in getattr(dist.Backend, "backend_list", []) or hasattr(dist.Backend, "KOLO"):
        return
    dist.Backend.register_backend("kolo", _create, extended_api=True, devices=["cpu"])


def monitored_barrier(group=None, timeout=None):
    """A barrier that raises, naming the ranks that did not arrive within `timeout` (a
    timedelta or seconds; 30 s by default) — torch's ``monitored_barrier`` for kolo groups."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, ProcessGroupKolo):
        raise TypeError("kolo.torch.monitored_barrier: the group is not a kolo process group")
    secs = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else (timeout or 30.0)
    pg._comm.monitored_barrier(float(secs))


def _autoload():
    """torch's plugin hook (``torch.backends`` entry point): registers the backend, and never
    lets a failure here break ``import torch``."""
    try:
        register()
    except Exception as e:  # pragma: no cover - depends on the torch build
        import warnings

        warnings.warn(f"kolo: could not register the torch.distributed backend: {e}")


register()
