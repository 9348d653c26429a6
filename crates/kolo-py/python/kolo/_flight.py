"""Python stacks in the flight record: every rank of a Python program has ``faulthandler`` write
its threads' stacks to ``rank-R.py.txt`` in the trace directory on SIGUSR1 — the signal on
which kolo writes ``rank-R.json``, which ``kolo run`` sends its workers before stopping them after
a failure and which ``kolo diagnose --live`` sends a running job. ``faulthandler`` writes from the
signal handler itself, so a rank stuck in its own code (even holding the GIL) still tells where
it is; ``kolo diagnose`` shows the main thread's innermost frame of the program."""

import atexit
import faulthandler
import os
import signal

_files = {}


@atexit.register
def _tidy():
    """At a clean exit, removes the stack files no signal wrote to (and their directory when it is
    left empty): a job that went well leaves nothing behind."""
    for path, f in list(_files.items()):
        try:
            empty = os.fstat(f.fileno()).st_size == 0
            f.close()
            if empty:
                os.remove(path)
                os.rmdir(os.path.dirname(path))
        except OSError:
            pass


def watch(native):
    """Registers the stack dump for the world communicator ``native`` (once per file)."""
    try:
        path = os.path.join(native.flight_record_dir, f"rank-{native.rank}.py.txt")
        if path in _files:
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        f = open(path, "w")  # noqa: SIM115 — kept open for the signal handler
        # chain: kolo's own SIGUSR1 handler (the JSON record) runs too.
        faulthandler.register(signal.SIGUSR1, file=f, all_threads=True, chain=True)
    except (OSError, ValueError, RuntimeError, AttributeError):
        return  # no trace directory, or no signals here: the record goes on without stacks
    _files[path] = f


def dump(native, reason):
    """Writes the Python stacks now and this rank's flight record; returns the record's path."""
    for f in _files.values():
        try:
            faulthandler.dump_traceback(file=f, all_threads=True)
            f.flush()
        except (OSError, ValueError):
            pass
    return native.dump_flight_record(str(reason))
