#!/usr/bin/env python3
"""PyTorch's own TCPStore client against kolo's c10d store server (crates/kolo-store/examples/
c10d_server.rs): every operation torch's client has, so that kolo's server, which the test suite
uses as a stand-in for torchrun's store, is checked against the real client.

    python3 scripts/check_c10d_server.py [PATH_TO_c10d_server]   (needs torch)
Prints one line per check and `c10d-server: N passed, M failed`; exits 1 on a failure.
"""
import datetime
import os
import subprocess
import sys

import torch.distributed as dist

exe = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(__file__), "..", "target", "debug", "examples", "c10d_server")
server = subprocess.Popen([exe], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
host, port = server.stdout.readline().strip().rsplit(":", 1)
passed = failed = 0


def check(name, got, want):
    global passed, failed
    if got == want:
        passed += 1
        print(f"ok - {name}")
    else:
        failed += 1
        print(f"FAIL - {name}: got {got!r}, want {want!r}")


try:
    s = dist.TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=5),
                      use_libuv=False)
    s.set("k", "v")
    check("set/get", s.get("k"), b"v")
    check("add", (s.add("n", 5), s.add("n", -2)), (5, 3))
    check("add stores text", s.get("n"), b"3")
    check("check", (s.check(["k", "n"]), s.check(["k", "nope"])), (True, False))
    check("compare_set swaps", s.compare_set("c", "", "one"), b"one")
    check("compare_set mismatch", s.compare_set("c", "zzz", "two"), b"one")
    check("compare_set match", s.compare_set("c", "one", "two"), b"two")
    s.append("k", "!")
    check("append", s.get("k"), b"v!")
    s.multi_set(["m1", "m2"], ["a", "b"])
    check("multi_get", s.multi_get(["m1", "m2"]), [b"a", b"b"])
    check("num_keys", s.num_keys(), 5)
    check("delete", (s.delete_key("m1"), s.delete_key("m1")), (True, False))
    try:
        s.wait(["never"], datetime.timedelta(milliseconds=300))
        check("wait times out", "returned", "timeout")
    except Exception as e:  # torch raises DistStoreError
        check("wait times out", "timeout" in str(e).lower(), True)
    s.set("later", "x")
    s.wait(["later"], datetime.timedelta(seconds=2))
    check("the connection works after a canceled wait", s.get("later"), b"x")
finally:
    server.stdin.close()
    server.wait(timeout=10)
print(f"c10d-server: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
