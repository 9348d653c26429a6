#!/usr/bin/env python3
"""Checks the dev profile's list of host-only crates against the dependency graph.

The workspace's Cargo.toml builds dependencies at opt-level 2 (`[profile.dev.package] "*"`) and
names, at opt-level 0, every crate that only the compiler runs: proc macros, build scripts and what
only they depend on. A crate missing from that list builds slower than it needs to; a crate on it
that the tests link (it became a normal dependency of something) would run unoptimised. Either way
this exits 1 and says which line to add or remove.

Host-only means: in the graph with build and proc-macro edges, not in the graph without them
(`cargo tree -e normal,dev,no-proc-macro`).
"""

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def packages(edges: str) -> set[str]:
    out = subprocess.run(
        ["cargo", "tree", "--workspace", "--locked", "-e", edges, "--prefix", "none", "--format", "{p}"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def main() -> int:
    host_only = packages("normal,dev,build") - packages("normal,dev,no-proc-macro")
    table = tomllib.loads((ROOT / "Cargo.toml").read_text())["profile"]["dev"]["package"]
    listed = {name for name, settings in table.items() if name != "*" and settings.get("opt-level") == 0}
    missing = sorted(host_only - listed)
    linked = sorted(listed - host_only)
    for name in missing:
        print(f"check-host-crates: {name} is only run by the compiler; add to [profile.dev.package]: "
              f"{name} = {{ opt-level = 0 }}", file=sys.stderr)
    for name in linked:
        print(f"check-host-crates: {name} is listed at opt-level 0 but is no longer host-only "
              f"(the tests link it, or nothing uses it); remove its line from [profile.dev.package]",
              file=sys.stderr)
    if missing or linked:
        return 1
    print(f"check-host-crates: {len(listed)} host-only crates at opt-level 0, as the graph has them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
