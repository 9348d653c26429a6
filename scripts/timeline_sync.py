#!/usr/bin/env python3
"""Per-step backward and exposed gradient-sync time from kolo timelines (`kolo train --timeline`,
or `Ddp::set_timeline` in your own loop): the median and mean, over every rank's steps, of the
"backward" and "gradient sync" spans (the wait for the buckets after backward: communication
that did not overlap it, plus waiting for a slower rank), each rank's first step left out (it
re-lays the buckets).

    python3 scripts/timeline_sync.py TIMELINE.json [...]
"""
import json
import statistics
import sys


def main(paths):
    for path in paths:
        with open(path) as f:
            d = json.load(f)
        events = d["traceEvents"] if isinstance(d, dict) else d
        per = {}
        for e in events:
            if e.get("ph") == "X" and e.get("name") in ("backward", "gradient sync"):
                per.setdefault((e["pid"], e["name"]), []).append(e["dur"] / 1000)
        out = []
        for name in ("backward", "gradient sync"):
            vals = [v for (_, n), vs in per.items() if n == name for v in vs[1:]]
            if not vals:
                out.append(f"{name}: none")
                continue
            out.append(f"{name} median {statistics.median(vals):.1f} ms, "
                       f"mean {statistics.mean(vals):.1f} ms ({len(vals)} steps)")
        print(f"{path}: " + "; ".join(out))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
