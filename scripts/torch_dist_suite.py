#!/usr/bin/env python3
"""PyTorch's own distributed test suite against the kolo backend and Gloo, side by side.

    python scripts/torch_dist_suite.py [--backends gloo,kolo] [-k PATTERN ...] [--exact] [--list]
        [--timeout 120] [--json FILE] [--logs DIR] [--quiet] [--strict]

Runs the CPU tests of ``torch.testing._internal.distributed.distributed_test`` (``_DistTestBase``,
spawned as PyTorch's ``test/distributed/test_distributed_spawn.py`` does: one process per rank,
WORLD_SIZE=2) once per backend, each backend in a process of its own, and prints per backend how
many passed, failed and were skipped, the tests whose outcome differs between the backends (with
the first line of each failure), and the elapsed time. Run it with the Python of a venv that has
torch, ``expecttest`` (torch's test utilities import it) and the kolo wheel installed. Nothing of
PyTorch's is copied here: the test module comes from the installed torch (the wheel ships
``torch.testing._internal``).

The selection is every test whose name matches one of ``CATEGORIES`` (collectives, point to point,
barriers, groups, objects, DDP, join), less those of CUDA or NCCL (``EXCLUDE``); ``-k`` narrows it
to names containing any of the given substrings.

kolo runs as Gloo does: the test module reads its backend from the environment when it is
imported and decides, with comparisons such as ``BACKEND != "gloo"`` and look-ups such as
``BACKEND in DistTestCases.backend_feature["ddp"]``, which tests run and what they expect. For
kolo it is handed a name (``_AsGloo``) that is ``"kolo"`` where it reaches torch
(``init_process_group(backend=BACKEND)``) and equal to ``"gloo"`` in those comparisons, and "kolo"
joins every feature set of ``DistTestCases`` that names Gloo; so kolo is held to every test and
every branch written for Gloo, its error messages included.

Exit status: 0, or with ``--strict`` 1 when a test of any backend failed.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import unittest

CATEGORIES = {
    "collectives": r"broadcast|reduce|gather|scatter|all_to_all|coalesc",
    "p2p": r"send|recv",
    "barrier": r"barrier",
    "groups": r"group|get_rank|get_backend|destroy|Backend_enum",
    "objects": r"object",
    "DDP": r"ddp|DistributedDataParallel",
    "join": r"join|uneven",
}
EXCLUDE = r"cuda|nccl|gpu"
WORLD_SIZE = "2"


class _AsGloo(str):
    """kolo's name as the test module sees it: ``"kolo"`` as a string (what torch gets), equal to
    ``"gloo"`` too in comparisons, and hashed as ``"gloo"`` (so that ``BACKEND in {"gloo"}``
    holds)."""

    def __eq__(self, other):
        return isinstance(other, str) and str.__str__(other) in ("gloo", str.__str__(self))

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        return hash("gloo")

    def __reduce__(self):
        return (_AsGloo, (str.__str__(self),))


def _import_suite(backend):
    """Imports torch's distributed test module for `backend` (its decorators run at import)."""
    from torch.testing._internal import common_distributed

    sets = common_distributed.DistTestCases.backend_feature
    if backend != "gloo":
        for names in sets.values():
            if "gloo" in names:
                names.add(backend)
        sets["plugin"].add(backend)
    name = _AsGloo(backend) if backend != "gloo" else backend
    env = os.environ

    class _Env(type(env)):
        def __getitem__(self, key):
            return name if key == "BACKEND" else super().__getitem__(key)

    view = _Env.__new__(_Env)
    view.__dict__.update(env.__dict__)  # the same variables, BACKEND read as `name`
    os.environ = view
    try:
        from torch.testing._internal.distributed import distributed_test
    finally:
        os.environ = env
    return distributed_test


# In a worker (and in the processes it spawns, which import this file again): the test class.
if os.environ.get("KOLO_TORCH_SUITE_BACKEND"):
    os.environ["BACKEND"] = os.environ["KOLO_TORCH_SUITE_BACKEND"]
    os.environ.setdefault("WORLD_SIZE", WORLD_SIZE)
    _dt = _import_suite(os.environ["BACKEND"])

    class TestDistBackendWithSpawn(_dt.TestDistBackend, _dt.DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._spawn_processes()


def selected(names, patterns=None, exact=False):
    """The test names of the selection (narrowed to those containing one of `patterns`, or, with
    `exact`, named so)."""
    every = "|".join(f"(?:{r})" for r in CATEGORIES.values())
    out = []
    for n in sorted(names):
        if not n.startswith("test_") or re.search(EXCLUDE, n) or not re.search(every, n):
            continue
        if patterns and not any(p == n if exact else p in n for p in patterns):
            continue
        out.append(n)
    return out


class _Record(unittest.TextTestResult):
    """Outcome of each test: pass, fail (failures and errors) or skip, with the failure's text;
    one line per test on stdout (the log has the rest)."""

    progress = True

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.outcomes = {}
        self.started = {}

    def _name(self, test):
        return test.id().rsplit(".", 1)[-1]

    def startTest(self, test):
        super().startTest(test)
        self.started[self._name(test)] = time.monotonic()

    def stopTest(self, test):
        super().stopTest(test)
        name = self._name(test)
        if self.progress and name in self.outcomes:
            took = time.monotonic() - self.started.get(name, time.monotonic())
            print(f"  {os.environ['BACKEND']}: {name}: {self.outcomes[name][0]} ({took:.0f} s)",
                  flush=True)

    def addSuccess(self, test):
        super().addSuccess(test)
        self.outcomes[self._name(test)] = ("pass", "")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.outcomes[self._name(test)] = ("fail", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self.outcomes[self._name(test)] = ("fail", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.outcomes[self._name(test)] = ("skip", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self.outcomes[self._name(test)] = ("pass", "")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self.outcomes[self._name(test)] = ("fail", "unexpected success")


def worker(out, patterns, exact, quiet):
    """Runs the selection on this process's backend; writes {test: [outcome, text]} to `out`."""
    cls = globals()["TestDistBackendWithSpawn"]
    names = selected(unittest.TestLoader().getTestCaseNames(cls), patterns, exact)
    suite = unittest.TestSuite(cls(n) for n in names)
    _Record.progress = not quiet
    runner = unittest.TextTestRunner(stream=sys.stderr, verbosity=2, resultclass=_Record)
    result = runner.run(suite)
    with open(out, "w") as f:
        json.dump(result.outcomes, f)


def _first_line(text):
    """The line of a failure's text that says what went wrong (the last exception's)."""
    code = re.search(r"Expected exit code 0 but got (\d+)", text)
    if code:  # a rank failed outside the test's body (its traceback is in the log)
        return f"a rank exited with {code.group(1)} outside the test (see the log)"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[\w.]*(Error|Exception|Timeout\w*|Failure)\b", ln) or ln.startswith(
            ("AssertionError", "RuntimeError", "ValueError", "TypeError")
        ):
            return ln[:200]
    return lines[-1][:200] if lines else ""


def run_backend(backend, patterns, exact, timeout, quiet, logs):
    """Runs the worker for `backend` (its log, and that of the ranks it spawns, in `logs`); its
    outcomes and elapsed seconds."""
    env = dict(os.environ)
    env.pop("BACKEND", None)
    env["KOLO_TORCH_SUITE_BACKEND"] = backend
    env["WORLD_SIZE"] = WORLD_SIZE
    env["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(timeout)
    # One thread per rank for torch's intra-op work: the ranks share the machine's cores.
    env.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="kolo-torch-suite-") as tmp:
        out = os.path.join(tmp, "outcomes.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--out", out]
        for p in patterns or []:
            cmd += ["-k", p]
        cmd += ["--exact"] if exact else []
        cmd += ["--quiet"] if quiet else []
        start = time.monotonic()
        with open(os.path.join(logs, f"{backend}.log"), "w") as log:
            rc = subprocess.call(cmd, env=env, stderr=log, cwd=tmp)
        elapsed = time.monotonic() - start
        if not os.path.exists(out):
            raise SystemExit(f"torch_dist_suite: the {backend} worker exited with {rc}, no results")
        with open(out) as f:
            return json.load(f), elapsed


def report(results, elapsed):
    """Prints the table and the tests whose outcome differs; whether any test failed."""
    backends = list(results)
    print()
    print(f"{'backend':<8} {'tests':>6} {'passed':>7} {'failed':>7} {'skipped':>8} {'time':>8}")
    any_failed = False
    for b in backends:
        o = [v[0] for v in results[b].values()]
        n = {k: o.count(k) for k in ("pass", "fail", "skip")}
        any_failed |= n["fail"] > 0
        print(f"{b:<8} {len(o):>6} {n['pass']:>7} {n['fail']:>7} {n['skip']:>8} "
              f"{elapsed[b]:>7.0f}s")
    names = sorted(set().union(*(r.keys() for r in results.values())))
    differ = [n for n in names if len({results[b].get(n, ("missing",))[0] for b in backends}) > 1]
    if len(backends) > 1:
        print(f"\noutcomes that differ ({len(differ)}):")
        for n in differ:
            cols = ", ".join(f"{b}: {results[b].get(n, ('missing',))[0]}" for b in backends)
            print(f"  {n}: {cols}")
            for b in backends:
                kind, text = results[b].get(n, ("missing", ""))
                if kind == "fail":
                    print(f"      {b}: {_first_line(text)}")
    for b in backends:
        failed = [n for n in names if results[b].get(n, ("",))[0] == "fail"]
        if failed and (len(backends) == 1 or any(n not in differ for n in failed)):
            print(f"\n{b} failed:")
            for n in failed:
                print(f"  {n}: {_first_line(results[b][n][1])}")
    return any_failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="gloo,kolo")
    ap.add_argument("-k", dest="patterns", action="append", help="names containing this")
    ap.add_argument("--exact", action="store_true", help="-k gives whole test names")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per test")
    ap.add_argument("--json", help="write every outcome (and failure text) here")
    ap.add_argument("--list", action="store_true", help="print the selection and exit")
    ap.add_argument("--quiet", action="store_true", help="no line per test while running")
    ap.add_argument("--logs", help="directory for each backend's log (default: a new one)")
    ap.add_argument("--strict", action="store_true", help="exit 1 if a test failed")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.out, args.patterns, args.exact, args.quiet)
        return 0
    if args.list:
        os.environ.setdefault("BACKEND", "gloo")
        os.environ.setdefault("WORLD_SIZE", WORLD_SIZE)
        dt = _import_suite("gloo")
        names = selected(dir(dt.DistributedTest._DistTestBase), args.patterns, args.exact)
        print("\n".join(names))
        print(f"{len(names)} tests", file=sys.stderr)
        return 0
    start = time.monotonic()
    logs = args.logs or tempfile.mkdtemp(prefix="kolo-torch-suite-logs-")
    os.makedirs(logs, exist_ok=True)
    results, elapsed = {}, {}
    for b in args.backends.split(","):
        print(f"torch_dist_suite: running on {b} (log: {os.path.join(logs, b + '.log')}) ...",
              flush=True)
        results[b], elapsed[b] = run_backend(
            b, args.patterns, args.exact, args.timeout, args.quiet, logs
        )
    failed = report(results, elapsed)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print(f"\nelapsed: {time.monotonic() - start:.0f} s (torch {_torch_version()}, "
          f"WORLD_SIZE={WORLD_SIZE}, {os.cpu_count()} CPUs)")
    return 1 if failed and args.strict else 0


def _torch_version():
    import torch

    return torch.__version__


if __name__ == "__main__":
    sys.exit(main())
