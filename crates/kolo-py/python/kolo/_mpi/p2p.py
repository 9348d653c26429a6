"""kolo.MPI's point-to-point methods (a part of `Intracomm`).

Messages are bytes: ``Send([buf, 3, MPI.DOUBLE], ...)`` sends 24 bytes of `buf`, and a receive
takes a message of at most its buffer's length, filling its start and leaving the rest as it was
(``Status.Get_count`` says how much came), as in MPI; a longer message raises (MPI's
``ERR_TRUNCATE``).

Sends are buffered — done once kolo has the bytes, whether or not a receive is posted — except
large ones to a rank of the same host (``KOLO_SHM_SINGLE_COPY_BYTES``, 16 MiB, and more; smaller
ones stream through the shared ring faster): those go in place, MPI's rendezvous: the receiver
copies the bytes once, straight out of the sender's buffer, so ``Isend``'s request is pending and
its buffer must stay as it is until ``Wait`` (as MPI asks), and ``Send`` returns once the
receiver has them. A rank waiting in kolo for anything copies the messages in place sent to it
meanwhile, so two ranks sending to each other first cannot deadlock. ``Bsend`` and ``Ibsend`` stay
buffered.
"""

import pickle

from . import request as rq
from .request import irecv, nbytes
from .status import fill
from .datatypes import ANY_SOURCE, ANY_TAG, BAD_INPUT, PROC_NULL, raw, to_int
from .datatypes import Datatype as DT

_U8 = "uint8"


def send_to(dest, tag):
    """(dest, tag) of a send checked; dest None for `PROC_NULL` (nothing to send)."""
    dest, tag = to_int(dest, "dest"), to_int(tag, "tag")
    if tag < 0:
        raise ValueError(f"tag: a send's tag must be >= 0, got {tag}")
    if dest == PROC_NULL:
        return None, tag
    if dest < 0:
        raise ValueError(f"dest: expected a rank or MPI.PROC_NULL, got {dest}")
    return dest, tag


def recv_from(source, tag):
    """(source, tag) of a receive checked (`ANY_SOURCE` and `ANY_TAG` kept); source None for
    `PROC_NULL`."""
    source, tag = to_int(source, "source"), to_int(tag, "tag")
    if source == PROC_NULL:
        return None, tag
    if source < 0 and source != ANY_SOURCE:
        raise ValueError(f"source: expected a rank, MPI.ANY_SOURCE or MPI.PROC_NULL, got {source}")
    if tag < 0 and tag != ANY_TAG:
        raise ValueError(f"tag: expected a tag >= 0 or MPI.ANY_TAG, got {tag}")
    return source, tag


def wild(source, tag):
    """A wildcard receive's (source, tag) as kolo takes them: None for any."""
    return (None if source < 0 else source), (None if tag < 0 else tag)


class P2P:
    """Sends and receives of buffers and of pickled objects."""

    # -- buffers ----------------------------------------------------------------------------------
    def Send(self, buf, dest, tag=0):
        try:
            # The common case ([buf, count, datatype] or a buffer alone, a rank, a tag) in one
            # native call, a message in place waited for there too; the rest below.
            if self._c.mpi_send(buf, dest, tag):
                return
            if type(dest) is not int or type(tag) is not int or dest < 0 or tag < 0:
                dest, tag = send_to(dest, tag)
                if dest is None:
                    return
            # raw(buf), its common form inline (a call costs as much as the rest of Send).
            if type(buf) is list and len(buf) == 3 and type(buf[1]) is int and type(buf[2]) is DT:
                span = (buf[0], 0, buf[1] * buf[2].size)
            else:
                span = raw(buf)
            big = self._in_place_min
            # nbytes(span), inline: its call would cost every small send on shared memory.
            if big is not None and (span[2] if span[2] is not None else nbytes(span)) >= big:
                sent = self._c.send_in_place(span, dest, tag)
                if sent is not None:
                    sent.wait()
                return
            self._c.send(span, dest, tag, _U8)
        except BAD_INPUT as e:
            self._fail("Send", e)
            raise

    Rsend = Send

    def Bsend(self, buf, dest, tag=0):
        """A send that is done once kolo has the bytes (kolo needs no attached buffer)."""
        try:
            dest, tag = send_to(dest, tag)
            if dest is not None:
                self._c.send(raw(buf), dest, tag, _U8)
        except BAD_INPUT as e:
            self._fail("Bsend", e)
            raise

    def Recv(self, buf, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        try:
            if not self._posted:
                # The common case (one rank, one tag; see Send) in one native call.
                n = self._c.mpi_recv(buf, source, tag)
                if n is not None:
                    if status is not None:
                        status._set(int(source), int(tag), n)  # a whole float taken as its int
                    return
            if type(source) is not int or type(tag) is not int or source < 0 or tag < 0:
                source, tag = recv_from(source, tag)
                if source is None:
                    fill(status, PROC_NULL, ANY_TAG, 0)
                    return
            if self._posted:
                rq.complete_posted(self, source, tag)
            if type(buf) is list and len(buf) == 3 and type(buf[1]) is int and type(buf[2]) is DT:
                span = (buf[0], 0, buf[1] * buf[2].size)  # raw(buf), inline (see Send)
            else:
                span = raw(buf)
            if source >= 0 and tag >= 0:
                n = self._c.recv_upto(span, source, tag, _U8)
            else:
                source, tag, n = self._c.recv_match(span, *wild(source, tag), _U8)
        except BAD_INPUT as e:
            self._fail("Recv", e)
            raise
        if status is not None:
            status._set(source, tag, n)

    def Isend(self, buf, dest, tag=0):
        big = self._in_place_min
        if big is not None:
            try:
                # The common case (see Send) in one native call: sent buffered (True), in place
                # (its send to wait on) or not the common case (False).
                sent = self._c.mpi_isend(buf, dest, tag)
                if sent is True:
                    return rq.Request()  # complete: the message is the transport's
                if sent is not False:
                    return sent  # in place: its request
                dest, tag = send_to(dest, tag)
                if dest is None:
                    return rq.Request()
                span = raw(buf)
                if nbytes(span) >= big:
                    sent = self._c.send_in_place(span, dest, tag)
                    return rq.Request() if sent is None else sent
                self._c.send(span, dest, tag, _U8)
            except BAD_INPUT as e:
                self._fail("Isend", e)
                raise
            return rq.Request()
        self.Send(buf, dest, tag)
        return rq.Request()  # complete: the message is the transport's

    Irsend = Isend

    def Ibsend(self, buf, dest, tag=0):
        self.Bsend(buf, dest, tag)
        return rq.Request()

    def Irecv(self, buf, source=ANY_SOURCE, tag=ANY_TAG):
        try:
            if (not self._plain and (type(source) is int or type(source) is float)
                    and source not in self._unposted):
                # The common case (see Send), posted with the transport, in one native call.
                posted = self._c.mpi_irecv(buf, source, tag)
                if posted is not None:
                    return posted
            if type(source) is not int or type(tag) is not int or source < 0 or tag < 0:
                source, tag = recv_from(source, tag)
                if source is None:
                    return rq.proc_null_request()
            if type(buf) is list and len(buf) == 3 and type(buf[1]) is int and type(buf[2]) is DT:
                return irecv(self, (buf[0], 0, buf[1] * buf[2].size), source, tag)  # see Send
            return irecv(self, raw(buf), source, tag)
        except BAD_INPUT as e:
            self._fail("Irecv", e)
            raise

    def Sendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None, source=ANY_SOURCE,
                 recvtag=ANY_TAG, status=None):
        recv_from(source, recvtag)  # a bad source or tag fails before the send
        self.Send(sendbuf, dest, sendtag)
        self.Recv(recvbuf, source, recvtag, status)

    def Sendrecv_replace(self, buf, dest, sendtag=0, source=ANY_SOURCE, recvtag=ANY_TAG,
                         status=None):
        recv_from(source, recvtag)
        self.Send(buf, dest, sendtag)  # the message is the transport's once Send returns
        self.Recv(buf, source, recvtag, status)

    # -- objects (pickled) ------------------------------------------------------------------------
    _loads = staticmethod(pickle.loads)

    def send(self, obj, dest, tag=0):
        try:
            dest, tag = send_to(dest, tag)
            if dest is not None:
                self._c.send(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL), dest, tag)
        except BAD_INPUT as e:
            self._fail("send", e)
            raise

    bsend = send

    def recv(self, buf=None, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        try:
            source, tag = recv_from(source, tag)
        except BAD_INPUT as e:
            self._fail("recv", e)
            raise
        if source is None:
            fill(status, PROC_NULL, ANY_TAG, 0)
            return None
        if self._posted:
            rq.complete_posted(self, source, tag)
        if source >= 0 and tag >= 0:
            data = self._c.recv_bytes(source, tag)
        else:
            source, tag, data = self._c.recv_bytes_match(*wild(source, tag))
        fill(status, source, tag, len(data))
        return pickle.loads(data)

    def isend(self, obj, dest, tag=0):
        self.send(obj, dest, tag)
        return rq.Request()

    ibsend = isend

    def irecv(self, buf=None, source=ANY_SOURCE, tag=ANY_TAG):
        try:
            source, tag = recv_from(source, tag)
        except BAD_INPUT as e:
            self._fail("irecv", e)
            raise
        if source is None:
            return rq.proc_null_request()
        return rq.receive(self, None, source, tag)

    def sendrecv(self, sendobj, dest, sendtag=0, recvbuf=None, source=ANY_SOURCE,
                 recvtag=ANY_TAG, status=None):
        recv_from(source, recvtag)
        self.send(sendobj, dest, sendtag)
        return self.recv(recvbuf, source, recvtag, status)
