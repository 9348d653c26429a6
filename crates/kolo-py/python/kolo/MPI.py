"""mpi4py's names on kolo: ``from kolo import MPI`` in place of ``from mpi4py import MPI``.

    from kolo import MPI
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    data = comm.bcast({"step": 1} if rank == 0 else None, root=0)   # Python objects (pickled)
    comm.Send([buf, 3, MPI.BYTE], dest=1, tag=5)                      # buffers: 3 bytes of buf
    comm.Allreduce(MPI.IN_PLACE, array, op=MPI.SUM)                  # in place

Lower-case methods move picklable objects, capitalised ones buffers (numpy arrays, bytearray,
memoryview, mmap, array.array) in mpi4py's buffer specifications: ``buf``, ``[buf, datatype]``,
``[buf, count, datatype]``, ``[buf, (count, displ), datatype]`` and, for the vector collectives,
``[buf, (counts, displs), datatype]``; only `count` elements are sent, received or reduced. Point
to point: ``Send``/``Recv``/``Isend``/``Irecv``/``Sendrecv`` (and the object forms), ``Status``,
``Request.Wait``/``Test``/``Waitall``/``Waitany``/``Waitsome``/``Testall``. Collectives:
``Barrier``, ``Bcast``, ``Gather(v)``, ``Scatter(v)``, ``Allgather(v)``, ``Alltoall(v)``,
``Reduce``, ``Allreduce``, ``Reduce_scatter_block``, ``Ibarrier``/``Ibcast``/``Iallreduce``.
``COMM_WORLD`` is kolo's world from the launcher (``kolo run``, torchrun, ``srun``; a world of one
without one), made on first use.

A send or receive issued after a nonblocking collective (``Ibarrier``, ``Ibcast``, ``Iallreduce``)
runs once that collective has completed (kolo orders them so), which MPI does not ask for: wait for
the collective before a send its peers need in order to enter it.

What kolo does not do raises `NotImplementedError` naming it (an `AttributeError` too, so
``hasattr`` says no): derived datatypes, one-sided communication (``Win``), dynamic processes
(``Spawn``, ports), files, topologies, and reductions of buffers other than SUM/PROD/MIN/MAX.
"""

import socket as _socket
import threading as _threading
import time as _time

from . import _kolo
from ._comm import Communicator as _Communicator
from ._comm import init as _init
from ._comm import local_world as _local_world
from ._mpi.comm import Comm, Intracomm
from ._mpi.request import REQUEST_NULL, Request
from ._mpi.status import Status
from ._mpi.datatypes import (
    ANY_SOURCE,
    ANY_TAG,
    DATATYPES as _DATATYPES,
    IN_PLACE,
    OPS as _OPS,
    PROC_NULL,
    ROOT,
    SUCCESS,
    TAG_UB,
    THREAD_FUNNELED,
    THREAD_MULTIPLE,
    THREAD_SERIALIZED,
    THREAD_SINGLE,
    UNDEFINED,
    Datatype,
    MPINotImplementedError,
    Op,
    missing as _missing,
)

globals().update(_DATATYPES)  # MPI.BYTE, MPI.INT, MPI.DOUBLE, ...
# Send/Recv of [buf, count, datatype] read the message natively (kolo._kolo's mpi_send/mpi_recv).
_kolo.register_mpi_datatype(Datatype)
globals().update(_OPS)  # MPI.SUM, MPI.MAX, ...

COMM_NULL = None

# Wall-clock time in seconds (a monotonic clock, as MPI_Wtime on Linux) and its resolution.
Wtime = _time.perf_counter
_TICK = _time.get_clock_info("perf_counter").resolution


def Wtick():
    return _TICK


def Get_processor_name():
    """This host's name, as MPI_Get_processor_name."""
    return _socket.gethostname()


def Get_library_version():
    return f"kolo {_kolo.__version__}"


# Initialization: kolo's world is made on first use of COMM_WORLD, and closed at exit.
def Init():
    pass


# Threads may call kolo.MPI one at a time (its posted receives are plain Python state).
def Init_thread(required=THREAD_MULTIPLE):
    return THREAD_SERIALIZED


def Query_thread():
    return THREAD_SERIALIZED


def Is_initialized():
    return True


def Is_finalized():
    return _finalized


def Is_thread_main():
    return _threading.current_thread() is _threading.main_thread()


def Finalize():
    global _finalized
    if _world is not None:
        _world.Free()
    _finalized = True


_world = None
_self = None
_finalized = False


def __getattr__(name):
    # COMM_WORLD and COMM_SELF are made on first use (module attributes, like mpi4py's).
    global _world, _self
    if name == "COMM_WORLD":
        if _world is None:
            _world = Intracomm(_init(), "MPI_COMM_WORLD")
        return _world
    if name == "COMM_SELF":
        if _self is None:
            _self = Intracomm(_local_world(1)[0], "MPI_COMM_SELF")
        return _self
    if name.startswith("_"):
        raise AttributeError(f"module 'kolo.MPI' has no attribute {name!r}")
    raise _missing(f"MPI.{name}")


def Wrap(comm):
    """mpi4py's names for a kolo `Communicator`."""
    if not isinstance(comm, _Communicator):
        raise TypeError("expected a kolo.Communicator")
    return Intracomm(comm)
