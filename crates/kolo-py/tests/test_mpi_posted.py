"""kolo.MPI's Irecv between processes of one host is posted with the transport: the message is
written straight into the receive buffer by whichever kolo call next moves messages (before Wait),
in MPI's matching order among posted and wildcard receives, never past the message; a message too
long raises and leaves the buffer as it was."""

import pytest

from two_ranks import KOLO, run_two


@pytest.mark.skipif(not KOLO, reason="set KOLO_BIN to the kolo binary (the suite does)")
def test_posted_receives_fill_in_matching_order():
    # Sends in place from 8 KiB, so that the worker's 1 MiB sends go in place (the default
    # threshold is 16 MiB) and their requests are pending.
    found = run_two("posted_worker.py", KOLO_SHM_SINGLE_COPY_BYTES="8192")
    assert found[0] == {"rank": 0, "exchange": True, "send_request": True, "send_done": True}
    assert found[1] == {"rank": 1, "before_wait": True, "count": 5000, "rest": True,
                        "order": [True, True, True], "exchange": True, "truncated": True,
                        "untouched": True, "next": True, "get_status": True,
                        "recv_request": True, "mixed": True, "statuses": True}
