"""kolo.MPI's `Status`: where a received message came from, its length and its error."""

from .datatypes import ANY_SOURCE, ANY_TAG, BYTE, SUCCESS, UNDEFINED, add_missing, datatype


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


add_missing(Status, "MPI.Status", "f2py py2f tomemory")
