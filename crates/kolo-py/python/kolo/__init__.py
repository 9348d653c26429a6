"""kolo for Python: kolo's communicator (collectives over shared memory and TCP, every rank
failure an exception naming the rank and the call) over numpy arrays, buffers and torch tensors.

    import kolo, numpy as np
    comm = kolo.init()                      # under kolo run, torchrun, mpirun or srun
    x = np.full(4, comm.rank, np.float32)
    comm.all_reduce(x)                      # in place: the sum over ranks
    objs = comm.all_gather_object({"rank": comm.rank})

`kolo.MPI` has mpi4py's names (``from kolo import MPI; comm = MPI.COMM_WORLD``), and
``import kolo.torch`` (automatic with ``import torch`` once kolo is installed) registers the
torch.distributed backend ``"kolo"``.
"""

from ._kolo import (
    ArgumentError,
    KoloError,
    KoloTimeoutError,
    MismatchError,
    PeerError,
    __version__,
)
from ._comm import Communicator, Work, init, local_world, REDUCE_OPS, DTYPES

import atexit as _atexit

from . import _kolo

# Before the interpreter finalizes: close every communicator and let its asynchronous operations
# finish (their completions run Python code, which CPython would cut short mid-call during
# finalization), aborting those still running after a grace period.
_atexit.register(_kolo.shutdown)

__all__ = [
    "ArgumentError",
    "Communicator",
    "DTYPES",
    "KoloError",
    "KoloTimeoutError",
    "MismatchError",
    "PeerError",
    "REDUCE_OPS",
    "Work",
    "__version__",
    "init",
    "local_world",
]
