"""Runs a worker script of this directory under `kolo run -n 2` on shared memory and collects the
JSON line each rank prints (a dict with its "rank")."""

import json
import os
import shutil
import subprocess
import sys

KOLO = os.environ.get("KOLO_BIN") or shutil.which("kolo")


def run_two(worker, *args, **env):
    """Each rank's findings, by rank; fails with the output if the job failed."""
    script = os.path.join(os.path.dirname(__file__), worker)
    p = subprocess.run([KOLO, "run", "-n", "2", "--", sys.executable, script, *args],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, KOLO_TRANSPORT="shm", **env))
    assert p.returncode == 0, p.stdout + p.stderr
    found = {}
    for line in p.stdout.splitlines():
        if "{" in line:
            got = json.loads(line[line.index("{"):])
            found[got["rank"]] = got
    return found
