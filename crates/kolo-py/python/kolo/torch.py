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
import inspect
import math
import os
import secrets

import torch
import torch.distributed as dist

from . import _kolo
from ._comm import aborts


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

__all__ = ["ProcessGroupKolo", "register", "monitored_barrier", "dump_flight_record"]

# Imported once torch has passed the check above.
from ._torch_ops import (  # noqa: E402
    DoneWork as _DoneWork,
    TorchWork as _Work,
    check as _check,
    copy_out as _copy_out,
    one as _one,
    one_per_rank as _one_per_rank,
    op_name as _op,
    plain_buffer as _plain,
    raw as _raw,
    reducible as _buf,
    register_cpu_backend,
    seconds as _seconds,
    sparse_all_reduce,
    then as _then,
)


# The element types kolo reduces, by torch's dtype (the all-reduce's fast path).
_ADDRESSABLE = {
    getattr(torch, n): n
    for n in ("float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8")
    if isinstance(getattr(torch, n, None), torch.dtype)
}
_STRIDED = torch.strided
_SUM = dist.ReduceOp.SUM

# torch's reductions by their type, as kolo names them (the all-reduce's fast path).
_OPS = {
    getattr(dist.ReduceOp.RedOpType, k): v
    for k, v in (("SUM", "sum"), ("AVG", "avg"), ("PRODUCT", "prod"), ("MIN", "min"),
                 ("MAX", "max"))
    if hasattr(dist.ReduceOp.RedOpType, k)
}


class ProcessGroupKolo(dist.ProcessGroup):
    """A torch process group whose collectives run on a kolo communicator (CPU tensors, in
    place, asynchronous: every call returns a `Work` at once and kolo's worker thread runs the
    calls in order)."""

    def __init__(self, comm, rank, size, name="kolo", store=None):
        super().__init__(rank, size)
        self._c = comm
        self._group_name = name
        self._group_desc = ""
        self._store = store

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

    def get_group_store(self):
        """The store this group met through (a split group's: its parent's, under its name)."""
        if self._store is None:
            raise RuntimeError(f"kolo: process group {self._group_name!r} has no store")
        return self._store

    def split_group(self, new_ranks, timeout=None, opts=None, group_name=None, group_desc=None,
                    device_types=None):
        """torch's ``dist.split_group`` on a kolo group: the ranks of `new_ranks` (this group's
        ranks, in their new order) form a new group, split from this one's communicator over the
        connections it has (no new rendezvous), as Gloo's and NCCL's splits do. Collective, as
        torch says: every rank of this group calls it, each with the split it is in (torch hands
        a rank in none the first split, and it gets None)."""
        me = self.rank()
        ranks = [int(r) for r in new_ranks]
        key = ranks.index(me) if me in ranks else None
        # Splits do not overlap (torch checks), so a split's lowest rank names it.
        sub = self._c.split(None if key is None else min(ranks), key or 0)
        if sub is None:
            return None
        name = str(group_name) if group_name else f"{self._group_name}:split:{min(ranks)}"
        store = None if self._store is None else dist.PrefixStore(f"kolo-split/{name}/", self._store)
        pg = _wrap(sub, key, len(ranks), name, store)
        if group_desc:
            pg.setGroupDesc(str(group_desc))
        return pg

    @property
    def comm(self):
        """The kolo communicator (``kolo._kolo.Communicator``) under this group."""
        return self._c

    def __repr__(self):
        return f"ProcessGroupKolo(rank={self.rank()}, size={self.size()}, {self._c!r})"

    def abort(self):
        """Ends this group at once: its operations in flight and queued fail with an error on
        every rank (the others learn of it), and the process goes on — to make a new group over
        the ranks left, as torchft's reconfiguration does (``kolo.torchft``)."""
        self._c.abort("the process group was aborted")

    def shutdown(self):
        """Ends this group (torch's ``destroy_process_group`` calls it) as Gloo's does, without
        failing the other ranks: later operations are refused and the asynchronous ones issued
        get 5 seconds to finish; only operations still running then make it abort (they fail on
        every rank, the error naming this rank)."""
        if self._c.failure() is None:
            self._c.shutdown(5.0)

    # -- machinery ------------------------------------------------------------------------------
    # A plan is what one torch call does: (calls, after), each call `call(done)` one kolo
    # operation, `after` a copy out of scratch tensors once they have all succeeded (or None).
    # Coalesced calls join their plans into one work.
    def _start(self, result, plan, opts=None):
        """Issues `plan`'s calls with one `Work` completing when all have: queued, unless `opts`
        says the caller waits at once (``asyncOp`` false, as torch's synchronous calls set it):
        then they run now, on this thread when nothing is queued, and the work is complete."""
        calls, after = plan
        if opts is not None and getattr(opts, "asyncOp", True) is False:
            try:
                for call in calls:
                    call(None)
                if after is not None:
                    after()
            except Exception as e:  # noqa: BLE001 - the work carries it, as a queued one would
                work = _Work(result, parts=1)
                work._fail(e)
                return work
            return _DoneWork.of(result)
        work = _Work(result, after, parts=len(calls))
        for call in calls:
            call(work._done)
        return work

    def _join(self, plans):
        """One plan of several."""
        calls = [c for p in plans for c in p[0]]
        return calls, _then(*(p[1] for p in plans))

    # -- collectives ----------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        """One all-reduce per element type: the tensors of a type are flattened into one buffer
        (a tensor alone is reduced in place), reduced by one call, and copied back.

        torch's synchronous all-reduce of one dense CPU tensor (``dist.all_reduce``) goes
        straight to kolo with the tensor's address and returns no work (torch waits on none: the
        call has finished), so a small all-reduce costs little more than torch's own dispatch."""
        if (opts is not None and opts.asyncOp is False and type(tensors) is list
                and len(tensors) == 1):
            t = tensors[0]
            dt = _ADDRESSABLE.get(t.dtype) if type(t) is torch.Tensor else None
            if (dt is not None and t.is_cpu and t.layout is _STRIDED and t.is_contiguous()
                    and not t.is_neg()):
                op = opts.reduceOp
                # SUM compared first: reading the op's type and hashing it costs three times more.
                name = "sum" if op == _SUM else _OPS.get(op.op)
                if name is not None:
                    try:
                        self._c._all_reduce_address(t.data_ptr(), t.numel(), dt, name)
                    except Exception as e:  # noqa: BLE001 - the work carries it, as in _start
                        work = _Work(tensors, parts=1)
                        work._fail(e)
                        return work
                    return None
        return self._allreduce(tensors, opts)

    @aborts
    def _allreduce(self, tensors, opts):
        if not tensors:
            raise ValueError("kolo: allreduce requires a non-empty tensor list (as Gloo does)")
        reduce_op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        _op(reduce_op)
        if any(isinstance(t, torch.Tensor) and t.is_sparse for t in tensors):
            return self._sparse_allreduce(tensors, reduce_op)
        groups = {}  # by dtype, in the order of the tensors (the same on every rank)
        for t in tensors:
            _check(t, "allreduce")
            groups.setdefault(t.dtype, []).append(t)
        calls, afters = [], []
        for group in groups.values():
            op = _op(reduce_op, group[0])
            if len(group) == 1:
                flat = group[0]
            else:
                flat = torch.cat([t.reshape(-1) for t in group])
                afters.append(functools.partial(_copy_out, group, flat))
            b, dt = _buf(flat, "allreduce")
            calls.append(lambda d, b=b, dt=dt, op=op: self._c.all_reduce(b, op, dtype=dt, done=d))
        return self._start(tensors, (calls, _then(*afters)), opts)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def _sparse_allreduce(self, tensors, reduce_op):
        """Sums sparse COO tensors (as Gloo does): every rank's indices and values gathered and
        coalesced, one tensor after the other, before the call returns."""
        for t in tensors:
            sparse_all_reduce(self._c, t, reduce_op, self.size())
        return self._start(tensors, ([], None))

    allreduce_sparse = allreduce

    @aborts
    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        b, dt, _ = _raw(_one(tensors, "broadcast"), "broadcast")
        return self._start(
            tensors, ([lambda d: self._c.broadcast(b, root, dtype=dt, done=d)], None), opts)

    @aborts
    def reduce(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        tensor = _one(tensors, "reduce")
        op = _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, tensor)
        b, dt = _buf(tensor, "reduce")
        return self._start(
            tensors, ([lambda d: self._c.reduce(b, root, op, dtype=dt, done=d)], None), opts)

    @aborts
    def barrier(self, opts=None):
        return self._start([], ([lambda d: self._c.barrier(done=d)], None), opts)

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """Raises (`kolo.KoloTimeoutError`, saying so as Gloo's does) naming the ranks that did not
        arrive within `timeout` (a timedelta, or torch's options holding one; 30 s by default;
        0 passes only the ranks already there). kolo always names every missing rank."""
        self._c.monitored_barrier(_seconds(timeout, 30.0))

    # all-gather: into one tensor (both generations of names), into a list, coalesced
    def _all_gather_single(self, output, input):
        s, dt, _ = _raw(input, "all_gather input")
        r, _, _ = _raw(output, "all_gather output")
        return [lambda d: self._c.all_gather(s, r, dtype=dt, done=d)], None

    @aborts
    def all_gather_single(self, output, input, opts=None):
        return self._start([output], self._all_gather_single(output, input), opts)

    _allgather_base = all_gather_single

    def _allgather(self, outs, inp):
        if len(outs) != self.size():
            raise ValueError(
                f"kolo: allgather needs {self.size()} output tensors, got {len(outs)}"
            )
        flat = torch.empty((self.size(),) + tuple(inp.shape), dtype=inp.dtype)
        calls, _ = self._all_gather_single(flat, inp)
        return calls, functools.partial(_copy_out, outs, flat)

    @aborts
    def allgather(self, output_tensors, input_tensors, opts=None):
        inp = _one(input_tensors, "allgather")
        outs = _one(output_tensors, "allgather")
        return self._start(output_tensors, self._allgather(outs, inp), opts)

    @aborts
    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """Every rank's `input_list` into `output_lists[rank]` (one list per rank, holding one
        tensor per input): one all-gather per input."""
        n, k = self.size(), len(input_list)
        if len(output_lists) != n or any(len(o) != k for o in output_lists):
            got = [len(o) for o in output_lists]
            raise ValueError(
                f"kolo: allgather_coalesced needs {n} output lists (one per rank) of {k} tensors "
                f"(one per input), got lists of {got}"
            )
        plans = [self._allgather([o[i] for o in output_lists], t) for i, t in enumerate(input_list)]
        return self._start(output_lists, self._join(plans), opts)

    @aborts
    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        plans = [self._all_gather_single(o, i) for o, i in zip(outputs, inputs)]
        return self._start(outputs, self._join(plans), opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    # reduce-scatter: from one tensor (both generations), from lists, coalesced
    def _reduce_scatter_single(self, output, input, opts):
        op = _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, input)
        s, dt = _buf(input, "reduce_scatter input")
        r, _ = _buf(output, "reduce_scatter output")
        return [lambda d: self._c.reduce_scatter(s, r, op, dtype=dt, done=d)], None

    @aborts
    def reduce_scatter_single(self, output, input, opts=None):
        return self._start([output], self._reduce_scatter_single(output, input, opts), opts)

    _reduce_scatter_base = reduce_scatter_single

    @aborts
    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        out = _one(output_tensors, "reduce_scatter")
        ins = _one(input_tensors, "reduce_scatter")
        if len(ins) != self.size():
            raise ValueError(
                f"kolo: reduce_scatter needs {self.size()} input tensors, got {len(ins)}"
            )
        flat = torch.cat([t.reshape(-1) for t in ins])
        return self._start(output_tensors, self._reduce_scatter_single(out, flat, opts), opts)

    @aborts
    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        plans = [self._reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return self._start(outputs, self._join(plans), opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # gather / scatter
    @aborts
    def gather(self, output_tensors, input_tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        inp = _one(input_tensors, "gather")
        s, dt, _ = _raw(inp, "gather input")
        if self.rank() != root:
            return self._start(
                [], ([lambda d: self._c.gather(s, None, root, dtype=dt, done=d)], None), opts)
        outs = _one(output_tensors, "gather")
        _one_per_rank(outs, inp, self.size(), "gather", "output")
        flat = torch.empty((self.size(),) + tuple(inp.shape), dtype=inp.dtype)
        r = _raw(flat, "gather output")[0]
        call = lambda d: self._c.gather(s, r, root, dtype=dt, done=d)  # noqa: E731
        return self._start(output_tensors, ([call], functools.partial(_copy_out, outs, flat)), opts)

    @aborts
    def gather_single(self, output, input, opts=None):
        root = opts.rootRank if opts is not None else 0
        s, dt, _ = _raw(input, "gather input")
        r = _raw(output, "gather output")[0] if self.rank() == root else None
        return self._start(
            [output], ([lambda d: self._c.gather(s, r, root, dtype=dt, done=d)], None), opts)

    gather_into_tensor = gather_single

    @aborts
    def scatter(self, output_tensors, input_tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        out = _one(output_tensors, "scatter")
        r, dt, _ = _raw(out, "scatter output")
        s = None
        if self.rank() == root:
            ins = _one(input_tensors, "scatter")
            _one_per_rank(ins, out, self.size(), "scatter", "input")
            flat = torch.cat([t.reshape(-1) for t in ins])
            s = _raw(flat, "scatter input")[0]
        return self._start(
            output_tensors, ([lambda d: self._c.scatter(s, r, root, dtype=dt, done=d)], None), opts)

    # all-to-all
    @aborts
    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        s, dt, scale = _raw(input, "all_to_all input")
        r, _, _ = _raw(output, "all_to_all output")
        if output_split_sizes or input_split_sizes:
            n = self.size()
            ins = list(input_split_sizes) or [input.shape[0] // n] * n
            outs = list(output_split_sizes) or [output.shape[0] // n] * n
            row_in = math.prod(input.shape[1:]) * scale
            row_out = math.prod(output.shape[1:]) * scale
            sc = [c * row_in for c in ins]
            rc = [c * row_out for c in outs]
            call = lambda d: self._c.all_to_all(s, r, sc, rc, dtype=dt, done=d)  # noqa: E731
        else:
            call = lambda d: self._c.all_to_all(s, r, dtype=dt, done=d)  # noqa: E731
        return self._start([output], ([call], None), opts)

    alltoall_base = all_to_all_single

    @aborts
    def alltoall(self, output_tensors, input_tensors, opts=None):
        flat_in = torch.cat([t.reshape(-1) for t in input_tensors])
        flat_out = torch.empty(sum(t.numel() for t in output_tensors), dtype=flat_in.dtype)
        s, dt, scale = _raw(flat_in, "alltoall input")
        r, _, _ = _raw(flat_out, "alltoall output")
        counts_in = [t.numel() * scale for t in input_tensors]
        counts_out = [t.numel() * scale for t in output_tensors]
        call = lambda d: self._c.all_to_all(s, r, counts_in, counts_out, dtype=dt, done=d)  # noqa: E731
        after = functools.partial(_copy_out, output_tensors, flat_out)
        return self._start(output_tensors, ([call], after), opts)

    # point to point
    @aborts
    def send(self, tensors, dst, tag=0):
        b, dt, _ = _raw(_one(tensors, "send"), "send")
        return self._start(tensors, ([lambda d: self._c.send(b, dst, tag, dtype=dt, done=d)], None))

    @aborts
    def recv(self, tensors, src, tag=0):
        b, dt, _ = _raw(_one(tensors, "recv"), "recv")
        work = _Work(tensors, source=src)
        self._c.recv(b, src, tag, dtype=dt, done=work._done)
        return work

    @aborts
    def recv_anysource(self, tensors, tag=0):
        """A receive from whichever rank's message with `tag` comes first; the work's
        `source_rank()` names it once it has completed."""
        b, dt, _ = _raw(_one(tensors, "recv"), "recv")
        work = _Work(tensors)

        def done(error, sender):
            work._source = sender
            work._done(error)

        self._c.recv_any(b, tag, dtype=dt, done=done)
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
    group = str(getattr(dist_backend_opts, "group_id", "") or "default")
    return make_group(
        dist_backend_opts.store,
        dist_backend_opts.group_rank,
        dist_backend_opts.group_size,
        group,
        _timeout_seconds(dist_backend_opts.timeout),
    )


def make_group(store, rank, size, group="default", timeout=None):
    """A :class:`ProcessGroupKolo` of `size` ranks meeting through the torch `store` (each
    rank passes its own `rank`; `timeout` in seconds, None for kolo's own)."""
    # A name for this communicator's keys and shared memory, unique to this run: rank 0 draws it,
    # the others read it from the (group's) store.
    if rank == 0:
        token = secrets.token_hex(6)
        store.set("kolo/token", token)
    else:
        token = store.get("kolo/token").decode()
    comm = _kolo.init_with_store(
        store,
        rank,
        size,
        job=f"torch-{token}/{group}",
        timeout=timeout,
        host=_store_host(store),
    )
    return _wrap(comm, rank, size, group, store)


def _wrap(comm, rank, size, name, store):
    """The :class:`ProcessGroupKolo` of the communicator `comm`, its operations recorded."""
    from . import _flight

    _flight.watch(comm)
    pg = ProcessGroupKolo(comm, rank, size, name, store)
    # torch uses a ProcessGroup subclass as the group itself (its Python methods are what torch's
    # calls reach, a receive's work included), and so registers no backend for its devices: the
    # group registers one for the CPU, passing every call on to it.
    register_cpu_backend(pg)
    return pg


# Set once the backend is registered (the import hook, ``kolo._torch_hook``, reads it).
_registered = False


def register():
    """Registers the ``"kolo"`` backend with torch.distributed (once; later calls do nothing)."""
    global _registered
    if not ("kolo" in getattr(dist.Backend, "backend_list", []) or hasattr(dist.Backend, "KOLO")):
        dist.Backend.register_backend("kolo", _create, extended_api=True, devices=["cpu"])
    _registered = True


def dump_flight_record(group=None, reason="on demand"):
    """Writes this rank's flight record: the last operations of the kolo process groups of this
    process (collectives and point-to-point, with their state and source line) and the Python
    threads' stacks, into the trace directory (``KOLO_TRACE_DIR``, else the job's under the
    temporary directory — torchrun's run id names it); returns the record's path. ``kolo diagnose
    DIR`` reads every rank's together. Each rank writes its own; not a collective."""
    from . import _flight

    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, ProcessGroupKolo):
        raise TypeError("kolo.torch.dump_flight_record: the group is not a kolo process group")
    comm = pg._c
    return _flight.dump(comm, reason)


def monitored_barrier(group=None, timeout=None):
    """A barrier that raises, naming the ranks that did not arrive within `timeout` (a
    timedelta or seconds; 30 s by default) — torch's ``monitored_barrier`` for kolo groups."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, ProcessGroupKolo):
        raise TypeError("kolo.torch.monitored_barrier: the group is not a kolo process group")
    pg.monitored_barrier(timeout)


def _autoload():
    """torch's plugin hook of earlier kolo wheels (the entry point is now
    ``kolo._torch_hook:autoload``)."""
    from ._torch_hook import autoload

    autoload()


register()
