#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""scripts/bench_scale.py: the scale benchmark: GPT-2 124M, 350M and 774M under a memory cap.

Usage (normally through `scripts/dev bench scale [ARGS]`, which builds release mini_gpt first):
    bench_scale.py --trainer build/release/examples/mini_gpt/mini_gpt [--cap 4G] [--budget 3.5G]
                   [--sizes gpt2,gpt2-medium,gpt2-large] [--steps 3] [--path DIR] [--out FILE]
    bench_scale.py --demo --trainer ...     GPT-2 XL, 5 steps under the cap, the loss at each step
    bench_scale.py --self-test              tests/report/check_scale.py against a fake trainer

What one run does:
1. Finds a memory cgroup it may create groups in: cgroup v1's memory controller (the group
   this process is in, under the controller's mount, e.g. /sys/fs/cgroup/memory/...) or
   cgroup v2 (memory.max, memory.peak, memory.events). With neither (not root, no
   controller, a v2 parent that does not delegate the memory controller), it says which and
   why, and exits with status 3: it never reports a cap it could not enforce.
2. Measures the --path's file system with fio (1 MiB O_DIRECT writes then reads, io_uring,
   fio's buffers on huge pages as Spillway's are), the bandwidth the bound uses.
3. For each model size: `none` inside a child group capped at --cap (memory.limit_in_bytes,
   and memory.memsw.limit_in_bytes where present, so swap cannot hide the cap; v2:
   memory.max and memory.swap.max 0), each run in a process of its own that joins the group
   before exec. A run SIGKILLed with an OOM event in its group is "killed by the cap". The
   compute time of the model is a `none` run without the cap (the capped `none` run itself
   when it completed without the group ever reaching its limit). Then the offloaded row
   (--mode, default `params`) with `--memory-budget` (default: the cap less 0.5 GiB) under
   the same cap.
4. Each row: peak RSS (the trainer's VmHWM from its JSON summary, else the kernel's
   ru_maxrss of the process, and the group's peak usage beside it), step time (median of
   the steps after --warmup), bytes per step to and from the path (the trainer's summary),
   the I/O time (read bytes / fio read bandwidth + written bytes / fio write bandwidth), the
   bound max(compute time, I/O time) and step time / bound.
5. Goals (met / not met): the offloaded rows' peak RSS under the cap at every size; from the
   smallest size to the largest, that peak grows by at most 25% apart from the embeddings
   ((Vp*C + maxT*C) * 4 B * 4 arrays: parameters, gradients, m, v); step time <= 1.25x the
   bound; the offloaded rows' losses bit-identical to `none`'s (per step, same seed).
6. JSON to --out (build/bench/scale.json; the demo: build/bench/scale_demo.json), read by
   scripts/bench_report.py's "scale" section, and a Markdown table on stdout. The previous
   JSON is removed first, so a failed run never leaves an old one behind as this run's.

The trainer's flags and JSON field names are in one table below (TRAINER_FLAGS, STEP_FIELDS,
TRAFFIC_PARTS, SUMMARY_FIELDS, PATH_FIELDS): each field is a list of accepted names, the first
present wins. Today's mini_gpt --offload params prints, in each step's object, peak_rss_bytes
(VmHWM so far), memory_budget and param_read_bytes, param_written_bytes, state_read_bytes,
state_written_bytes, act_read_bytes, act_written_bytes (the step's bytes through the path:
the parameter and moment streams' and the activation stash's), and no summary object with
--json.
Exit status: 0 the benchmark ran (goals may be unmet: see the table), 1 a run failed other
than by the cap (the table says which), 2 bad arguments, 3 no usable memory cgroup.
Python 3 standard library only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

# ==== The trainer's interface: edit here when examples/mini_gpt's flags or JSON change ========

# Flags passed to the trainer. None: the flag is not passed.
TRAINER_FLAGS = {
    "init": "--init",                 # --init gpt2|gpt2-medium|gpt2-large|gpt2-xl
    "offload": "--offload",           # --offload none|params|...
    "budget": "--memory-budget",      # --memory-budget SIZE (format_size_flag)
    "steps": "--steps",
    "batch": "--batch",
    "seq": "--seq",
    "threads": "--threads",
    "path": "--path",
    "json": "--json",                 # one JSON object per step, then the summary
}
# The offload mode of a `none` row.
NONE_MODE = "none"
# The offloaded row's mode (--mode overrides it).
OFFLOAD_MODE = "params"

# A per-step JSON object: the first of each list that the object has.
STEP_FIELDS = {
    "step": ["step"],
    "loss": ["loss"],
    "ms": ["ms", "step_ms"],
    # VmHWM so far (the run's peak: the largest over its steps), when the summary has none.
    "peak_rss": ["peak_rss_bytes", "vm_hwm_bytes", "vmhwm_bytes", "VmHWM_bytes"],
    "budget": ["memory_budget", "memory_budget_bytes", "budget_bytes"],
    # The step's path traffic (used when the summary has none: the median of the timed steps):
    # a total, or else the sum of the parts (TRAFFIC_PARTS) that the object has.
    "read_bytes": ["path_read_bytes", "read_bytes", "bytes_read"],
    "write_bytes": ["path_write_bytes", "written_bytes", "write_bytes", "bytes_written"],
}
# The parts of a step's (or the summary's) traffic, each a list of names, summed when no total
# is given: mini_gpt --offload params prints the parameter stream's and the m|v stream's bytes.
TRAFFIC_PARTS = {
    "read_bytes": [["param_read_bytes"], ["state_read_bytes"], ["grad_read_bytes"], ["act_read_bytes"]],
    "write_bytes": [["param_written_bytes", "param_write_bytes"], ["state_written_bytes", "state_write_bytes"],
                    ["grad_written_bytes", "grad_write_bytes"], ["act_written_bytes", "act_write_bytes"]],
}
# A JSON object on stdout without the step field is (part of) the summary. Objects nested
# under one of these keys are read as the summary too ({"summary": {...}}).
SUMMARY_NESTS = ["summary", "totals"]
SUMMARY_FIELDS = {
    "peak_rss": ["peak_rss_bytes", "vm_hwm_bytes", "vmhwm_bytes", "VmHWM_bytes", "rss_peak_bytes",
                 "max_rss_bytes", "peak_rss"],
    "budget": ["memory_budget_bytes", "memory_budget", "budget_bytes"],
    # Totals over every path, per step (or else the sum of TRAFFIC_PARTS' names with
    # "_per_step" appended, e.g. param_read_bytes_per_step).
    "read_bytes": ["path_read_bytes_per_step", "read_bytes_per_step", "bytes_read_per_step"],
    "write_bytes": ["path_write_bytes_per_step", "path_written_bytes_per_step", "write_bytes_per_step",
                    "written_bytes_per_step", "bytes_written_per_step"],
    # Or a list of paths, each an object with PATH_FIELDS (summed when the totals are absent).
    "paths": ["paths", "path_bytes", "path_traffic", "tiers"],
    # The model's shape, when the trainer reports it (else GPT2_CONFIGS).
    "params": ["params", "num_params", "num_parameters", "parameters"],
    "padded_vocab": ["padded_vocab_size", "Vp", "vocab_padded"],
    "channels": ["channels", "C", "n_embd"],
    "max_seq": ["max_seq_len", "maxT", "max_seq"],
}
PATH_FIELDS = {
    "name": ["path", "dir", "name"],
    "read_bytes": ["read_bytes_per_step", "read_bytes", "bytes_read_per_step", "from_bytes_per_step"],
    "write_bytes": ["write_bytes_per_step", "write_bytes", "bytes_written_per_step", "to_bytes_per_step"],
}

# GPT-2's shapes (the `--init` names): layers, channels, heads, vocabulary (padded to 128 as
# llm.c does), context. Parameters: Vp*C + maxT*C + L*(12*C*C + 13*C) + 2*C.
GPT2_CONFIGS = {
    "gpt2": dict(label="GPT-2 124M", L=12, C=768, NH=12, V=50257, Vp=50304, maxT=1024),
    "gpt2-medium": dict(label="GPT-2 350M", L=24, C=1024, NH=16, V=50257, Vp=50304, maxT=1024),
    "gpt2-large": dict(label="GPT-2 774M", L=36, C=1280, NH=20, V=50257, Vp=50304, maxT=1024),
    "gpt2-xl": dict(label="GPT-2 XL 1.56B", L=48, C=1600, NH=25, V=50257, Vp=50304, maxT=1024),
}
EMBEDDING_ARRAYS = 4  # parameters, gradients, Adam's m and v: fp32 each
GROWTH_GOAL = 0.25    # the offloaded peak grows by at most this from the smallest size to the largest
RATIO_GOAL = 1.25     # step time / bound at most this

GiB = 1 << 30
MiB = 1 << 20

# ==== Small helpers ===========================================================================


def log(msg: str) -> None:
    print(f"[bench_scale] {msg}", file=sys.stderr, flush=True)


def first(d: dict, names) -> object | None:
    """The value of the first of `names` that `d` has (None when none)."""
    for n in names:
        if n in d and d[n] is not None:
            return d[n]
    return None


def number(x) -> float | None:
    if isinstance(x, bool) or x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kKmMgGtT]?)(i?[bB])?\s*$")


def parse_size(text: str) -> int:
    """'4G', '3.5GiB', '512M', '1048576' -> bytes (binary units)."""
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (expected e.g. 4G, 3.5G, 512M)")
    scale = {"": 1, "k": 1 << 10, "m": MiB, "g": GiB, "t": 1 << 40}[m.group(2).lower()]
    return int(round(float(m.group(1)) * scale))


def format_size_flag(n: int) -> str:
    """A size as the trainer's --memory-budget takes it: '3.5G' where exact, else 'M', else bytes."""
    for unit, scale in (("G", GiB), ("M", MiB)):
        v = n / scale
        if n % scale == 0 or (n * 1000) % scale == 0 and v >= 1:
            return f"{v:g}{unit}"
    return str(n)


def human(n: float | None) -> str:
    if n is None:
        return "–"
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def fmt(x: float | None, digits: int = 2, suffix: str = "") -> str:
    return "–" if x is None else f"{x:.{digits}f}{suffix}"


def median(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# ==== The model's arithmetic ==================================================================


def model_shape(name: str, summary: dict | None = None) -> dict:
    """The shape of `name` (GPT2_CONFIGS), with what the trainer's summary reports over it."""
    cfg = dict(GPT2_CONFIGS.get(name, {}))
    if summary:
        for key, cfg_key in (("padded_vocab", "Vp"), ("channels", "C"), ("max_seq", "maxT")):
            v = number(first(summary, SUMMARY_FIELDS[key]))
            if v is not None:
                cfg[cfg_key] = int(v)
        p = number(first(summary, SUMMARY_FIELDS["params"]))
        if p is not None:
            cfg["params"] = int(p)
    if "params" not in cfg and all(k in cfg for k in ("Vp", "C", "maxT", "L")):
        cfg["params"] = param_count(cfg)
    return cfg


def param_count(cfg: dict) -> int:
    C, L = cfg["C"], cfg["L"]
    return cfg["Vp"] * C + cfg["maxT"] * C + L * (12 * C * C + 13 * C) + 2 * C


def embedding_bytes(cfg: dict) -> int | None:
    """The embeddings' bytes: (Vp*C + maxT*C) fp32 values in each of the 4 arrays."""
    if not all(k in cfg for k in ("Vp", "C", "maxT")):
        return None
    return (cfg["Vp"] * cfg["C"] + cfg["maxT"] * cfg["C"]) * 4 * EMBEDDING_ARRAYS


def io_seconds(read_bytes: float | None, write_bytes: float | None,
               read_bps: float | None, write_bps: float | None) -> float | None:
    """The path's time for a step's bytes: reads at the read bandwidth plus writes at the write
    bandwidth (one device carries both). None when a side with bytes has no bandwidth."""
    total = 0.0
    for b, bw in ((read_bytes, read_bps), (write_bytes, write_bps)):
        if not b:
            continue
        if not bw or bw <= 0:
            return None
        total += b / bw
    return total


def bound_seconds(compute_s: float | None, io_s: float | None) -> float | None:
    """max(compute time, path time); None without the compute time (the I/O side alone is not
    the bound)."""
    if compute_s is None:
        return None
    return max(compute_s, io_s) if io_s is not None else compute_s


def ratio(step_s: float | None, bound_s: float | None) -> float | None:
    if step_s is None or not bound_s:
        return None
    return step_s / bound_s


def growth_excluding_embeddings(small_peak: float | None, small_emb: float | None,
                                large_peak: float | None, large_emb: float | None) -> float | None:
    """(large peak - its embeddings) / (small peak - its embeddings) - 1; None when either is
    unmeasured or the small side is not positive (the subtraction leaves nothing to compare)."""
    if None in (small_peak, small_emb, large_peak, large_emb):
        return None
    base = small_peak - small_emb
    if base <= 0:
        return None
    return (large_peak - large_emb) / base - 1.0


def loss_identity(a: list, b: list) -> tuple[bool | None, str]:
    """Whether two runs' per-step losses are bit-identical (the same float32 printed with 9
    significant digits reads back the same), with the first difference in words."""
    if not a or not b:
        return None, "no losses to compare"
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return False, f"step {i + 1}: {a[i]!r} vs {b[i]!r}"  # steps count from 1
    if len(a) != len(b):
        return False, f"{len(a)} vs {len(b)} steps"
    return True, f"{n} steps identical"


# ==== The trainer's output ====================================================================


def parse_trainer_output(lines) -> tuple[list[dict], dict, list[str]]:
    """Step objects (in order), the summary (every other JSON object merged, nested summaries
    flattened) and the lines that are not JSON objects."""
    steps, summary, other = [], {}, []
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            other.append(line)
            continue
        if not isinstance(obj, dict):
            other.append(line)
            continue
        if first(obj, STEP_FIELDS["step"]) is not None and first(obj, STEP_FIELDS["loss"]) is not None:
            steps.append(obj)
            continue
        for nest in SUMMARY_NESTS:
            if isinstance(obj.get(nest), dict):
                summary.update(obj[nest])
        summary.update({k: v for k, v in obj.items() if not (k in SUMMARY_NESTS and isinstance(v, dict))})
    return steps, summary, other


def step_losses(steps: list[dict]) -> list[float]:
    return [number(first(s, STEP_FIELDS["loss"])) for s in steps]


def timed_ms(steps: list[dict], warmup: int) -> list[float]:
    ms = [number(first(s, STEP_FIELDS["ms"])) for s in steps[warmup:]]
    return [x for x in ms if x is not None]


def traffic_value(obj: dict, totals: list, parts: list, suffix: str = "") -> float | None:
    """A total of `obj` (the first of `totals`), else the sum of the parts it has (each part a
    list of names, `suffix` appended), else None."""
    total = number(first(obj, totals))
    if total is not None:
        return total
    values = [number(first(obj, [n + suffix for n in names])) for names in parts]
    values = [v for v in values if v is not None]
    return sum(values) if values else None


def path_traffic(summary: dict, steps: list[dict], warmup: int) -> dict:
    """Bytes per step from and to the paths: {read_bytes, write_bytes, paths: [...], source}."""
    read = traffic_value(summary, SUMMARY_FIELDS["read_bytes"], TRAFFIC_PARTS["read_bytes"], "_per_step")
    write = traffic_value(summary, SUMMARY_FIELDS["write_bytes"], TRAFFIC_PARTS["write_bytes"], "_per_step")
    per_path = []
    listed = first(summary, SUMMARY_FIELDS["paths"])
    if isinstance(listed, dict):  # {"/path": {...}} as well as [{"path": "/path", ...}]
        listed = [dict(v, path=k) if isinstance(v, dict) else {} for k, v in listed.items()]
    if isinstance(listed, list):
        for p in listed:
            if isinstance(p, dict):
                per_path.append({"path": first(p, PATH_FIELDS["name"]),
                                 "read_bytes": number(first(p, PATH_FIELDS["read_bytes"])),
                                 "write_bytes": number(first(p, PATH_FIELDS["write_bytes"]))})
    source = "summary totals"
    if read is None and write is None and per_path:
        read = sum(p["read_bytes"] or 0 for p in per_path)
        write = sum(p["write_bytes"] or 0 for p in per_path)
        source = "summary, summed over its paths"
    if read is None and write is None:
        timed = steps[warmup:]
        r = median(traffic_value(s, STEP_FIELDS["read_bytes"], TRAFFIC_PARTS["read_bytes"]) for s in timed)
        w = median(traffic_value(s, STEP_FIELDS["write_bytes"], TRAFFIC_PARTS["write_bytes"]) for s in timed)
        if r is not None or w is not None:
            read, write, source = r, w, "per-step objects (median of the timed steps)"
        else:
            source = "not reported by the trainer"
    return {"read_bytes": read, "write_bytes": write, "paths": per_path, "source": source}


def trainer_peak_rss(summary: dict, steps: list[dict]) -> float | None:
    """The trainer's VmHWM: the summary's, else the largest a step reported."""
    peak = number(first(summary, SUMMARY_FIELDS["peak_rss"]))
    if peak is not None:
        return peak
    return max((v for v in (number(first(s, STEP_FIELDS["peak_rss"])) for s in steps) if v is not None),
               default=None)


def trainer_budget(summary: dict, steps: list[dict]) -> float | None:
    b = number(first(summary, SUMMARY_FIELDS["budget"]))
    if b is None and steps:
        b = number(first(steps[-1], STEP_FIELDS["budget"]))
    return b


# ==== Memory cgroups ==========================================================================


class CgroupUnavailable(Exception):
    """No memory cgroup this process may create groups in; the message says why."""


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _mounts() -> list[tuple[str, str, str, str]]:
    """(fstype, mount point, root within the hierarchy, super options) of each mount."""
    out = []
    text = _read(Path("/proc/self/mountinfo")) or ""
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        lf, rf = left.split(), right.split()
        if len(lf) < 5 or len(rf) < 3:
            continue
        out.append((rf[0], lf[4].replace("\\040", " "), lf[3], rf[2]))
    return out


def _own_cgroup(controller: str | None) -> str | None:
    """This process's group path in the v1 hierarchy of `controller`, or (None) the v2 one."""
    for line in (_read(Path("/proc/self/cgroup")) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if controller is None and parts[0] == "0" and parts[1] == "":
            return parts[2]
        if controller is not None and controller in parts[1].split(","):
            return parts[2]
    return None


def _under(mount: str, mount_root: str, own: str | None) -> Path:
    """The directory of group `own` under a hierarchy mounted at `mount` (its root `mount_root`)."""
    if own is None:
        return Path(mount)
    rel = own
    if mount_root not in ("/", "") and rel.startswith(mount_root):
        rel = rel[len(mount_root):]
    d = Path(mount) / rel.lstrip("/")
    return d if d.is_dir() else Path(mount)


@dataclass
class CgroupHost:
    """Where child groups go: version 1 or 2, and the parent directory."""

    version: int
    parent: Path
    swap_file: str | None  # the file that caps swap as well, when the kernel has it
    note: str = ""

    @staticmethod
    def detect(root_override: str | None = None) -> "CgroupHost":
        """The memory controller this process may use, v1 first (where the memory controller
        is bound to v1 it is not on v2), else v2; CgroupUnavailable says why not."""
        mounts = _mounts()
        reasons = []
        v1 = [(mp, root) for fs, mp, root, opts in mounts if fs == "cgroup" and "memory" in opts.split(",")]
        v2 = [(mp, root) for fs, mp, root, opts in mounts if fs == "cgroup2"]
        if root_override:
            d = Path(root_override)
            if (d / "memory.limit_in_bytes").exists():
                v1, v2 = [(str(d), "/")], []
            else:
                v1, v2 = [], [(str(d), "/")]
        for mp, root in v1:
            parent = _under(mp, root, None if root_override else _own_cgroup("memory"))
            if not (parent / "memory.limit_in_bytes").exists():
                reasons.append(f"cgroup v1 at {mp}: no memory.limit_in_bytes in {parent}")
                continue
            if not os.access(parent, os.W_OK):
                reasons.append(f"cgroup v1 memory controller at {parent}: not writable by uid {os.geteuid()} "
                               "(run as root)")
                continue
            swap = "memory.memsw.limit_in_bytes" if (parent / "memory.memsw.limit_in_bytes").exists() else None
            note = "" if swap else "no memory.memsw.limit_in_bytes (swap accounting off): swap could hide the cap"
            return CgroupHost(1, parent, swap, note)
        for mp, root in v2:
            parent = _under(mp, root, None if root_override else _own_cgroup(None))
            controllers = (_read(parent / "cgroup.controllers") or "").split()
            if "memory" not in controllers:
                reasons.append(f"cgroup v2 at {mp}: the memory controller is not available in {parent}")
                continue
            if not os.access(parent, os.W_OK):
                reasons.append(f"cgroup v2 at {parent}: not writable by uid {os.geteuid()} (run as root, or "
                               "from a delegated group, e.g. systemd-run --user --scope -p Delegate=yes)")
                continue
            if "memory" not in (_read(parent / "cgroup.subtree_control") or "").split():
                try:
                    (parent / "cgroup.subtree_control").write_text("+memory")
                except OSError as e:
                    reasons.append(f"cgroup v2 at {parent}: cannot enable the memory controller for child groups "
                                   f"({e.strerror}; a group with processes of its own cannot: run from a "
                                   "delegated leaf, e.g. systemd-run --scope -p Delegate=yes)")
                    continue
            # memory.swap.max 0 in each child, where the kernel accounts swap (checked per group).
            return CgroupHost(2, parent, "memory.swap.max")
        if not v1 and not v2:
            reasons.append("no cgroup file system is mounted (no cgroup v1 memory controller, no cgroup v2)")
        raise CgroupUnavailable("; ".join(reasons))


class Cgroup:
    """One child group, capped or not, for one run; remove() deletes it."""

    _count = 0

    def __init__(self, host: CgroupHost, limit: int | None):
        Cgroup._count += 1
        self.host = host
        self.limit = limit
        self.path = host.parent / f"spillway-bench-scale-{os.getpid()}-{Cgroup._count}"
        self.path.mkdir()
        self.procs = str(self.path / "cgroup.procs")
        try:
            if limit is not None:
                if host.version == 1:
                    # memsw is at least the memory limit: memory's first, then memsw.
                    (self.path / "memory.limit_in_bytes").write_text(str(limit))
                    if host.swap_file:
                        (self.path / host.swap_file).write_text(str(limit))
                else:
                    (self.path / "memory.max").write_text(str(limit))
                    if (self.path / "memory.swap.max").exists():
                        (self.path / "memory.swap.max").write_text("0")
        except OSError:
            self.remove()
            raise

    def join(self) -> None:
        """Moves the calling process into the group (a child, between fork and exec)."""
        with open(self.procs, "w") as f:
            f.write(str(os.getpid()))

    def readings(self) -> dict:
        """Peak usage, OOM kills and times the limit was hit, as the kernel counts them."""
        r = {"peak_bytes": None, "oom_kills": None, "limit_hits": None, "peak_source": None}
        if self.host.version == 1:
            peak = number((_read(self.path / "memory.max_usage_in_bytes") or "").strip())
            r.update(peak_bytes=peak, peak_source="memory.max_usage_in_bytes")
            oom = _read(self.path / "memory.oom_control") or ""
            m = re.search(r"^oom_kill (\d+)", oom, re.M)
            r["oom_kills"] = int(m.group(1)) if m else None
            hits = [number((_read(self.path / f) or "").strip()) for f in ("memory.failcnt", "memory.memsw.failcnt")]
            hits = [h for h in hits if h is not None]
            r["limit_hits"] = int(max(hits)) if hits else None
        else:
            peak = number((_read(self.path / "memory.peak") or "").strip())
            r.update(peak_bytes=peak, peak_source="memory.peak" if peak is not None else
                     "memory.peak missing (kernel before 5.19)")
            ev = _read(self.path / "memory.events") or ""
            m = re.search(r"^oom_kill (\d+)", ev, re.M)
            r["oom_kills"] = int(m.group(1)) if m else None
            m = re.search(r"^max (\d+)", ev, re.M)
            r["limit_hits"] = int(m.group(1)) if m else None
        return r

    def remove(self) -> None:
        for _ in range(50):  # the group empties as soon as its last process is reaped
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)
        log(f"could not remove {self.path} (still busy); remove it with rmdir")


# ==== One run =================================================================================


@dataclass
class Run:
    """One trainer process and what it reported."""

    model: str
    mode: str
    capped: bool
    argv: list
    status: str = "not run"  # ok | killed by the cap | killed | failed | timed out | refused
    detail: str = ""
    exit_code: int | None = None
    wall_s: float | None = None
    steps: list = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    other_lines: list = field(default_factory=list)
    stderr_tail: str = ""
    ru_maxrss_bytes: int | None = None
    cgroup: dict = field(default_factory=dict)

    def losses(self) -> list:
        return step_losses(self.steps)


def classify_exit(code: int | None, cg: dict, timed_out: bool = False) -> tuple[str, str]:
    """A run's status from its exit and its group's counters: (status, detail)."""
    if timed_out:
        return "timed out", "killed after the time limit"
    if code == 0:
        return "ok", ""
    if code == -signal.SIGKILL:
        if (cg.get("oom_kills") or 0) > 0:
            return "killed by the cap", f"SIGKILL with {cg['oom_kills']} OOM kill(s) in its group"
        if cg.get("oom_kills") is None and (cg.get("limit_hits") or 0) > 0:
            return "killed by the cap", "SIGKILL after its group hit the limit (no oom_kill counter here)"
        return "killed", "SIGKILL without an OOM event in its group"
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return "failed", f"signal {name}"
    if code == 2:
        return "refused", "exit status 2 (the trainer refused its arguments)"
    return "failed", f"exit status {code}"


def run_trainer(run: Run, host: CgroupHost, cap: int | None, timeout_s: float, echo=None, log_dir: Path | None = None,
                path: Path | None = None) -> Run:
    """Runs run.argv in a process of its own inside a new child group (capped at `cap`, or
    not), reads its JSON from stdout and fills `run`. `echo(step_obj)` is called per step.
    `path`: the run's folder for the trainer's files, made empty before and removed after."""
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
    group = Cgroup(host, cap)
    stderr_file = tempfile.TemporaryFile() if log_dir is None else open(
        log_dir / f"{run.model}-{run.mode}-{'capped' if run.capped else 'uncapped'}.stderr", "w+b")
    timed_out = threading.Event()
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(run.argv, stdout=subprocess.PIPE, stderr=stderr_file, stdin=subprocess.DEVNULL,
                                preexec_fn=group.join, text=True, bufsize=1)
    except OSError as e:
        group.remove()
        stderr_file.close()
        run.status, run.detail = "failed", f"could not start {run.argv[0]}: {e}"
        return run

    def kill():
        timed_out.set()
        try:
            proc.kill()
        except OSError:
            pass

    timer = threading.Timer(timeout_s, kill)
    timer.start()
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if echo is not None:
                steps, _, _ = parse_trainer_output([line])
                if steps:
                    echo(steps[0])
    finally:
        proc.stdout.close()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        timer.cancel()
        timer.join()
    run.wall_s = time.monotonic() - t0
    run.exit_code = proc.returncode
    run.ru_maxrss_bytes = int(usage.ru_maxrss) * 1024  # KiB on Linux
    run.cgroup = group.readings()
    run.cgroup["limit_bytes"] = cap
    group.remove()
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
    stderr_file.seek(0)
    err = stderr_file.read().decode(errors="replace")
    stderr_file.close()
    run.stderr_tail = "\n".join(err.strip().splitlines()[-5:])
    run.steps, run.summary, run.other_lines = parse_trainer_output(lines)
    run.status, run.detail = classify_exit(run.exit_code, run.cgroup, timed_out.is_set())
    if run.status in ("failed", "refused") and run.stderr_tail:
        run.detail += ": " + run.stderr_tail.splitlines()[-1][:200]
    return run


# ==== fio: the path's bandwidth ===============================================================


def fs_of(path: Path) -> str:
    """'ext4 on /dev/vda' for the file system that holds `path`."""
    best, text = "", "file system not found"
    p = str(path.resolve())
    for fs, mp, _root, _opts in _mounts():
        if (p == mp or p.startswith(mp.rstrip("/") + "/")) and len(mp) >= len(best):
            src = ""
            for line in (_read(Path("/proc/self/mounts")) or "").splitlines():
                f = line.split()
                if len(f) > 2 and f[1] == mp:
                    src = f[0]
            best, text = mp, f"{fs} on {src or mp}"
    return text


def fio_bandwidth(directory: Path, size: str, iodepth: int, pattern: str, runtime_s: int) -> dict:
    """fio's write then read bandwidth (bytes/s) on a file in `directory`: 1 MiB blocks,
    O_DIRECT, io_uring, buffers on huge pages (glibc.malloc.hugetlb=1, as bench/support/fio.hpp)."""
    out = {"read_bytes_per_s": None, "write_bytes_per_s": None, "source": "", "error": ""}
    if not shutil.which("fio"):
        out["error"] = "fio is not installed (Debian: fio): the bound has no I/O side"
        return out
    directory.mkdir(parents=True, exist_ok=True)
    f = directory / f"bench_scale_fio.{os.getpid()}"
    rw = {"seq": ("write", "read"), "random": ("randwrite", "randread")}[pattern]
    common = (f"--filename={f} --bs=1m --direct=1 --ioengine=io_uring --iodepth={iodepth} --size={size} "
              f"--runtime={runtime_s}")
    out["source"] = f"fio {rw[0]} then {rw[1]}, {common.replace(f'--filename={f} ', '')}, huge-page buffers"
    env = dict(os.environ, GLIBC_TUNABLES="glibc.malloc.hugetlb=1")
    try:
        for side, mode in (("write", rw[0]), ("read", rw[1])):
            cmd = ["fio", "--output-format=json", f"--name=scale_{side}", f"--rw={mode}"] + common.split()
            p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=runtime_s * 4 + 120)
            brace = p.stdout.find("{")
            if p.returncode != 0 or brace < 0:
                out["error"] = f"fio {mode} failed (exit {p.returncode}): {p.stderr.strip()[-200:]}"
                return out
            job = json.loads(p.stdout[brace:])["jobs"][0]
            out[f"{side}_bytes_per_s"] = number(job.get(side, {}).get("bw_bytes"))
    except (OSError, ValueError, KeyError, IndexError, subprocess.TimeoutExpired) as e:
        out["error"] = f"fio failed: {e}"
    finally:
        try:
            f.unlink()
        except OSError:
            pass
    return out


# ==== Rows, goals and the table ===============================================================


def run_path(a, model: str, mode: str, capped: bool) -> Path:
    """The run's own folder under --path (removed after the run: a model's state is gigabytes)."""
    return a.path / f"{model}-{mode}-{'capped' if capped else 'uncapped'}"


def trainer_argv(trainer: list, model: str, mode: str, a, budget: int | None, steps: int, capped: bool = True) -> list:
    argv = list(trainer)
    F = TRAINER_FLAGS
    for key, value in (("init", model), ("offload", mode), ("steps", steps), ("batch", a.batch), ("seq", a.seq),
                       ("threads", a.threads), ("path", str(run_path(a, model, mode, capped)))):
        if F.get(key):
            argv += [F[key], str(value)]
    if budget is not None and F.get("budget"):
        argv += [F["budget"], format_size_flag(budget)]
    if F.get("json"):
        argv.append(F["json"])
    return argv + list(a.trainer_arg)


def row_record(run: Run, cfg: dict, warmup: int, compute_s: float | None, compute_source: str, bw: dict) -> dict:
    """The JSON row of a capped run, with its derived figures."""
    ms = timed_ms(run.steps, warmup)
    step_s = median(ms) / 1e3 if ms else None
    trainer_peak = trainer_peak_rss(run.summary, run.steps)
    traffic = path_traffic(run.summary, run.steps, warmup)
    io_s = io_seconds(traffic["read_bytes"], traffic["write_bytes"], bw.get("read_bytes_per_s"),
                      bw.get("write_bytes_per_s"))
    if traffic["read_bytes"] is None and traffic["write_bytes"] is None:
        io_s = None
    b = bound_seconds(compute_s, io_s) if run.status == "ok" else None
    return {
        "model": run.model, "label": cfg.get("label", run.model), "params": cfg.get("params"), "mode": run.mode,
        "status": run.status, "detail": run.detail, "exit_code": run.exit_code, "argv": run.argv,
        "wall_s": run.wall_s,
        "peak_rss_bytes": trainer_peak if trainer_peak is not None else run.ru_maxrss_bytes,
        "peak_rss_source": "trainer VmHWM" if trainer_peak is not None else "ru_maxrss (wait4)",
        "trainer_vmhwm_bytes": trainer_peak, "ru_maxrss_bytes": run.ru_maxrss_bytes,
        "cgroup_peak_bytes": run.cgroup.get("peak_bytes"), "cgroup_peak_source": run.cgroup.get("peak_source"),
        "cgroup_oom_kills": run.cgroup.get("oom_kills"), "cgroup_limit_hits": run.cgroup.get("limit_hits"),
        "cap_bytes": run.cgroup.get("limit_bytes"),
        "budget_bytes": trainer_budget(run.summary, run.steps),
        "step_s": step_s, "step_ms": ms, "losses": run.losses(),
        "read_bytes_per_step": traffic["read_bytes"], "write_bytes_per_step": traffic["write_bytes"],
        "paths": traffic["paths"], "traffic_source": traffic["source"],
        "compute_s": compute_s, "compute_source": compute_source, "io_s": io_s, "bound_s": b,
        "ratio": ratio(step_s, b) if run.status == "ok" else None,
        "embedding_bytes": embedding_bytes(cfg),
        "summary": run.summary,
    }


def evaluate_goals(rows: list[dict], cap: int, offload_mode: str, reference_losses: dict) -> list[dict]:
    """The goals, each {what, goal, measured, met (True/False/None: not measured)}.
    reference_losses: model -> the `none` losses (capped or uncapped run)."""
    off = [r for r in rows if r["mode"] == offload_mode]
    goals = []

    def add(what, goal, measured, met):
        goals.append({"what": what, "goal": goal, "measured": measured, "met": met})

    # 1. Peak RSS under the cap at every size.
    if off:
        ok = all(r["status"] == "ok" and r["peak_rss_bytes"] is not None and r["peak_rss_bytes"] < cap for r in off)
        add(f"`{offload_mode}` peak RSS under the cap at every size", f"< {human(cap)}",
            ", ".join(f"{r['label']} {human(r['peak_rss_bytes']) if r['status'] == 'ok' else r['status']}"
                      for r in off), ok)
    # 2. Growth from the smallest to the largest size, apart from the embeddings.
    sized = [r for r in off if r.get("params")]
    if len(sized) >= 2:
        small, large = min(sized, key=lambda r: r["params"]), max(sized, key=lambda r: r["params"])
        okrun = small["status"] == "ok" and large["status"] == "ok"
        g = growth_excluding_embeddings(small["peak_rss_bytes"], small["embedding_bytes"], large["peak_rss_bytes"],
                                        large["embedding_bytes"]) if okrun else None
        raw = (large["peak_rss_bytes"] / small["peak_rss_bytes"] - 1) if okrun and small["peak_rss_bytes"] else None
        add(f"`{offload_mode}` peak growth {small['label']} to {large['label']}, apart from the embeddings",
            f"≤ {100 * GROWTH_GOAL:.0f}%",
            (f"{100 * g:+.1f}% ({human(small['peak_rss_bytes'] - small['embedding_bytes'])} -> "
             f"{human(large['peak_rss_bytes'] - large['embedding_bytes'])}; {100 * raw:+.1f}% with them)"
             if g is not None else "not measured" if not okrun else
             f"not measurable: {small['label']}'s peak {human(small['peak_rss_bytes'])} is not above its embeddings' "
             f"{human(small['embedding_bytes'])}"), None if g is None else g <= GROWTH_GOAL)
    # 3. Step time within 1.25x the bound.
    if off:
        ratios = [r["ratio"] for r in off]
        known = [x for x in ratios if x is not None]
        met = None if len(known) < len(off) else all(x <= RATIO_GOAL for x in known)
        if any(r["status"] != "ok" for r in off):
            met = False
        add(f"`{offload_mode}` step time over the bound", f"≤ {RATIO_GOAL}x",
            ", ".join(f"{r['label']} {fmt(r['ratio'])}x" if r["ratio"] is not None else f"{r['label']} –"
                      for r in off), met)
    # 4. Losses bit-identical to none.
    if off:
        verdicts, texts = [], []
        for r in off:
            ident, why = loss_identity(r["losses"], reference_losses.get(r["model"], []))
            if r["status"] != "ok":
                ident, why = False, r["status"]
            verdicts.append(ident)
            texts.append(f"{r['label']} {'identical' if ident else why}")
        met = None if any(v is None for v in verdicts) and all(v is not False for v in verdicts) else \
            all(v is True for v in verdicts)
        add(f"`{offload_mode}` losses bit-identical to `none`", "every step", ", ".join(texts), met)
    return goals


def verdict(met) -> str:
    return "–" if met is None else ("met" if met else "not met")


def markdown(doc: dict) -> str:
    bw = doc["path_bandwidth"]
    head = ["model", "params", "offload", "status", "peak RSS (VmHWM)", "cgroup peak", "step s", "path MB/step "
            "read / write", "compute s", "I/O s", "bound s", "step / bound"]
    lines = ["| " + " | ".join(head) + " |", "| --- | ---: | --- | --- |" + " ---: |" * (len(head) - 4)]
    for r in doc["rows"]:
        mb = (lambda x: "–" if x is None else f"{x / 1e6:.0f}")
        lines.append("| " + " | ".join([
            r["label"], f"{r['params'] / 1e6:.0f}M" if r.get("params") else "–", f"`{r['mode']}`",
            r["status"] if r["status"] == "ok" else f"**{r['status']}**",
            human(r["peak_rss_bytes"]) if r["status"] == "ok" else "–",
            human(r["cgroup_peak_bytes"]), fmt(r["step_s"], 2),
            f"{mb(r['read_bytes_per_step'])} / {mb(r['write_bytes_per_step'])}" if r["mode"] != NONE_MODE else "–",
            fmt(r["compute_s"], 2) + (" (est.)" if "estimate" in (r.get("compute_source") or "") else ""),
            fmt(r["io_s"], 2), fmt(r["bound_s"], 2), fmt(r["ratio"], 2)]) + " |")
    s = doc["settings"]
    out = [f"**{doc['title']}** ({doc['machine']['cpu_model']}, {doc['machine']['num_cpus']} CPUs, "
           f"{doc['date']}): B={s['batch']} T={s['seq']}, {s['threads']} threads, {s['steps']} steps (the first "
           f"{s['warmup']} not timed), cap {human(s['cap_bytes'])} (cgroup v{doc['cgroup']['version']}), "
           f"`{s['mode']}` with --memory-budget {format_size_flag(s['budget_bytes']) if s['budget_bytes'] else '–'}.",
           "",
           f"Path {s['path']} ({doc['path_fs']}): fio write {fmt(gb(bw.get('write_bytes_per_s')))} GB/s, read "
           f"{fmt(gb(bw.get('read_bytes_per_s')))} GB/s" + (f" ({bw['error']})" if bw.get("error") else "") + ".",
           "", "\n".join(lines), ""]
    if doc.get("notes"):
        out += [f"- {n}" for n in doc["notes"]] + [""]
    out.append("Goals:")
    out += [f"- **{verdict(g['met'])}**: {g['what']}: goal {g['goal']}; this run {g['measured']}." for g in doc["goals"]]
    return "\n".join(out) + "\n"


def gb(x):
    return None if x is None else x / 1e9


def machine_info() -> dict:
    cpu = ""
    for line in (_read(Path("/proc/cpuinfo")) or "").splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = re.search(r"MemTotal:\s+(\d+) kB", _read(Path("/proc/meminfo")) or "")
    return {"cpu_model": cpu or platform.processor() or "CPU model not recorded", "num_cpus": os.cpu_count(),
            "mem_total_bytes": int(mem.group(1)) * 1024 if mem else None, "kernel": platform.release(),
            "hostname": platform.node()}


def write_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


# ==== The benchmark and the demonstration =====================================================


def echo_step(prefix: str, total: int, stream=None):
    """Prints "step k/total" for the k-th step object of a run, counted from 1 as mini_gpt's
    progress line and its --json "step" count (the position, not the field: a trainer that
    counts from 0 is echoed the same)."""
    seen = 0

    def echo(step: dict):
        nonlocal seen
        seen += 1
        loss = number(first(step, STEP_FIELDS["loss"]))
        ms = number(first(step, STEP_FIELDS["ms"]))
        print(f"{prefix}step {seen}/{total}: loss {fmt(loss, 4)}"
              f" ({fmt(ms / 1e3 if ms is not None else None, 2)} s)", file=stream or sys.stderr, flush=True)
    return echo


def compute_reference(host, a, model: str, capped_none: Run | None, log_dir: Path) -> tuple[Run | None, float | None,
                                                                                          str]:
    """The `none` run that gives the model's compute time: the capped one when the group never
    reached its limit (the cap did not touch it), else a run without the cap."""
    if capped_none is not None and capped_none.status == "ok" and not (capped_none.cgroup.get("oom_kills") or 0) \
            and not (capped_none.cgroup.get("limit_hits") or 0):
        ms = timed_ms(capped_none.steps, a.warmup)
        if ms:
            return capped_none, median(ms) / 1e3, "`none` under the cap, which it never reached"
    log(f"{model}: `none` without the cap (the compute time of the bound)")
    run = Run(model, NONE_MODE, False, trainer_argv(a.trainer_cmd, model, NONE_MODE, a, None, a.steps, False))
    run_trainer(run, host, None, a.timeout, echo_step(f"  {model} none (uncapped) ", a.steps), log_dir,
                run_path(a, model, NONE_MODE, False))
    ms = timed_ms(run.steps, a.warmup)
    if run.status != "ok" or not ms:
        return run, None, f"`none` without the cap {run.status}: {run.detail}"
    return run, median(ms) / 1e3, "`none` without the cap"


def base_doc(a, host: CgroupHost, bw: dict, title: str) -> dict:
    return {
        "schema": 1, "benchmark": "scale", "title": title,
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "machine": machine_info(),
        "cgroup": {"version": host.version, "parent": str(host.parent), "swap_capped_by": host.swap_file,
                   "note": host.note},
        "settings": {"cap_bytes": a.cap_bytes, "budget_bytes": a.budget_bytes, "batch": a.batch, "seq": a.seq,
                     "threads": a.threads, "steps": a.steps, "warmup": a.warmup, "mode": a.mode,
                     "path": str(a.path), "trainer": a.trainer_cmd, "sizes": a.sizes},
        "path_fs": fs_of(a.path), "path_bandwidth": bw, "notes": [], "rows": [], "runs": [], "goals": [],
    }


def add_traffic_notes(doc: dict) -> None:
    quiet = [r["label"] for r in doc["rows"] if r["mode"] != NONE_MODE and r["status"] == "ok"
             and r["read_bytes_per_step"] is None and r["write_bytes_per_step"] is None]
    if quiet:
        doc["notes"].append(f"The trainer reported no path bytes for {', '.join(quiet)} (none of the names in "
                            "SUMMARY_FIELDS, STEP_FIELDS or TRAFFIC_PARTS): their bound is the compute time alone.")


def run_record(run: Run) -> dict:
    """A run's raw facts, for the JSON (uncapped references included)."""
    return {"model": run.model, "mode": run.mode, "capped": run.capped, "status": run.status, "detail": run.detail,
            "exit_code": run.exit_code, "wall_s": run.wall_s, "ru_maxrss_bytes": run.ru_maxrss_bytes,
            "cgroup": run.cgroup, "losses": run.losses(), "step_ms": timed_ms(run.steps, 0),
            "stderr_tail": run.stderr_tail}


def prepare(a, host: CgroupHost) -> dict:
    a.path.mkdir(parents=True, exist_ok=True)
    fs = fs_of(a.path)
    if fs.startswith("tmpfs") or fs.startswith("ramfs"):
        log(f"warning: --path {a.path} is in memory ({fs}): its files are charged to the group and count "
            "against the cap")
    if a.path_bandwidth:
        r, w = (float(x) * 1e9 for x in a.path_bandwidth.split(","))
        bw = {"read_bytes_per_s": r, "write_bytes_per_s": w, "source": "--path-bandwidth (given, not measured)",
              "error": ""}
    else:
        log(f"fio on {a.path} ({fs})")
        bw = fio_bandwidth(a.path, a.fio_size, a.fio_iodepth, a.fio_pattern, a.fio_runtime)
        if bw["error"]:
            log(bw["error"])
        else:
            log(f"path: write {fmt(gb(bw['write_bytes_per_s']))} GB/s, read {fmt(gb(bw['read_bytes_per_s']))} GB/s")
    return bw


def bench(a, host: CgroupHost) -> int:
    bw = prepare(a, host)
    doc = base_doc(a, host, bw, "Scale: GPT-2 sizes under a memory cap")
    log_dir = a.out.parent / "scale-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    reference_losses = {}
    failed = False
    if host.note:
        doc["notes"].append(host.note)
    for model in a.sizes:
        log(f"{model}: `none` under the {human(a.cap_bytes)} cap")
        none = Run(model, NONE_MODE, True, trainer_argv(a.trainer_cmd, model, NONE_MODE, a, None, a.steps))
        run_trainer(none, host, a.cap_bytes, a.timeout, echo_step(f"  {model} none ", a.steps), log_dir,
                    run_path(a, model, NONE_MODE, True))
        log(f"  -> {none.status} {none.detail}")
        ref, compute_s, compute_source = compute_reference(host, a, model, none, log_dir)
        if ref is not None and ref is not none:
            doc["runs"].append(run_record(ref))
            failed |= ref.status != "ok"
        reference_losses[model] = ref.losses() if ref is not None and ref.status == "ok" else []
        log(f"{model}: `{a.mode}` --memory-budget {format_size_flag(a.budget_bytes)} under the cap")
        off = Run(model, a.mode, True, trainer_argv(a.trainer_cmd, model, a.mode, a, a.budget_bytes, a.steps))
        run_trainer(off, host, a.cap_bytes, a.timeout, echo_step(f"  {model} {a.mode} ", a.steps), log_dir,
                    run_path(a, model, a.mode, True))
        log(f"  -> {off.status} {off.detail}")
        cfg = model_shape(model, off.summary or none.summary)
        for run in (none, off):
            doc["runs"].append(run_record(run))
            doc["rows"].append(row_record(run, cfg, a.warmup, compute_s, compute_source, bw))
            # Killed by the cap is a result (expected of `none`, a goal not met for the
            # offloaded row); anything else is a run that did not measure what it should.
            failed |= run.status not in ("ok", "killed by the cap")
    doc["goals"] = evaluate_goals(doc["rows"], a.cap_bytes, a.mode, reference_losses)
    add_traffic_notes(doc)
    if bw.get("error"):
        doc["notes"].append("The bound has no I/O side: " + bw["error"])
    write_json(a.out, doc)
    print(markdown(doc), end="")
    log(f"wrote {a.out}")
    return 1 if failed else 0


def demo(a, host: CgroupHost) -> int:
    bw = prepare(a, host)
    model = a.demo_size
    doc = base_doc(a, host, bw, f"Demonstration: {GPT2_CONFIGS[model]['label']} under a {human(a.cap_bytes)} cap")
    log_dir = a.out.parent / "scale-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    # The compute time: XL's `none` does not fit this machine, so it is estimated from
    # gpt2-large's `none` step (a previous scale run's, or measured now) times the parameter ratio.
    ref_model = a.demo_reference
    ref_s, ref_source = None, ""
    scale_json = a.reference_json
    if scale_json and scale_json.exists():
        try:
            prev = json.loads(scale_json.read_text())
            ps = prev.get("settings", {})
            same = all(ps.get(k) == getattr(a, k) for k in ("batch", "seq", "threads"))
            for r in prev.get("rows", []):
                if r.get("model") == ref_model and r.get("compute_s") and same:
                    shown = scale_json.resolve()
                    shown = shown.relative_to(a.root) if shown.is_relative_to(a.root) else shown
                    ref_s, ref_source = r["compute_s"], f"{shown} of {prev.get('date')}, {r.get('compute_source')}"
                    break
        except (OSError, ValueError):
            pass
    if ref_s is None:
        log(f"{ref_model}: `none` without the cap, for the estimate of {model}'s compute time")
        ref, ref_s, ref_source = compute_reference(host, a, ref_model, None, log_dir)
        if ref is not None:
            doc["runs"].append(run_record(ref))
    cfg = model_shape(model)
    ref_cfg = model_shape(ref_model)
    factor = cfg["params"] / ref_cfg["params"]
    compute_s = ref_s * factor if ref_s is not None else None
    compute_source = (f"estimate: {ref_model}'s `none` step {fmt(ref_s)} s x {factor:.3f}, the ratio of their "
                      f"parameters ({ref_source})")
    print(f"{GPT2_CONFIGS[model]['label']} ({cfg['params'] / 1e9:.2f} B parameters), `{a.mode}`, --memory-budget "
          f"{format_size_flag(a.budget_bytes)}, inside a {human(a.cap_bytes)} memory cgroup (v{host.version}):",
          flush=True)
    run = Run(model, a.mode, True, trainer_argv(a.trainer_cmd, model, a.mode, a, a.budget_bytes, a.demo_steps))
    run_trainer(run, host, a.cap_bytes, a.timeout, echo_step("  ", a.demo_steps, sys.stdout), log_dir,
                run_path(a, model, a.mode, True))
    a.steps = a.demo_steps
    doc["settings"]["steps"] = a.demo_steps
    doc["runs"].append(run_record(run))
    row = row_record(run, model_shape(model, run.summary), a.warmup, compute_s, compute_source, bw)
    doc["rows"].append(row)
    doc["notes"].append(f"The compute time of {model} is an {compute_source}: its own `none` run would need "
                        f"{human(cfg['params'] * 16)} for the parameters, gradients, m and v alone.")
    goals = evaluate_goals(doc["rows"], a.cap_bytes, a.mode, {})
    doc["goals"] = [g for g in goals if "bit-identical" not in g["what"]]  # no `none` run to compare with
    add_traffic_notes(doc)
    write_json(a.out, doc)
    print(markdown(doc), end="")
    log(f"wrote {a.out}")
    return 0 if run.status == "ok" else 1


# ==== Command line ============================================================================


def parse_args(argv):
    root = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trainer", default=str(root / "build/release/examples/mini_gpt/mini_gpt"),
                    help="the trainer command (split like a shell line; default: release mini_gpt)")
    ap.add_argument("--trainer-arg", action="append", default=[], help="one more argument for every run")
    ap.add_argument("--sizes", default="gpt2,gpt2-medium,gpt2-large", help="the --init names, in order")
    ap.add_argument("--cap", default="4G", help="the memory cgroup's limit (default 4G)")
    ap.add_argument("--budget", default=None, help="--memory-budget of the offloaded rows (default: cap - 0.5G)")
    ap.add_argument("--mode", default=OFFLOAD_MODE, help=f"the offloaded rows' --offload (default {OFFLOAD_MODE})")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="steps not timed (default 1)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--path", type=Path, default=None,
                    help="the trainer's --path and fio's (default: $SPILLWAY_BENCH_DIR/scale or build/bench/scratch/scale)")
    ap.add_argument("--out", type=Path, default=None,
                    help="the JSON (default build/bench/scale.json; with --demo build/bench/scale_demo.json)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per run before it is killed")
    ap.add_argument("--path-bandwidth", default=None, metavar="READ_GBPS,WRITE_GBPS",
                    help="use these instead of measuring with fio")
    ap.add_argument("--fio-size", default="1g")
    ap.add_argument("--fio-iodepth", type=int, default=8)
    ap.add_argument("--fio-pattern", choices=("seq", "random"), default="seq")
    ap.add_argument("--fio-runtime", type=int, default=30, help="seconds per fio job at most")
    ap.add_argument("--cgroup-root", default=None, help="the parent group's directory (default: found from /proc)")
    ap.add_argument("--demo", action="store_true", help="GPT-2 XL under the cap, the loss at each step")
    ap.add_argument("--demo-size", default="gpt2-xl", choices=sorted(GPT2_CONFIGS))
    ap.add_argument("--demo-steps", type=int, default=5)
    ap.add_argument("--demo-reference", default="gpt2-large", choices=sorted(GPT2_CONFIGS),
                    help="the model whose `none` step time, scaled by the parameter ratio, estimates the demo's")
    ap.add_argument("--reference-json", type=Path, default=None,
                    help="a scale.json whose reference-model compute time the demo reuses (default build/bench/scale.json)")
    ap.add_argument("--self-test", action="store_true", help="run tests/report/check_scale.py and exit")
    a = ap.parse_args(argv)
    a.root = root
    try:
        a.cap_bytes = parse_size(a.cap)
        a.budget_bytes = parse_size(a.budget) if a.budget else a.cap_bytes - GiB // 2
    except ValueError as e:
        ap.error(str(e))
    if a.budget_bytes <= 0:
        ap.error("the budget must be above 0 (--cap below 0.5G needs --budget)")
    if a.budget_bytes >= a.cap_bytes:
        ap.error(f"--budget {human(a.budget_bytes)} must be under --cap {human(a.cap_bytes)}")
    a.sizes = [s for s in a.sizes.split(",") if s]
    if a.warmup >= a.steps:
        ap.error("--steps must exceed --warmup")
    bench_dir = Path(os.environ.get("SPILLWAY_BENCH_DIR", root / "build/bench/scratch"))
    a.path = (a.path or bench_dir / "scale").resolve()
    a.out = a.out or root / ("build/bench/scale_demo.json" if a.demo else "build/bench/scale.json")
    a.reference_json = a.reference_json or root / "build/bench/scale.json"
    a.trainer_cmd = shlex.split(a.trainer)
    return a


def main(argv=None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if a.self_test:
        test = a.root / "tests/report/check_scale.py"
        return subprocess.call([sys.executable, str(test), "--script", str(Path(__file__).resolve())])
    exe = a.trainer_cmd[0] if a.trainer_cmd else ""
    if not exe or not (os.access(exe, os.X_OK) or shutil.which(exe)):
        print(f"bench_scale.py: the trainer {exe!r} is not an executable (build it: scripts/dev build release, or "
              "run scripts/dev bench scale)", file=sys.stderr)
        return 2
    try:
        host = CgroupHost.detect(a.cgroup_root)
    except CgroupUnavailable as e:
        print(f"bench_scale.py: cannot cap memory here, so nothing was measured: {e}", file=sys.stderr)
        return 3
    log(f"memory cgroup v{host.version}: child groups under {host.parent}"
        + (f" ({host.note})" if host.note else ""))
    try:
        a.out.unlink()  # a failed run must not leave the previous one as this run's
    except FileNotFoundError:
        pass
    return demo(a, host) if a.demo else bench(a, host)


if __name__ == "__main__":
    sys.exit(main())
