"""kolo.MPI's datatypes, reduction operators and constants, and mpi4py's buffer specifications
read into what kolo's native communicator takes: a part of a buffer, ``(buffer, byte_offset,
count)``.

mpi4py's forms: a buffer alone; ``[buf, datatype]``; ``[buf, count]``; ``[buf, count,
datatype]``; ``[buf, (count, displ), datatype]``; ``[buf, count, displ, datatype]`` (`displ` in
elements) — and for the vector collectives (``Gatherv`` & co.) ``[buf, counts, datatype]``,
``[buf, (counts, displs), datatype]``, ``[buf, counts, displs, datatype]``. Only ``count``
elements are sent, received or reduced; the rest of the buffer is left as it was. A datatype
says what the bytes are (the buffer's own format is used only when none is given), as in MPI.
"""

import functools
import operator

# mpi4py's (OpenMPI's) values for its integer constants.
ANY_SOURCE = -1
ANY_TAG = -1
PROC_NULL = -2
ROOT = -4
UNDEFINED = -32766
SUCCESS = 0
TAG_UB = (1 << 31) - 1
THREAD_SINGLE, THREAD_FUNNELED, THREAD_SERIALIZED, THREAD_MULTIPLE = range(4)


class _InPlace:
    """mpi4py's ``MPI.IN_PLACE``."""

    def __repr__(self):
        return "MPI.IN_PLACE"


IN_PLACE = _InPlace()


class MPINotImplementedError(NotImplementedError, AttributeError):
    """A name of mpi4py's that kolo.MPI does not implement. A `NotImplementedError`, and an
    `AttributeError` too, so that ``hasattr``/``getattr(..., default)`` see it as absent."""

    __module__ = "kolo.MPI"


def missing(what, why=""):
    """The error for an mpi4py feature kolo.MPI lacks."""
    return MPINotImplementedError(f"kolo.MPI does not implement {what}{why}")


class _Missing:
    """A name of mpi4py's that kolo.MPI lacks, on a class: reading it raises (a class attribute,
    not `__getattr__`, which would slow every attribute read of the class's objects)."""

    def __init__(self, what):
        self.what = what

    def __get__(self, obj, cls=None):
        raise missing(self.what)


def add_missing(cls, prefix, names):
    """Makes each of `names` (mpi4py's, space-separated) that `cls` lacks raise on reading."""
    for name in names.split():
        if not hasattr(cls, name):
            setattr(cls, name, _Missing(f"{prefix}.{name}"))


class Datatype:
    """An MPI datatype: a name and a size in bytes; `kolo` names the element type kolo reduces
    it as (None: it can be moved, not reduced)."""

    __slots__ = ("name", "size", "kolo", "code")

    def __init__(self, name, size, kolo=None, code=None):
        self.name, self.size, self.kolo, self.code = name, size, kolo, code

    def Get_size(self):
        return self.size

    def Get_extent(self):
        return (0, self.size)

    extent = property(lambda self: self.size)
    lb = property(lambda self: 0)
    ub = property(lambda self: self.size)

    def Get_name(self):
        return f"MPI_{self.name}"

    def tocode(self):
        if self.code is None:
            raise ValueError(f"{self!r} has no typecode")
        return self.code

    def Commit(self):
        return self  # predefined datatypes are committed

    def Dup(self):
        return self

    def Free(self):
        pass

    def __repr__(self):
        return f"MPI.{self.name}"


add_missing(Datatype, "MPI.Datatype", """
    Create_contiguous Create_darray Create_dup Create_f90_complex Create_f90_integer
    Create_f90_real Create_hindexed Create_hindexed_block Create_hvector Create_indexed
    Create_indexed_block Create_keyval Create_resized Create_struct Create_subarray Create_vector
    Delete_attr Free_keyval Get_attr Get_contents Get_envelope Get_true_extent Get_value_index
    Match_size Pack Pack_external Pack_external_size Pack_size Resized Set_attr Set_name Unpack
    Unpack_external combiner contents decode envelope f2py free fromcode fromhandle fromint
    handle is_named is_predefined py2f toint true_extent true_lb true_ub typechar typestr
""")


def _types():
    t = {}

    def add(names, size, kolo=None, code=None):
        dt = Datatype(names[0], size, kolo, code)
        for n in names:
            t[n] = dt

    add(["BYTE"], 1, "uint8", "B")
    add(["PACKED"], 1)
    add(["CHAR", "CHARACTER"], 1, None, "c")
    add(["SIGNED_CHAR", "INT8_T", "INTEGER1"], 1, None, "b")
    add(["UNSIGNED_CHAR", "UINT8_T"], 1, "uint8", "B")
    add(["C_BOOL", "CXX_BOOL", "BOOL"], 1, None, "?")
    add(["SHORT", "SIGNED_SHORT", "INT16_T", "INTEGER2"], 2, None, "h")
    add(["UNSIGNED_SHORT", "UINT16_T"], 2, None, "H")
    add(["INT", "SIGNED_INT", "INT32_T", "INTEGER", "INTEGER4"], 4, "int32", "i")
    add(["UNSIGNED", "UNSIGNED_INT", "UINT32_T"], 4, None, "I")
    add(["LONG", "SIGNED_LONG", "INT64_T", "INTEGER8", "AINT", "OFFSET", "COUNT"], 8, "int64", "l")
    add(["LONG_LONG", "SIGNED_LONG_LONG", "LONG_LONG_INT"], 8, "int64", "q")
    add(["UNSIGNED_LONG", "UINT64_T"], 8, None, "L")
    add(["UNSIGNED_LONG_LONG"], 8, None, "Q")
    add(["FLOAT16", "FLOAT16_T", "REAL2"], 2, "float16", "e")
    add(["FLOAT", "REAL", "REAL4"], 4, "float32", "f")
    add(["DOUBLE", "DOUBLE_PRECISION", "REAL8"], 8, "float64", "d")
    add(["LONG_DOUBLE", "REAL16"], 16, None, "g")
    add(["C_FLOAT_COMPLEX", "C_COMPLEX", "COMPLEX", "COMPLEX8", "CXX_FLOAT_COMPLEX"], 8, None, "F")
    add(["C_DOUBLE_COMPLEX", "DOUBLE_COMPLEX", "COMPLEX16", "CXX_DOUBLE_COMPLEX"], 16, None, "D")
    add(["WCHAR"], 4, None, "w")
    return t


DATATYPES = _types()

# Buffer formats (PEP 3118, numpy typestrings) and typecodes to datatypes, as mpi4py's TypeDict.
_BY_CODE = {
    "?": "C_BOOL", "c": "CHAR", "b": "SIGNED_CHAR", "B": "BYTE", "h": "SHORT",
    "H": "UNSIGNED_SHORT", "i": "INT", "I": "UNSIGNED", "l": "LONG", "L": "UNSIGNED_LONG",
    "q": "LONG_LONG", "Q": "UNSIGNED_LONG_LONG", "n": "LONG", "N": "UNSIGNED_LONG", "p": "LONG",
    "P": "UNSIGNED_LONG", "e": "FLOAT16", "f": "FLOAT", "d": "DOUBLE", "g": "LONG_DOUBLE",
    "Zf": "C_FLOAT_COMPLEX", "Zd": "C_DOUBLE_COMPLEX", "F": "C_FLOAT_COMPLEX",
    "D": "C_DOUBLE_COMPLEX", "i1": "INT8_T", "i2": "INT16_T", "i4": "INT", "i8": "LONG",
    "u1": "UINT8_T", "u2": "UINT16_T", "u4": "UNSIGNED", "u8": "UNSIGNED_LONG", "f2": "FLOAT16",
    "f4": "FLOAT", "f8": "DOUBLE", "c8": "C_FLOAT_COMPLEX", "c16": "C_DOUBLE_COMPLEX",
    "b1": "C_BOOL",
}
TYPECODES = {code: DATATYPES[name] for code, name in _BY_CODE.items()}
BYTE = DATATYPES["BYTE"]


def datatype(x):
    """The datatype `x` names (a `Datatype` or a typecode such as ``"d"`` or ``"i4"``)."""
    if type(x) is Datatype:
        return x
    if isinstance(x, str):
        try:
            return TYPECODES[x.lstrip("@=<")]
        except KeyError:
            raise KeyError(f"cannot map {x!r} to an MPI datatype") from None
    raise TypeError(f"expected an MPI datatype or a typecode, got {type(x).__name__}")


def format_datatype(buf):
    """The datatype of a buffer's own format (mpi4py's rule: format ``B`` is ``MPI.BYTE``)."""
    fmt = memoryview(buf).format
    try:
        return TYPECODES[fmt.lstrip("@=<")]
    except KeyError:
        raise KeyError(f"cannot map the buffer format {fmt!r} to an MPI datatype") from None


def nbytes(buf):
    return memoryview(buf).nbytes


# -- reductions --------------------------------------------------------------------------------


def _maxloc(a, b):
    return a if (a[0], -a[1]) >= (b[0], -b[1]) else b


def _minloc(a, b):
    return a if (a[0], a[1]) <= (b[0], b[1]) else b


class Op:
    """A reduction: `kolo` is kolo's name for buffers (None: objects only), `fn` combines two
    Python objects."""

    __slots__ = ("name", "fn", "kolo")

    def __init__(self, name, fn, kolo=None):
        self.name, self.fn, self.kolo = name, fn, kolo

    def __call__(self, x, y):
        return self.fn(x, y)

    def Free(self):
        pass

    def Is_commutative(self):
        return True

    def __repr__(self):
        return f"MPI.{self.name}"

    @staticmethod
    def Create(function, commute=False):
        raise missing("MPI.Op.Create (user-defined reductions)")


OPS = {
    "SUM": Op("SUM", operator.add, "sum"),
    "PROD": Op("PROD", operator.mul, "prod"),
    "MIN": Op("MIN", min, "min"),
    "MAX": Op("MAX", max, "max"),
    "LAND": Op("LAND", lambda a, b: a and b),
    "LOR": Op("LOR", lambda a, b: a or b),
    "LXOR": Op("LXOR", lambda a, b: bool(a) != bool(b)),
    "BAND": Op("BAND", operator.and_),
    "BOR": Op("BOR", operator.or_),
    "BXOR": Op("BXOR", operator.xor),
    "MAXLOC": Op("MAXLOC", _maxloc),
    "MINLOC": Op("MINLOC", _minloc),
    "REPLACE": Op("REPLACE", lambda a, b: b),
    "NO_OP": Op("NO_OP", lambda a, b: a),
}


def op_name(op):
    """kolo's name of a reduction of buffers."""
    name = KOLO_OPS.get(op) if type(op) is Op else None
    if name is not None:
        return name
    if type(op) is not Op:
        raise TypeError(f"expected an MPI reduction operator (MPI.SUM, ...), got {op!r}")
    if op.kolo is None:
        raise missing(f"{op!r} on buffers", " (kolo reduces buffers with SUM, PROD, MIN and MAX)")
    return op.kolo


KOLO_OPS = {op: op.kolo for op in OPS.values() if op.kolo is not None}


def reduce_objects(op, items):
    if type(op) is not Op:
        raise TypeError(f"expected an MPI reduction operator (MPI.SUM, ...), got {op!r}")
    return functools.reduce(op.fn, items)


# -- buffer specifications ------------------------------------------------------------------------


def _unpack(msg, vector):
    """mpi4py's message forms: (buffer, count(s), displacement(s), datatype), None where not
    given."""
    t = type(msg)
    if t is not list and t is not tuple:
        return msg, None, None, None
    n = len(msg)
    pair = tuple if vector else (tuple, list)
    count = displ = dt = None
    if n == 2:
        buf, count = msg
        if isinstance(count, (Datatype, str)):
            count, dt = None, count
        elif isinstance(count, pair):
            count, displ = count
    elif n == 3:
        buf, count, dt = msg
        if isinstance(count, pair):
            count, displ = count
    elif n == 4:
        buf, count, displ, dt = msg
    else:
        raise ValueError(f"message: expecting 2 to 4 items, got {n}")
    return buf, count, displ, dt


def _indices(xs, what):
    """The ints >= 0 of the sequence `xs` as a list (`_index` of each, in one pass where all are
    good: a vector collective's counts and displacements)."""
    try:
        out = list(map(operator.index, xs))
    except TypeError:
        out = None
    if out is None or (out and min(out) < 0):
        return [_index(x, what) for x in xs]  # raises, naming the bad one
    return out


def _index(x, what):
    try:
        v = operator.index(x)
    except TypeError:
        raise TypeError(f"message: the {what} must be an int, got {type(x).__name__}") from None
    if v < 0:
        raise ValueError(f"message: negative {what} {v}")
    return v


class Part:
    """A buffer specification read: `buf`, the byte `offset` of its first element, `count`
    elements per block (None: the rest of the buffer, in equal blocks) and `dt` (None: the
    buffer's own format)."""

    __slots__ = ("buf", "offset", "count", "dt")

    def __init__(self, buf, offset, count, dt):
        self.buf, self.offset, self.count, self.dt = buf, offset, count, dt

    def size(self):
        """Bytes per element."""
        if self.dt is None:
            self.dt = format_datatype(self.buf)
        return self.dt.size

    def per_block(self, blocks):
        """Elements per block."""
        if self.count is not None:
            return self.count
        rest = nbytes(self.buf) - self.offset
        size = self.size()
        if rest % size or (rest // size) % blocks:
            raise ValueError(
                f"message: cannot infer the count: {rest} bytes are not {blocks} equal blocks of "
                f"{self.dt!r}"
            )
        return rest // size // blocks

    def raw(self, blocks=1):
        """The native form for moving bytes: (buffer, byte offset, bytes or None)."""
        if self.count is None:
            return (self.buf, self.offset, None)
        return (self.buf, self.offset, self.count * blocks * self.size())

    def typed(self):
        """The native form for reducing: (buffer, byte offset, count or None), and kolo's
        element type."""
        dt = self.dt
        if dt is None:
            dt = self.dt = format_datatype(self.buf)
        if dt.kolo is None:
            raise missing(f"reductions of {dt!r}", " (kolo reduces FLOAT, DOUBLE, FLOAT16, INT, "
                          "LONG and BYTE buffers)")
        return (self.buf, self.offset, self.count), dt.kolo

    def block(self, i, blocks):
        """Block `i` of `blocks`, in the native form for moving bytes."""
        n = self.per_block(blocks) * self.size()
        return (self.buf, self.offset + i * n, n)


def part(msg):
    """A simple message (``[buf, count, datatype]`` & co.) as a `Part`."""
    t = type(msg)
    if (t is list or t is tuple) and len(msg) == 3:
        # The common form, read as below without the general reading's cost (a third of a small
        # collective's time).
        buf, count, dt = msg
        if type(count) is int and type(dt) is Datatype and count >= 0 and buf is not None:
            return Part(buf, 0, count, dt)
    buf, count, displ, dt = _unpack(msg, False)
    if buf is None:
        raise TypeError("message: expected a buffer or a list/tuple, got None")
    dt = None if dt is None else datatype(dt)
    p = Part(buf, 0, None if count is None else _index(count, "count"), dt)
    if displ is not None:
        p.offset = _index(displ, "displacement") * p.size()
    return p


def raw(msg):
    """A simple message in the native form for moving bytes (the fast path of `part(msg).raw()`,
    for ``[buf, count, datatype]`` and a buffer alone)."""
    t = type(msg)
    if t is list or t is tuple:
        if len(msg) == 3:
            buf, count, dt = msg
            if type(count) is int and type(dt) is Datatype and count >= 0 and buf is not None:
                return (buf, 0, count * dt.size)
        return part(msg).raw()
    if msg is None:
        raise TypeError("message: expected a buffer or a list/tuple, got None")
    return (msg, 0, None)


def typed(msg):
    """A simple message in the native form for reducing: (buffer, byte offset, count or None) —
    or the buffer itself, whose format the native side reads — and kolo's element type (None:
    the buffer's format's). The fast path of `part(msg).typed()`."""
    t = type(msg)
    if t is list or t is tuple:
        n = len(msg)
        if n == 2:
            dt = msg[1]
            if type(dt) is Datatype and dt.kolo is not None and msg[0] is not None:
                return (msg[0], 0, None), dt.kolo
        elif n == 3:
            count, dt = msg[1], msg[2]
            if (type(count) is int and type(dt) is Datatype and dt.kolo is not None
                    and count >= 0 and msg[0] is not None):
                return (msg[0], 0, count), dt.kolo
        return part(msg).typed()
    if msg is None:
        raise TypeError("message: expected a buffer or a list/tuple, got None")
    return msg, None


def typed_like(sendbuf, recvbuf, dt):
    """A reduction's send buffer in the native form, checked to be of the receive buffer's type
    (`dt`, from `typed(recvbuf)`)."""
    s, sdt = typed(sendbuf)
    if sdt is None and dt is None:
        return s  # two buffers alone: the native side checks their formats
    if sdt is None:
        sdt = format_datatype(sendbuf).kolo
    if dt is None:
        dt = format_datatype(recvbuf).kolo
    if sdt != dt:
        raise ValueError(f"mismatch in send and receive MPI datatypes ({sdt} and {dt})")
    return s


class Vector:
    """A vector message (``[buf, (counts, displs), datatype]`` & co.) for `blocks` ranks: `buf`,
    `counts` and `displs` (elements) per rank, and `dt`."""

    __slots__ = ("buf", "counts", "displs", "dt", "_bytes", "_packed")

    def __init__(self, msg, blocks):
        buf, counts, displs, dt = _unpack(msg, True)
        if buf is None:
            raise TypeError("message: expected a buffer or a list/tuple, got None")
        self.buf = buf
        self.dt = format_datatype(buf) if dt is None else datatype(dt)
        if counts is None:
            total = nbytes(buf)
            if total % self.dt.size:
                raise ValueError(
                    f"message: cannot infer the counts: {total} bytes are not a whole number of "
                    f"{self.dt!r}"
                )
            n = total // self.dt.size
            counts = [n // blocks + (n % blocks > i) for i in range(blocks)]
        elif isinstance(counts, int):
            counts = [_index(counts, "count")] * blocks
        else:
            counts = _indices(counts, "count")
        if len(counts) != blocks:
            raise ValueError(f"message: expected {blocks} counts, got {len(counts)}")
        if displs is None:
            displs, at = [], 0
            for c in counts:
                displs.append(at)
                at += c
        elif isinstance(displs, int):
            displs = [_index(displs, "displacement") * i for i in range(blocks)]
        else:
            displs = _indices(displs, "displacement")
        if len(displs) != blocks:
            raise ValueError(f"message: expected {blocks} displacements, got {len(displs)}")
        self.counts, self.displs, self._bytes, self._packed = counts, displs, None, None

    def byte_counts(self):
        """Bytes per rank (one list, made once: the native calls only read it)."""
        if self._bytes is None:
            s = self.dt.size
            self._bytes = self.counts if s == 1 else [c * s for c in self.counts]
        return self._bytes

    def packed(self):
        """Whether the blocks lie one after the other in rank order from the first one on."""
        if self._packed is None:
            at, self._packed = (self.displs[0] if self.displs else 0), True
            for c, d in zip(self.counts, self.displs):
                if d != at:
                    self._packed = False
                    break
                at += c
        return self._packed

    def span(self):
        """The packed blocks in the native form for moving bytes (call only if `packed()`)."""
        s = self.dt.size
        start = self.displs[0] if self.displs else 0
        return (self.buf, start * s, sum(self.counts) * s)

    def block(self, i):
        s = self.dt.size
        return (self.buf, self.displs[i] * s, self.counts[i] * s)

    def gather_into(self, scratch):
        """Copies the blocks, in rank order, into `scratch` (packing a message with gaps)."""
        src, dst, s, at = memoryview(self.buf).cast("B"), memoryview(scratch), self.dt.size, 0
        for c, d in zip(self.counts, self.displs):
            dst[at:at + c * s] = src[d * s:(d + c) * s]
            at += c * s

    def scatter_from(self, scratch):
        """Copies packed blocks from `scratch` to their places in the buffer."""
        dst, src, s, at = memoryview(self.buf).cast("B"), memoryview(scratch), self.dt.size, 0
        for c, d in zip(self.counts, self.displs):
            dst[d * s:(d + c) * s] = src[at:at + c * s]
            at += c * s


# -- arguments --------------------------------------------------------------------------------------

# Bad input (these) on one rank ends the communicator on every rank, as kolo's own methods do,
# so that the others raise at once instead of waiting for a call that will not come. (A
# `NotImplementedError` does not: a program may fall back.)
BAD_INPUT = (TypeError, ValueError)


def to_int(x, what):
    """An int argument (mpi4py, through Cython, takes any number and truncates it; kolo takes
    whole floats)."""
    try:
        return operator.index(x)
    except TypeError:
        if isinstance(x, float) and x.is_integer():
            return int(x)
        raise TypeError(f"{what}: expected an int, got {type(x).__name__}") from None
