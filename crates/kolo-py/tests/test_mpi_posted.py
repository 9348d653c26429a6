"""kolo.MPI's Irecv between processes of one host is posted with the transport: the message is
written straight into the receive buffer by whichever kolo call next moves messages (before Wait),
in MPI's matching order among posted and wildcard receives, never past the message; a message too
long raises and leaves the buffer as it was."""

import json
import os
import shutil
import subprocess
import sys

import pytest

KOLO = os.environ.get("KOLO_BIN") or shutil.which("kolo")
WORKER = os.path.join(os.path.dirname(__file__), "posted_worker.py")


@pytest.mark.skipif(not KOLO, reason="set KOLO_BIN to the kolo binary (the suite does)")
def test_posted_receives_fill_in_matching_order():
    p = subprocess.run([KOLO, "run", "-n", "2", "--", sys.executable, WORKER],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, KOLO_TRANSPORT="shm"))
    assert p.returncode == 0, p.stdout + p.stderr
    found = {}
    for line in p.stdout.splitlines():
        if "{" in line:
            got = json.loads(line[line.index("{"):])
            found[got["rank"]] = got
    assert found[0] == {"rank": 0, "exchange": True}
    assert found[1] == {"rank": 1, "before_wait": True, "count": 5000, "rest": True,
                        "order": [True, True, True], "exchange": True, "truncated": True,
                        "untouched": True, "next": True}
