"""Several worlds in one process: `kolo.init()` again, and `kolo.MPI` after `kolo.init()`, under
`kolo run` — a new working world every time."""

import os
import shutil
import subprocess
import sys

import pytest

KOLO = os.environ.get("KOLO_BIN") or shutil.which("kolo")

SCRIPT = r"""
import numpy as np
import kolo

def check(c, w):
    v = np.full(1000, c.rank + w, dtype=np.float64)
    c.all_reduce(v)
    n = c.size
    want = n * (n - 1) / 2 + n * w
    assert (v == want).all(), f"world {w}: {v[0]} != {want}"

first = kolo.init()
check(first, 0)
from kolo import MPI  # a second world, made on first use of COMM_WORLD
total = MPI.COMM_WORLD.allreduce(MPI.COMM_WORLD.Get_rank() + 1)
assert total == 3, total
check(first, 0)
prev = first
for k in range(1, 49):
    c = kolo.init()
    check(c, k)
    check(prev, k - 1)
    prev = c
print("ok worlds", flush=True)
"""


@pytest.mark.skipif(not KOLO, reason="set KOLO_BIN to the kolo binary (the suite does)")
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_fifty_worlds_in_one_process(transport):
    env = dict(os.environ, KOLO_TRANSPORT=transport)
    p = subprocess.run([KOLO, "run", "-n", "2", "--", sys.executable, "-c", SCRIPT],
                       capture_output=True, text=True, timeout=120, env=env)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert out.count("ok worlds") == 2, out[-3000:]
