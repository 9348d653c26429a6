"""The examples the book quotes, run as it says: examples/numpy_comm.py alone (a world of one) and,
where the suite hands over the kolo binary (KOLO_BIN), under `kolo run -n 2`."""

import os
import shutil
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
NUMPY_COMM = os.path.join(EXAMPLES, "numpy_comm.py")
KOLO = os.environ.get("KOLO_BIN") or shutil.which("kolo")


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    return p.returncode, p.stdout + p.stderr


def test_numpy_comm_alone_is_a_world_of_one():
    rc, out = run([sys.executable, NUMPY_COMM])
    assert rc == 0, out[-3000:]
    assert "rank 0 of 1: all-reduce 0, objects from 1 ranks" in out, out[-3000:]


@pytest.mark.skipif(not KOLO, reason="set KOLO_BIN to the kolo binary (the suite does)")
def test_numpy_comm_under_kolo_run():
    rc, out = run([KOLO, "run", "-n", "2", "--", sys.executable, NUMPY_COMM])
    assert rc == 0, out[-3000:]
    for r in range(2):
        assert f"rank {r} of 2: all-reduce 1, objects from 2 ranks" in out, out[-3000:]
