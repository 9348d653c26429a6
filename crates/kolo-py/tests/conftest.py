"""Shared helpers: run a function on every rank of a world of threads."""

import threading

import pytest

import kolo


def run_ranks(size, fn, timeout=20.0, comm_timeout=10.0):
    """Runs `fn(comm)` on `size` threads, one per rank of a local world; returns each rank's
    result or raised exception, in rank order (the test fails if a rank is still running after
    `timeout` seconds)."""
    comms = kolo.local_world(size, timeout=comm_timeout)
    out = [None] * size

    def body(c):
        try:
            out[c.rank] = fn(c)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out[c.rank] = e

    threads = [threading.Thread(target=body, args=(c,), daemon=True) for c in comms]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        if t.is_alive():
            pytest.fail(f"a rank was still running after {timeout} s")
    for c in comms:
        c.close()
    return out


def ok(results):
    """The results, after failing the test on the first rank that raised."""
    for r, v in enumerate(results):
        if isinstance(v, BaseException):
            raise AssertionError(f"rank {r} raised {type(v).__name__}: {v}") from v
    return results
