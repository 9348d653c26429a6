"""mpi4py's own demo programs under `kolo run -n 2` with ``from mpi4py import MPI`` changed to
``from kolo import MPI``: a quick run of a few (the OSU programs with small sizes and few
iterations). Only where mpi4py's source distribution is on this machine already
(``~/.cache/kolo/mpi4py/mpi4py-4.1.2.tar.gz``, where ``scripts/osu_mpi4py.py`` puts it and
``scripts/test.sh`` downloads it before the tests): the tests themselves download nothing. scripts/osu_mpi4py.py runs them all, in full, against mpi4py."""

import json
import os
import shutil
import subprocess
import sys
import tarfile

import pytest

KOLO = os.environ.get("KOLO_BIN") or shutil.which("kolo")
SDIST = os.path.join(os.path.expanduser(os.environ.get("KOLO_CACHE", "~/.cache/kolo")),
                     "mpi4py", "mpi4py-4.1.2.tar.gz")
pytestmark = [
    pytest.mark.skipif(not KOLO, reason="set KOLO_BIN to the kolo binary (the suite does)"),
    pytest.mark.skipif(not os.path.exists(SDIST), reason=f"mpi4py's sdist is not at {SDIST}"),
]

# Runs a demo as __main__, or (with a function name) calls its function with small arguments.
RUNNER = """\
import io, json, runpy, sys
sys.stdin = io.StringIO("1000\\n0\\n")
path, fn, kwargs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
ns = runpy.run_path(path, run_name="__main__" if not fn else "demo")
if fn:
    ns[fn](**kwargs)
"""
SMALL = {"MAX_MSG_SIZE": 1 << 12, "skip": 2, "loop": 5, "skip_large": 1, "loop_large": 2}


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    """The demos, with the import changed, in a temporary directory."""
    out = tmp_path_factory.mktemp("mpi4py-demos")
    with tarfile.open(SDIST) as t:
        for m in t.getmembers():
            if m.isfile() and m.name.endswith(".py") and "/demo/" in m.name:
                text = t.extractfile(m).read().decode()
                name = m.name.split("/demo/", 1)[1].replace("/", "_")
                (out / name).write_text(text.replace("from mpi4py import MPI", "from kolo import MPI"))
    (out / "runner.py").write_text(RUNNER)
    return out


def run(demos, name, fn="", **kwargs):
    cmd = [KOLO, "run", "-n", "2", "--", sys.executable, str(demos / "runner.py"),
           str(demos / name), fn, json.dumps(kwargs)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_helloworld(demos):
    out = run(demos, "helloworld.py")
    for r in range(2):
        assert f"I am process {r} of 2 on " in out


def test_compute_pi(demos):
    assert "pi is approximately 3.14159" in run(demos, "compute-pi_cpi-cco.py")


@pytest.mark.parametrize("prog", ["osu_latency", "osu_bw", "osu_bibw", "osu_bcast",
                                  "osu_allgather", "osu_alltoall", "osu_alltoallv", "osu_gather",
                                  "osu_scatter", "osu_multi_lat", "osu_barrier"])
def test_osu(demos, prog):
    kwargs = dict(SMALL)
    if prog in ("osu_bw", "osu_bibw"):
        kwargs.update(window_size=4, window_size_large=2)
    if prog == "osu_multi_lat":
        kwargs = {"MAX_MSG_SIZE": 1 << 12, "skip_small": 2, "loop_small": 5, "skip_large": 1,
                  "loop_large": 2}
    out = run(demos, f"{prog}.py", prog, **kwargs)
    rows = [line.split() for line in out.splitlines() if line.startswith("[rank 0]")]
    sizes = [int(r[2]) for r in rows if len(r) == 4 and r[2].isdigit()]
    assert sizes and sizes[-1] == (0 if prog == "osu_barrier" else 1 << 12), out
