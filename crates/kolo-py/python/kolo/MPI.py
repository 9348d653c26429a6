"""mpi4py's names on kolo: ``from kolo import MPI`` in place of ``from mpi4py import MPI``.

    from kolo import MPI
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    data = comm.bcast({"step": 1} if rank == 0 else None, root=0)   # Python objects (pickled)
    total = comm.allreduce(rank, op=MPI.SUM)
    comm.Allreduce(MPI.IN_PLACE, array, op=MPI.SUM)                  # buffers, in place

Lower-case methods move picklable objects, capitalised ones buffers (numpy arrays, bytearray,
memoryview, array.array; mpi4py's ``[buffer, MPI.DOUBLE]`` form is accepted, the datatype being
read from the buffer itself). ``COMM_WORLD`` is kolo's world from the launcher (``kolo run``,
torchrun, ``srun``; a world of one without one), made on first use.
"""

import functools
import operator

from ._comm import REDUCE_OPS, Communicator, init


class Op:
    """A reduction: kolo's name for buffers, a Python function for objects."""

    def __init__(self, name, fn):
        self.name = name
        self.fn = fn

    def __repr__(self):
        return f"MPI.{self.name.upper()}"


SUM = Op("sum", operator.add)
PROD = Op("prod", operator.mul)
MIN = Op("min", min)
MAX = Op("max", max)

IN_PLACE = object()
ANY_TAG = -1
# Datatypes are read from the buffers; these names exist so that mpi4py code that spells them
# out keeps working.
FLOAT = DOUBLE = INT = LONG = BYTE = FLOAT16 = None


def _op_name(op):
    if isinstance(op, Op):
        if op.name not in REDUCE_OPS:
            raise ValueError(f"{op!r} cannot reduce buffers")
        return op.name
    raise TypeError(f"expected MPI.SUM, MPI.PROD, MPI.MIN or MPI.MAX, got {op!r}")


def _copy(dst, src):
    if isinstance(src, (list, tuple)):
        src = src[0]
    if isinstance(dst, (list, tuple)):
        dst = dst[0]
    d, s = memoryview(dst).cast("B"), memoryview(src).cast("B")
    if d.nbytes != s.nbytes:
        raise ValueError(f"send and receive buffers differ in size ({s.nbytes} and {d.nbytes} bytes)")
    d[:] = s


class Intracomm:
    """A communicator with mpi4py's method names."""

    def __init__(self, comm):
        self._comm = comm

    # who
    def Get_rank(self):
        return self._comm.rank

    def Get_size(self):
        return self._comm.size

    rank = property(Get_rank)
    size = property(Get_size)

    # objects
    def bcast(self, obj=None, root=0):
        return self._comm.broadcast_object(obj, root)

    def scatter(self, sendobj=None, root=0):
        return self._comm.scatter_object(sendobj, root)

    def gather(self, sendobj, root=0):
        return self._comm.gather_object(sendobj, root)

    def allgather(self, sendobj):
        return self._comm.all_gather_object(sendobj)

    def alltoall(self, sendobj):
        if len(sendobj) != self.size:
            raise ValueError(f"alltoall: one object per rank ({self.size}), got {len(sendobj)}")
        every = self._comm.all_gather_object(list(sendobj))
        return [every[src][self.rank] for src in range(self.size)]

    def reduce(self, sendobj, op=SUM, root=0):
        every = self._comm.gather_object(sendobj, root)
        return functools.reduce(op.fn, every) if every is not None else None

    def allreduce(self, sendobj, op=SUM):
        return functools.reduce(op.fn, self._comm.all_gather_object(sendobj))

    def send(self, obj, dest, tag=0):
        self._comm.send_object(obj, dest, tag)

    def recv(self, buf=None, source=0, tag=0):
        return self._comm.recv_object(source, tag)

    def barrier(self):
        self._comm.barrier()

    Barrier = barrier

    # buffers
    def Bcast(self, buf, root=0):
        self._comm.broadcast(buf, root)

    def Allreduce(self, sendbuf, recvbuf, op=SUM):
        if sendbuf is not IN_PLACE:
            _copy(recvbuf, sendbuf)
        self._comm.all_reduce(recvbuf, _op_name(op))

    def Reduce(self, sendbuf, recvbuf, op=SUM, root=0):
        if self.rank == root:
            if sendbuf is not IN_PLACE:
                _copy(recvbuf, sendbuf)
            self._comm.reduce(recvbuf, root, _op_name(op))
        else:
            # kolo reduces in place: reduce a copy, leaving the caller's send buffer as it was.
            src = sendbuf[0] if isinstance(sendbuf, (list, tuple)) else sendbuf
            view = memoryview(src)
            scratch = memoryview(bytearray(view.cast("B"))).cast(view.format)
            self._comm.reduce(scratch, root, _op_name(op))

    def Allgather(self, sendbuf, recvbuf):
        self._comm.all_gather(sendbuf, recvbuf)

    def Gather(self, sendbuf, recvbuf, root=0):
        self._comm.gather(sendbuf, recvbuf if self.rank == root else None, root)

    def Scatter(self, sendbuf, recvbuf, root=0):
        self._comm.scatter(sendbuf if self.rank == root else None, recvbuf, root)

    def Alltoall(self, sendbuf, recvbuf):
        self._comm.all_to_all(sendbuf, recvbuf)

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=SUM):
        self._comm.reduce_scatter(sendbuf, recvbuf, _op_name(op))

    def Send(self, buf, dest, tag=0):
        self._comm.send(buf, dest, tag)

    def Recv(self, buf, source=0, tag=0):
        self._comm.recv(buf, source, tag)

    # groups and the end
    def Split(self, color=0, key=0):
        sub = self._comm.split(None if color is None or color < 0 else color, key)
        return None if sub is None else Intracomm(sub)

    def Abort(self, errorcode=1):
        self._comm.abort(f"MPI.Abort({errorcode})")
        raise SystemExit(errorcode)


_world = None


def __getattr__(name):
    # COMM_WORLD is made on first use (a module attribute, like mpi4py's).
    global _world
    if name == "COMM_WORLD":
        if _world is None:
            _world = Intracomm(init())
        return _world
    raise AttributeError(f"module 'kolo.MPI' has no attribute {name!r}")


def Wrap(comm):
    """mpi4py's names for a kolo `Communicator`."""
    if not isinstance(comm, Communicator):
        raise TypeError("expected a kolo.Communicator")
    return Intracomm(comm)
