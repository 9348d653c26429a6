"""kolo.MPI's collectives on buffers (a part of `Intracomm`).

The operations that move data move bytes (``uint8``): the part of each buffer its specification
names, per rank for the block forms (``Gather``'s receive buffer holds `size` blocks of `count`
elements). Reductions reduce the datatype's elements. MPI's variable-count forms map onto kolo's:
``Allgatherv`` and ``Alltoallv`` directly; ``Gatherv`` and ``Scatterv`` (whose counts MPI gives
the root alone, where kolo's gather_v wants them on every rank) as an all-to-all with counts in
which only the root sends or receives. Blocks that do not lie one after the other in rank order
go through scratch memory.
"""

from . import request as rq
from .datatypes import (
    BAD_INPUT,
    IN_PLACE,
    KOLO_OPS,
    OPS,
    Vector,
    missing,
    op_name,
    part,
    raw,
    to_int,
    typed,
    typed_like,
)
from .._comm import Work
from .datatypes import Datatype as DT

SUM = OPS["SUM"]
_EMPTY = (bytearray(), 0, 0)
_U8 = "uint8"


def _nbytes(span):
    """Bytes in a native span (buffer, offset, bytes or None)."""
    buf, offset, n = span
    return memoryview(buf).nbytes - offset if n is None else n


def _packed(v):
    """A vector message's blocks packed in rank order, as a native span (a copy if they are not
    already)."""
    if v.packed():
        return v.span()
    scratch = bytearray(sum(v.byte_counts()))
    v.gather_into(scratch)
    return (scratch, 0, None)


def _into(v, run):
    """`run(span)` receives packed blocks: into `v`'s buffer directly if they lie packed there,
    else through scratch memory then copied to their places."""
    if v.packed():
        run(v.span())
        return
    scratch = bytearray(sum(v.byte_counts()))
    run((scratch, 0, None))
    v.scatter_from(scratch)


def _issued(issue):
    """A request for a collective issued by `issue(done)`."""
    work = Work()
    issue(work._done)
    return rq.Pending(work)


class Collectives:
    """Barrier, broadcast, gathers, scatters, all-to-alls and reductions of buffers."""

    def _root(self, root):
        root = to_int(root, "root")
        if not 0 <= root < self._size:
            raise ValueError(f"root: expected a rank below {self._size}, got {root}")
        return root

    def _sink(self, nbytes):
        """Scratch memory of `nbytes` (one buffer, reused by blocking calls), as a native span."""
        if len(self._scratch) < nbytes:
            self._scratch = bytearray(nbytes)
        return (self._scratch, 0, nbytes)

    def Barrier(self):
        self._c.barrier()

    def Bcast(self, buf, root=0):
        try:
            if type(root) is not int:
                root = to_int(root, "root")
            if type(buf) is list and len(buf) == 3 and type(buf[1]) is int and type(buf[2]) is DT:
                span = (buf[0], 0, buf[1] * buf[2].size)  # raw(buf), inline (see P2P.Send)
            else:
                span = raw(buf)
            self._c.broadcast(span, root, _U8)
        except BAD_INPUT as e:
            self._fail("Bcast", e)
            raise

    def Gather(self, sendbuf, recvbuf, root=0):
        try:
            root, n, me = self._root(root), self._size, self._rank
            if me != root:
                self._c.gather(raw(sendbuf), None, root, None, _U8)
                return
            r = part(recvbuf)
            s = r.block(me, n) if sendbuf is IN_PLACE else raw(sendbuf)
            self._c.gather(s, r.raw(n), root, None, _U8)
        except BAD_INPUT as e:
            self._fail("Gather", e)
            raise

    def Scatter(self, sendbuf, recvbuf, root=0):
        try:
            root, n, me = self._root(root), self._size, self._rank
            if me != root:
                self._c.scatter(None, raw(recvbuf), root, None, _U8)
                return
            s = part(sendbuf)
            # In place, the root's block stays where it is: it lands in scratch memory.
            r = self._sink(s.per_block(n) * s.size()) if recvbuf is IN_PLACE else raw(recvbuf)
            self._c.scatter(s.raw(n), r, root, None, _U8)
        except BAD_INPUT as e:
            self._fail("Scatter", e)
            raise

    def Allgather(self, sendbuf, recvbuf):
        try:
            r, n = part(recvbuf), self._size
            # In place, the rank's own block is where it lies already: nothing is copied.
            s = None if sendbuf is IN_PLACE else raw(sendbuf)
            self._c.all_gather(s, r.raw(n), None, _U8)
        except BAD_INPUT as e:
            self._fail("Allgather", e)
            raise

    def Alltoall(self, sendbuf, recvbuf):
        try:
            r, n = part(recvbuf), self._size
            s = r.raw(n) if sendbuf is IN_PLACE else part(sendbuf).raw(n)
            self._c.all_to_all(s, r.raw(n), None, None, _U8)
        except BAD_INPUT as e:
            self._fail("Alltoall", e)
            raise

    def Gatherv(self, sendbuf, recvbuf, root=0):
        try:
            root, n, me = self._root(root), self._size, self._rank
            send_counts, recv_counts = [0] * n, [0] * n
            if me != root:
                s = raw(sendbuf)
                send_counts[root] = _nbytes(s)
                self._c.all_to_all(s, _EMPTY, send_counts, recv_counts, _U8)
                return
            v = Vector(recvbuf, n)
            s = v.block(me) if sendbuf is IN_PLACE else raw(sendbuf)
            send_counts[root] = _nbytes(s)
            recv_counts = v.byte_counts()
            _into(v, lambda r: self._c.all_to_all(s, r, send_counts, recv_counts, _U8))
        except BAD_INPUT as e:
            self._fail("Gatherv", e)
            raise

    def Scatterv(self, sendbuf, recvbuf, root=0):
        try:
            root, n, me = self._root(root), self._size, self._rank
            send_counts, recv_counts = [0] * n, [0] * n
            if me != root:
                r = raw(recvbuf)
                recv_counts[root] = _nbytes(r)
                self._c.all_to_all(_EMPTY, r, send_counts, recv_counts, _U8)
                return
            v = Vector(sendbuf, n)
            if recvbuf is IN_PLACE:
                r = (bytearray(v.counts[me] * v.dt.size), 0, None)
            else:
                r = raw(recvbuf)
            recv_counts[root] = _nbytes(r)
            self._c.all_to_all(_packed(v), r, v.byte_counts(), recv_counts, _U8)
        except BAD_INPUT as e:
            self._fail("Scatterv", e)
            raise

    def Allgatherv(self, sendbuf, recvbuf):
        try:
            v = Vector(recvbuf, self._size)
            counts = v.byte_counts()
            # In place with the blocks packed, the extension sees the rank's own block and copies
            # nothing of it.
            s = v.block(self._rank) if sendbuf is IN_PLACE else raw(sendbuf)
            _into(v, lambda r: self._c.all_gather(s, r, counts, _U8))
        except BAD_INPUT as e:
            self._fail("Allgatherv", e)
            raise

    def Alltoallv(self, sendbuf, recvbuf):
        try:
            rv = Vector(recvbuf, self._size)
            if sendbuf is IN_PLACE:
                copy = bytearray(sum(rv.byte_counts()))
                rv.gather_into(copy)
                s, send_counts = (copy, 0, None), rv.byte_counts()
            else:
                sv = Vector(sendbuf, self._size)
                s, send_counts = _packed(sv), sv.byte_counts()
            recv_counts = rv.byte_counts()
            _into(rv, lambda r: self._c.all_to_all(s, r, send_counts, recv_counts, _U8))
        except BAD_INPUT as e:
            self._fail("Alltoallv", e)
            raise

    # -- reductions -------------------------------------------------------------------------------
    def Reduce(self, sendbuf, recvbuf, op=SUM, root=0):
        try:
            name = KOLO_OPS.get(op) or op_name(op)
            if type(root) is not int or not 0 <= root < self._size:
                root = self._root(root)
            if self._rank != root:
                # kolo reduces in place: into a copy of the send buffer, off the root.
                s, dt = typed(sendbuf)
                self._c.reduce(None, root, name, dt, None, s)
                return
            r, dt = typed(recvbuf)
            s = None if sendbuf is IN_PLACE else typed_like(sendbuf, recvbuf, dt)
            self._c.reduce(r, root, name, dt, None, s)
        except BAD_INPUT as e:
            self._fail("Reduce", e)
            raise

    def Allreduce(self, sendbuf, recvbuf, op=SUM):
        try:
            r, dt = typed(recvbuf)
            s = None if sendbuf is IN_PLACE else typed_like(sendbuf, recvbuf, dt)
            self._c.all_reduce(r, KOLO_OPS.get(op) or op_name(op), dt, None, s)
        except BAD_INPUT as e:
            self._fail("Allreduce", e)
            raise

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=SUM):
        try:
            name, n, rp = op_name(op), self._size, part(recvbuf)
            if sendbuf is IN_PLACE:
                # The input is the whole receive buffer; the result lands in its first block.
                per = rp.per_block(n)
                (buf, off, _), dt = rp.typed()
                s, r = (buf, off, per * n), (buf, off, per)
            else:
                r, dt = rp.typed()
                s = typed_like(sendbuf, recvbuf, dt)
            self._c.reduce_scatter(s, r, name, dt)
        except BAD_INPUT as e:
            self._fail("Reduce_scatter_block", e)
            raise

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=SUM):
        if recvcounts is not None and len(set(recvcounts)) > 1:
            raise missing("MPI.Comm.Reduce_scatter with unequal counts")
        self.Reduce_scatter_block(sendbuf, recvbuf, op)

    # -- nonblocking ------------------------------------------------------------------------------
    def Ibarrier(self):
        return _issued(lambda done: self._c.barrier(done=done))

    def Ibcast(self, buf, root=0):
        try:
            span, root = raw(buf), self._root(root)
            return _issued(lambda done: self._c.broadcast(span, root, _U8, done))
        except BAD_INPUT as e:
            self._fail("Ibcast", e)
            raise

    def Iallreduce(self, sendbuf, recvbuf, op=SUM):
        try:
            r, dt = typed(recvbuf)
            s = None if sendbuf is IN_PLACE else typed_like(sendbuf, recvbuf, dt)
            name = op_name(op)
            return _issued(lambda done: self._c.all_reduce(r, name, dt, done, s))
        except BAD_INPUT as e:
            self._fail("Iallreduce", e)
            raise
