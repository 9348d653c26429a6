"""The flight recorder from Python: a rank stuck in its own code, under `kolo run` (numpy API)
and under torchrun (the torch backend); `kolo diagnose` names the collective, the stuck rank
with its Python frame and the rank that waited with the line it called from."""

import os
import shutil
import socket
import subprocess
import sys

import pytest

KOLO = os.environ.get("KOLO_BIN") or shutil.which("kolo")

NUMPY_PROGRAM = r"""
import time
import numpy as np
import kolo

def load_batch(c, step):
    if c.rank == 1 and step == 3:
        time.sleep(60)  # stuck in its own code
    return np.ones(1000, dtype=np.float32)

c = kolo.init()
for step in range(6):
    x = load_batch(c, step)
    c.all_reduce(x)
"""

TORCH_PROGRAM = r"""
import datetime, time
import torch, torch.distributed as dist
import kolo.torch

def load_batch(step):
    if dist.get_rank() == 1 and step == 3:
        time.sleep(60)  # stuck in its own code
    return torch.ones(1000)

dist.init_process_group("kolo", timeout=datetime.timedelta(seconds=3))
for step in range(6):
    x = load_batch(step)
    dist.all_reduce(x)
"""


def diagnose(trace):
    p = subprocess.run([KOLO, "diagnose", str(trace)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def line_of(text, needle):
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def check(report, program):
    text = program.read_text()
    call, stuck = line_of(text, "all_reduce(x)"), line_of(text, "time.sleep(60)")
    assert "2 of 2 ranks left a flight record" in report, report
    assert "collective #3: all_reduce f32 × 1,000 (sum" in report, report
    assert f"rank 0 waited in it and failed, up to 3.0 s at {program}:{call} in <module>" in report, report
    assert "rank 1 never entered collective #3: its last completed collective was #2" in report
    assert f"its Python main thread is at {program}:{stuck} in load_batch" in report, report


@pytest.mark.skipif(not KOLO, reason="set KOLO_BIN to the kolo binary (the suite does)")
def test_a_stuck_rank_under_kolo_run(tmp_path):
    program = tmp_path / "stuck.py"
    program.write_text(NUMPY_PROGRAM)
    env = dict(os.environ, KOLO_TIMEOUT="3", KOLO_TRACE_DIR=str(tmp_path / "trace"))
    p = subprocess.run([KOLO, "run", "-n", "2", "--", sys.executable, str(program)],
                       capture_output=True, text=True, timeout=120, env=env)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert f"flight records of 2 of this node's 2 workers are in {tmp_path / 'trace'}" in out, out
    check(diagnose(tmp_path / "trace"), program)


@pytest.mark.skipif(not KOLO, reason="set KOLO_BIN to the kolo binary (the suite does)")
def test_a_stuck_rank_under_torchrun(tmp_path):
    pytest.importorskip("torch")
    program = tmp_path / "stuck.py"
    program.write_text(TORCH_PROGRAM)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1", KOLO_TRACE_DIR=str(tmp_path / "trace"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(port), str(program)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode != 0, p.stdout + p.stderr
    check(diagnose(tmp_path / "trace"), program)


def test_dump_on_demand(tmp_path, monkeypatch):
    import json

    import kolo

    monkeypatch.setenv("KOLO_TRACE_DIR", str(tmp_path))
    import numpy as np

    comms = kolo.local_world(1)
    x = np.ones(3)
    comms[0].all_reduce(x)
    path = comms[0].dump_flight_record("asked")
    record = json.loads(open(path).read())
    assert record["reason"] == "asked"
    assert [o["op"] for o in record["groups"][0]["collectives"]] == ["all_reduce"]


@pytest.mark.skipif(not KOLO, reason="set KOLO_BIN to the kolo binary (the suite does)")
def test_a_job_that_goes_well_leaves_nothing_behind(tmp_path):
    program = tmp_path / "fine.py"
    program.write_text("import numpy as np, kolo\nc = kolo.init()\nc.all_reduce(np.ones(4))\n")
    env = dict(os.environ, KOLO_TRACE_DIR=str(tmp_path / "trace"))
    p = subprocess.run([KOLO, "run", "-n", "2", "--", sys.executable, str(program)],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert not (tmp_path / "trace").exists(), os.listdir(tmp_path / "trace")
