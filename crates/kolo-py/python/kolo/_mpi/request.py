"""kolo.MPI's `Status` and `Request`.

kolo's sends are buffered (a send returns once the transport has the message), so ``Isend``
returns a request that is already complete. ``Irecv`` posts nothing: its request receives when
it is waited on or tested — after the receives posted before it from the same source with the
same tag, which MPI's matching order gives the messages first. Since no send waits for a
receive, receiving late cannot deadlock a program that is correct under MPI.
"""

import collections
import time

from .types import (
    ANY_SOURCE,
    ANY_TAG,
    BYTE,
    PROC_NULL,
    SUCCESS,
    UNDEFINED,
    add_missing,
    datatype,
    missing,
)


class Status:
    """Where a received message came from (`source`, `tag`), its length and its error."""

    __slots__ = ("source", "tag", "error", "_bytes", "_cancelled")

    def __init__(self, status=None):
        if status is None:
            self.source, self.tag, self.error, self._bytes = ANY_SOURCE, ANY_TAG, SUCCESS, 0
            self._cancelled = False
        else:
            self.source, self.tag, self.error = status.source, status.tag, status.error
            self._bytes, self._cancelled = status._bytes, status._cancelled

    def _set(self, source, tag, nbytes):
        self.source, self.tag, self.error, self._bytes = source, tag, SUCCESS, nbytes

    def Get_source(self):
        return self.source

    def Set_source(self, source):
        self.source = source

    def Get_tag(self):
        return self.tag

    def Set_tag(self, tag):
        self.tag = tag

    def Get_error(self):
        return self.error

    def Set_error(self, error):
        self.error = error

    def Get_count(self, datatype_=BYTE):
        """Entries of `datatype_` received (`UNDEFINED` if the bytes are not a whole number)."""
        size = datatype(datatype_).size
        return self._bytes // size if self._bytes % size == 0 else UNDEFINED

    Get_elements = Get_count

    def Set_elements(self, datatype_, count):
        self._bytes = count * datatype(datatype_).size

    @property
    def count(self):
        return self._bytes

    @count.setter
    def count(self, value):
        self._bytes = value

    def Is_cancelled(self):
        return self._cancelled

    def Set_cancelled(self, flag):
        self._cancelled = bool(flag)

    cancelled = property(Is_cancelled, Set_cancelled)

    def __repr__(self):
        return f"<MPI.Status source={self.source} tag={self.tag} count={self._bytes}>"


def fill(status, source, tag, nbytes):
    if status is not None:
        status._set(source, tag, nbytes)


class Request:
    """An operation issued; ``Wait``/``Test`` complete it. A completed request is
    ``MPI.REQUEST_NULL`` (false, equal to it)."""

    __slots__ = ("_pending", "_status", "_result")

    def __init__(self, result=None):
        self._pending = False
        self._status = None  # (source, tag, bytes) of a completed receive
        self._result = result

    # -- one request -----------------------------------------------------------------------------
    def _progress(self, block):
        """Completes the operation if it can (waiting for it if `block`); whether it has."""
        return True

    def Wait(self, status=None):
        if self._pending:
            self._progress(True)
        self._report(status)
        return True

    def Test(self, status=None):
        if self._pending and not self._progress(False):
            return False
        self._report(status)
        return True

    def wait(self, status=None):
        self.Wait(status)
        result, self._result = self._result, None
        return result

    def test(self, status=None):
        if not self.Test(status):
            return (False, None)
        result, self._result = self._result, None
        return (True, result)

    def Get_status(self, status=None):
        """Whether the request has completed (without completing it)."""
        done = not self._pending
        if done:
            self._report(status)
        return done

    def _report(self, status):
        if status is None:
            return
        if self._status is None:
            status._set(ANY_SOURCE, ANY_TAG, 0)
        else:
            status._set(*self._status)

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
        result, requests[i]._result = requests[i]._result, None
        return (i, True, result)

    @staticmethod
    def Waitsome(requests, statuses=None):
        got = _poll(requests, lambda: _all_done(requests) or None)
        return _complete(requests, got, statuses)

    @staticmethod
    def Testsome(requests, statuses=None):
        return _complete(requests, _all_done(requests), statuses)


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
add_missing(Status, "MPI.Status", "f2py py2f tomemory")

REQUEST_NULL = Request()


class Receive(Request):
    """A posted receive (see the module's documentation): of `part` (native form) or, when
    `part` is None, of a pickled object."""

    __slots__ = ("_comm", "_part", "_source", "_tag")

    def __init__(self, comm, part, source, tag):
        super().__init__()
        self._comm, self._part, self._source, self._tag = comm, part, source, tag
        self._pending = True
        comm._posted[(source, tag)].append(self)

    def _progress(self, block):
        posted, key = self._comm._posted, (self._source, self._tag)
        queue = posted.get(key)
        if queue is None:
            return not self._pending
        try:
            return self._take(queue, block)
        finally:
            if not queue:
                del posted[key]  # a communicator without posted receives skips all this

    def _take(self, queue, block):
        """Completes the receives of `queue` up to this one: those posted before it take the
        messages first."""
        while queue:
            head = queue[0]
            try:
                done = head._receive(block)
            except BaseException:
                queue.popleft()  # failed: complete (with its error raised here)
                head._pending = False
                raise
            if not done:
                return False
            queue.popleft()
            if head is self:
                return True
        return not self._pending

    def _receive(self, block):
        c = self._comm._c
        if self._part is None:
            data = c.recv_bytes(self._source, self._tag, wait=block)
            if data is None:
                return False
            self._result = self._comm._loads(data)
            n = len(data)
        else:
            n = c.recv_upto(self._part, self._source, self._tag, "uint8", wait=block)
            if n is None:
                return False
        self._status = (self._source, self._tag, n)
        self._pending = False
        return True


def posted():
    """A communicator's posted receives: a queue per (source, tag)."""
    return collections.defaultdict(collections.deque)


def complete_posted(comm, source, tag):
    """Completes the receives posted before a blocking one from `source` with `tag`."""
    queue = comm._posted.get((source, tag))
    if queue:
        queue[-1]._progress(True)


def proc_null_request():
    """The completed request of a receive from `PROC_NULL`."""
    r = Request()
    r._status = (PROC_NULL, ANY_TAG, 0)
    return r


class Pending(Request):
    """A nonblocking collective: kolo's `Work`."""

    __slots__ = ("_work",)

    def __init__(self, work):
        super().__init__()
        self._work = work
        self._pending = True

    def _progress(self, block):
        if not block and not self._work.is_completed():
            return False
        self._pending = False
        self._work.wait()  # raises the operation's error
        return True


def missing_wildcard(name):
    """The error for a receive from any source or with any tag, which kolo's core lacks."""
    return missing(
        f"receives with {name}",
        " (kolo matches a receive to one source and one tag: name both)",
    )
