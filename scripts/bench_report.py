#!/usr/bin/python3
"""scripts/bench_report.py: docs/benchmarks.md and its plots, from the benchmark JSON.

Usage (normally through `scripts/dev bench report`):
    bench_report.py --json-dir build/bench --out docs [--narrative docs/report] [--keep-going]

Reads every <json-dir>/<name>.json that `scripts/dev bench <name>` wrote (Google Benchmark's
JSON report) and the side files some benchmarks write beside it (stash_series.json,
mini_gpt_series.json), and writes <out>/benchmarks.md and <out>/img/bench_*.png.

What it guarantees:
- Every known benchmark has a section, in a fixed order. A section whose JSON is missing
  says "not measured" and gives the command that measures it; it never fails the report.
- A JSON file that no section knows (a new benchmark) gets a generic section: its rows and
  counters as a table and, when the rows have `vs_limit`, a plot of it.
- Figures are medians: a row run with repetitions is reduced to Google Benchmark's `_median`
  aggregate (or the median of its repetitions when only those were kept), and the spread of
  the ratio (cv) is shown when repetitions exist. Non-finite values (NaN, inf) are left out of
  both; a figure with no finite value shows "–".
- Each section and each plot names the machine (CPU model, CPU count) and the date of its run.
- Nothing is overwritten unless the whole report was produced: outputs are written to a
  temporary folder first and moved into place at the end. A malformed JSON file is an error
  naming the file; it, or a section that fails, stops the report (or, with --keep-going, its
  error is printed in the section's place).

The narrative of each section (what is measured, the limit, the goal) lives in
<narrative>/<section>.md, so it can be edited without touching this script; the numbers,
tables, verdicts and plots are generated here. Only the standard library and matplotlib
(Debian's python3-matplotlib, Agg backend) are used.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import colors as mcolors
    from matplotlib import ticker
except ImportError:  # pragma: no cover - depends on the machine
    sys.exit("bench_report.py: matplotlib is missing; install Debian's python3-matplotlib and run "
             "this script with /usr/bin/python3 (scripts/dev bench report does both)")

IMG_PREFIX = "bench_"

# MLP-Offload's published figures (Maurya, Rafique, Cappello, Nicolae: "MLP-Offload:
# Multi-Level, Multi-Path Offloading for LLM Pre-training to Break the GPU Memory Wall",
# SC'25). One node with 4 GPUs, sequence length 2048; speedups over DeepSpeed ZeRO-3 with
# NVMe offload of the optimizer state.
MLP_OFFLOAD_PUBLISHED = {
    "source": "MLP-Offload (Maurya et al., SC'25), 1 node, 4 GPUs, over DeepSpeed ZeRO-3 NVMe offload",
    "update_speedup": {"40B": 2.17, "52B": 2.34, "70B": 2.29, "100B": 1.86, "120B": 1.68},
    "iteration_speedup": (1.91, 2.59),
    "backward_speedup": (11.0, 17.0),  # no fp32 gradient writes in backward
    "resident_subgroups_percent": (10, 27),  # subgroups needing neither read nor write
    "baseline_read_wait": (202.0, 209.0),  # 52B: seconds waiting for reads of the update's seconds
    "update_gparams_per_s_baseline": 0.2,  # per 4-GPU node
    "update_gparams_per_s": (0.4, 0.5),
}


class ReportError(Exception):
    """A problem with the input that the user must fix (the message names the file)."""


# ---- Reading Google Benchmark JSON ----------------------------------------------------------

# Fields of a benchmark entry that describe the run rather than measure it.
_META_KEYS = {
    "name", "run_name", "run_type", "aggregate_name", "aggregate_unit", "family_index",
    "per_family_instance_index", "repetitions", "repetition_index", "threads", "iterations",
    "time_unit", "label", "error_occurred", "error_message",
}
_TIME_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


@dataclass
class Row:
    """One benchmark row, its repetitions reduced to medians."""

    name: str
    values: dict[str, float] = field(default_factory=dict)  # metric -> median
    cv: dict[str, float] = field(default_factory=dict)  # metric -> coefficient of variation
    repetitions: int = 1
    label: str = ""
    error: str = ""
    time_unit: str = "ns"

    def get(self, key: str, default: float | None = None) -> float | None:
        return self.values.get(key, default)

    def seconds(self) -> float | None:
        """The row's (real or manual) time per iteration, in seconds."""
        t = self.values.get("real_time")
        return None if t is None else t * _TIME_UNIT_SECONDS.get(self.time_unit, 1e-9)


@dataclass
class BenchReport:
    """One JSON report: its machine context and its rows in order of first appearance."""

    path: Path
    context: dict
    rows: list[Row]

    def machine(self) -> str:
        return machine_of(self.context)

    def date(self) -> str:
        return date_of(self.context.get("date", ""))


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ReportError(f"{path}: not readable as JSON ({e})") from e


def load_bench(path: Path) -> BenchReport:
    """The report in `path`; any problem reading it is a ReportError naming the file."""
    doc = read_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list):
        raise ReportError(f"{path}: not a Google Benchmark JSON report (no 'benchmarks' list)")
    try:
        return reduce_bench(path, doc)
    except ReportError:
        raise
    except Exception as e:  # a value of an unexpected type or range
        raise ReportError(f"{path}: could not be read as a Google Benchmark report ({e!r})") from e


def reduce_bench(path: Path, doc: dict) -> BenchReport:
    """load_bench's work: the entries of `doc` grouped into rows, their repetitions reduced."""
    order: list[str] = []
    samples: dict[str, dict[str, list[float]]] = {}
    aggregates: dict[str, dict[str, dict[str, float]]] = {}
    rows: dict[str, Row] = {}
    for i, entry in enumerate(doc["benchmarks"]):
        if not isinstance(entry, dict) or "name" not in entry:
            raise ReportError(f"{path}: benchmarks[{i}] has no 'name'")
        run = entry.get("run_name", entry["name"])
        if run not in rows:
            order.append(run)
            rows[run] = Row(name=run)
            samples[run] = {}
            aggregates[run] = {}
        row = rows[run]
        row.time_unit = entry.get("time_unit", row.time_unit)
        if entry.get("label"):
            row.label = entry["label"]
        if entry.get("error_occurred"):
            row.error = entry.get("error_message", "error")
            continue
        row.repetitions = max(row.repetitions, int(entry.get("repetitions", 1) or 1))
        # Non-finite values (NaN, inf: a counter divided by zero) are dropped, in repetitions
        # and aggregates alike: the median and cv are of the finite ones, and a metric with
        # none is absent from the row ("–").
        metrics = {k: float(v) for k, v in entry.items()
                   if k not in _META_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool)
                   and math.isfinite(v)}
        if entry.get("run_type") == "aggregate":
            aggregates[run][entry.get("aggregate_name", "")] = metrics
        else:
            for k, v in metrics.items():
                samples[run].setdefault(k, []).append(v)
    for run in order:
        row, agg, smp = rows[run], aggregates[run], samples[run]
        keys = set(smp) | set(agg.get("median", {})) | set(agg.get("mean", {}))
        for k in keys:
            if k in agg.get("median", {}):
                row.values[k] = agg["median"][k]
            elif k in smp:
                row.values[k] = statistics.median(smp[k])
            else:
                row.values[k] = agg["mean"][k]
            if len(smp.get(k, [])) >= 2 and statistics.fmean(smp[k]) != 0:
                row.cv[k] = statistics.stdev(smp[k]) / abs(statistics.fmean(smp[k]))
            elif k in agg.get("cv", {}):
                row.cv[k] = agg["cv"][k]
        if row.error and row.values:
            row.error = ""  # some repetitions succeeded: report those
    return BenchReport(path, doc.get("context", {}) or {}, [rows[r] for r in order])


def load_series(path: Path) -> dict | None:
    """A side file ({"machine", "date", "runs": [...]}), or None when it does not exist."""
    if not path.exists():
        return None
    doc = read_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list):
        raise ReportError(f"{path}: expected an object with a 'runs' list")
    return doc


def machine_of(context: dict) -> str:
    cpu = context.get("cpu_model") or "CPU model not recorded"
    text = cpu
    if context.get("num_cpus"):
        text += f", {context['num_cpus']} CPUs"
    if context.get("gpu_model"):
        text += f", {context['gpu_model']}"
    return text


def date_of(stamp: str) -> str:
    """ISO 8601 (with an offset or Z) as 'YYYY-MM-DD HH:MM UTC'; other text as it is."""
    if not stamp:
        return "date not recorded"
    try:
        t = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return stamp
    if t.tzinfo is not None:
        t = t.astimezone(dt.timezone.utc)
    return t.strftime("%Y-%m-%d %H:%M UTC")


def load_note(context: dict) -> str:
    load = context.get("load_avg")
    if isinstance(load, list) and load:
        return f"load average {load[0]:.1f}"
    return ""


# ---- Formatting -------------------------------------------------------------------------------

def fmt(x: float | None, digits: int = 2, suffix: str = "") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}f}{suffix}"


def fmt_cv(row: Row, key: str = "vs_limit") -> str:
    c = row.cv.get(key)
    return "–" if c is None else f"{100 * c:.0f}%"


def fmt_spread(row: Row) -> str:
    """The spread of a row's vs_limit: its cv over repetitions, else the smallest and largest
    of the row's own rounds (vs_limit_lo, vs_limit_hi), else '–'."""
    if "vs_limit" in row.cv:
        return "cv " + fmt_cv(row)
    lo, hi = row.get("vs_limit_lo"), row.get("vs_limit_hi")
    return f"{lo:.2f}–{hi:.2f}" if lo is not None and hi is not None else "–"


def gb(x: float | None) -> float | None:
    return None if x is None else x / 1e9


def mb(x: float | None) -> float | None:
    return None if x is None else x / 1e6


def at_least(x: float | None, goal: float) -> bool | None:
    """Whether x reaches the goal; None when x was not measured."""
    return None if x is None else x >= goal


def verdict(ok: bool | None) -> str:
    return "–" if ok is None else ("met" if ok else "not met")


def md_table(headers: list[str], rows: list[list[str]], numeric_from: int = 1) -> str:
    """A Markdown table; columns from `numeric_from` on are right-aligned."""
    if not rows:
        return "_(no rows)_\n"
    align = ["---" if i < numeric_from else "---:" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines) + "\n"


def details(summary: str, body: str) -> str:
    return f"<details><summary>{summary}</summary>\n\n{body}\n</details>\n"


# ---- Figures ------------------------------------------------------------------------------

@dataclass
class Figures:
    """Saves figures into a folder and hands back the Markdown that shows them."""

    folder: Path
    written: list[str] = field(default_factory=list)

    def save(self, fig, name: str, alt: str, machine: str, date: str) -> str:
        # The machine and date as the figure's bottom line (placed by the constrained layout).
        fig.supxlabel(f"{machine} · {date}", x=0.995, ha="right", fontsize=7, color="0.35")
        file = f"{IMG_PREFIX}{name}.png"
        fig.savefig(self.folder / file, dpi=110, metadata={"Software": None})
        plt.close(fig)
        self.written.append(file)
        return f"![{alt}](img/{file})\n"


def subplots(*args, **kwargs):
    """plt.subplots with the constrained layout (colorbars, suptitle and footer included)."""
    return plt.subplots(*args, layout="constrained", **kwargs)


def goal_line(ax, y: float, text: str, color: str = "tab:red") -> None:
    ax.axhline(y, color=color, linestyle="--", linewidth=1)
    ax.annotate(text, xy=(1.0, y), xycoords=("axes fraction", "data"), xytext=(-4, 2),
                textcoords="offset points", ha="right", va="bottom", fontsize=7, color=color)


def annotate_bars(ax, bars, texts: list[str], fontsize: int = 7) -> None:
    for bar, text in zip(bars, texts):
        if text:
            ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), xytext=(0, 2),
                        textcoords="offset points", ha="center", va="bottom", fontsize=fontsize)


# ---- Sections -----------------------------------------------------------------------------

@dataclass
class Headline:
    """One line of the summary table at the top of the report."""

    what: str
    goal: str
    measured: str
    met: bool | None


@dataclass
class SectionOutput:
    body: str
    headlines: list[Headline] = field(default_factory=list)


@dataclass
class Context:
    json_dir: Path
    figures: Figures
    narrative_dir: Path


@dataclass
class Section:
    key: str  # the JSON file's stem: <json-dir>/<key>.json
    title: str
    source: str
    command: str  # the full-size run that produces the JSON
    render: Callable[[BenchReport, Context], SectionOutput]
    what: str  # the summary line's subject when not measured
    where: str = ""  # what the command needs, when more than `scripts/dev`


def machine_line(report: BenchReport | None, series: dict | None = None, extra: str = "") -> str:
    parts = []
    if report is not None:
        note = load_note(report.context)
        parts.append(f"Measured on {report.machine()}, {report.date()}" + (f" ({note})" if note else ""))
    if series is not None:
        parts.append(f"series: {series.get('machine', 'machine not recorded')}, {date_of(series.get('date', ''))}")
    if extra:
        parts.append(extra)
    return "_" + "; ".join(parts) + "._\n"


def other_rows(rows: list[Row], title: str = "Other rows") -> str:
    """Rows a section does not know (added later): name, time and every counter, folded away."""
    if not rows:
        return ""
    return details(f"{title} ({len(rows)})", generic_table(rows))


def generic_table(rows: list[Row]) -> str:
    skip = {"real_time", "cpu_time"}
    keys: list[str] = []
    for r in rows:
        for k in r.values:
            if k not in skip and k not in keys:
                keys.append(k)
    keys.sort(key=lambda k: (k != "vs_limit", k))
    body = []
    for r in rows:
        if r.error:
            body.append([f"`{r.name}`", "skipped: " + r.error] + [""] * len(keys))
            continue
        t = r.seconds()
        body.append([f"`{r.name}`", fmt(t * 1e3 if t is not None else None, 3)] +
                    [fmt_value(r.get(k)) for k in keys])
    return md_table(["row", "time ms"] + keys, body)


def fmt_value(x: float | None) -> str:
    if x is None:
        return "–"
    a = abs(x)
    if a != 0 and (a >= 1e5 or a < 1e-3):
        return f"{x:.3g}"
    return f"{x:.3f}" if a < 10 else f"{x:.1f}"


def classify(rows: list[Row], *patterns: re.Pattern) -> tuple[list[list[tuple[re.Match, Row]]], list[Row]]:
    """Sorts rows by the first pattern their name matches: one list of (match, row) per pattern,
    and the rest (rows no pattern knows, and skipped rows), for the section's "other rows"."""
    groups: list[list[tuple[re.Match, Row]]] = [[] for _ in patterns]
    rest = []
    for r in rows:
        for group, pattern in zip(groups, patterns):
            m = pattern.match(r.name)
            if m and not r.error:
                group.append((m, r))
                break
        else:
            rest.append(r)
    return groups, rest


def skipped_rows(rows: list[Row]) -> str:
    bad = [r for r in rows if r.error]
    if not bad:
        return ""
    return "Skipped rows: " + "; ".join(f"`{r.name}` ({r.error})" for r in bad) + ".\n"


# ---- Storage tiers ------------------------------------------------------------------------

_TIER_ROW = re.compile(r"^(read|write)/(file_io_uring|file_posix|host)/bs_KiB:(\d+)(?:/qd:(\d+))?")
_TIER_HUGE_ROW = re.compile(r"^(read|write)/file_io_uring_huge_pages/bs_KiB:(\d+)/qd:(\d+)")
_ENGINE_NAME = {"file_io_uring": "io_uring", "file_posix": "POSIX", "host": "host"}
TIERS_GOAL = 0.9


def block_text(kib: int) -> str:
    return f"{kib // 1024} MiB" if kib >= 1024 else f"{kib} KiB"


def render_tiers(rep: BenchReport, ctx: Context) -> SectionOutput:
    (matched, huge), rest = classify(rep.rows, _TIER_ROW, _TIER_HUGE_ROW)
    file_rows, host_rows = [], []
    for m, r in matched:
        op, kind, kib, qd = m.group(1), m.group(2), int(m.group(3)), int(m.group(4) or 1)
        (host_rows if kind == "host" else file_rows).append((op, _ENGINE_NAME[kind], kib, qd, r))
    out = []
    goal_cells = [c for c in file_rows if c[2] in (1024, 8192) and c[3] >= 8]
    with_ratio = [c for c in goal_cells if c[4].get("vs_limit") is not None]
    met = sum(1 for c in with_ratio if c[4].get("vs_limit") >= TIERS_GOAL)
    if goal_cells:
        out.append(f"**Goal cells** (1 MiB and 8 MiB blocks, queue depth ≥ 8): {met} of "
                   f"{len(with_ratio)} reach `vs_limit` ≥ {TIERS_GOAL}.\n")
        body = [[op, eng, block_text(kib), str(qd), fmt(gb(r.get("bytes_per_second"))),
                 fmt(gb(r.get("fio_bytes_per_second"))), fmt(r.get("vs_limit")), fmt_spread(r),
                 verdict(at_least(r.get("vs_limit"), TIERS_GOAL))]
                for op, eng, kib, qd, r in goal_cells]
        out.append(md_table(["op", "engine", "block", "qd", "ours GB/s", "fio GB/s", "vs_limit", "spread", "goal"],
                            body, numeric_from=2))
    if file_rows:
        out.append(figure_tier_heatmaps(file_rows, rep, ctx))
        out.append(figure_tier_bandwidth(file_rows, rep, ctx))
        body = [[op, eng, block_text(kib), str(qd), fmt(gb(r.get("bytes_per_second"))),
                 fmt(gb(r.get("fio_bytes_per_second"))), fmt(r.get("vs_limit")), fmt_spread(r)]
                for op, eng, kib, qd, r in file_rows]
        out.append(details(f"All file tier rows ({len(file_rows)})",
                           md_table(["op", "engine", "block", "qd", "ours GB/s", "fio GB/s", "vs_limit", "spread"],
                                    body, numeric_from=2)))
    if huge:
        body = [[m.group(1), block_text(int(m.group(2))), m.group(3), fmt(gb(r.get("bytes_per_second"))),
                 fmt(gb(r.get("fio_bytes_per_second"))), fmt(r.get("vs_limit")), fmt_spread(r),
                 fmt(gb(r.get("fio_base_pages_bytes_per_second"))), fmt(r.get("buf_run_KiB"), 0)]
                for m, r in huge]
        out.append("**Huge-page buffers** (io_uring; `aligned_buffer`'s default for large buffers) against the "
                   "grid cell's fio job run from huge pages too (`vs_limit`), and fio from its default base "
                   "pages in the same rounds:\n\n" +
                   md_table(["op", "block", "qd", "ours GB/s", "fio GB/s (huge pages)", "vs_limit", "spread",
                             "fio GB/s (base pages)", "buffer run KiB"], body, numeric_from=1))
    if host_rows:
        body = [[op, block_text(kib), fmt(gb(r.get("bytes_per_second"))),
                 fmt(gb(r.get("memcpy_bytes_per_second"))), fmt(r.get("vs_limit")), fmt_cv(r)]
                for op, _, kib, _, r in host_rows]
        out.append("**Host tier** against `memcpy` of the same size between resident buffers:\n\n" +
                   md_table(["op", "block", "ours GB/s", "memcpy GB/s", "vs_limit", "cv"], body, numeric_from=1))
    out.append(other_rows(rest))
    out.append(skipped_rows(rep.rows))
    ratios = [c[4].get("vs_limit") for c in with_ratio]
    head = Headline("File tier against fio (1 and 8 MiB, qd ≥ 8), base-page buffers like fio's",
                    f"vs_limit ≥ {TIERS_GOAL} in every cell",
                    f"{met} of {len(with_ratio)} cells; min {fmt(min(ratios))}, median {fmt(statistics.median(ratios))}"
                    if ratios else "no goal cells measured",
                    (met == len(with_ratio)) if ratios else None)
    heads = [head]
    huge_ratios = [r.get("vs_limit") for m, r in huge
                   if r.get("vs_limit") is not None and int(m.group(2)) in (1024, 8192) and int(m.group(3)) >= 8]
    if huge_ratios:
        huge_met = sum(1 for v in huge_ratios if v >= TIERS_GOAL)
        heads.append(Headline("File tier against fio (1 and 8 MiB, qd ≥ 8), huge-page buffers on both sides",
                              f"vs_limit ≥ {TIERS_GOAL} in every cell",
                              f"{huge_met} of {len(huge_ratios)} cells; min {fmt(min(huge_ratios))}, "
                              f"median {fmt(statistics.median(huge_ratios))}", huge_met == len(huge_ratios)))
    return SectionOutput("\n".join(x for x in out if x), heads)


def figure_tier_heatmaps(cells, rep: BenchReport, ctx: Context) -> str:
    ops = [o for o in ("write", "read") if any(c[0] == o for c in cells)]
    engines = [e for e in ("io_uring", "POSIX") if any(c[1] == e for c in cells)]
    sizes = sorted({c[2] for c in cells})
    depths = sorted({c[3] for c in cells})
    fig, axes = subplots(len(ops), len(engines), squeeze=False,
                             figsize=(max(7.0, 1.6 + 0.75 * len(sizes) * len(engines)),
                                      max(4.5, 1.2 + 0.45 * len(depths) * len(ops))))
    norm = mcolors.TwoSlopeNorm(vmin=0.0, vcenter=1.0, vmax=2.0)
    image = None
    for i, op in enumerate(ops):
        for j, eng in enumerate(engines):
            ax = axes[i][j]
            grid = [[math.nan] * len(sizes) for _ in depths]
            for o, e, kib, qd, r in cells:
                if o == op and e == eng and r.get("vs_limit") is not None:
                    grid[depths.index(qd)][sizes.index(kib)] = r.get("vs_limit")
            image = ax.imshow(grid, cmap="RdYlGn", norm=norm, origin="lower", aspect="auto")
            for y, qd in enumerate(depths):
                for x, kib in enumerate(sizes):
                    v = grid[y][x]
                    if not math.isnan(v):
                        ax.text(x, y, f"{v:.2f}", ha="center", va="center", fontsize=7)
                    if kib in (1024, 8192) and qd >= 8:  # a goal cell
                        ax.add_patch(plt.Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, linewidth=1.2))
            ax.set_xticks(range(len(sizes)), [block_text(k) for k in sizes], fontsize=7, rotation=45)
            ax.set_yticks(range(len(depths)), [str(d) for d in depths], fontsize=7)
            ax.set_title(f"{op}, {eng} engine", fontsize=9)
            ax.set_xlabel("block size", fontsize=8)
            ax.set_ylabel("queue depth", fontsize=8)
    fig.colorbar(image, ax=axes, shrink=0.8, label="vs_limit (ours / fio)")
    fig.suptitle("File tier against fio, same block size, queue depth and file (outlined: goal cells)", fontsize=10)
    return ctx.figures.save(fig, "tiers_vs_fio", "file tier vs fio heatmaps", rep.machine(), rep.date())


def figure_tier_bandwidth(cells, rep: BenchReport, ctx: Context) -> str:
    ops = [o for o in ("write", "read") if any(c[0] == o for c in cells)]
    engines = [e for e in ("io_uring", "POSIX") if any(c[1] == e for c in cells)]
    depths = sorted({c[3] for c in cells})
    fig, axes = subplots(len(ops), len(engines), squeeze=False, figsize=(5 * len(engines), 3.2 * len(ops)),
                             sharey=True)
    palette = plt.get_cmap("viridis")
    for i, op in enumerate(ops):
        for j, eng in enumerate(engines):
            ax = axes[i][j]
            for k, qd in enumerate(depths):
                pts = sorted((c[2], c[4]) for c in cells if c[0] == op and c[1] == eng and c[3] == qd)
                if not pts:
                    continue
                color = palette(k / max(1, len(depths) - 1) * 0.9)
                xs = [p[0] * 1024 for p in pts]
                ax.plot(xs, [gb(p[1].get("bytes_per_second")) for p in pts], "o-", color=color, label=f"ours, qd {qd}",
                        markersize=3)
                fio = [(x, gb(p[1].get("fio_bytes_per_second"))) for x, p in zip(xs, pts)
                       if p[1].get("fio_bytes_per_second") is not None]
                if fio:
                    ax.plot([f[0] for f in fio], [f[1] for f in fio], "x--", color=color, label=f"fio, qd {qd}",
                            linewidth=1, markersize=4)
            ax.set_xscale("log", base=2)
            ax.set_xticks([c[2] * 1024 for c in cells], [block_text(c[2]) for c in cells], fontsize=7)
            ax.minorticks_off()
            ax.set_title(f"{op}, {eng} engine", fontsize=9)
            ax.set_xlabel("block size", fontsize=8)
            ax.set_ylabel("GB/s", fontsize=8)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6, ncol=2)
    fig.suptitle("File tier bandwidth (solid) and fio's on the same file (dashed)", fontsize=10)
    return ctx.figures.save(fig, "tiers_bandwidth", "file tier and fio bandwidth", rep.machine(), rep.date())


# ---- Virtual tier -----------------------------------------------------------------------------

_AGG_ROW = re.compile(r"^BM_aggregate/(\d+)")
_CONTENTION_ROW = re.compile(r"^BM_contention/(\d+)/(\d+)")
VIRTUAL_GOAL = 0.9


def render_virtual_tier(rep: BenchReport, ctx: Context) -> SectionOutput:
    (agg, cont), rest = classify(rep.rows, _AGG_ROW, _CONTENTION_ROW)
    aggregate = [(int(m.group(1)), r) for m, r in agg]
    contention = [(int(m.group(1)), "node_lock" if m.group(2) == "1" else "null_lock", r) for m, r in cont]
    out, heads = [], []
    if aggregate:
        most = max(n for n, _ in aggregate)
        body = []
        for n, r in aggregate:
            paths = [fmt(mb(r.get(f"B{i}")), 0) for i in range(1, most + 1)]
            body.append([str(n)] + paths + [fmt(mb(r.get("limit_bytes_per_second")), 0),
                                            fmt(mb(r.get("bytes_per_second")), 0), fmt(r.get("vs_limit")), fmt_cv(r),
                                            verdict(at_least(r.get("vs_limit"), VIRTUAL_GOAL))])
        headers = ["paths"] + [f"B{i} MB/s" for i in range(1, most + 1)] + ["sum MB/s", "virtual tier MB/s",
                                                                          "vs_limit", "cv", "goal"]
        out.append("**Aggregate** (B1 is the disk path, B2 and B3 the throttled shm paths, each measured alone):\n\n" +
                   md_table(headers, body))
        ratios = [r.get("vs_limit") for _, r in aggregate if r.get("vs_limit") is not None]
        heads.append(Headline("Virtual tier against the sum of its paths", f"vs_limit ≥ {VIRTUAL_GOAL}",
                              ", ".join(f"{n} paths {fmt(r.get('vs_limit'))}" for n, r in aggregate),
                              all(x >= VIRTUAL_GOAL for x in ratios) if ratios else None))
    if contention:
        body = [[str(p), lock, fmt(mb(r.get("aggregate_bytes_per_second")), 0), fmt(r.get("vs_limit")),
                 fmt(r.get("p50_ms"), 1), fmt(r.get("p99_ms"), 1)] for p, lock, r in contention]
        headers = ["processes", "lock", "aggregate MB/s", "vs one process", "p50 ms", "p99 ms"]
        out.append("**Contention** (processes offloading to one disk path at once; `vs_limit` against one process "
                   "alone):\n\n" + md_table(headers, body, numeric_from=2))
    if aggregate or contention:
        out.append(figure_virtual(aggregate, contention, rep, ctx))
    out.append(other_rows(rest))
    out.append(skipped_rows(rep.rows))
    return SectionOutput("\n".join(x for x in out if x), heads)


def figure_virtual(aggregate, contention, rep: BenchReport, ctx: Context) -> str:
    panels = (1 if aggregate else 0) + (1 if contention else 0)
    fig, axes = subplots(1, panels, squeeze=False, figsize=(5.2 * panels, 3.6))
    ax_i = 0
    if aggregate:
        ax = axes[0][ax_i]
        ax_i += 1
        colors = ["tab:blue", "tab:cyan", "tab:olive", "tab:gray"]
        for k, (n, r) in enumerate(aggregate):
            bottom = 0.0
            for i in range(1, n + 1):
                v = mb(r.get(f"B{i}")) or 0.0
                ax.bar(k - 0.2, v, 0.38, bottom=bottom, color=colors[(i - 1) % len(colors)],
                       label=("disk path alone" if i == 1 else f"shm path {i - 1} alone") if k == len(aggregate) - 1
                       else None)
                bottom += v
            bar = ax.bar(k + 0.2, mb(r.get("bytes_per_second")) or 0.0, 0.38, color="tab:orange",
                         label="virtual tier" if k == 0 else None)
            annotate_bars(ax, bar, [f"{fmt(r.get('vs_limit'))} of sum"])
        ax.set_xticks(range(len(aggregate)), [f"{n} paths" for n, _ in aggregate])
        ax.set_ylabel("MB/s (write then read back)")
        ax.set_title("Virtual tier against the sum of its paths", fontsize=9)
        ax.legend(fontsize=7)
    if contention:
        ax = axes[0][ax_i]
        procs = sorted({p for p, _, _ in contention})
        for j, lock in enumerate(("null_lock", "node_lock")):
            pts = {p: r for p, l, r in contention if l == lock}
            xs = [i + (j - 0.5) * 0.38 for i, p in enumerate(procs) if p in pts]
            vals = [mb(pts[p].get("aggregate_bytes_per_second")) or 0.0 for p in procs if p in pts]
            bars = ax.bar(xs, vals, 0.36, label=lock, color="tab:gray" if j == 0 else "tab:purple")
            annotate_bars(ax, bars, [f"p99 {fmt(pts[p].get('p99_ms'), 0)} ms" for p in procs if p in pts], fontsize=6)
        ax.set_xticks(range(len(procs)), [f"{p} processes" for p in procs])
        ax.set_ylabel("aggregate MB/s")
        ax.set_title("Processes sharing one disk path", fontsize=9)
        ax.legend(fontsize=7)
    return ctx.figures.save(fig, "virtual_tier", "virtual tier against the sum of its paths", rep.machine(),
                            rep.date())


# ---- AdamW step -------------------------------------------------------------------------------

_ADAM_ROW = re.compile(r"^BM_adam<(\w+), (\w+)>/threads:(\d+)/simd:(\d+)/scan:(\d+)")
_STREAM_ROW = re.compile(r"^BM_stream<(\w+), (\w+)>/threads:(\d+)")
_CONVERT_ROW = re.compile(r"^BM_(widen|narrow)<(\w+)>/simd:(\d+)")
_DTYPE = {"float": "fp32", "float16": "fp16", "bfloat16": "bf16"}
_SIMD = {0: "scalar loop", 1: "AVX2", 2: "AVX-512"}
ADAM_GOAL = 0.92


def render_adam(rep: BenchReport, ctx: Context) -> SectionOutput:
    (adam, convert, _streams), rest = classify(rep.rows, _ADAM_ROW, _CONVERT_ROW, _STREAM_ROW)
    steps = [{"grad": _DTYPE.get(m.group(1), m.group(1)),
              "copy": "" if m.group(2) == "no_copy" else _DTYPE.get(m.group(2), m.group(2)) + " copy",
              "threads": int(m.group(3)), "simd": _SIMD.get(int(m.group(4)), m.group(4)), "scan": m.group(5) == "1",
              "row": r} for m, r in adam]
    converts = []
    for m, r in convert:
        half = _DTYPE.get(m.group(2), m.group(2))
        what = f"{half} → fp32" if m.group(1) == "widen" else f"fp32 → {half}"
        converts.append((what, _SIMD.get(int(m.group(3)), m.group(3)), r))
    out, heads = [], []
    if steps:
        most = max(s["threads"] for s in steps)

        def kernel(s):
            return s["simd"] + (", scan" if s["scan"] else "")

        body = [[s["grad"] + (", " + s["copy"] if s["copy"] else ""), str(s["threads"]), kernel(s),
                 fmt(s["row"].get("Gparams_per_s"), 3), fmt(gb(s["row"].get("bytes_per_second")), 1),
                 fmt(s["row"].get("limit_GBps"), 1), fmt(s["row"].get("vs_limit")), fmt_cv(s["row"])]
                for s in steps]
        out.append(md_table(["gradients", "threads", "kernel", "G params/s", "GB/s", "limit GB/s", "vs_limit", "cv"],
                            body, numeric_from=3))
        goal_rows = [s for s in steps if s["threads"] == most and not s["scan"] and not s["copy"]
                     and s["simd"] != "scalar loop" and s["row"].get("vs_limit") is not None]
        best = {}
        for s in goal_rows:  # the widest kernel per gradient type (AVX-512 before AVX2)
            if s["grad"] not in best or s["simd"] == "AVX-512":
                best[s["grad"]] = s
        if best:
            heads.append(Headline(f"AdamW step against the memory roofline ({most} threads)",
                                  f"vs_limit ≥ {ADAM_GOAL} for fp32, fp16, bf16",
                                  ", ".join(f"{g} {fmt(s['row'].get('vs_limit'))}" for g, s in best.items()),
                                  all(s["row"].get("vs_limit") >= ADAM_GOAL for s in best.values())))
    if converts:
        body = [[what, simd, fmt(gb(r.get("items_per_second")) or r.get("Gparams_per_s"), 2), fmt(r.get("vs_limit")),
                 fmt_cv(r)] for what, simd, r in converts]
        out.append("**Widening and narrowing** (one thread) against a `memcpy` of the same total bytes, timed in "
                   "the same iteration:\n\n" + md_table(["conversion", "kernel", "G values/s", "vs_limit", "cv"], body,
                                                      numeric_from=2))
    if steps:
        out.append(figure_adam(steps, converts, max(s["threads"] for s in steps), rep, ctx))
    out.append(other_rows(rest))
    out.append(skipped_rows(rep.rows))
    return SectionOutput("\n".join(x for x in out if x), heads)


def figure_adam(steps, converts, threads: int, rep: BenchReport, ctx: Context) -> str:
    grads = ["fp32", "fp16", "bf16"]
    kernels = {"AVX-512": 0, "AVX2": 1, "scalar loop": 3}
    rows = sorted((s for s in steps if s["threads"] == threads),
                  key=lambda s: (grads.index(s["grad"]) if s["grad"] in grads else 9, bool(s["copy"]),
                                 kernels.get(s["simd"], 2) + (0.5 if s["scan"] else 0)))
    panels = 2 if converts else 1
    fig, axes = subplots(1, panels, squeeze=False, figsize=(8 + 4 * (panels - 1), 4.2),
                         gridspec_kw={"width_ratios": [2, 1][:panels]})
    ax = axes[0][0]
    labels = [s["grad"] + (" +copy" if s["copy"] else "") + "\n" + s["simd"].replace(" loop", "") +
              (" scan" if s["scan"] else "") for s in rows]
    xs = list(range(len(rows)))
    kinds = [("scalar" if s["simd"] == "scalar loop" else "scan" if s["scan"] else "step") for s in rows]
    color = {"step": "tab:blue", "scan": "tab:olive", "scalar": "tab:gray"}
    bars = ax.bar(xs, [gb(s["row"].get("bytes_per_second")) or 0.0 for s in rows], 0.6,
                  color=[color[k] for k in kinds])
    limits = [s["row"].get("limit_GBps") for s in rows]
    ax.scatter([x for x, lim in zip(xs, limits) if lim], [lim for lim in limits if lim], marker="_", s=300,
               color="black", linewidths=2, zorder=3)
    annotate_bars(ax, bars, [fmt(s["row"].get("vs_limit")) for s in rows], fontsize=6)
    handles = [plt.Line2D([], [], color="black", marker="_", linestyle="", markersize=14, markeredgewidth=2)]
    handles += [plt.Rectangle((0, 0), 1, 1, color=color[k]) for k in ("step", "scan", "scalar")]
    ax.legend(handles, ["memory roofline: a stream of the same bytes, same iteration", "AdamW step",
                        "with the overflow scan", "scalar loop (portable fallback)"], fontsize=6, loc="upper right")
    ax.set_xticks(xs, labels, fontsize=6)
    ax.set_ylabel("GB/s moved (28 B/param fp32, 26 fp16/bf16)", fontsize=8)
    ax.set_title(f"AdamW step, {threads} threads, against its memory roofline (labels: vs_limit; goal "
                 f"{ADAM_GOAL})", fontsize=9)
    if converts:
        ax2 = axes[0][1]
        bars = ax2.bar(range(len(converts)), [r.get("vs_limit") or 0.0 for _, _, r in converts], 0.6,
                       color=["tab:gray" if simd == "scalar loop" else "tab:blue" for _, simd, _ in converts])
        annotate_bars(ax2, bars, [fmt(r.get("vs_limit")) for _, _, r in converts], fontsize=6)
        goal_line(ax2, 1.0, "memcpy", color="black")
        ax2.set_xticks(range(len(converts)), [f"{what}\n{simd.replace(' loop', '')}" for what, simd, _ in converts],
                       fontsize=6, rotation=45, ha="right")
        ax2.set_ylabel("vs_limit (memcpy of the same bytes = 1)", fontsize=8)
        ax2.set_title("Widening and narrowing, one thread", fontsize=9)
    return ctx.figures.save(fig, "adam", "AdamW step against the memory roofline", rep.machine(), rep.date())


# ---- Update phase -----------------------------------------------------------------------------

_UPDATE_ROW = re.compile(r"^update_phase/([^/]+)")
_UPDATE_NAMES = {
    "baseline": "baseline (ascending, fp32 gradients on the tier)",
    "+lazy_widening": "+ lazy widening",
    "+alternating_resident": "+ alternating order, resident set",
    "+second_path": "+ second path (virtual tier)",
    "+node_lock_2proc": "+ node_lock, 2 processes",
    "baseline_read_ahead": "reference: baseline reading ahead (whole budget)",
}
# The ablation's baseline (the speedups are over it), the row the goal is about, and the
# reference that is not part of the ablation (bench_update_phase.cpp's row names).
_UPDATE_BASELINE, _UPDATE_FULL, _UPDATE_REFERENCE = "baseline", "+node_lock_2proc", "baseline_read_ahead"
_DISK_UNDER_ADAM_ROW = re.compile(r"^disk_under_adam/threads:(\d+)")
UPDATE_GOAL_SPEEDUP, UPDATE_GOAL_VS_LIMIT = 2.3, 0.9


def render_update(rep: BenchReport, ctx: Context) -> SectionOutput:
    (matched, contended), rest = classify(rep.rows, _UPDATE_ROW, _DISK_UNDER_ADAM_ROW)
    rows = [(m.group(1), r) for m, r in matched]
    out, heads = [], []
    if rows:
        body = []
        for key, r in rows:
            body.append([_UPDATE_NAMES.get(key, key), fmt(r.get("update_s")), fmt(r.get("read_wait_s")),
                         fmt(r.get("compute_s")), fmt(r.get("write_wait_s")), fmt(r.get("handover_s")),
                         fmt(gb(r.get("bytes_moved")), 1), fmt(r.get("served_resident"), 0),
                         fmt(r.get("speedup")), fmt(r.get("speedup_with_handover")),
                         fmt(r.get("speedup_vs_read_ahead")), fmt(r.get("floor_s")),
                         fmt(r.get("vs_limit")), busy_percent(r.get("disk_busy")), busy_percent(r.get("shm_busy"))])
        out.append(md_table(["row", "update s", "read-wait", "compute", "write-wait", "hand-over s", "moved GB",
                             "resident", "speedup", "with hand-over", "vs read-ahead baseline", "floor s",
                             "vs_limit", "disk busy", "shm busy"], body))
        if any(r.get("disk_busy") is not None for _, r in rows):
            out.append("*disk busy*, *shm busy*: the share of the call during which the path had a read, and a "
                       "write, in flight (the mean of the two directions; two processes add up, since node_lock "
                       "lets one read and one write a path at a time). The floor assumes 100%.\n")
        first = rows[0][1]
        disk, shm = first.get("disk_mixed_Bps"), first.get("shm_throttle_Bps")
        if disk:
            out.append(f"Disk under the 50/50 mix (median of the rounds): {fmt(gb(disk))} GB/s; shm throttle "
                       f"{fmt(gb(shm))} GB/s; optimizer state {fmt(first.get('state_GiB'), 3)} GiB, host buffers "
                       f"{fmt(first.get('buffer_GiB'), 2)} GiB.\n")
        out.append(contention_table(contended))
        # The comparison's rows by their names: a row that was not run (or failed) is absent,
        # and its figures print as "–", never another row's.
        ablation = [(k, r) for k, r in rows if k != _UPDATE_REFERENCE]
        named = dict(ablation)
        base, full = named.get(_UPDATE_BASELINE), named.get(_UPDATE_FULL)
        if ablation:
            out.append("**Next to MLP-Offload's published table.** Source: " + MLP_OFFLOAD_PUBLISHED["source"] +
                       ".\n\n" + comparison_table(ablation, base, full))
        else:
            out.append("_No row of the ablation was measured (only the reference): no comparison with "
                       "MLP-Offload._\n")
        out.append(figure_update(rows, rep, ctx))
        full_name = f"Update phase, full configuration ({_UPDATE_NAMES[_UPDATE_FULL]})"
        goal = f"speedup ≥ {UPDATE_GOAL_SPEEDUP}, vs_limit ≥ {UPDATE_GOAL_VS_LIMIT}"
        if full is None:
            heads.append(Headline(full_name, goal, f"not measured (no `{_UPDATE_FULL}` row)", None))
        else:
            sp, vs = full.get("speedup"), full.get("vs_limit")
            heads.append(Headline(full_name, goal,
                                  f"speedup {fmt(sp)} ({fmt(full.get('speedup_with_handover'))} with hand-over), "
                                  f"vs_limit {fmt(vs)}",
                                  None if sp is None or vs is None else
                                  (sp >= UPDATE_GOAL_SPEEDUP and vs >= UPDATE_GOAL_VS_LIMIT)))
    out.append(other_rows(rest))
    out.append(skipped_rows(rep.rows))
    return SectionOutput("\n".join(x for x in out if x), heads)


def contention_table(contended) -> str:
    """The disk beside the Adam kernel (bench_update_phase's disk_under_adam rows), or nothing."""
    if not contended:
        return ""
    body = [[m.group(1), fmt(gb(r.get("idle_Bps"))), fmt(gb(r.get("loaded_Bps"))), fmt(r.get("loaded_vs_idle")),
             fmt(gb(r.get("adam_Bps")), 1)] for m, r in contended]
    return ("**The disk while the Adam step runs** (same run): the floor's fio job alone, then beside "
            "the update's own kernel (adamw_step with fp16 gradients over 768 MiB of state, in a loop) on "
            "as many threads as the rows compute with (one per process). The rows overlap the two, so "
            "*beside / idle* is what the floor's bandwidth shrinks to while a call computes.\n\n" +
            md_table(["Adam threads", "fio idle GB/s", "fio beside Adam GB/s", "beside / idle",
                      "Adam's memory traffic GB/s"], body))


def busy_percent(fraction) -> str:
    """A path's busy fraction as a percentage, or the missing-value mark."""
    return fmt(100 * fraction if fraction is not None else None, 0, "%")


def comparison_table(rows, base: Row | None, full: Row | None) -> str:
    """MLP-Offload's published figures beside this run's: `rows` the ablation (the reference
    excluded), `base` its baseline row and `full` the row the goal is about, each None when it
    was not measured (its figures are then "–")."""
    pub = MLP_OFFLOAD_PUBLISHED
    speeds = [r.get("speedup") for k, r in rows if k != _UPDATE_BASELINE and r.get("speedup") is not None]
    best = f"best row {fmt(max(speeds))}x" if speeds else "best row –"
    # The figures of `base` and `full` are read through these: None where the row is absent.
    b = base.get if base is not None else (lambda key: None)
    f = full.get if full is not None else (lambda key: None)
    sp_pub = pub["update_speedup"]
    lines = []
    lines.append(["update speedup, full configuration",
                  f"{min(sp_pub.values()):.2f}-{max(sp_pub.values()):.2f}x ("
                  + ", ".join(f"{k} {v:.2f}x" for k, v in sp_pub.items()) + ")",
                  (f"{fmt(f('speedup'))}x ({fmt(f('speedup_with_handover'))}x with hand-over); "
                   if f("speedup") is not None else "–; ") + best])
    subgroups = f("subgroups")
    resident = f("served_resident")
    lines.append(["subgroups served from host memory",
                  f"{pub['resident_subgroups_percent'][0]}-{pub['resident_subgroups_percent'][1]}%",
                  f"{fmt(100 * resident / subgroups, 0)}% ({fmt(resident, 0)} of {fmt(subgroups, 0)})"
                  if resident is not None and subgroups else
                  f"{fmt(resident, 0)} subgroups" if resident is not None else "–"])
    rw, up = pub["baseline_read_wait"]
    base_share = b("read_wait_s") / b("update_s") if b("read_wait_s") is not None and b("update_s") else None
    lines.append(["baseline update time waiting for reads", f"{100 * rw / up:.0f}% (52B: {rw:.0f} of {up:.0f} s)",
                  fmt(100 * base_share if base_share is not None else None, 0, "%")])
    lo, hi = pub["iteration_speedup"]
    lines.append(["iteration speedup", f"{lo:.2f}-{hi:.2f}x", "not measured (the update phase alone)"])
    lo, hi = pub["backward_speedup"]
    lines.append(["backward: fp32 gradient hand-over", f"removed (backward {lo:.0f}-{hi:.0f}x faster)",
                  f"{fmt(b('handover_s'), 2, ' s')} in the baseline, {fmt(f('handover_s'), 2, ' s')} in the full row"])
    state = b("state_GiB") or f("state_GiB")  # the same state in every row
    params = state * 2**30 / 12 if state else None
    rate = [params / get("update_s") / 1e9 if params and get("update_s") else None for get in (b, f)]
    g_lo, g_hi = pub["update_gparams_per_s"]
    lines.append(["update throughput, G params/s",
                  f"{pub['update_gparams_per_s_baseline']} baseline, {g_lo}-{g_hi} (per 4-GPU node)",
                  f"{fmt(rate[0])} baseline, {fmt(rate[1])} full (this machine)"])
    return md_table(["", "MLP-Offload (published)", "Spillway (this run)"], lines, numeric_from=9)


def figure_update(rows, rep: BenchReport, ctx: Context) -> str:
    fig, (ax, ax2) = subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    names = [_UPDATE_NAMES.get(k, k) for k, _ in rows]
    ys = list(range(len(rows)))[::-1]
    parts = [("read_wait_s", "read-wait", "tab:red"), ("compute_s", "compute", "tab:blue"),
             ("write_wait_s", "write-wait", "tab:orange")]
    left = [0.0] * len(rows)
    for key, label, color in parts:
        vals = [r.get(key) or 0.0 for _, r in rows]
        ax.barh(ys, vals, 0.6, left=left, color=color, label=label)
        left = [a + b for a, b in zip(left, vals)]
    rest = [max(0.0, (r.get("update_s") or 0.0) - l) for (_, r), l in zip(rows, left)]
    ax.barh(ys, rest, 0.6, left=left, color="0.8", label="other")
    hand = [r.get("handover_s") or 0.0 for _, r in rows]
    ax.barh(ys, hand, 0.6, left=[(r.get("update_s") or 0.0) for _, r in rows], color="white", edgecolor="tab:red",
            hatch="///", label="hand-over in backward")
    floors = [r.get("floor_s") for _, r in rows]
    ax.scatter([f for f in floors if f], [y for y, f in zip(ys, floors) if f], marker="|", s=250, color="black",
               linewidths=2, label="storage floor", zorder=3)
    ax.set_yticks(ys, names, fontsize=7)
    ax.set_xlabel("seconds per update phase (median)")
    ax.set_title("Where the update phase's time goes, against its storage floor", fontsize=9)
    ax.legend(fontsize=6, loc="lower right")
    pub = MLP_OFFLOAD_PUBLISHED["update_speedup"]
    ours = [(k, r) for k, r in rows if k != _UPDATE_BASELINE and r.get("speedup") is not None]
    x_ours = list(range(len(ours)))
    b1 = ax2.bar([x - 0.2 for x in x_ours], [r.get("speedup") for _, r in ours], 0.38, color="tab:blue",
                 label="Spillway: update")
    ax2.bar([x + 0.2 for x in x_ours], [r.get("speedup_with_handover") or 0 for _, r in ours], 0.38,
            color="tab:cyan", label="Spillway: update + hand-over")
    annotate_bars(ax2, b1, [fmt(r.get("speedup")) for _, r in ours], fontsize=6)
    x_pub = [len(ours) + 0.6 + i for i in range(len(pub))]
    b2 = ax2.bar(x_pub, list(pub.values()), 0.6, color="tab:green", label="MLP-Offload, published (update)")
    annotate_bars(ax2, b2, [f"{v:.2f}" for v in pub.values()], fontsize=6)
    ax2.axhline(1.0, color="0.4", linewidth=0.8)
    goal_line(ax2, UPDATE_GOAL_SPEEDUP, f"goal {UPDATE_GOAL_SPEEDUP}x")
    ax2.set_xticks(x_ours + x_pub, [_UPDATE_NAMES.get(k, k).replace("+ ", "+").split(" (")[0] for k, _ in ours]
                   + list(pub.keys()), fontsize=6, rotation=35, ha="right")
    ax2.set_ylabel("speedup over the baseline")
    ax2.set_title("Speedups: this run (per row) and the paper (per model)", fontsize=9)
    ax2.legend(fontsize=6, loc="upper left")
    return ctx.figures.save(fig, "update_phase", "update-phase ablation", rep.machine(), rep.date())


# ---- Activation stash ---------------------------------------------------------------------

_STASH_ROW = re.compile(r"^BM_stash/layers:(\d+)/MiB:(\d+)/ms:(\d+)/MBps:(\d+)/file:(\d)/offload_all:(\d)")
STASH_GOAL_PEAK, STASH_GOAL_OVERHEAD, STASH_GOAL_OVERHEAD_SLOW = 0.55, 0.05, 0.10


def render_stash(rep: BenchReport, ctx: Context) -> SectionOutput:
    (matched,), rest = classify(rep.rows, _STASH_ROW)
    rows = [{"tier": "file" if m.group(5) == "1" else "host", "MBps": int(m.group(4)),
             "split": "offload all" if m.group(6) == "1" else "adaptive", "row": r} for m, r in matched]
    out, heads = [], []
    series = load_series(ctx.json_dir / "stash_series.json")
    if rows:
        body = []
        for x in rows:
            r = x["row"]
            need = r.get("need_GBps")
            rate = r.get("rate_GBps", x["MBps"] / 1e3)  # the throttle's rate (the name's, before the counter)
            times = f" ({fmt(rate / need, 2)}x need)" if need and rate else ""
            first = r.get("first_kept")
            layers = r.get("layers", int(_STASH_ROW.match(r.name).group(1)))
            if x["split"] != "adaptive":
                kept = "–"
            else:
                kept = "none" if first is None or first >= layers else f"{first:.0f}"
            x["fast"] = bool(need and rate and rate >= need)
            body.append([x["tier"], f"{fmt(rate * 1e3, 0) if rate else 'unthrottled'} MB/s{times}", x["split"], kept,
                         fmt(r.get("peak_ratio")),
                         fmt(100 * r.get("overhead") if r.get("overhead") is not None else None, 1, " %"),
                         fmt_cv(r), fmt(r.get("load_wait_ms"), 1), fmt(r.get("write_skips"), 1)])
        out.append(md_table(["tier", "rate", "split", "first kept layer", "peak_ratio", "overhead", "cv",
                             "backward waited ms", "write skips"], body, numeric_from=3))
        fast = [x for x in rows if x["fast"] and x["split"] == "adaptive"]
        slow = [x["row"] for x in rows if x not in fast]
        if fast:
            ok = all((x["row"].get("peak_ratio") or 9) <= STASH_GOAL_PEAK and
                     (x["row"].get("overhead") or 9) <= STASH_GOAL_OVERHEAD for x in fast)
            heads.append(Headline("Activation stash, bandwidth suffices",
                                  f"peak ≥ 45% lower (ratio ≤ {STASH_GOAL_PEAK}), overhead ≤ 5%",
                                  "; ".join(f"{x['tier']}: peak {fmt(x['row'].get('peak_ratio'))}, overhead "
                                            f"{fmt(100 * (x['row'].get('overhead') or 0), 1)}%" for x in fast), ok))
        if slow:
            worst = max((r.get("overhead") or 0) for r in slow)
            heads.append(Headline("Activation stash, bandwidth short", "overhead ≤ 10%",
                                  f"worst overhead {fmt(100 * worst, 1)}%", worst <= STASH_GOAL_OVERHEAD_SLOW))
    if series is not None and series["runs"]:
        out.append(figure_stash(series, rep, ctx))
        out.append(machine_line(None, series))
    elif rows:
        out.append("_The memory series (stash_series.json) was not found beside stash.json: run the benchmark "
                   "again with a bench_stash that writes it._\n")
    out.append(other_rows(rest))
    out.append(skipped_rows(rep.rows))
    return SectionOutput("\n".join(x for x in out if x), heads)


def figure_stash(series: dict, rep: BenchReport, ctx: Context) -> str:
    """Rows: resident bytes with the pool (what peak_ratio counts), then live bytes without it;
    columns: one per tier."""
    tiers = [t for t in ("host", "file") if any(r.get("tier") == t for r in series["runs"])]
    tiers += sorted({r.get("tier", "?") for r in series["runs"]} - set(tiers))
    fig, axes = subplots(2, len(tiers), squeeze=False, figsize=(6 * len(tiers), 6.4), sharey=True, sharex="col")
    mib = float(1 << 20)
    measures = [("resident MiB, pool included", lambda x: [b / mib for b in x["resident_bytes"]]),
                ("live MiB (tensors, reads in flight)",
                 lambda x: [(b - p) / mib for b, p in zip(x["resident_bytes"], x["pooled_bytes"])])]
    palette = plt.get_cmap("tab10")
    for col, tier in enumerate(tiers):
        runs = sorted((r for r in series["runs"] if r.get("tier") == tier),
                      key=lambda r: (-(r.get("MBps") or math.inf), r.get("split", "")))
        keep = runs[0]["keep_all"]
        for row, (ylabel, values) in enumerate(measures):
            ax = axes[row][col]
            ax.plot(keep["t_ms"], values(keep), color="black", linewidth=2, drawstyle="steps-post",
                    label="keep everything")
            for i, run in enumerate(runs):
                need, mbps = run.get("need_GBps"), run.get("MBps")
                rate = f"{mbps:.0f} MB/s" + (f" ({mbps / 1e3 / need:.2g}x need)" if need else "") if mbps \
                    else "unthrottled"
                ax.plot(run["stash"]["t_ms"], values(run["stash"]), color=palette(i), linewidth=1.2,
                        drawstyle="steps-post", label=f"stash, {rate}, {run.get('split', '').replace('_', ' ')}")
            start = keep.get("backward_start_ms", 0)
            ax.axvline(start, color="0.5", linewidth=0.8, linestyle="--")
            ax.annotate("backward →", (start, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -10),
                        textcoords="offset points", fontsize=7, color="0.4")
            ax.set_ylabel(ylabel, fontsize=8)
            ax.grid(alpha=0.3)
            if row == 0:
                shape = (f"{runs[0].get('layers')} layers of {runs[0].get('MiB'):g} MiB, "
                         f"{runs[0].get('forward_ms'):g} ms each")
                ax.set_title(f"{tier} tier: {shape}", fontsize=9)
                ax.legend(fontsize=6, loc="lower right")
            else:
                ax.set_xlabel("ms into the training step")
    fig.suptitle("Activation memory over one training step: the stash against keeping everything", fontsize=10)
    return ctx.figures.save(fig, "stash_memory", "stash resident memory over a step", series.get("machine", ""),
                            date_of(series.get("date", "")))


# ---- mini-GPT -----------------------------------------------------------------------------

_GPT_ROW = re.compile(r"^step/([^/]+)/([^/]+)(?:/ranks:(\d+))?")
_SGEMM_ROW = re.compile(r"^sgemm_limit")
_PATH_ROW = re.compile(r"^path_bandwidth")
GPT_GOAL_PEAK, GPT_GOAL_ALL_VS_NONE, GPT_GOAL_LLMC = 0.55, 1.15, 2.0


def render_mini_gpt(rep: BenchReport, ctx: Context) -> SectionOutput:
    (limits, paths, matched), rest = classify(rep.rows, _SGEMM_ROW, _PATH_ROW, _GPT_ROW)
    sgemm = limits[0][1] if limits else None
    rows = [(m.group(1), m.group(2), int(m.group(3) or 1), r) for m, r in matched]
    out, heads = [], []
    if sgemm is not None and sgemm.get("flops_per_s"):
        kernels = rep.context.get("matmul_kernels")
        out.append(f"The matmul limit (M=N=K fp32 product through the trainer's matmul path): "
                   f"{fmt(sgemm.get('flops_per_s') / 1e9, 1)} GFLOP/s"
                   + (f" ({kernels})" if kernels else "") + ".\n")
    for _, r in paths:
        where = ("/dev/shm, the `_shm` rows' path" if r.name.startswith("path_bandwidth/shm")
                 else "the scratch directory")
        out.append(f"The offload path (a file tier in {where}): write "
                   f"{fmt(mb(r.get('write_bytes_per_s')), 0)} MB/s, "
                   f"read {fmt(mb(r.get('read_bytes_per_s')), 0)} MB/s.\n")
    if rows:
        by = {(c, m, k): r for c, m, k, r in rows}

        def vs_none(cfg, mode, ranks, r):
            """The row's vs_none (the median over runs paired with `none` runs), else its step
            time over the `none` row's of the same config and ranks."""
            if r.get("vs_none") is not None or mode == "none":
                return r.get("vs_none", 1.0 if mode == "none" else None)
            none = by.get((cfg, "none", ranks))
            if none and none.get("ms_per_step") and r.get("ms_per_step"):
                return r.get("ms_per_step") / none.get("ms_per_step")
            return None

        def vs_none_cell(cfg, mode, ranks, r):
            """vs_none, with the spread of the paired runs when the row has several."""
            cell = fmt(vs_none(cfg, mode, ranks, r))
            if (r.get("vs_none_pairs") or 0) > 1 and r.get("vs_none_min") is not None:
                cell += f" ({fmt(r.get('vs_none_min'))}-{fmt(r.get('vs_none_max'))})"
            return cell

        body = [[cfg, mode, str(ranks), fmt(r.get("ms_per_step"), 1), vs_none_cell(cfg, mode, ranks, r),
                 fmt(r.get("cpu_ms_per_step"), 1), fmt(r.get("vs_limit")), fmt(r.get("act_peak_vs_all_kept")),
                 fmt(r.get("update_ms"), 1), fmt(r.get("io_wait_ms"), 1), fmt(r.get("param_wait_ms"), 1),
                 fmt(r.get("speedup_vs_llmc")),
                 fmt(r.get("speedup_vs_llmc_cpu"))]
                for cfg, mode, ranks, r in rows]
        out.append(md_table(["config", "offload", "ranks", "ms/step", "vs none (paired runs' range)", "CPU ms/step",
                             "vs_limit (matmul)",
                             "activation peak vs all kept", "update ms", "I/O wait ms",
                             "forward's wait for the update ms", "vs llm.c (wall)",
                             "vs llm.c (CPU)"], body, numeric_from=2))
        taxed = [(cfg, mode, ranks, r) for cfg, mode, ranks, r in rows if r.get("io_tax") is not None]
        if taxed:
            out.append("What the machine charges for the bytes: after each offloading run, a `none` run "
                       "(which touches no path) while fio moves that run's bytes each way at its pace "
                       "(random 1 MiB O_DIRECT reads and writes on the same path). `none` under that load "
                       "over `none` alone is the machine's tax on the bytes; the offloading row over `none` "
                       "under the load is what the library adds to it (1: nothing).\n")
            out.append(md_table(
                ["config", "offload", "MB per step (both ways)", "fio moved MB/s (read / write)",
                 "`none` under fio ms", "`none` under fio vs `none`", "row vs `none` under fio"],
                [[cfg, mode, fmt(mb(r.get("io_load_bytes_per_step")), 1),
                  f"{fmt(mb(r.get('io_load_read_bytes_per_s')), 0)} / {fmt(mb(r.get('io_load_write_bytes_per_s')), 0)}",
                  fmt(r.get("none_under_io_ms"), 1), fmt(r.get("io_tax")), fmt(r.get("vs_none_under_io"))]
                 for cfg, mode, ranks, r in taxed], numeric_from=2))
        for cfg in dict.fromkeys(c for c, _, _, _ in rows):
            if cfg.endswith("_sync"):
                continue  # an ablation row (every update in its own phase), not a goal row
            none, full = by.get((cfg, "none", 1)), by.get((cfg, "all", 1))
            ratio = vs_none(cfg, "all", 1, full) if full else None
            if ratio is not None:
                peak = full.get("act_peak_vs_all_kept")
                suffices = full.get("bandwidth_suffices")
                note = "" if suffices is None else (", path bandwidth suffices" if suffices else
                                                    ", path bandwidth short of the goal's premise")
                fw, fn = full.get("forward_write_floor_ms"), full.get("forward_ms_none")
                # The `none` step the premise was judged against: the paired runs' median, which
                # path_needed_bytes_per_s divides the step's bytes by.
                floor, moved, needed = (full.get(k) for k in
                                        ("path_floor_ms", "path_bytes_per_step", "path_needed_bytes_per_s"))
                step = moved / needed * 1e3 if moved and needed else None
                parts = []
                if suffices is not None and floor is not None and step is not None:
                    parts.append(f"the step's path traffic {fmt(floor, 0)} ms at the path's bandwidth, "
                                 f"`none`'s step {fmt(step, 0)} ms")
                if suffices is not None and fw is not None and fn is not None:
                    parts.append(f"forward's writes {fmt(fw, 1)} ms at the path's write bandwidth, forward {fmt(fn, 1)} ms")
                if full.get("io_tax") is not None:
                    parts.append(f"`none` while fio moves the same bytes {fmt(full.get('io_tax'))}x, "
                                 f"`all` against that {fmt(full.get('vs_none_under_io'))}x")
                if parts:
                    note += " (" + "; ".join(parts) + ")"
                heads.append(Headline(f"mini-GPT {cfg}: `all` against `none`",
                                      f"step ≤ {GPT_GOAL_ALL_VS_NONE}x (when the bandwidth suffices), activation "
                                      f"peak ≤ {GPT_GOAL_PEAK}", f"step {fmt(ratio)}x, peak {fmt(peak)}{note}",
                                      ratio <= GPT_GOAL_ALL_VS_NONE and (peak or 9) <= GPT_GOAL_PEAK))
            if none and none.get("speedup_vs_llmc") is not None:
                heads.append(Headline(f"mini-GPT {cfg} against llm.c's CPU trainer", f"≥ {GPT_GOAL_LLMC}x per step",
                                      f"{fmt(none.get('speedup_vs_llmc'))}x wall, "
                                      f"{fmt(none.get('speedup_vs_llmc_cpu'))}x CPU time",
                                      none.get("speedup_vs_llmc") >= GPT_GOAL_LLMC))
    series = load_series(ctx.json_dir / "mini_gpt_series.json")
    if series is not None and series["runs"]:
        out.append(figure_mini_gpt(series, ctx))
        out.append(machine_line(None, series))
    else:
        out.append("_Loss curves not plotted: mini_gpt_series.json was not found beside mini_gpt.json._\n")
    out.append(other_rows(rest))
    out.append(skipped_rows(rep.rows))
    return SectionOutput("\n".join(x for x in out if x), heads)


def loss_difference(runs: list[dict]) -> float | None:
    """The largest |loss difference| at any step between runs (None when fewer than two)."""
    if len(runs) < 2:
        return None
    worst = 0.0
    ref = runs[0]["loss"]
    for r in runs[1:]:
        for a, b in zip(ref, r["loss"]):
            worst = max(worst, abs(a - b))
    return worst


def step_median(step_ms: list[float]) -> float:
    """The benchmark's step time, as bench_mini_gpt computes it: over the two-step cycles after
    the first step (which allocates and profiles), the median (the upper one of an even count)
    of each cycle's mean; the alternating order makes consecutive steps differ. A run too
    short for one cycle: the median step after the first."""
    cycles = sorted((step_ms[k] + step_ms[k + 1]) / 2 for k in range(1, len(step_ms) - 1, 2))
    if not cycles:
        tail = sorted(step_ms[1:] or step_ms)
        return tail[len(tail) // 2]
    return cycles[len(cycles) // 2]


def figure_mini_gpt(series: dict, ctx: Context) -> str:
    runs = series["runs"]
    fig, (ax, ax2) = subplots(1, 2, figsize=(12, 4))
    default = [r for r in runs if r.get("config") == "default" and r.get("ranks", 1) == 1] or \
              [r for r in runs if r.get("config") == "default"]
    styles = ["-", "--", ":", "-."]
    widths = [3.5, 2.5, 1.5, 1.0]
    for i, r in enumerate(default):
        ax.plot(range(1, len(r["loss"]) + 1), r["loss"], linestyle=styles[i % 4], linewidth=widths[i % 4],
                label=f"--offload {r.get('offload')}")
    diff = loss_difference(default)
    if diff is not None:
        note = ("bit-identical across modes (largest difference 0)" if diff == 0
                else f"largest difference between modes: {diff:.3g}")
        note += f"\n{default[0].get('ranks', 1)} rank" + ("s" if default[0].get("ranks", 1) > 1 else "")
        ax.text(0.98, 0.6, note, transform=ax.transAxes, ha="right", fontsize=8,
                bbox={"facecolor": "white", "edgecolor": "0.7"})
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title("mini-GPT, default config: loss per offload mode (overlaid)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    labels, values, colors = [], [], []
    palette = {"none": "tab:gray", "optimizer": "tab:blue", "activations": "tab:orange", "all": "tab:green"}
    for r in runs:
        steps = r.get("step_ms") or []
        if not steps:
            continue
        ranks = r.get("ranks", 1)
        labels.append(f"{r.get('config')} {r.get('offload')}, {ranks} rank{'s' if ranks > 1 else ''}")
        values.append(step_median(steps))
        colors.append(palette.get(r.get("offload"), "tab:purple"))
    bars = ax2.bar(range(len(values)), values, 0.6, color=colors)
    annotate_bars(ax2, bars, [f"{v:.0f}" for v in values], fontsize=6)
    ax2.set_xticks(range(len(values)), labels, fontsize=6, rotation=40, ha="right")
    if values and min(values) > 0 and max(values) / min(values) > 10:  # configs of very different sizes
        ax2.set_yscale("log")
        ax2.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax2.yaxis.set_minor_formatter(ticker.NullFormatter())
    ax2.set_ylabel("ms per step (median after the first)")
    ax2.set_title("Step time per offload mode, config and ranks", fontsize=9)
    return ctx.figures.save(fig, "mini_gpt", "mini-GPT loss curves and step times", series.get("machine", ""),
                            date_of(series.get("date", "")))


# ---- Benchmarks no section knows ----------------------------------------------------------

def render_generic(rep: BenchReport, ctx: Context) -> SectionOutput:
    out = [generic_table(rep.rows)]
    ratio_rows = [r for r in rep.rows if not r.error and r.get("vs_limit") is not None]
    if ratio_rows:
        fig, ax = subplots(figsize=(max(5.0, 0.5 * len(ratio_rows) + 2), 3.6))
        bars = ax.bar(range(len(ratio_rows)), [r.get("vs_limit") for r in ratio_rows], 0.6, color="tab:blue")
        annotate_bars(ax, bars, [fmt(r.get("vs_limit")) for r in ratio_rows], fontsize=6)
        goal_line(ax, 1.0, "limit", color="black")
        ax.set_xticks(range(len(ratio_rows)), [r.name.split("/iterations")[0] for r in ratio_rows], fontsize=6,
                      rotation=30, ha="right")
        ax.set_ylabel("vs_limit")
        ax.set_title(f"{rep.path.stem}: each row against its limit", fontsize=9)
        out.append(ctx.figures.save(fig, rep.path.stem, f"{rep.path.stem} against its limits", rep.machine(),
                                    rep.date()))
    return SectionOutput("\n".join(out))


# ---- CUDA path ----------------------------------------------------------------------------

# Goals of issue 8, by the first part of the row name.
CUDA_GOALS = {"staged_disk_to_device": 0.9, "device_adam": 0.8}


def render_cuda(rep: BenchReport, ctx: Context) -> SectionOutput:
    measured = [r for r in rep.rows if not r.error]
    if not measured:
        reasons = sorted({r.error for r in rep.rows})
        return SectionOutput(f"Every row was skipped ({'; '.join(reasons) or 'no rows'}): run it on a machine with "
                             "a GPU.\n", [Headline("CUDA path", "staged ≥ 0.9, device Adam ≥ 0.8",
                                                   "skipped (no GPU)", None)])
    out = render_generic(rep, ctx)
    heads = []
    for prefix, goal in CUDA_GOALS.items():
        rows = [r for r in measured if r.name.split("/")[0] == prefix and r.get("vs_limit") is not None]
        if rows:
            heads.append(Headline(f"CUDA: {prefix.replace('_', ' ')}", f"vs_limit ≥ {goal}",
                                  ", ".join(fmt(r.get("vs_limit")) for r in rows),
                                  all(r.get("vs_limit") >= goal for r in rows)))
    return SectionOutput(out.body, heads)


# ---- The report -------------------------------------------------------------------------------

SECTIONS = [
    Section("tiers", "Storage tiers: the file tier against fio", "bench/bench_tiers.cpp",
            "scripts/dev bench tiers", render_tiers, "File tier against fio",
            "add `--full` for every block size from 128 KiB to 64 MiB and queue depth from 1 to 64"),
    Section("virtual_tier", "The virtual tier against the sum of its paths", "bench/bench_virtual_tier.cpp",
            "scripts/dev bench virtual_tier --benchmark_repetitions=5 --benchmark_report_aggregates_only=true",
            render_virtual_tier, "Virtual tier against the sum of its paths"),
    Section("adam", "The AdamW step against the memory roofline", "bench/bench_adam.cpp",
            "scripts/dev bench adam --benchmark_repetitions=5 --benchmark_min_time=0.3 "
            "--benchmark_report_aggregates_only=true", render_adam, "AdamW step against the memory roofline"),
    Section("update", "The update phase: MLP-Offload's ablation", "bench/bench_update_phase.cpp",
            "scripts/dev bench update", render_update, "Update-phase ablation"),
    Section("stash", "The activation stash against keeping everything", "bench/bench_stash.cpp",
            "scripts/dev bench stash --benchmark_report_aggregates_only=true", render_stash,
            "Activation stash against keeping everything"),
    Section("mini_gpt", "The mini-GPT trainer", "bench/bench_mini_gpt.cpp", "scripts/dev bench mini_gpt",
            render_mini_gpt, "mini-GPT step time and loss"),
    Section("cuda", "The CUDA path (GPU)", "bench/bench_cuda.cu",
            "build/cuda/bench/bench_cuda --benchmark_out=build/bench/cuda.json --benchmark_out_format=json "
            "--benchmark_repetitions=5 --benchmark_report_aggregates_only=true", render_cuda, "CUDA path",
            "with the cuda preset built, on a machine with a GPU"),
]
SIDE_FILES = {"stash_series", "mini_gpt_series"}  # read by their sections, not reports of their own


def narrative(ctx: Context, key: str) -> str:
    path = ctx.narrative_dir / f"{key}.md"
    return path.read_text().strip() + "\n" if path.exists() else ""


def not_measured(section: Section, ctx: Context) -> str:
    where = f" ({section.where})" if section.where else ""
    return (f"**Not measured**: {ctx.json_dir / (section.key + '.json')} does not exist. Run "
            f"`{section.command}`{where}, then `scripts/dev bench report`.\n")


def build_report(json_dir: Path, out_img: Path, narrative_dir: Path, keep_going: bool) -> tuple[str, list[str]]:
    """The Markdown text and the list of errors of sections that failed (with keep_going)."""
    ctx = Context(json_dir, Figures(out_img), narrative_dir)
    known = {s.key for s in SECTIONS}
    extra = sorted(p.stem for p in json_dir.glob("*.json") if p.stem not in known and p.stem not in SIDE_FILES)
    sections = list(SECTIONS) + [
        Section(name, f"Benchmark `{name}`", f"bench/bench_{name}.cpp", f"scripts/dev bench {name}", render_generic,
                f"`{name}`") for name in extra]
    parts, summary, errors = [], [], []
    for s in sections:
        path = json_dir / f"{s.key}.json"
        where = f" ({s.where})" if s.where else ""
        text = [f"## {s.title}\n", f"Source: `{s.source}`; run: `{s.command}`{where}.\n"]
        story = narrative(ctx, s.key)
        if story:
            text.append(story)
        if not path.exists():
            text.append(not_measured(s, ctx))
            summary.append(Headline(s.what, "", "not measured", None))
        else:
            try:
                rep = load_bench(path)
                text.append(machine_line(rep))
                result = s.render(rep, ctx)
            except ReportError as e:  # names the file
                if not keep_going:
                    raise
                errors.append(f"{s.key}: {e}")
                result = SectionOutput(f"**This section could not be generated**: `{e}`.\n")
            except Exception as e:  # a section that cannot read its JSON any more
                if not keep_going:
                    raise ReportError(f"section '{s.key}' failed on {path}: {e!r}\n{traceback.format_exc()}") from e
                errors.append(f"{s.key}: {e!r}")
                result = SectionOutput(f"**This section could not be generated** from {path}: `{e!r}`.\n")
            text.append(result.body)
            summary.extend(result.headlines)
        parts.append("\n".join(text))
    head = [narrative(ctx, "intro") or "# Spillway benchmarks\n",
            "_Generated by `scripts/dev bench report` (scripts/bench_report.py) from build/bench/*.json; "
            "edit the narrative in docs/report/, not this file._\n",
            "| what | goal | this run | |\n| --- | --- | --- | --- |\n" +
            "".join(f"| {h.what} | {h.goal or '–'} | {h.measured} | {verdict(h.met)} |\n" for h in summary)]
    return "\n".join(head) + "\n" + "\n".join(parts), errors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json-dir", type=Path, default=Path("build/bench"), help="where the benchmark JSON is")
    ap.add_argument("--out", type=Path, default=Path("docs"), help="writes OUT/benchmarks.md and OUT/img/")
    ap.add_argument("--narrative", type=Path, default=None,
                    help="folder of the section narratives (default: docs/report beside this script)")
    ap.add_argument("--keep-going", action="store_true",
                    help="write the report even when a section fails (the error is printed in its place)")
    args = ap.parse_args(argv)
    narrative_dir = args.narrative or Path(__file__).resolve().parent.parent / "docs" / "report"
    if not args.json_dir.is_dir():
        print(f"bench_report.py: {args.json_dir} is not a folder (run `scripts/dev bench` first)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".bench_report.", dir=args.out) as tmp:
        tmp_img = Path(tmp) / "img"
        tmp_img.mkdir()
        try:
            text, errors = build_report(args.json_dir, tmp_img, narrative_dir, args.keep_going)
        except ReportError as e:
            print(f"bench_report.py: {e}\nNothing was written.", file=sys.stderr)
            return 1
        (Path(tmp) / "benchmarks.md").write_text(text)
        # Everything was produced: replace the old report and its plots (only ours: bench_*.png).
        img = args.out / "img"
        img.mkdir(exist_ok=True)
        for old in img.glob(f"{IMG_PREFIX}*.png"):
            old.unlink()
        for new in tmp_img.iterdir():
            shutil.move(str(new), img / new.name)
        os.replace(Path(tmp) / "benchmarks.md", args.out / "benchmarks.md")
    print(f"bench_report.py: wrote {args.out / 'benchmarks.md'} and {len(list(img.glob(IMG_PREFIX + '*.png')))} "
          f"plots in {img}")
    for e in errors:
        print(f"bench_report.py: section failed: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
