"""A few tests of PyTorch's own distributed suite (``distributed_test._DistTestBase``, as PyTorch
runs it for Gloo) on the kolo backend, through scripts/torch_dist_suite.py: those of the calls kolo
once failed (coalesced all-gather, batch_isend_irecv, monitored_barrier, int8 broadcast, receive
from any source, a barrier's timeout message, the sparse all-reduce). The whole selection, on both
backends, is ``python scripts/torch_dist_suite.py`` (see there). Skipped without torch and
``expecttest`` (which torch's test utilities import)."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("expecttest")

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "scripts",
                      "torch_dist_suite.py")
TESTS = [
    "test_all_gather_coalesced_simple",
    "test_batch_isend_irecv_gloo",
    "test_monitored_barrier_gloo",
    "test_monitored_barrier_gloo_rank_0_timeout",
    "test_broadcast",
    "test_send_recv_any_source",
    "test_barrier_timeout_full_group",
    "test_sparse_all_reduce_sum",
]


def test_pytorch_suite_subset_passes_on_kolo(tmp_path):
    cmd = [sys.executable, SCRIPT, "--backends", "kolo", "--exact", "--strict", "--quiet",
           "--timeout", "60", "--logs", str(tmp_path)]
    for t in TESTS:
        cmd += ["-k", t]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    log = ""
    if p.returncode != 0 and (tmp_path / "kolo.log").exists():
        log = (tmp_path / "kolo.log").read_text()[-6000:]
    assert p.returncode == 0, out + "\n--- log (end) ---\n" + log
    # Every test ran and passed: none skipped, none missing.
    row = [ln.split() for ln in out.splitlines() if ln.startswith("kolo ")]
    assert row and row[0][1:5] == [str(len(TESTS)), str(len(TESTS)), "0", "0"], out
