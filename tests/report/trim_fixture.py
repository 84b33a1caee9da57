#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Cuts a benchmark's JSON down to a test fixture for report.generate.

Usage: trim_fixture.py IN.json OUT.json

How the fixtures in tests/report/fixtures/ were made: each benchmark ran at smoke size,
    cd build/<dir>/bench && SPILLWAY_BENCH_SMOKE=1 ./bench_<name> --benchmark_out=<key>.json \\
        --benchmark_out_format=json --benchmark_repetitions=2
and its output went through this script, which keeps the run context (less the cache list),
every repetition and the median and cv aggregates (the ones the report reads), and drops
the mean and stddev aggregates. A side file ({"machine", "date", "runs": [...]}) keeps two
runs per tier of stash_series.json (every mini-GPT run) and every fourth sample of a series.
"""

import json
import sys
from pathlib import Path


def trim_bench(doc: dict) -> dict:
    context = {k: v for k, v in doc.get("context", {}).items() if k != "caches"}
    rows = [b for b in doc["benchmarks"] if b.get("aggregate_name") not in ("mean", "stddev")]
    return {"context": context, "benchmarks": rows}


def thin(series: dict) -> dict:
    """Every fourth sample of a sampled series (its columns are lists of one length), the last kept."""
    columns = [k for k, v in series.items() if isinstance(v, list)]
    n = len(series[columns[0]]) if columns else 0
    keep = sorted(set(range(0, n, 4)) | ({n - 1} if n else set()))
    return {k: ([v[i] for i in keep] if k in columns else v) for k, v in series.items()}


def trim_side(doc: dict) -> dict:
    seen: dict[tuple, int] = {}
    runs = []
    for run in doc["runs"]:
        group = (run.get("tier"), run.get("config"), run.get("ranks"))
        if seen.get(group, 0) >= 2 and "offload" not in run:
            continue
        seen[group] = seen.get(group, 0) + 1
        runs.append({k: (thin(v) if isinstance(v, dict) else v) for k, v in run.items()})
    return {**doc, "runs": runs}


def main() -> int:
    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    doc = json.loads(src.read_text())
    out = trim_side(doc) if "runs" in doc else trim_bench(doc)
    dst.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
