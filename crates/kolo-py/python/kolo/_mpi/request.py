"""kolo.MPI's `Request` (its `Status` is in `status`).

kolo's sends are buffered (a send returns once the transport has the message), so ``Isend``
returns a request that is already complete — but for a large one to a rank of the same host, which
goes in place (see `p2p`): its request is pending until the receiver has copied the buffer.

``Irecv`` into a buffer from one source with one tag is posted with the transport where it can
(shared memory between processes): whichever kolo call of this rank next moves incoming messages
writes the message straight into the buffer, as MPI's progress does, and ``Wait`` finds it there.
Other receives (wildcards, objects, a transport that posts none) receive when they are waited on or
tested — after the receives posted before them that could take their message (the same source
and tag, or a wildcard, ``ANY_SOURCE`` or ``ANY_TAG``, that covers them), which MPI's matching order
gives the messages first (each request knows the last of each such kind posted before it); while
one of them is pending, later receives are not posted with the transport either, so the order
holds. Since no send waits for a receive, receiving late cannot deadlock a program that is correct
under MPI.
"""

import itertools
import time

from .. import _kolo
from .status import Status
from .datatypes import ANY_SOURCE, ANY_TAG, PROC_NULL, UNDEFINED, add_missing, missing

# Requests are made without calling their class (whose __init__ costs as much as the rest).
_new = object.__new__


class Request:
    """An operation issued; ``Wait``/``Test`` complete it. A completed request is
    ``MPI.REQUEST_NULL`` (false, equal to it). This class is also a completed send's request
    (kolo's sends complete at once) and ``REQUEST_NULL``: nothing to keep per object."""

    __slots__ = ()
    _pending = False
    _result = None

    # -- one request -----------------------------------------------------------------------------
    def _progress(self, block):
        """Completes the operation if it can (waiting for it if `block`); whether it has."""
        return True

    def _report(self, status):
        """Fills `status` in for the completed operation (a send's, an empty status)."""
        status._set(ANY_SOURCE, ANY_TAG, 0)

    def Wait(self, status=None):
        if self._pending:
            self._progress(True)
        if status is not None:
            self._report(status)
        return True

    def Test(self, status=None):
        if self._pending and not self._progress(False):
            return False
        if status is not None:
            self._report(status)
        return True

    def wait(self, status=None):
        self.Wait(status)
        result = self._result
        if result is not None:
            self._result = None
        return result

    def test(self, status=None):
        if not self.Test(status):
            return (False, None)
        return (True, self.wait())

    def Get_status(self, status=None):
        """Whether the request has completed, filling `status` in if it has (kolo keeps a
        completed request's status, so completing it here is invisible)."""
        done = not self._pending or self._progress(False)
        if done and status is not None:
            self._report(status)
        return done

    def Free(self):
        if self._pending:
            self._progress(True)

    def Cancel(self):
        raise missing("MPI.Request.Cancel")

    def __bool__(self):
        return self._pending

    def __eq__(self, other):
        if not isinstance(other, Request):
            return NotImplemented
        return self is other or (not self._pending and not other._pending)

    __hash__ = object.__hash__

    def __repr__(self):
        return f"<MPI.Request {'pending' if self._pending else 'null'}>"

    # -- many requests ---------------------------------------------------------------------------
    @staticmethod
    def Waitall(requests, statuses=None):
        if type(requests) is list:
            if len(requests) > 1 and _window(requests):
                _receive_window(requests, statuses)
                return True
            if statuses is None:
                _kolo.wait_all(requests)  # each request's Wait, in one call
                return True
        if statuses is None:
            for r in requests:
                r.Wait()
            return True
        for i, r in enumerate(requests):
            r.Wait(None if statuses is None else _status_at(statuses, i))
        return True

    @staticmethod
    def waitall(requests, statuses=None):
        return [
            r.wait(None if statuses is None else _status_at(statuses, i))
            for i, r in enumerate(requests)
        ]

    @staticmethod
    def Testall(requests, statuses=None):
        # Completing some of them early is invisible: a request completed inside keeps its
        # result until it is waited on or tested again.
        if not all(not r._pending or r._progress(False) for r in requests):
            return False
        Request.Waitall(requests, statuses)
        return True

    @staticmethod
    def testall(requests, statuses=None):
        if not Request.Testall(requests):
            return (False, None)
        return (True, Request.waitall(requests, statuses))

    @staticmethod
    def Waitany(requests, status=None):
        i = _poll(requests, lambda: _first_done(requests))
        if i != UNDEFINED:
            requests[i].Wait(status)
        return i

    @staticmethod
    def waitany(requests, status=None):
        i = _poll(requests, lambda: _first_done(requests))
        return (i, None if i == UNDEFINED else requests[i].wait(status))

    @staticmethod
    def Testany(requests, status=None):
        i = _first_done(requests)
        if i is None:
            return (UNDEFINED, False)
        if i != UNDEFINED:
            requests[i].Wait(status)
        return (i, True)

    @staticmethod
    def testany(requests, status=None):
        i, flag = Request.Testany(requests)
        if not flag or i == UNDEFINED:
            return (i, flag, None)
        return (i, True, requests[i].wait())

    @staticmethod
    def Waitsome(requests, statuses=None):
        got = _poll(requests, lambda: _all_done(requests) or None)
        return _complete(requests, got, statuses)

    @staticmethod
    def Testsome(requests, statuses=None):
        return _complete(requests, _all_done(requests), statuses)


def _window(requests):
    """Whether `requests` are `Receive`s into buffers of one communicator from one source with one
    tag, posted one after the other in this order, the first next to complete: a window of
    ``Irecv``s, which `_receive_window` receives in one call into the extension."""
    first = requests[0]
    if type(first) is not Receive or not first._pending or first._span is None:
        return False
    comm, key, before = first._comm, first._key, first._before
    if key[0] < 0 or key[1] < 0 or (before is not None and (len(before) != 1 or before[0]._pending)):
        return False
    prev = first
    for r in requests[1:]:
        if (type(r) is not Receive or not r._pending or r._span is None or r._comm is not comm
                or r._key != key):
            return False
        before = r._before
        if before is None or len(before) != 1 or before[0] is not prev:
            return False
        prev = r
    return True


def _receive_window(requests, statuses):
    """Completes a window (see `_window`) as waiting on each in turn would: those received
    complete, a failing one completes with its error raised, the ones after it stay pending."""
    first = requests[0]
    comm, (source, tag) = first._comm, first._key
    counts, error = comm._c.recv_upto_each([r._span for r in requests], (source, tag))
    posted = comm._posted
    for r, n in zip(requests, counts):
        r._count, r._pending, r._before = n, False, None
    comm._plain -= len(counts)
    if statuses is not None:
        for i, n in enumerate(counts):
            _status_at(statuses, i)._set(source, tag, n)
    if counts and posted.get(first._key) is requests[len(counts) - 1]:
        del posted[first._key]
    if error is not None:
        requests[len(counts)]._complete()
        raise error


def _status_at(statuses, i):
    while len(statuses) <= i:
        statuses.append(Status())
    return statuses[i]


def _first_done(requests):
    """The index of a completed active request (completing one if it can), `UNDEFINED` when
    none is active, None when none has completed."""
    active = False
    for i, r in enumerate(requests):
        if r._pending:
            active = True
            if r._progress(False):
                return i
    return None if active else UNDEFINED


def _all_done(requests):
    """The indices of the active requests that can complete now; `UNDEFINED` when none is
    active."""
    active = [i for i, r in enumerate(requests) if r._pending]
    if not active:
        return UNDEFINED
    return [i for i in active if requests[i]._progress(False)]


def _complete(requests, got, statuses):
    if got == UNDEFINED:
        return None
    for n, i in enumerate(got):
        requests[i].Wait(None if statuses is None else _status_at(statuses, n))
    return got


def _poll(requests, check):
    """`check()` until it gives something other than None (kolo has no wait for the first of
    several receives): at once, then with pauses from 10 µs growing to 1 ms."""
    pause = 1e-5
    while True:
        got = check()
        if got is not None:
            return got
        time.sleep(pause)
        pause = min(pause * 2, 1e-3)


add_missing(Request, "MPI.Request", """
    Get_status_all Get_status_any Get_status_some cancel f2py free fromhandle fromint
    get_status get_status_all get_status_any get_status_some handle py2f toint
""")

REQUEST_NULL = Request()


class Receive(Request):
    """A posted receive (see the module's documentation): into `span` (native form) or, when
    `span` is None, of a pickled object (its `_result`). `source` and `tag` may be
    `ANY_SOURCE` and `ANY_TAG`; once complete, they are the message's. Made by `receive` (or
    `proc_null_request`), not by calling the class."""

    __slots__ = ("_pending", "_result", "_comm", "_span", "_source", "_tag", "_key", "_before",
                 "_count", "_seq")

    def _report(self, status):
        status._set(self._source, self._tag, self._count)

    def Wait(self, status=None):
        # Request.Wait with its common case inline (a call costs as much as the rest).
        if self._pending:
            before = self._before
            if before is None or (len(before) == 1 and not before[0]._pending):
                self._receive(True)
            else:
                self._progress(True)
        if status is not None:
            status._set(self._source, self._tag, self._count)
        return True

    def _progress(self, block):
        if self._before is not None:
            for r in _in_order(self._before):
                if not r._receive(block):
                    return False
            self._before = None
        return self._receive(block)

    def _receive(self, block):
        c = self._comm._c
        source, tag = self._source, self._tag
        try:
            if source >= 0 and tag >= 0:
                if self._span is not None:
                    n = c.recv_upto(self._span, source, tag, "uint8", block)
                else:
                    data = c.recv_bytes(source, tag, block)
                    n = None if data is None else len(data)
                    if data is not None:
                        self._result = self._comm._loads(data)
            else:
                src, tg = (None if source < 0 else source), (None if tag < 0 else tag)
                if self._span is not None:
                    got = c.recv_match(self._span, src, tg, "uint8", block)
                else:
                    got = c.recv_bytes_match(src, tg, block)
                if got is None:
                    n = None
                else:
                    self._source, self._tag, n = got
                    if self._span is None:
                        self._result = self._comm._loads(n)
                        n = len(n)
        except BaseException:
            self._complete()  # failed: complete, with its error raised here
            raise
        if n is None:
            return False  # nothing yet (block=False)
        self._count = n
        # _complete(), inline.
        self._pending = False
        self._before = None
        comm = self._comm
        comm._plain -= 1
        posted = comm._posted
        if posted.get(self._key) is self:
            del posted[self._key]
        return True

    def _complete(self):
        self._pending = False
        self._before = None
        comm = self._comm
        comm._plain -= 1
        posted = comm._posted
        if posted.get(self._key) is self:
            del posted[self._key]  # a communicator without posted receives skips the lookups
        return True


class Native(_kolo.Request, Request):
    """A request the extension makes and completes: of a receive posted with the transport (see
    the module's documentation), into its buffer from one source with one tag, or of a send in
    place (see `p2p`), pending until the receiver has copied the buffer. A posted receive gets its
    message before any receive posted later, so it needs no place in the communicator's order of
    pending receives; dropped without a wait, it is withdrawn (its buffer is released, so nothing
    may be written into it) and its message goes to the next receive. A send in place holds its
    buffer until the receiver has copied it (and, if the send fails, for good: the receiver may
    still be reading it); dropped while pending, it waits for the copy."""

    __slots__ = ()


_kolo.register_mpi_request(Native)


def receive(comm, span, source, tag):
    """A pending `Receive` into `span` (None: of an object) from `source` with `tag`, placed in
    the communicator's order of pending receives: the receives posted before it that could take
    its message take theirs first (MPI matches receives in the order they were posted). Made
    without calling the class, whose `__init__` would cost a third of an `Irecv`."""
    r = _new(Receive)
    r._comm, r._span, r._source, r._tag = comm, span, source, tag
    r._pending, r._result, r._count = True, None, 0
    posted = comm._posted
    r._key = key = (source, tag)
    r._seq = next(_POSTINGS)
    comm._plain += 1
    if source >= 0 and tag >= 0 and (not posted or (len(posted) == 1 and key in posted)):
        # No other receive pending, or only ones from this source with this tag (a window of
        # Irecvs): the last of them, if any, comes first.
        last = posted.get(key)
        r._before = None if last is None else [last]
    else:
        r._before = _competing(posted, source, tag)
    posted[key] = r
    return r


def irecv(comm, span, source, tag):
    """The request of an ``Irecv`` into `span` (the native form): posted with the transport,
    which writes the message into it and keeps the order among postings, where it can — while
    every receive pending is posted so — else a `Receive`."""
    if source >= 0 and tag >= 0 and not comm._plain and source not in comm._unposted:
        posted = comm._c.post_recv(span, source, tag)
        if posted is not None:
            return posted
        comm._unposted.add(source)  # a peer the transport posts no receives from
    return receive(comm, span, source, tag)


_POSTINGS = itertools.count()


def nbytes(span):
    """The bytes of a message in the native form (buffer, byte offset, bytes or None: the rest)."""
    n = span[2]
    if n is None:
        buf = span[0]
        n = getattr(buf, "nbytes", None)
        if type(n) is not int:
            with memoryview(buf) as m:
                n = m.nbytes
    return n


def _competing(posted, source, tag):
    """The last pending receive of each kind that could take a message a receive from `source`
    with `tag` could: of the same source and tag, and of the wildcards that cover them (any
    receive at all, for a wildcard receive); None if there is none."""
    if source < 0 or tag < 0:
        found = [r for (s, t), r in posted.items()
                 if (source < 0 or s < 0 or s == source) and (tag < 0 or t < 0 or t == tag)]
    else:
        found = [r for r in (posted.get((source, tag)), posted.get((ANY_SOURCE, tag)),
                             posted.get((source, ANY_TAG)), posted.get((ANY_SOURCE, ANY_TAG)))
                 if r is not None]
    return found or None


def _in_order(first):
    """The pending receives in `first` and everything they wait for, oldest posting first."""
    seen, todo = {}, list(first)
    while todo:
        r = todo.pop()
        if r._pending and id(r) not in seen:
            seen[id(r)] = r
            if r._before:
                todo.extend(r._before)
    return sorted(seen.values(), key=lambda r: r._seq)


def posted():
    """A communicator's posted receives: the last one posted per (source, tag)."""
    return {}


def complete_posted(comm, source, tag):
    """Completes the receives posted before a blocking one from `source` with `tag` that could
    take its message."""
    first = _competing(comm._posted, source, tag)
    if first is not None:
        for r in _in_order(first):
            r._receive(True)


def proc_null_request():
    """The completed request of a receive from `PROC_NULL`."""
    r = _new(Receive)
    r._comm = r._span = r._result = r._before = None
    r._source, r._tag, r._key, r._pending, r._count = PROC_NULL, ANY_TAG, None, False, 0
    return r


class Pending(Request):
    """A nonblocking collective: kolo's `Work`."""

    __slots__ = ("_pending", "_work")

    def __init__(self, work):
        self._work = work
        self._pending = True

    def _progress(self, block):
        if not block and not self._work.is_completed():
            return False
        self._pending = False
        self._work.wait()  # raises the operation's error
        return True
