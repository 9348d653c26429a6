"""kolo.MPI's large sends between processes of one host go in place: the receiver copies the
bytes once, straight out of the sender's buffer (``KOLO_SHM_SINGLE_COPY_BYTES``, set low here).
The request of an `Isend` is pending until then; the bytes, their order among other messages and
the rest of the receive buffer are right; two ranks sending to each other first do not deadlock; a
request dropped without a wait keeps its buffer until it is copied. With the threshold at 0 the
same program runs with buffered sends."""

import pytest

from two_ranks import KOLO, run_two


def run(tmp_path, mode, **env):
    found = run_two("in_place_worker.py", str(tmp_path / "go"), mode, **env)
    return found[0], found[1]


@pytest.mark.skipif(not KOLO, reason="set KOLO_BIN to the kolo binary (the suite does)")
@pytest.mark.parametrize("single_copy", [True, False])
def test_large_sends_go_in_place_and_arrive_whole(tmp_path, single_copy):
    # The worker's messages (1 MiB) are under the default threshold (16 MiB): set one below them.
    env = {"KOLO_SHM_SINGLE_COPY_BYTES": "8192" if single_copy else "0"}
    r0, r1 = run(tmp_path, "in-place" if single_copy else "buffered", **env)
    assert r0 == {"rank": 0, "pending": single_copy, "done": True, "exchange": True}
    assert r1 == {"rank": 1, "bytes": True, "rest": True, "exchange": True, "dropped": True,
                  "order": True, "longer": True}
