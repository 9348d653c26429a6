"""The torch.distributed backend "kolo" under the real launcher: torchrun starts the ranks of
tests/torch_worker.py (every collective against references, DDP's gradients, a mismatch, bad
input), and a rank that dies is named by the survivor. Skipped where torch is not installed."""

import os
import re
import shutil
import socket
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "torch_worker.py")
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")


def torchrun(args, n=2, timeout=240, env=None):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n),
           "--master_port", str(free_port())] + args
    e = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)
    return p.returncode, p.stdout + p.stderr


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def passes(out, name):
    return sum(1 for line in out.splitlines() if line.startswith(f"PASS {name}"))


@pytest.mark.parametrize("n", [2, 3])
def test_every_collective(n):
    rc, out = torchrun([WORKER, "collectives"], n=n)
    assert rc == 0, out[-3000:]
    for name in ["all_reduce torch.bfloat16", "all_reduce avg", "broadcast", "all_gather list",
                 "all_gather_into_tensor in place", "reduce_scatter_tensor", "reduce_scatter list",
                 "scatter", "all_to_all_single", "all_to_all list", "all_gather_object",
                 "async work's future", "new_group all_reduce", "split_group all_reduce",
                 "split_group non-member", "monitored_barrier"]:
        assert passes(out, name) >= 2, (name, out[-3000:])
    assert out.count("DONE") == n


def test_ddp_gradients_are_the_mean():
    rc, out = torchrun([WORKER, "ddp"])
    assert rc == 0, out[-3000:]
    assert passes(out, "DDP gradients are the mean") == 2


def test_mismatch_raises_on_every_rank():
    rc, out = torchrun([WORKER, "mismatch"])
    assert rc == 0, out[-3000:]
    for name in ["mismatch raises", "names the other rank", "names both calls", "within seconds"]:
        assert passes(out, name) == 2, (name, out[-3000:])


def test_bad_input():
    rc, out = torchrun([WORKER, "bad_input"])
    assert rc == 0, out[-3000:]
    assert out.count("PASS") >= 2 + 10, out[-3000:]


def test_dead_rank_is_named_by_the_survivor():
    # By hand (torchrun would stop the survivor as soon as the other rank exits).
    port = free_port()
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, WORKER, "dead"], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert procs[1].returncode == 3
    assert procs[0].returncode == 0, outs[0][-3000:]
    assert passes(outs[0], "a dead rank is a PeerError naming it") == 1
    assert passes(outs[0], "within seconds") == 1


def test_training_matches_gloo():
    # The same DDP training, same seed, on Gloo and on kolo: the same parameters afterwards.
    sums = {}
    for backend in ["gloo", "kolo"]:
        rc, out = torchrun([WORKER, "train"], env={"BACKEND": backend})
        assert rc == 0, out[-3000:]
        line = [x for x in out.splitlines() if x.startswith("PARAMS ")]
        assert len(line) == 2, out[-3000:]
        sums[backend] = [float(v) for v in line[0].split()[1:]]
    assert sums["kolo"] == pytest.approx(sums["gloo"], rel=1e-5, abs=1e-6)


def test_sharded_training_matches_gloo(tmp_path):
    # PyTorch's sharded and model-parallel training (FSDP2, FSDP1, ZeroRedundancyOptimizer, tensor
    # and pipeline parallelism) and its sharded checkpoints (torch.distributed.checkpoint) on
    # kolo: the losses Gloo gives, step for step.
    losses = {}
    for backend in ["gloo", "kolo"]:
        env = {"BACKEND": backend, "CHECKPOINT_DIR": str(tmp_path / backend)}
        rc, out = torchrun([WORKER, "sharded"], env=env)
        assert rc == 0, out[-3000:]
        assert passes(out, "checkpoint loads the saved parameters") == 2, out[-3000:]
        rows = [x.split() for x in out.splitlines() if x.startswith("LOSSES ")]
        losses[backend] = {row[1]: [float(v) for v in row[2:]] for row in rows}
        assert sorted(losses[backend]) == ["fsdp1", "fsdp2", "pp", "tp", "zero"], out[-3000:]
        assert len(rows) == 9, out[-3000:]  # every rank each kind, the last stage the pipeline's
    for kind, want in losses["gloo"].items():
        assert losses["kolo"][kind] == pytest.approx(want, rel=1e-6), kind


def test_mpi4py_examples_under_torchrun():
    rc, out = torchrun([os.path.join(EXAMPLES, "matrix.py")], n=2)
    assert rc == 0, out[-3000:]
    assert "sum: 28.0" in out and "squares: 0 1 4 9 16 25 36 49" in out
    rc, out = torchrun([os.path.join(EXAMPLES, "hello.py")], n=3)
    assert rc == 0, out[-3000:]
    # The ranks share one pipe and Python under torchrun is unbuffered: lines may run together.
    assert sorted(re.findall(r"Hello world from process \d of \d", out)) == [
        f"Hello world from process {r} of 3" for r in range(3)
    ]


def test_allreduce_of_several_tensors_is_one_call_per_dtype():
    # The tensors of a dtype are flattened into one buffer and reduced by one call; the results
    # are copied back into them. One Work for the lot: kolo's Work, and torch's.
    import threading

    import torch.distributed as dist

    import kolo
    import kolo.torch as kt
    from kolo import _kolo

    class Counting:
        def __init__(self, native):
            self.native, self.sizes = native, []

        def __getattr__(self, name):
            return getattr(self.native, name)

        def all_reduce(self, buf, op, dtype=None, done=None):
            self.sizes.append(len(buf))
            return self.native.all_reduce(buf, op, dtype=dtype, done=done)

    comms = [Counting(c) for c in _kolo.local_communicators(2, 10.0)]
    out = [None, None]

    def body(r):
        pg = kt.ProcessGroupKolo(comms[r], r, 2)
        ts = [torch.full((3,), r + 1.0), torch.full((2, 2), r + 1, dtype=torch.int64),
              torch.full((4,), 10.0 * (r + 1)), torch.tensor([r == 0, False])]
        w = pg.allreduce_coalesced(ts)
        w.wait()
        out[r] = (ts, w)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    for r, c in enumerate(comms):
        assert out[r] is not None, f"rank {r} did not finish"
        assert c.sizes == [7, 4, 2]  # float32 (3 + 4 elements), int64, bool
        (f, i, g, b), w = out[r]
        assert f.tolist() == [3.0] * 3 and g.tolist() == [30.0] * 4
        assert i.tolist() == [[3, 3], [3, 3]] and b.tolist() == [True, False]
        assert isinstance(w, kolo.Work) and isinstance(w, dist.Work) and w.is_success()
        assert w.get_future().value() is out[r][0]


def test_a_torch_without_the_hooks_is_a_clear_import_error():
    import types

    import kolo.torch as kt

    class Backend:
        @staticmethod
        def register_backend(name, func):  # the old signature: no extended_api, no devices
            pass

    old = types.SimpleNamespace(is_available=lambda: True, ProcessGroup=object, Backend=Backend,
                                ReduceOp=object, TCPStore=object)
    with pytest.raises(ImportError, match=r"torch\.distributed\.Work.*extended_api.*devices"):
        kt._check_torch(old)
    with pytest.raises(ImportError, match="built without it"):
        kt._check_torch(types.SimpleNamespace(is_available=lambda: False))
    kt._check_torch(torch.distributed)  # this torch has everything


KOLO = os.environ.get("KOLO_BIN") or shutil.which("kolo")
needs_kolo = pytest.mark.skipif(not KOLO, reason="set KOLO_BIN to the kolo binary (the suite does)")


def kolo_run(args, n=2, timeout=240, env=None):
    e = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    p = subprocess.run([KOLO, "run", "-n", str(n), "--"] + args, capture_output=True, text=True,
                       timeout=timeout, env=e)
    return p.returncode, p.stdout + p.stderr


@needs_kolo
def test_pytorch_programs_run_under_kolo_run():
    # kolo run's store answers torch's env:// rendezvous; on either backend the same training.
    sums = {}
    for backend in ["gloo", "kolo"]:
        rc, out = kolo_run([sys.executable, WORKER, "train"], env={"BACKEND": backend})
        assert rc == 0, out[-3000:]
        # destroy_process_group ends the group cleanly: no rank fails, so no flight record.
        assert "flight record" not in out and "aborted" not in out, out[-3000:]
        line = [x for x in out.splitlines() if "PARAMS " in x]
        assert len(line) == 2, out[-3000:]
        sums[backend] = [float(v) for v in line[0].split("PARAMS ")[1].split()]
    assert sums["kolo"] == pytest.approx(sums["gloo"], rel=1e-5, abs=1e-6)
    rc, out = kolo_run([sys.executable, os.path.join(EXAMPLES, "matrix.py")], n=4)
    assert rc == 0, out[-3000:]
    assert "sum: 28.0" in out


@pytest.mark.skipif(not os.path.isdir("/usr/share/datasets/fashion-mnist"),
                    reason="needs Debian's dataset-fashion-mnist")
def test_ddp_lenet_example_trains_on_kolo():
    # The book's PyTorch quick start: the example as it is, on a slice of the data.
    rc, out = torchrun([os.path.join(EXAMPLES, "ddp_lenet.py"), "--epochs", "1", "--limit", "4096"])
    assert rc == 0, out[-3000:]
    summary = [x for x in out.splitlines() if '"backend": "kolo"' in x]
    assert len(summary) == 1, out[-3000:]
    assert '"workers": 2' in summary[0], summary[0]
