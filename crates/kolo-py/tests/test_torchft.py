"""kolo as torchft's process group: three ranks all-reduce in one quorum, rank 2 is SIGKILLed, the
survivors' next all-reduce raises an error naming it (no hang), they abort the group and
reconfigure it, as torchft's Manager does, into a quorum of two that works."""

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchft", reason="pip install torchft")
import torch.distributed as dist  # noqa: E402

WORKER = r"""
import datetime, os, signal, sys
import torch
import torch.distributed as dist
from kolo.torchft import ProcessGroupKolo

rank, port = int(sys.argv[1]), sys.argv[2]
pg = ProcessGroupKolo(timeout=datetime.timedelta(seconds=20))
pg.configure(f"127.0.0.1:{port}/quorum0", "replica", rank, 3)
t = torch.full((4,), float(rank + 1))
pg.allreduce([t], dist.AllreduceOptions()).wait()
print(f"rank {rank} quorum0 {t[0].item()} {pg.getBackendName()}", flush=True)
if rank == 2:
    os.kill(os.getpid(), signal.SIGKILL)
try:
    pg.allreduce([torch.ones(4)], dist.AllreduceOptions()).wait()
    print(f"rank {rank} no error", flush=True)
except Exception as e:
    print(f"rank {rank} error: {e}", flush=True)
pg.abort()
pg.configure(f"127.0.0.1:{port}/quorum1", "replica", rank, 2)
t = torch.full((4,), float(rank + 1))
pg.allreduce([t], dist.AllreduceOptions()).wait()
print(f"rank {rank} quorum1 {t[0].item()}", flush=True)
"""


def test_survivors_reconfigure_after_a_lost_rank(tmp_path):
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    program = tmp_path / "worker.py"
    program.write_text(WORKER)
    env = dict(os.environ, KOLO_HEARTBEAT_TIMEOUT="3")
    procs = [
        subprocess.Popen(
            [sys.executable, str(program), str(r), str(store.port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for r in range(3)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    text = "\n".join(outs)
    for r in range(3):
        assert f"rank {r} quorum0 6.0 torchft-kolo" in outs[r], text
    assert procs[2].returncode == -9, text
    for r in (0, 1):
        assert procs[r].returncode == 0, text
        err = next(line for line in outs[r].splitlines() if line.startswith(f"rank {r} error: "))
        assert "rank 2" in err, text
        assert f"rank {r} quorum1 {float(1 + 2)}" in outs[r], text
