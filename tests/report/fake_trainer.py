#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A stand-in for examples/mini_gpt in check_scale.py: takes mini_gpt's flags, allocates and
touches the memory its spec tells it to, and prints what `mini_gpt --json` prints (one JSON
object per step, then a summary).

The spec is a JSON file named by $SPILLWAY_FAKE_TRAINER_SPEC:
    {"argv_log": FILE,                        each run appends its argv as one JSON line
     "models": {INIT: {OFFLOAD: {
         "alloc_mib": N,                      touched before the first step (its peak)
         "losses": [...], "ms": [...],        one per step (the last repeats)
         "read_bytes": R, "write_bytes": W,   the path's bytes per step (offloaded rows)
         "fields": "default" | "alt" | "per_step",   which names it prints: the summary's
                                              totals, other names nested per path, or (as
                                              today's mini_gpt) per-step parts and no summary
         "refuse": "message"                  exit 2 with this line on stderr
     }}}}
"""

import argparse
import json
import os
import sys


def vm_hwm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    for flag in ("--init", "--offload", "--memory-budget", "--steps", "--batch", "--seq", "--threads", "--path"):
        ap.add_argument(flag)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with open(os.environ["SPILLWAY_FAKE_TRAINER_SPEC"]) as f:
        spec = json.load(f)
    if spec.get("argv_log"):
        with open(spec["argv_log"], "a") as f:
            f.write(json.dumps(sys.argv[1:]) + "\n")
    m = spec["models"][a.init][a.offload]
    if m.get("refuse"):
        print(m["refuse"], file=sys.stderr)
        return 2
    n = int(m.get("alloc_mib", 0)) << 20
    held = bytearray(n)
    held[::4096] = b"\x01" * len(range(0, n, 4096))  # touch every page: resident, charged
    steps = int(a.steps)
    fields = m.get("fields", "default")
    for i in range(steps):
        obj = {"step": i + 1, "loss": m["losses"][min(i, len(m["losses"]) - 1)],
               "ms": m["ms"][min(i, len(m["ms"]) - 1)], "tokens_per_s": 1.0}
        if fields == "per_step":  # today's mini_gpt --offload params: the streams' bytes, no summary
            r, w = m.get("read_bytes", 0), m.get("write_bytes", 0)
            obj.update(peak_rss_bytes=vm_hwm_bytes(), memory_budget=a.memory_budget, param_read_bytes=r * 3 // 4,
                       param_written_bytes=w // 4, state_read_bytes=r - r * 3 // 4, state_written_bytes=w - w // 4)
        print(json.dumps(obj), flush=True)
    if fields == "per_step":
        return 0
    shape = {"padded_vocab_size": 256, "channels": 64, "max_seq_len": 64}
    if fields == "alt":  # other names, nested, per path: what the parser's alias table accepts
        summary = {"summary": dict(shape, vm_hwm_bytes=vm_hwm_bytes(), budget_bytes=a.memory_budget,
                                   paths=[{"dir": a.path, "read_bytes": m.get("read_bytes", 0) / 2,
                                           "write_bytes": m.get("write_bytes", 0) / 2},
                                          {"dir": "/dev/shm", "read_bytes": m.get("read_bytes", 0) / 2,
                                           "write_bytes": m.get("write_bytes", 0) / 2}])}
    else:
        summary = dict(shape, summary=True, peak_rss_bytes=vm_hwm_bytes(),
                       path_read_bytes_per_step=m.get("read_bytes", 0),
                       path_write_bytes_per_step=m.get("write_bytes", 0))
    print(json.dumps(summary), flush=True)
    del held
    return 0


if __name__ == "__main__":
    sys.exit(main())
