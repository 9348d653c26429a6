"""kolo.MPI's communicator: mpi4py's ``Intracomm`` methods on kolo's native communicator.

Buffer methods hand the part of a buffer that a buffer specification names straight to the
native communicator (no copies in Python): point to point in `p2p`, collectives in
`collectives`; objects go through kolo's `Communicator` (pickled).
"""

from . import request as rq
from .collectives import Collectives
from .p2p import P2P
from .datatypes import BAD_INPUT, OPS, UNDEFINED, add_missing, reduce_objects

SUM = OPS["SUM"]


class Intracomm(P2P, Collectives):
    """A communicator with mpi4py's method names (``MPI.COMM_WORLD``, ``MPI.Wrap(comm)``)."""

    def __init__(self, comm, name=""):
        self._comm = comm  # kolo.Communicator: objects, groups
        self._c = comm._c  # the native communicator: buffers
        self._rank, self._size = comm.rank, comm.size
        self._posted = rq.posted()
        # Receives pending that the transport did not post (see `request.Receive`), and the
        # sources it posts none from.
        self._plain, self._unposted = 0, set()
        # Sends of at least this many bytes may go in place (see `p2p`); None: none do.
        self._in_place_min = comm._c.in_place_min
        self._scratch = bytearray()
        self._name = name

    def _fail(self, method, error):
        """Ends the communicator on every rank for bad input to `method` (see `BAD_INPUT`)."""
        self._c.abort(f"MPI {method}: {error}")  # the error names this rank already

    # -- who --------------------------------------------------------------------------------------
    def Get_rank(self):
        return self._rank

    def Get_size(self):
        return self._size

    rank = property(Get_rank)
    size = property(Get_size)

    def Get_name(self):
        return self._name

    def Set_name(self, name):
        self._name = str(name)

    name = property(Get_name, Set_name)

    def Is_inter(self):
        return False

    def Is_intra(self):
        return True

    def __repr__(self):
        return f"<kolo.MPI.Intracomm rank {self._rank} of {self._size}>"

    # -- collectives, objects (pickled) -----------------------------------------------------------
    def barrier(self):
        self._c.barrier()

    def bcast(self, obj=None, root=0):
        return self._comm.broadcast_object(obj, self._root(root))

    def scatter(self, sendobj=None, root=0):
        return self._comm.scatter_object(sendobj, self._root(root))

    def gather(self, sendobj, root=0):
        return self._comm.gather_object(sendobj, self._root(root))

    def allgather(self, sendobj):
        return self._comm.all_gather_object(sendobj)

    def alltoall(self, sendobj):
        try:
            if len(sendobj) != self._size:
                raise ValueError(f"alltoall: one object per rank ({self._size}), got {len(sendobj)}")
        except BAD_INPUT as e:
            self._fail("alltoall", e)
            raise
        every = self._comm.all_gather_object(list(sendobj))
        return [every[src][self._rank] for src in range(self._size)]

    def reduce(self, sendobj, op=SUM, root=0):
        every = self._comm.gather_object(sendobj, self._root(root))
        return None if every is None else reduce_objects(op, every)

    def allreduce(self, sendobj, op=SUM):
        return reduce_objects(op, self._comm.all_gather_object(sendobj))

    # -- groups and the end -----------------------------------------------------------------------
    def Split(self, color=0, key=0):
        color = None if color is None or color == UNDEFINED or color < 0 else color
        sub = self._comm.split(color, key)
        return None if sub is None else Intracomm(sub)

    def Dup(self):
        return Intracomm(self._comm.split(0, self._rank), self._name)

    Clone = Dup

    def Free(self):
        self._comm.close()

    def Abort(self, errorcode=1):
        self._comm.abort(f"MPI.Abort({errorcode}) on rank {self._rank}")
        raise SystemExit(errorcode)


# mpi4py's other names, each raising NotImplementedError when read.
add_missing(Intracomm, "MPI.Comm", """
    Accept Ack_failed Agree Allgather_init Allgatherv_init Allreduce_init Alltoall_init
    Alltoallv_init Alltoallw Alltoallw_init Attach_buffer Barrier_init Bcast_init Bsend_init
    Call_errhandler Cart_map Compare Connect Create Create_cart Create_dist_graph
    Create_dist_graph_adjacent Create_errhandler Create_from_group Create_graph Create_group
    Create_intercomm Create_keyval Delete_attr Detach_buffer Disconnect Dup_with_info Exscan
    Exscan_init Flush_buffer Free_keyval Gather_init Gatherv_init Get_attr Get_errhandler
    Get_failed Get_group Get_info Get_parent Get_topology Graph_map Iagree Iallgather
    Iallgatherv Ialltoall Ialltoallv Ialltoallw Idup Idup_with_info Iexscan Iflush_buffer Igather
    Igatherv Improbe Iprobe Ireduce Ireduce_scatter Ireduce_scatter_block Is_revoked Iscan
    Iscatter Iscatterv Isendrecv Isendrecv_replace Ishrink Issend Join Mprobe Precv_init Probe
    Psend_init Recv_init Reduce_init Reduce_scatter_block_init Reduce_scatter_init Revoke
    Rsend_init Scan Scan_init Scatter_init Scatterv_init Send_init Shrink Spawn Spawn_multiple
    Split_type Ssend Ssend_init exscan f2py free fromhandle fromint group handle improbe info
    iprobe is_topo issend mprobe probe py2f scan ssend toint topology
""")

Comm = Intracomm
