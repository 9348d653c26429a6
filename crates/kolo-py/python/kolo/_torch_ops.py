"""What the torch backend (``kolo.torch``) does to tensors and works: checks, the buffers kolo
reduces or moves, the reductions' names, copies out of scratch tensors, torch's ``Work``, the
sparse all-reduce, and the group's CPU backend as torch 2.x looks one up."""

import datetime
import math
import weakref

import torch
import torch.distributed as dist

from . import _kolo
from ._comm import DTYPES, Work, _tensor_buffer

# As torch's NCCL backend: a reduction of bool tensors is a logical or/and, so that the result
# stays a bool.
_BOOL_OPS = {"sum": "max", "max": "max", "prod": "min", "min": "min"}

# torch's reductions kolo's table knows (SUM, AVG, PRODUCT, MIN, MAX), for messages.
_SUPPORTED = ", ".join(
    n for n in dist.ReduceOp.RedOpType.__members__ if n.lower() in _kolo.REDUCE_OP_NAMES
)


def op_name(reduce_op, tensor=None):
    """kolo's name for torch's reduction `reduce_op` (of `tensor`'s dtype), from kolo's table."""
    red = getattr(reduce_op, "op", reduce_op)  # a ReduceOp holds its RedOpType in .op
    label = getattr(red, "name", None)
    # As torch spells it (ReduceOp.PREMUL_SUM), not the object's default repr (an address).
    label = f"ReduceOp.{label}" if label else repr(reduce_op)
    name = _kolo.REDUCE_OP_NAMES.get(str(getattr(red, "name", "")).lower())
    if name is None:
        raise ValueError(
            f"kolo: unsupported reduction {label}: the kolo backend reduces with {_SUPPORTED}"
        )
    if tensor is not None and tensor.dtype == torch.bool:
        if name not in _BOOL_OPS:
            raise ValueError(f"kolo: {label} of bool tensors is not defined")
        return _BOOL_OPS[name]
    if tensor is not None and tensor.is_complex() and name not in ("sum", "avg"):
        raise ValueError(f"kolo: {label} of complex tensors is not defined (SUM and AVG are)")
    return name


def check(t, arg):
    """Raises unless `t` is a dense CPU tensor in one piece (any dtype)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"kolo: {arg}: expected a tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise TypeError(
            f"kolo: {arg}: sparse tensors are not supported ({t.layout}; the all-reduce sums "
            "sparse COO tensors; pass tensor.to_dense() elsewhere)"
        )
    if t.device.type != "cpu":
        raise ValueError(
            f"kolo: {arg}: the tensor is on {t.device}; the kolo backend works on CPU tensors"
        )
    if not t.is_contiguous():
        raise ValueError(f"kolo: {arg}: the tensor is not contiguous: pass tensor.contiguous()")
    if t.is_neg() or t.is_conj():
        raise ValueError(
            f"kolo: {arg}: the tensor is a lazily negated or conjugated view (its memory holds "
            "other values than it shows): pass tensor.resolve_neg() / tensor.resolve_conj()"
        )


def _kolo_type(t):
    return t.dtype == torch.bool or str(t.dtype).removeprefix("torch.") in DTYPES


def reducible(t, arg):
    """`t`'s memory as (buffer, kolo dtype name or None) for a reduction: kolo's element types
    and bool; a complex tensor as its real and imaginary parts (which SUM and AVG reduce)."""
    check(t, arg)
    if t.is_complex():
        t = torch.view_as_real(t)
    return _tensor_buffer(t, f"kolo: {arg}")


def raw(t, arg):
    """`t`'s memory for a call that only moves it (broadcast, gather, scatter, all-to-all,
    send/recv): (buffer, kolo dtype name or None, buffer elements per tensor element). Tensors of
    kolo's element types as `reducible`; any other dtype (int8, int16, complex, ...) as bytes."""
    check(t, arg)
    if _kolo_type(t):
        b, dt = _tensor_buffer(t, f"kolo: {arg}")
        return b, dt, 1
    return t.detach().reshape(-1).view(torch.uint8).numpy(), None, t.element_size()


def one(tensors, op):
    if len(tensors) != 1:
        raise ValueError(
            f"kolo: {op} takes one tensor per process (got {len(tensors)}): one device per rank"
        )
    return tensors[0]


def one_per_rank(tensors, like, size, op, which):
    """Raises unless the root's list `tensors` of a gather (scatter) holds one tensor per rank
    (`size`), each of `like`'s dtype and element count, as Gloo checks before it starts."""
    if len(tensors) != size:
        raise ValueError(
            f"kolo: {op}: the {which} list holds {len(tensors)} tensors; it should hold {size}, "
            "one per rank of the group"
        )
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"kolo: {op}: {which}[{i}]: expected a tensor, got {type(t).__name__}")
        if t.dtype != like.dtype or t.numel() != like.numel():
            raise ValueError(
                f"kolo: {op}: {which}[{i}] is {t.dtype} x {t.numel()}, the other side of the "
                f"call {like.dtype} x {like.numel()}: every tensor of the list matches it"
            )


def copy_out(outs, flat):
    """Copies `flat` (a scratch tensor) into the tensors `outs`, in order."""
    at = 0
    for o in outs:
        n = o.numel()
        o.copy_(flat.reshape(-1)[at : at + n].view(o.shape))
        at += n


def then(*afters):
    """One copy-out running `afters` (the None ones skipped) in order, or None."""
    todo = [a for a in afters if a is not None]
    if not todo:
        return None

    def after():
        for a in todo:
            a()

    return after


def seconds(timeout, default):
    """Seconds of a timedelta, a number, or torch's options holding one in `.timeout`."""
    timeout = getattr(timeout, "timeout", timeout)
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return default if timeout is None else float(timeout)


class TorchWork(Work, dist.Work):
    """kolo's `Work` as torch's: its future completes with the list of tensors the operation
    wrote (what DDP's reducer expects), or with its exception; a receive's work knows its
    sender (`source_rank()`)."""

    def __init__(self, result, after=None, parts=1, source=None):
        self._future = torch.futures.Future()
        self._source = source
        super().__init__(result, after, parts)

    def _completed(self, error):
        if error is None:
            self._future.set_result(self._result)
        else:
            self._future.set_exception(error)

    def wait(self, timeout=None):
        secs = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
        Work.wait(self, secs or None)  # torch's timedelta(0), its default, is no timeout
        return True

    def get_future(self):
        return self._future

    def synchronize(self):
        pass

    def _source_rank(self):
        """The rank a receive's message came from (known once a receive from any source has
        completed)."""
        if self._source is None:
            raise ValueError(
                "kolo: source_rank() is defined for the work of a receive, once it has completed"
            )
        return self._source

    source_rank = _source_rank


class DoneWork(dist.Work):
    """The work of a synchronous call (torch's ``asyncOp`` false) that succeeded: complete when
    returned, so it holds only its result (a `TorchWork` costs more than a small all-reduce)."""

    _result = None

    @classmethod
    def of(cls, result):
        w = cls()
        w._result = result
        return w

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True

    def is_success(self):
        return True

    def exception(self):
        return None

    def result(self):
        return self._result

    def get_future(self):
        f = torch.futures.Future()
        f.set_result(self._result)
        return f

    def synchronize(self):
        pass


# dtypes whose tensors an all-reduce takes as they are (a numpy view of their memory), by name.
_PLAIN = {
    getattr(torch, n): n
    for n in ("float32", "float64", "float16", "int32", "int64", "uint8")
    if n in DTYPES
}


def plain_buffer(t):
    """`t`'s memory as a numpy view when `t` is a dense contiguous CPU tensor of a type kolo
    reduces without conversion; None otherwise (the general path checks and converts)."""
    if (
        type(t) is torch.Tensor
        and t.dtype in _PLAIN
        and t.is_contiguous()
        and t.is_cpu
        and t.layout is torch.strided
    ):
        try:
            return (t.detach() if t.requires_grad else t).numpy()  # any shape: kolo takes it whole
        except RuntimeError:  # a lazily negated view, say: the general path copes
            return None
    return None


def sparse_all_reduce(c, t, reduce_op, size):
    """Sums the sparse COO tensor `t` over the ranks of communicator `c`, in place: every rank's
    indices and values are gathered and the sum coalesced (as Gloo's sparse all-reduce)."""
    if op_name(reduce_op) != "sum":
        raise ValueError(f"kolo: {reduce_op} of sparse tensors is not defined (SUM is)")
    if t.layout != torch.sparse_coo or t.device.type != "cpu":
        raise TypeError(
            f"kolo: allreduce: only sparse COO tensors on the CPU are summed ({t.layout}, {t.device})"
        )
    s = t.coalesce()
    idx, val = s.indices().contiguous(), s.values().contiguous()
    counts = torch.empty(size, dtype=torch.int64)
    c.all_gather(torch.tensor([idx.shape[1]]).numpy(), counts.numpy())
    n = [int(k) for k in counts]
    all_idx = torch.empty((sum(n), idx.shape[0]), dtype=torch.int64)
    c.all_gather(idx.t().contiguous().numpy(), all_idx.numpy(), [k * idx.shape[0] for k in n])
    row = math.prod(val.shape[1:])
    all_val = torch.empty((sum(n),) + tuple(val.shape[1:]), dtype=val.dtype)
    b, dt, scale = raw(val, "allreduce values")
    out, _, _ = raw(all_val, "allreduce values")
    c.all_gather(b, out, [k * row * scale for k in n], dtype=dt)
    # Checked: the indices come from the peers.
    total = torch.sparse_coo_tensor(all_idx.t(), all_val, t.shape, check_invariants=True)
    t.copy_(total.coalesce())


# The calls torch makes on a backend; the CPU backend passes each on to the group.
_FORWARDED = (
    "allreduce", "allreduce_coalesced", "allreduce_sparse", "broadcast", "reduce", "allgather",
    "all_gather_single", "allgather_coalesced", "all_gather_single_coalesced", "gather",
    "gather_single", "scatter", "reduce_scatter", "reduce_scatter_single",
    "reduce_scatter_single_coalesced", "all_to_all_single", "alltoall", "send", "recv",
    "recv_anysource", "barrier", "monitored_barrier",
)


def _cpu_backend_class():
    """torch's C++ `Backend` subclassed (torch 2.x lets Python subclass it), or None."""
    base = getattr(getattr(torch._C, "_distributed_c10d", None), "Backend", None)
    if base is None:
        return None

    class CpuBackend(base):
        """The group's backend for the CPU device, where torch 2.x looks one up
        (``group._get_backend(torch.device("cpu"))``, ``group._device_types``:
        ``batch_isend_irecv``, ``monitored_barrier``, the functional collectives). It passes
        every call on to the group, which torch otherwise calls directly."""

        def __init__(self, group):
            super().__init__(group.rank(), group.size())
            self._group = weakref.ref(group)

        def getBackendName(self):
            return "kolo"

        # Said here: torch's C++ side reads these through Python, and its own versions of them,
        # inherited, would come back to that C++ side (endless recursion).
        supports_coalescing = property(lambda self: False)
        # The group splits (``ProcessGroupKolo.split_group``); torch asks its backend whether.
        supports_splitting = property(lambda self: True)
        supports_shrinking = property(lambda self: False)
        supports_reconfigure = property(lambda self: False)
        supports_window = property(lambda self: False)
        _supports_time_estimate = property(lambda self: False)

    def forward(name):
        def call(self, *args, **kwargs):
            group = self._group()
            if group is None:
                raise RuntimeError("kolo: the process group of this backend is gone")
            work = getattr(group, name)(*args, **kwargs)
            # The group's synchronous fast path returns no work (torch's Python functions
            # wait on none); torch's C++ side, calling here, needs one.
            return work if work is not None else DoneWork.of(args[0] if args else None)

        call.__name__ = call.__qualname__ = name
        return call

    for name in _FORWARDED:
        setattr(CpuBackend, name, forward(name))
    return CpuBackend


CpuBackend = _cpu_backend_class()


def register_cpu_backend(group):
    """Registers `group`'s CPU backend (a `CpuBackend` passing calls on to it) with the group,
    where this torch lets Python subclass its `Backend`; whether it did."""
    if CpuBackend is None or not hasattr(group, "_register_backend"):
        return False
    try:
        backend = CpuBackend(group)
    except TypeError:  # an older torch: its Backend cannot be subclassed from Python
        return False
    group._cpu_backend = backend  # the Python side must outlive the registration
    custom = dist.ProcessGroup.BackendType.CUSTOM
    group._register_backend(torch.device("cpu"), custom, backend)
    group._set_default_backend(custom)
    return True
