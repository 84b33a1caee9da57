#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""scripts/bench_report.py: docs/benchmarks.md and its plots, from the benchmark JSON.

Usage (normally through `scripts/dev bench report`):
    bench_report.py --json-dir build/bench --out docs [--narrative docs/report] [--keep-going]

Reads every <json-dir>/<name>.json that `scripts/dev bench <name>` wrote (Google Benchmark's
JSON report) and the side files some benchmarks write beside it (stash_series.json,
mini_gpt_series.json), and writes <out>/benchmarks.md and <out>/img/bench_*.png.

What it guarantees:
- Every known benchmark has a section, in a fixed order, laid out the same way: what it
  measures and the limit it is held against (the narrative), the machine and date of the
  run, a short table of the latest run, the plot, and each goal with whether it is met.
  Every row and counter is still there, folded under "All rows". A section whose JSON is
  missing says "not measured" and gives the command that measures it; it never fails the
  report.
- A JSON file that no section knows (a new benchmark) gets a generic section: its rows and
  counters as a table and, when the rows have `vs_limit`, a plot of it.
- Figures are medians: a row run with repetitions is reduced to Google Benchmark's `_median`
  aggregate (or the median of its repetitions when only those were kept), and the spread of
  the ratio (cv) is shown when repetitions exist. Non-finite values (NaN, inf) are left out of
  both; a figure with no finite value shows "–".
- Each section and each plot names the machine (CPU model, CPU count) and the date of its run.
- Plots label things in a user's words (no internal row names), explain every colour in a
  legend placed outside the data, and never put this machine's figures on the same axis as a
  paper's (published figures appear in tables only).
- Nothing is overwritten unless the whole report was produced: outputs are written to a
  temporary folder first and moved into place at the end. A malformed JSON file is an error
  naming the file; it, or a section that fails, stops the report (or, with --keep-going, its
  error is printed in the section's place).

The narrative of each section (what is measured, the limit) lives in <narrative>/<section>.md,
so it can be edited without touching this script; the numbers, tables, goals, verdicts and
plots are generated here. Only the standard library and matplotlib (Debian's
python3-matplotlib, Agg backend) are used.
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
import textwrap
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


def at_most(x: float | None, bound: float) -> bool:
    """Whether a measured x stays within the bound; an unmeasured one does not (0 does)."""
    return x is not None and x <= bound


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


def goal_line(ax, y: float, text: str, color: str = "tab:red", on_plot: bool = True):
    """A dashed line at y. Labelled on the plot at its right end, or (on_plot=False, where bars
    could sit under the label) returned as a legend handle for `text`."""
    line = ax.axhline(y, color=color, linestyle="--", linewidth=1, label=None if on_plot else text)
    if on_plot:
        ax.annotate(text, xy=(1.0, y), xycoords=("axes fraction", "data"), xytext=(-4, 2),
                    textcoords="offset points", ha="right", va="bottom", fontsize=7, color=color)
    return line


def legend_outside(ax, handles=None, labels=None, fontsize: int = 7) -> None:
    """The legend to the right of `ax`, outside the data (the constrained layout makes room)."""
    kwargs = dict(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=fontsize,
                  frameon=False)
    if handles is None:
        ax.legend(**kwargs)
    else:
        ax.legend(handles, labels, **kwargs)


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
    when: str = ""  # the machine and day of the run, filled in by build_report


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
    load: Callable[[Path], BenchReport] | None = None  # reads <key>.json (default: load_bench)


def machine_line(report: BenchReport | None, series: dict | None = None, extra: str = "") -> str:
    parts = []
    if report is not None:
        note = load_note(report.context)
        parts.append(f"Latest run: {report.machine()}, {report.date()}" + (f" ({note})" if note else ""))
    if series is not None:
        parts.append(f"series: {series.get('machine', 'machine not recorded')}, {date_of(series.get('date', ''))}")
    if extra:
        parts.append(extra)
    return "_" + "; ".join(parts) + "._\n"


def short_machine(report: BenchReport) -> str:
    """The CPU model without its decorations and the day of the run, for the summary table."""
    cpu = (report.context.get("cpu_model") or "machine not recorded").replace("(R)", "").replace(" Processor", "")
    return f"{cpu.strip()}, {report.date()[:10]}"


def goal_block(heads: list[Headline]) -> str:
    """Each goal of a section with this run's figure and the verdict, one line each."""
    if not heads:
        return ""
    lines = [f"- **{verdict(h.met)}**: {h.what}: goal {h.goal or '–'}; this run {h.measured}." for h in heads]
    return "**Goals**\n\n" + "\n".join(lines) + "\n"


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
    huge_rows = [(m.group(1), int(m.group(2)), int(m.group(3)), r) for m, r in huge]
    out = []
    goal_cells = [c for c in file_rows if is_goal_cell(c[2], c[3])]
    with_ratio = [c for c in goal_cells if c[4].get("vs_limit") is not None]
    met = sum(1 for c in with_ratio if c[4].get("vs_limit") >= TIERS_GOAL)
    if goal_cells or huge_rows:
        out.append(goal_cell_table(goal_cells, huge_rows))
    if file_rows:
        out.append(figure_tier_heatmaps(file_rows, rep, ctx))
        out.append(figure_tier_bandwidth(file_rows, rep, ctx))
    folded = []
    if file_rows:
        body = [[op, eng, block_text(kib), str(qd), fmt(gb(r.get("bytes_per_second"))),
                 fmt(gb(r.get("fio_bytes_per_second"))), fmt(r.get("vs_limit")), fmt_spread(r)]
                for op, eng, kib, qd, r in file_rows]
        folded.append(f"Every file tier row ({len(file_rows)}), base-page buffers on both sides:\n\n" +
                      md_table(["op", "engine", "block", "qd", "ours GB/s", "fio GB/s", "vs_limit", "spread"],
                               body, numeric_from=2))
    if huge_rows:
        body = [[op, block_text(kib), str(qd), fmt(gb(r.get("bytes_per_second"))),
                 fmt(gb(r.get("fio_bytes_per_second"))), fmt(r.get("vs_limit")), fmt_spread(r),
                 fmt(gb(r.get("fio_base_pages_bytes_per_second"))), fmt(r.get("buf_run_KiB"), 0)]
                for op, kib, qd, r in huge_rows]
        folded.append("**Huge-page buffers** (io_uring; `aligned_buffer`'s default for large buffers) against "
                      "fio from huge pages too (`vs_limit`), and fio from base pages in the same rounds:\n\n" +
                      md_table(["op", "block", "qd", "ours GB/s", "fio GB/s (huge pages)", "vs_limit", "spread",
                                "fio GB/s (base pages)", "buffer run KiB"], body, numeric_from=1))
    if host_rows:
        body = [[op, block_text(kib), fmt(gb(r.get("bytes_per_second"))),
                 fmt(gb(r.get("memcpy_bytes_per_second"))), fmt(r.get("vs_limit")), fmt_cv(r)]
                for op, _, kib, _, r in host_rows]
        folded.append("**Host tier** against `memcpy` of the same size between resident buffers (no goal):\n\n" +
                      md_table(["op", "block", "ours GB/s", "memcpy GB/s", "vs_limit", "cv"], body, numeric_from=1))
    if folded:
        out.append(details(f"All rows ({len(file_rows) + len(huge_rows) + len(host_rows)})", "\n".join(folded)))
    out.append(other_rows(rest))
    out.append(skipped_rows(rep.rows))
    ratios = [c[4].get("vs_limit") for c in with_ratio]
    heads = [Headline("File tier against fio, base-page buffers", f"≥ {TIERS_GOAL} in every goal cell",
                      f"{met} of {len(with_ratio)} cells, min {fmt(min(ratios))}, median "
                      f"{fmt(statistics.median(ratios))}" if ratios else "no goal cells measured",
                      (met == len(with_ratio)) if ratios else None)]
    huge_ratios = [r.get("vs_limit") for _, kib, qd, r in huge_rows
                   if r.get("vs_limit") is not None and is_goal_cell(kib, qd)]
    if huge_ratios:
        huge_met = sum(1 for v in huge_ratios if v >= TIERS_GOAL)
        heads.append(Headline("File tier against fio, huge-page buffers on both sides",
                              f"≥ {TIERS_GOAL} in every goal cell",
                              f"{huge_met} of {len(huge_ratios)} cells, min {fmt(min(huge_ratios))}, "
                              f"median {fmt(statistics.median(huge_ratios))}", huge_met == len(huge_ratios)))
    return SectionOutput("\n".join(x for x in out if x), heads)


def is_goal_cell(kib: int, qd: int) -> bool:
    """The goal's cells: 1 MiB and 8 MiB blocks at queue depth 8 or more."""
    return kib in (1024, 8192) and qd >= 8


def goal_cell_table(goal_cells, huge_rows) -> str:
    """One line per goal cell (operation, block, depth): each engine's GB/s, fio's beside it in
    brackets, and the ratio; huge-page rows in the last columns."""
    keys = list(dict.fromkeys([(op, kib, qd) for op, _, kib, qd, _ in goal_cells] +
                              [(op, kib, qd) for op, kib, qd, _ in huge_rows if is_goal_cell(kib, qd)]))
    by = {(op, eng, kib, qd): r for op, eng, kib, qd, r in goal_cells}
    by.update({(op, "huge", kib, qd): r for op, kib, qd, r in huge_rows})
    engines = [e for e in ("io_uring", "POSIX", "huge") if any(k[1] == e for k in by)]
    title = {"io_uring": "io_uring", "POSIX": "POSIX", "huge": "io_uring, huge pages"}

    def cells(r: Row | None) -> list[str]:
        if r is None:
            return ["–", "–"]
        ratio = fmt(r.get("vs_limit"))
        if r.get("vs_limit") is not None and r.get("vs_limit") < TIERS_GOAL:
            ratio = f"**{ratio}**"
        return [f"{fmt(gb(r.get('bytes_per_second')))} ({fmt(gb(r.get('fio_bytes_per_second')))})", ratio]

    headers = ["op", "block", "qd"]
    for e in engines:
        headers += [f"{title[e]} GB/s (fio)", "ratio"]
    body = [[op, block_text(kib), str(qd)] + sum((cells(by.get((op, e, kib, qd))) for e in engines), [])
            for op, kib, qd in keys]
    return ("The goal cells (ratio = ours / fio on the same file; **bold**: below the goal of "
            f"{TIERS_GOAL}):\n\n" + md_table(headers, body, numeric_from=1))


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
    fig.colorbar(image, ax=axes, shrink=0.8, label="ours / fio (green: faster than fio, red: slower)")
    fig.suptitle("File tier speed over fio's, same block size, queue depth and file (outlined: the goal's cells)",
                 fontsize=10)
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
                ax.plot(xs, [gb(p[1].get("bytes_per_second")) for p in pts], "o-", color=color, markersize=3)
                fio = [(x, gb(p[1].get("fio_bytes_per_second"))) for x, p in zip(xs, pts)
                       if p[1].get("fio_bytes_per_second") is not None]
                if fio:
                    ax.plot([f[0] for f in fio], [f[1] for f in fio], "x--", color=color, linewidth=1,
                            markersize=4)
            ax.set_xscale("log", base=2)
            ax.set_xticks([c[2] * 1024 for c in cells], [block_text(c[2]) for c in cells], fontsize=7)
            ax.minorticks_off()
            ax.set_title(f"{op}, {eng} engine", fontsize=9)
            ax.set_xlabel("block size", fontsize=8)
            ax.set_ylabel("GB/s", fontsize=8)
            ax.grid(alpha=0.3)
    # One legend for every panel, below them: colour = queue depth, line style = who moved the data.
    handles = [plt.Line2D([], [], color=palette(k / max(1, len(depths) - 1) * 0.9), linewidth=3)
               for k in range(len(depths))]
    handles += [plt.Line2D([], [], color="0.3", marker="o", markersize=3),
                plt.Line2D([], [], color="0.3", marker="x", linestyle="--", linewidth=1)]
    legend_outside(axes[0][-1], handles, [f"queue depth {qd}" for qd in depths] +
                   ["Spillway file tier", "fio, same file"])
    fig.suptitle("File tier bandwidth and fio's on the same file", fontsize=10)
    return ctx.figures.save(fig, "tiers_bandwidth", "file tier and fio bandwidth", rep.machine(), rep.date())


# ---- Virtual tier -----------------------------------------------------------------------------

_AGG_ROW = re.compile(r"^BM_aggregate(?:_(12_2_1|mixed))?/(\d+)")
_AGG_KIND = {None: "400 and 200 MB/s", "12_2_1": "12:2:1 of the disk", "mixed": "mixed sizes"}
_CONTENTION_ROW = re.compile(r"^BM_contention/(\d+)/(\d+)")
VIRTUAL_GOAL = 0.9


def render_virtual_tier(rep: BenchReport, ctx: Context) -> SectionOutput:
    (agg, cont), rest = classify(rep.rows, _AGG_ROW, _CONTENTION_ROW)
    # (paths, what the row is, row): the blobs of 8 MiB over 400 and 200 MB/s paths, the same
    # over paths at 12:2:1 of the disk, and blobs of mixed sizes.
    aggregate = [(int(m.group(2)), _AGG_KIND[m.group(1)], r) for m, r in agg]
    contention = [(int(m.group(1)), "node_lock" if m.group(2) == "1" else "null_lock", r) for m, r in cont]
    out, heads = [], []
    if aggregate:
        most = max(n for n, _, _ in aggregate)
        body = []
        for n, kind, r in aggregate:
            paths = [fmt(mb(r.get(f"B{i}")), 0) for i in range(1, most + 1)]
            lo, hi = r.get("vs_limit_min"), r.get("vs_limit_max")
            steady = r.get("steady_iterations")
            body.append([str(n), kind] + paths + [
                fmt(mb(r.get("limit_bytes_per_second")), 0), fmt(mb(r.get("vt_bytes_per_second",
                                                                           r.get("bytes_per_second"))), 0),
                fmt(r.get("vs_limit")), f"{lo:.2f}–{hi:.2f}" if lo is not None and hi is not None else "–",
                fmt(r.get("vs_limit_steady")) + (f" ({steady:.0f})" if steady is not None else ""),
                fmt(r.get("placement")), verdict(at_least(r.get("vs_limit"), VIRTUAL_GOAL))])
        headers = (["paths", "paths and blobs"] + [f"B{i} MB/s" for i in range(1, most + 1)] +
                   ["sum MB/s", "virtual tier MB/s", "vs_limit", "range", "steady disk", "placement", "goal"])
        out.append("**Paths together** (B1: the disk path, B2 and B3: the throttled /dev/shm paths, each measured "
                   "alone, medians; `vs_limit` = virtual tier over their sum, the median of the iterations, "
                   "*range* their smallest and largest; *steady disk*: the median of the iterations whose disk "
                   "kept its speed within 10% across the iteration (how many); *placement*: what the bytes "
                   "placed on each path would reach at the paths' alone speeds):\n\n" +
                   md_table(headers, body, numeric_from=2))
        ratios = [r.get("vs_limit") for _, _, r in aggregate if r.get("vs_limit") is not None]
        heads.append(Headline("Virtual tier against the sum of its paths", f"≥ {VIRTUAL_GOAL}",
                              ", ".join(f"{n} paths ({kind}) {fmt(r.get('vs_limit'))}" for n, kind, r in aggregate),
                              all(x >= VIRTUAL_GOAL for x in ratios) if ratios else None))
    if contention:
        body = [[str(p), lock, fmt(mb(r.get("aggregate_bytes_per_second")), 0), fmt(r.get("vs_limit")),
                 fmt(r.get("p50_ms"), 1), fmt(r.get("p99_ms"), 1)] for p, lock, r in contention]
        headers = ["processes", "lock", "aggregate MB/s", "vs one process", "p50 ms", "p99 ms"]
        out.append("**Processes sharing one disk path** (no goal; `vs one process`: their total over one process "
                   "alone; `node_lock`: one reader and one writer per path at a time, `null_lock`: no "
                   "exclusion):\n\n" + md_table(headers, body, numeric_from=2))
    if aggregate or contention:
        out.append(figure_virtual(aggregate, contention, rep, ctx))
    out.append(other_rows(rest))
    out.append(skipped_rows(rep.rows))
    return SectionOutput("\n".join(x for x in out if x), heads)


def figure_virtual(aggregate, contention, rep: BenchReport, ctx: Context) -> str:
    panels = (1 if aggregate else 0) + (1 if contention else 0)
    wide = 1.2 * max(0, len(aggregate) - 2)  # room for each aggregate row past two
    fig, axes = subplots(1, panels, squeeze=False, figsize=(5.2 * panels + wide, 3.6))
    ax_i = 0
    if aggregate:
        ax = axes[0][ax_i]
        ax_i += 1
        colors = ["tab:blue", "tab:cyan", "tab:olive", "tab:gray"]
        for k, (n, _, r) in enumerate(aggregate):
            bottom = 0.0
            for i in range(1, n + 1):
                v = mb(r.get(f"B{i}")) or 0.0
                ax.bar(k - 0.2, v, 0.38, bottom=bottom, color=colors[(i - 1) % len(colors)],
                       label=("disk path alone" if i == 1 else f"/dev/shm path {i - 1} alone") if k == len(aggregate) - 1
                       else None)
                bottom += v
            bar = ax.bar(k + 0.2, mb(r.get("vt_bytes_per_second", r.get("bytes_per_second"))) or 0.0, 0.38,
                         color="tab:orange",
                         label="virtual tier over them" if k == 0 else None)
            # The ratio over the pair, above the taller of its two bars.
            top = max(bottom, bar[0].get_height())
            ax.annotate(f"{fmt(r.get('vs_limit'))}\nof the sum", (k, top), xytext=(0, 3), textcoords="offset points",
                        ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(aggregate)), [f"{n} paths\n" + textwrap.fill(kind, 12) for n, kind, _ in aggregate],
                      fontsize=7)
        ax.set_ylabel("MB/s (write then read back)")
        ax.set_ylim(top=ax.get_ylim()[1] * 1.18)
        ax.set_title("Virtual tier (orange) against its paths measured alone (stacked)", fontsize=9)
        legend_outside(ax)
    if contention:
        ax = axes[0][ax_i]
        procs = sorted({p for p, _, _ in contention})
        for j, lock in enumerate(("null_lock", "node_lock")):
            pts = {p: r for p, l, r in contention if l == lock}
            xs = [i + (j - 0.5) * 0.38 for i, p in enumerate(procs) if p in pts]
            vals = [mb(pts[p].get("aggregate_bytes_per_second")) or 0.0 for p in procs if p in pts]
            bars = ax.bar(xs, vals, 0.36, color="tab:gray" if j == 0 else "tab:purple",
                          label="no exclusion (null_lock)" if j == 0 else "one reader, one writer\nper path (node_lock)")
            annotate_bars(ax, bars, [f"p99 {fmt(pts[p].get('p99_ms'), 0)} ms" for p in procs if p in pts], fontsize=6)
        ax.set_xticks(range(len(procs)), [f"{p} processes" for p in procs])
        ax.set_ylabel("all processes together, MB/s")
        ax.set_ylim(top=ax.get_ylim()[1] * 1.08)
        ax.set_title("Processes sharing one disk path (labels: 99th percentile latency)", fontsize=9)
        legend_outside(ax)
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
    folded = []
    if steps:
        most = max(s["threads"] for s in steps)
        out.append(adam_pivot(steps, most))
        out.append(figure_adam(steps, converts, most, rep, ctx))

        def kernel(s):
            return s["simd"] + (", scan" if s["scan"] else "")

        body = [[s["grad"] + (", " + s["copy"] if s["copy"] else ""), str(s["threads"]), kernel(s),
                 fmt(s["row"].get("Gparams_per_s"), 3), fmt(gb(s["row"].get("bytes_per_second")), 1),
                 fmt(s["row"].get("limit_GBps"), 1), fmt(s["row"].get("vs_limit")), fmt_cv(s["row"])]
                for s in steps]
        folded.append(f"Every AdamW row ({len(steps)}):\n\n" +
                      md_table(["gradients", "threads", "kernel", "G params/s", "GB/s", "limit GB/s", "vs_limit",
                                "cv"], body, numeric_from=3))
        goal_rows = [s for s in steps if s["threads"] == most and not s["scan"] and not s["copy"]
                     and s["simd"] != "scalar loop" and s["row"].get("vs_limit") is not None]
        best = {}
        for s in goal_rows:  # the widest kernel per gradient type (AVX-512 before AVX2)
            if s["grad"] not in best or s["simd"] == "AVX-512":
                best[s["grad"]] = s
        if best:
            heads.append(Headline(f"AdamW step against the memory roofline, {most} threads",
                                  f"≥ {ADAM_GOAL} for fp32, fp16 and bf16 gradients",
                                  ", ".join(f"{g} {fmt(s['row'].get('vs_limit'))}" for g, s in best.items()),
                                  all(s["row"].get("vs_limit") >= ADAM_GOAL for s in best.values())))
    if converts:
        kinds = list(dict.fromkeys(simd for _, simd, _ in converts))
        by = {(what, simd): r for what, simd, r in converts}
        body = [[what] + [fmt(by[(what, k)].get("vs_limit")) if (what, k) in by else "–" for k in kinds]
                for what in dict.fromkeys(w for w, _, _ in converts)]
        out.append("**Widening and narrowing** (one thread; no goal) against a `memcpy` of the same total bytes in "
                   "the same iteration:\n\n" + md_table(["conversion"] + kinds, body))
        body = [[what, simd, fmt(gb(r.get("items_per_second")) or r.get("Gparams_per_s"), 2), fmt(r.get("vs_limit")),
                 fmt_cv(r)] for what, simd, r in converts]
        folded.append("Conversions:\n\n" + md_table(["conversion", "kernel", "G values/s", "vs_limit", "cv"], body,
                                                     numeric_from=2))
    if folded:
        out.append(details(f"All rows ({len(steps) + len(converts)})", "\n".join(folded)))
    out.append(other_rows(rest))
    out.append(skipped_rows(rep.rows))
    return SectionOutput("\n".join(x for x in out if x), heads)


def adam_pivot(steps, threads: int) -> str:
    """The step at `threads` threads: one line per gradient type, one column per kernel
    (its share of the memory roofline), and the widest kernel's G params/s."""
    rows = [s for s in steps if s["threads"] == threads]
    columns = [c for c in ("AVX-512", "AVX2", "AVX-512, scan", "AVX2, scan", "scalar loop")
               if any(kernel_name(s) == c for s in rows)]
    kinds = list(dict.fromkeys(s["grad"] + (" + " + s["copy"] if s["copy"] else "") for s in rows))
    by = {(s["grad"] + (" + " + s["copy"] if s["copy"] else ""), kernel_name(s)): s["row"] for s in rows}
    body = []
    for k in kinds:
        fastest = max((by[(k, c)] for c in columns if (k, c) in by),
                      key=lambda r: r.get("Gparams_per_s") or 0.0)
        body.append([k + " gradients" if "copy" not in k else k.replace(" + ", " gradients + ")] +
                    [fmt(by[(k, c)].get("vs_limit")) if (k, c) in by else "–" for c in columns] +
                    [fmt(fastest.get("Gparams_per_s"), 2)])
    return (f"Share of the memory roofline, {threads} threads (kernel chosen at run time; *scan*: with the "
            "default overflow scan):\n\n" + md_table(["AdamW step"] + columns + ["best G params/s"], body))


def kernel_name(s) -> str:
    return s["simd"] + (", scan" if s["scan"] else "")


def figure_adam(steps, converts, threads: int, rep: BenchReport, ctx: Context) -> str:
    grads = ["fp32", "fp16", "bf16"]
    kernels = {"AVX-512": 0, "AVX2": 1, "scalar loop": 3}
    rows = sorted((s for s in steps if s["threads"] == threads),
                  key=lambda s: (grads.index(s["grad"]) if s["grad"] in grads else 9, bool(s["copy"]),
                                 kernels.get(s["simd"], 2) + (0.5 if s["scan"] else 0)))
    panels = 2 if converts else 1
    fig, axes = subplots(1, panels, squeeze=False, figsize=(9 + 4 * (panels - 1), 4.4),
                         gridspec_kw={"width_ratios": [2.2, 1][:panels]})
    ax = axes[0][0]
    labels = [s["grad"] + (" + copy" if s["copy"] else "") + "\n" + s["simd"].replace(" loop", "") +
              ("\n+ scan" if s["scan"] else "") for s in rows]
    xs = list(range(len(rows)))
    kinds = [("scalar" if s["simd"] == "scalar loop" else "scan" if s["scan"] else "step") for s in rows]
    color = {"step": "tab:blue", "scan": "tab:olive", "scalar": "tab:gray"}
    bars = ax.bar(xs, [gb(s["row"].get("bytes_per_second")) or 0.0 for s in rows], 0.6,
                  color=[color[k] for k in kinds])
    limits = [s["row"].get("limit_GBps") for s in rows]
    ax.scatter([x for x, lim in zip(xs, limits) if lim], [lim for lim in limits if lim], marker="_", s=300,
               color="black", linewidths=2, zorder=3)
    annotate_bars(ax, bars, [fmt(s["row"].get("vs_limit")) for s in rows], fontsize=6)
    top = max([lim for lim in limits if lim] + [gb(s["row"].get("bytes_per_second")) or 0.0 for s in rows] + [1.0])
    ax.set_ylim(0, top * 1.12)
    handles = [plt.Line2D([], [], color="black", marker="_", linestyle="", markersize=14, markeredgewidth=2)]
    handles += [plt.Rectangle((0, 0), 1, 1, color=color[k]) for k in ("step", "scan", "scalar")]
    legend_outside(ax, handles, ["memory roofline:\na stream of the\nsame bytes", "AdamW step",
                                 "with the overflow\nscan", "scalar loop\n(portable fallback)"])
    ax.set_xticks(xs, labels, fontsize=6)
    ax.set_ylabel("GB/s moved (28 B/param fp32 gradients,\n26 fp16/bf16)", fontsize=8)
    ax.set_title(f"AdamW step, {threads} threads (number on a bar: its share of the roofline; goal "
                 f"{ADAM_GOAL})", fontsize=9)
    if converts:
        ax2 = axes[0][1]
        bars = ax2.bar(range(len(converts)), [r.get("vs_limit") or 0.0 for _, _, r in converts], 0.6,
                       color=["tab:gray" if simd == "scalar loop" else "tab:blue" for _, simd, _ in converts])
        annotate_bars(ax2, bars, [fmt(r.get("vs_limit")) for _, _, r in converts], fontsize=6)
        goal_line(ax2, 1.0, "memcpy of the same bytes", color="black")
        ax2.set_ylim(0, 1.15)
        ax2.set_xticks(range(len(converts)), [f"{what}\n{simd.replace(' loop', '')}" for what, simd, _ in converts],
                       fontsize=6, rotation=45, ha="right")
        ax2.set_ylabel("share of a memcpy of the same bytes", fontsize=8)
        ax2.set_title("Widening and narrowing, one thread\n(blue: SIMD, grey: scalar loop)", fontsize=9)
    return ctx.figures.save(fig, "adam", "AdamW step against the memory roofline", rep.machine(), rep.date())


# ---- Update phase -----------------------------------------------------------------------------

_UPDATE_ROW = re.compile(r"^update_phase/([^/]+)")
_UPDATE_NAMES = {
    "baseline": "DeepSpeed-like baseline (ascending order, fp32 gradients written to storage)",
    "+lazy_widening": "+ lazy fp16 widening (no fp32 gradients written)",
    "+alternating_resident": "+ alternating order, subgroups kept in memory",
    "+second_path": "+ a second storage path (virtual tier)",
    "+node_lock_2proc": "+ two processes sharing the paths (node_lock)",
    "baseline_read_ahead": "reference: baseline reading ahead through the whole budget",
}
# Short names for the plot's axis.
_UPDATE_SHORT = {
    "baseline": "DeepSpeed-like baseline",
    "+lazy_widening": "+ lazy fp16 widening",
    "+alternating_resident": "+ alternating order,\nsubgroups kept in memory",
    "+second_path": "+ second storage path",
    "+node_lock_2proc": "+ two processes\n(node_lock)",
    "baseline_read_ahead": "reference: baseline\nreading ahead",
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
        first = rows[0][1]
        disk, shm = first.get("disk_mixed_Bps"), first.get("shm_throttle_Bps")
        if disk:
            out.append(f"The paths in this run: the disk {fmt(gb(disk))} GB/s for fio's 50/50 mix (median of the "
                       f"rounds), /dev/shm capped at {fmt(gb(shm))} GB/s; optimizer state "
                       f"{fmt(first.get('state_GiB'), 3)} GiB, host buffers {fmt(first.get('buffer_GiB'), 2)} GiB.\n")
        body = [[_UPDATE_NAMES.get(key, key), fmt(r.get("update_s")), fmt(r.get("floor_s")), fmt(r.get("vs_limit")),
                 fmt(r.get("speedup")), fmt(r.get("speedup_with_handover")), fmt(r.get("read_wait_s")),
                 fmt(r.get("served_resident"), 0)] for key, r in rows]
        out.append(md_table(["configuration (each adds one idea)", "update s", "floor s", "floor / update",
                             "speedup", "with hand-over", "read-wait s", "subgroups in memory"], body))
        # The comparison's rows by their names: a row that was not run (or failed) is absent,
        # and its figures print as "–", never another row's.
        ablation = [(k, r) for k, r in rows if k != _UPDATE_REFERENCE]
        named = dict(ablation)
        base, full = named.get(_UPDATE_BASELINE), named.get(_UPDATE_FULL)
        out.append(figure_update(rows, rep, ctx))
        if ablation:
            out.append("**Beside MLP-Offload's published figures** (" + MLP_OFFLOAD_PUBLISHED["source"] +
                       "; a different machine and scale, so compare ratios only):\n\n" +
                       comparison_table(ablation, base, full))
        else:
            out.append("_No row of the ablation was measured (only the reference): no comparison with "
                       "MLP-Offload._\n")
        folded = [full_update_table(rows)]
        if any(r.get("disk_busy") is not None for _, r in rows):
            folded.append("*disk busy*, *shm busy*: the share of the call during which the path had a read, and a "
                          "write, in flight (the mean of the two directions; two processes add up, since node_lock "
                          "lets one read and one write a path at a time). The floor assumes 100%.\n")
        folded.append(contention_table(contended))
        out.append(details(f"All rows ({len(rows) + len(contended)})", "\n".join(x for x in folded if x)))
        full_name = "Update phase, full configuration over the baseline"
        goal = f"speedup ≥ {UPDATE_GOAL_SPEEDUP} at ≥ {UPDATE_GOAL_VS_LIMIT} of the storage floor"
        if full is None:
            heads.append(Headline(full_name, goal, f"not measured (no `{_UPDATE_FULL}` row)", None))
        else:
            sp, vs = full.get("speedup"), full.get("vs_limit")
            heads.append(Headline(full_name, goal, f"{fmt(sp) + 'x' if sp is not None else '–'} at {fmt(vs)} of the floor",
                                  None if sp is None or vs is None else
                                  (sp >= UPDATE_GOAL_SPEEDUP and vs >= UPDATE_GOAL_VS_LIMIT)))
    out.append(other_rows(rest))
    out.append(skipped_rows(rep.rows))
    return SectionOutput("\n".join(x for x in out if x), heads)


def full_update_table(rows) -> str:
    """Every figure of every update-phase row."""
    body = []
    for key, r in rows:
        body.append([_UPDATE_NAMES.get(key, key), fmt(r.get("update_s")), fmt(r.get("read_wait_s")),
                     fmt(r.get("compute_s")), fmt(r.get("write_wait_s")), fmt(r.get("handover_s")),
                     fmt(gb(r.get("bytes_moved")), 1), fmt(r.get("served_resident"), 0),
                     fmt(r.get("speedup")), fmt(r.get("speedup_with_handover")),
                     fmt(r.get("speedup_vs_read_ahead")), fmt(r.get("floor_s")),
                     fmt(r.get("vs_limit")), busy_percent(r.get("disk_busy")), busy_percent(r.get("shm_busy"))])
    return md_table(["row", "update s", "read-wait", "compute", "write-wait", "hand-over s", "moved GB",
                     "resident", "speedup", "with hand-over", "vs read-ahead baseline", "floor s",
                     "vs_limit", "disk busy", "shm busy"], body)


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
    """Left: where each row's time goes, against its storage floor. Right: each row's speedup
    over the baseline, with the goal. Only this run's figures: the paper's are in the table."""
    fig, (ax, ax2) = subplots(1, 2, figsize=(13, 4.4), gridspec_kw={"width_ratios": [3, 2]})
    names = [_UPDATE_SHORT.get(k, k) for k, _ in rows]
    ys = list(range(len(rows)))[::-1]
    parts = [("read_wait_s", "waiting for reads", "tab:red"), ("compute_s", "computing (Adam)", "tab:blue"),
             ("write_wait_s", "waiting for writes", "tab:orange")]
    left = [0.0] * len(rows)
    for key, label, color in parts:
        vals = [r.get(key) or 0.0 for _, r in rows]
        ax.barh(ys, vals, 0.6, left=left, color=color, label=label)
        left = [a + b for a, b in zip(left, vals)]
    rest = [max(0.0, (r.get("update_s") or 0.0) - l) for (_, r), l in zip(rows, left)]
    ax.barh(ys, rest, 0.6, left=left, color="0.8", label="other")
    hand = [r.get("handover_s") or 0.0 for _, r in rows]
    ax.barh(ys, hand, 0.6, left=[(r.get("update_s") or 0.0) for _, r in rows], color="white", edgecolor="tab:red",
            hatch="///", label="gradient hand-over\n(in backward)")
    floors = [r.get("floor_s") for _, r in rows]
    ax.scatter([f for f in floors if f], [y for y, f in zip(ys, floors) if f], marker="|", s=250, color="black",
               linewidths=2, label="storage floor\n(fio, same paths)", zorder=3)
    ax.set_yticks(ys, names, fontsize=7)
    ax.set_xlabel("seconds per update phase (median)")
    ax.set_title("Where the update phase's time goes", fontsize=9)
    legend_outside(ax, fontsize=6)
    ours = [(k, r) for k, r in rows if k != _UPDATE_BASELINE and r.get("speedup") is not None]
    x_ours = list(range(len(ours)))
    b1 = ax2.bar([x - 0.2 for x in x_ours], [r.get("speedup") for _, r in ours], 0.38, color="tab:blue",
                 label="update phase")
    ax2.bar([x + 0.2 for x in x_ours], [r.get("speedup_with_handover") or 0 for _, r in ours], 0.38,
            color="tab:cyan", label="update + hand-over")
    annotate_bars(ax2, b1, [fmt(r.get("speedup")) for _, r in ours], fontsize=6)
    ax2.axhline(1.0, color="0.4", linewidth=0.8)
    goal_line(ax2, UPDATE_GOAL_SPEEDUP, f"goal {UPDATE_GOAL_SPEEDUP}x")
    top = max([r.get("speedup_with_handover") or 0 for _, r in ours] + [r.get("speedup") or 0 for _, r in ours]
              + [UPDATE_GOAL_SPEEDUP])
    ax2.set_ylim(0, top * 1.12)
    ax2.set_xticks(x_ours, [_UPDATE_SHORT.get(k, k) for k, _ in ours], fontsize=6, rotation=30, ha="right")
    ax2.set_ylabel("speedup over the baseline (this run)")
    ax2.set_title("Each configuration over the DeepSpeed-like baseline", fontsize=9)
    legend_outside(ax2, fontsize=6)
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
        out.append(md_table(["tier", "tier's rate (vs need)", "split", "first layer kept", "peak vs keep-all",
                             "overhead", "cv", "backward waited ms", "write skips"], body, numeric_from=3))
        out.append(figure_stash_summary(rows, rep, ctx))
        fast = [x for x in rows if x["fast"] and x["split"] == "adaptive"]
        slow = [x["row"] for x in rows if x not in fast]
        if fast:
            ok = all(at_most(x["row"].get("peak_ratio"), STASH_GOAL_PEAK) and
                     at_most(x["row"].get("overhead"), STASH_GOAL_OVERHEAD) for x in fast)
            heads.append(Headline("Activation stash, tier fast enough",
                                  f"peak ≤ {STASH_GOAL_PEAK} of keep-all, overhead ≤ 5%",
                                  "; ".join(f"{x['tier']} {fmt(x['row'].get('peak_ratio'))}, "
                                            f"{fmt(100 * (x['row'].get('overhead') or 0), 1)}%" for x in fast), ok))
        if slow:
            worst = max((r.get("overhead") or 0) for r in slow)
            heads.append(Headline("Activation stash, tier too slow", "overhead ≤ 10%",
                                  f"worst {fmt(100 * worst, 1)}%", worst <= STASH_GOAL_OVERHEAD_SLOW))
    if series is not None and series["runs"]:
        out.append(figure_stash(series, rep, ctx))
        out.append(machine_line(None, series))
    elif rows:
        out.append("_The memory series (stash_series.json) was not found beside stash.json: run the benchmark "
                   "again with a bench_stash that writes it._\n")
    out.append(other_rows(rest))
    out.append(skipped_rows(rep.rows))
    return SectionOutput("\n".join(x for x in out if x), heads)


def rate_text(mbps, need) -> str:
    """A throttle's rate in a user's words: MB/s and how it compares with what hiding needs."""
    if not mbps:
        return "unthrottled"
    return f"{mbps:.0f} MB/s" + (f" ({mbps / 1e3 / need:.2g}x need)" if need else "")


def figure_stash_summary(rows, rep: BenchReport, ctx: Context) -> str:
    """Peak and overhead of every stash row against its goals, from stash.json."""
    fig, (ax, ax2) = subplots(1, 2, figsize=(max(12, 1.7 * len(rows) + 2), 4.2))
    labels = []
    for x in rows:
        r = x["row"]
        rate = r.get("rate_GBps", x["MBps"] / 1e3)
        # One fact a line, so that neighbouring labels never run into each other.
        labels.append(f"{x['tier']} tier\n" + rate_text(rate * 1e3 if rate else None, r.get('need_GBps')).replace(" (", "\n(")
                      + f"\n{x['split']}")
    colors = ["tab:green" if x["fast"] else "tab:orange" for x in rows]
    xs = list(range(len(rows)))
    bars = ax.bar(xs, [x["row"].get("peak_ratio") or 0.0 for x in rows], 0.6, color=colors)
    annotate_bars(ax, bars, [fmt(x["row"].get("peak_ratio")) for x in rows], fontsize=6)
    peak_goal = goal_line(ax, STASH_GOAL_PEAK, f"peak goal, tier fast enough: ≤ {STASH_GOAL_PEAK}", on_plot=False)
    ax.axhline(1.0, color="0.4", linewidth=0.8)
    ax.set_ylim(0, max([1.0] + [x["row"].get("peak_ratio") or 0.0 for x in rows]) * 1.15)
    ax.set_ylabel("peak memory / keeping everything")
    ax.set_title("Activation peak", fontsize=9)
    ax.set_xticks(xs, labels, fontsize=6)
    over = [100 * (x["row"].get("overhead") or 0.0) for x in rows]
    bars = ax2.bar(xs, over, 0.6, color=colors)
    annotate_bars(ax2, bars, [f"{v:.1f}%" for v in over], fontsize=6)
    fast_goal = goal_line(ax2, 100 * STASH_GOAL_OVERHEAD, "overhead goal, tier fast enough: ≤ 5%", on_plot=False)
    slow_goal = goal_line(ax2, 100 * STASH_GOAL_OVERHEAD_SLOW, "overhead goal, tier too slow: ≤ 10%",
                          color="tab:orange", on_plot=False)
    ax2.set_ylim(min(0.0, min(over) * 1.25), max([100 * STASH_GOAL_OVERHEAD_SLOW] + over) * 1.2)
    ax2.set_ylabel("step time over keeping everything, %")
    ax2.set_title("Step-time overhead", fontsize=9)
    ax2.set_xticks(xs, labels, fontsize=6)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ("tab:green", "tab:orange")]
    legend_outside(ax2, handles + [peak_goal, fast_goal, slow_goal],
                   ["tier fast enough\nto hide the I/O", "tier too slow\n(or offload all)",
                    f"peak goal (left), tier fast\nenough: ≤ {STASH_GOAL_PEAK}",
                    f"overhead goal, tier fast\nenough: ≤ {100 * STASH_GOAL_OVERHEAD:g}%",
                    f"overhead goal, tier too\nslow: ≤ {100 * STASH_GOAL_OVERHEAD_SLOW:g}%"])
    return ctx.figures.save(fig, "stash", "stash peak and overhead against keeping everything", rep.machine(),
                            rep.date())


def figure_stash(series: dict, rep: BenchReport, ctx: Context) -> str:
    """Rows: resident bytes with the pool (what peak_ratio counts), then live bytes without it;
    columns: one per tier."""
    tiers = [t for t in ("host", "file") if any(r.get("tier") == t for r in series["runs"])]
    tiers += sorted({r.get("tier", "?") for r in series["runs"]} - set(tiers))
    fig, axes = subplots(2, len(tiers), squeeze=False, figsize=(6 * len(tiers) + 2.5, 6.4), sharey=True,
                         sharex="col")
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
                    label="keep everything in memory")
            for i, run in enumerate(runs):
                split = run.get("split", "").replace("_", " ")
                ax.plot(run["stash"]["t_ms"], values(run["stash"]), color=palette(i), linewidth=1.2,
                        linestyle="--" if "all" in split else "-", drawstyle="steps-post",
                        label=f"stash, tier at {rate_text(run.get('MBps'), run.get('need_GBps'))},\n{split} split")
            start = keep.get("backward_start_ms", 0)
            ax.axvline(start, color="0.5", linewidth=0.8, linestyle="--")
            ax.annotate("backward →", (start, 0.02), xycoords=("data", "axes fraction"), xytext=(3, 0),
                        textcoords="offset points", fontsize=7, color="0.4")
            ax.set_ylabel(ylabel, fontsize=8)
            ax.grid(alpha=0.3)
            if row == 0:
                shape = (f"{runs[0].get('layers')} layers of {runs[0].get('MiB'):g} MiB, "
                         f"{runs[0].get('forward_ms'):g} ms each")
                ax.set_title(f"{tier} tier: {shape}", fontsize=9)
                if col == len(tiers) - 1:
                    legend_outside(ax, fontsize=6)
            else:
                ax.set_xlabel("ms into the training step")
    fig.suptitle("Activation memory over one training step: the stash against keeping everything", fontsize=10)
    return ctx.figures.save(fig, "stash_memory", "stash resident memory over a step", series.get("machine", ""),
                            date_of(series.get("date", "")))


# ---- mini-GPT -----------------------------------------------------------------------------

_GPT_ROW = re.compile(r"^step/([^/]+)/([^/]+)(?:/ranks:(\d+))?")
_SGEMM_ROW = re.compile(r"^sgemm_limit")
_PATH_ROW = re.compile(r"^path_bandwidth")
GPT_GOAL_PEAK = 0.55


_GPT_MODELS = {"default": "demo model", "gpt2_124M": "GPT-2 124M"}
_GPT_VARIANTS = {"_shm": "path on /dev/shm", "_2path": "disk + /dev/shm", "_sync": "updates in a phase of their own"}


def config_text(cfg: str) -> str:
    """A bench_mini_gpt config name in a user's words: the model, then how its paths differ."""
    for suffix, words in _GPT_VARIANTS.items():
        if cfg.endswith(suffix):
            base = cfg[: -len(suffix)]
            return f"{_GPT_MODELS.get(base, base)}, {words}"
    return _GPT_MODELS.get(cfg, cfg)


def render_mini_gpt(rep: BenchReport, ctx: Context) -> SectionOutput:
    (limits, paths, matched), rest = classify(rep.rows, _SGEMM_ROW, _PATH_ROW, _GPT_ROW)
    sgemm = limits[0][1] if limits else None
    rows = [(m.group(1), m.group(2), int(m.group(3) or 1), r) for m, r in matched]
    out, heads = [], []
    limits_text = []
    if sgemm is not None and sgemm.get("flops_per_s"):
        kernels = rep.context.get("matmul_kernels")
        limits_text.append(f"matmul limit {fmt(sgemm.get('flops_per_s') / 1e9, 1)} GFLOP/s"
                           + (f" ({kernels})" if kernels else ""))
    for _, r in paths:
        where = "/dev/shm path" if r.name.startswith("path_bandwidth/shm") else "disk path"
        limits_text.append(f"{where} write {fmt(mb(r.get('write_bytes_per_s')), 0)} MB/s, "
                           f"read {fmt(mb(r.get('read_bytes_per_s')), 0)} MB/s")
    if limits_text:
        out.append("Limits measured in this run: " + "; ".join(limits_text) + ".\n")
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

        # One line per model and paths: `none`'s step, every other mode over it, the peak.
        modes = [m for m in ("optimizer", "activations", "all") if any(x[1] == m for x in rows)]
        multi = sorted({k for _, _, k, _ in rows if k > 1})
        body = []
        for cfg in dict.fromkeys(c for c, _, _, _ in rows):
            none = by.get((cfg, "none", 1))
            full = by.get((cfg, "all", 1))
            line = [config_text(cfg), fmt(none.get("ms_per_step"), 1) if none else "–"]
            line += [vs_none_cell(cfg, m, 1, by[(cfg, m, 1)]) if (cfg, m, 1) in by else "–" for m in modes]
            line += [vs_none_cell(cfg, "all", k, by[(cfg, "all", k)]) if (cfg, "all", k) in by else "–" for k in multi]
            line += [fmt(full.get("act_peak_vs_all_kept")) if full else "–"]
            body.append(line)
        out.append("Step time over `--offload none` (the paired runs' range in brackets), one rank unless "
                   "named:\n\n" + md_table(["model and paths", "none ms/step"] + modes +
                                            [f"all, {k} ranks" for k in multi] +
                                            ["activation peak (all)"], body))
        out.append(figure_mini_gpt_steps(rows, vs_none, rep, ctx))
        taxed = [(cfg, mode, ranks, r) for cfg, mode, ranks, r in rows if r.get("io_tax") is not None]
        premise = []
        for cfg in dict.fromkeys(c for c, _, _, _ in rows):
            if cfg.endswith("_sync"):
                continue  # an ablation row (every update in its own phase), not a goal row
            none, full = by.get((cfg, "none", 1)), by.get((cfg, "all", 1))
            ratio = vs_none(cfg, "all", 1, full) if full else None
            if ratio is not None:
                peak = full.get("act_peak_vs_all_kept")
                suffices = full.get("bandwidth_suffices")
                note = premise_note(full)
                if note:
                    premise.append(f"- {config_text(cfg)}: {note}.")
                measured = f"{fmt(ratio)}x, peak {fmt(peak)}"
                if suffices == 0:
                    measured += " (path too slow for the premise)"
                elif full.get("io_tax") is not None:
                    measured += f" (the bytes alone cost {fmt(full.get('io_tax'))}x)"
                # The step time of `all` over `none` is reported, without a goal; the goal is
                # the activation peak.
                heads.append(Headline(f"mini-GPT, {config_text(cfg)}: `all` against `none`",
                                      f"activation peak ≤ {GPT_GOAL_PEAK} of keeping every layer", measured,
                                      at_most(peak, GPT_GOAL_PEAK)))
        if premise:
            out.append("**Is the path fast enough?** (the goal's premise: the step's path traffic at the path's "
                       "bandwidth within a `none` step, and forward's writes within forward):\n\n"
                       + "\n".join(premise) + "\n")
        full_body = [[cfg, mode, str(ranks), fmt(r.get("ms_per_step"), 1), vs_none_cell(cfg, mode, ranks, r),
                      fmt(r.get("cpu_ms_per_step"), 1), fmt(r.get("vs_limit")), fmt(r.get("act_peak_vs_all_kept")),
                      fmt(r.get("update_ms"), 1), fmt(r.get("io_wait_ms"), 1), fmt(r.get("param_wait_ms"), 1)]
                     for cfg, mode, ranks, r in rows]
        folded = md_table(["config", "offload", "ranks", "ms/step", "vs none (paired runs' range)", "CPU ms/step",
                           "vs_limit (matmul)", "activation peak vs all kept", "update ms", "I/O wait ms",
                           "forward's wait for the update ms"],
                          full_body, numeric_from=2)
        if taxed:
            folded += ("\nWhat this machine charges for the bytes: after each offloading run, a `none` run while "
                       "fio moves that run's bytes each way at its pace (random 1 MiB O_DIRECT reads and writes on "
                       "the same path); `none` under fio over `none` is the charge, the row over `none` under fio "
                       "what the library adds to it (1: nothing).\n\n") + md_table(
                ["config", "offload", "MB per step (both ways)", "fio moved MB/s (read / write)",
                 "`none` under fio ms", "`none` under fio vs `none`", "row vs `none` under fio"],
                [[cfg, mode, fmt(mb(r.get("io_load_bytes_per_step")), 1),
                  f"{fmt(mb(r.get('io_load_read_bytes_per_s')), 0)} / {fmt(mb(r.get('io_load_write_bytes_per_s')), 0)}",
                  fmt(r.get("none_under_io_ms"), 1), fmt(r.get("io_tax")), fmt(r.get("vs_none_under_io"))]
                 for cfg, mode, ranks, r in taxed], numeric_from=2)
        out.append(details(f"All rows ({len(rows)})", folded))
    peer_text, peer_head = torch_peer(ctx)
    out.append(peer_text)
    heads += peer_head
    series = load_series(ctx.json_dir / "mini_gpt_series.json")
    if series is not None and series["runs"]:
        out.append(figure_mini_gpt(series, ctx))
        out.append(machine_line(None, series))
    else:
        out.append("_Loss curves not plotted: mini_gpt_series.json was not found beside mini_gpt.json._\n")
    out.append(other_rows(rest))
    out.append(skipped_rows(rep.rows))
    return SectionOutput("\n".join(x for x in out if x), heads)


PEER_LOSS_DIFF = 1e-5  # bench/peers/torch_gpt2.py's --max-loss-diff


def torch_peer(ctx: Context) -> tuple[str, list[Headline]]:
    """The PyTorch peer (torch_peer.json, bench/peers/torch_gpt2.py compare): the same GPT-2
    step on the same checkpoint and tokens in the same run; a peer is measured or not shown."""
    path = ctx.json_dir / "torch_peer.json"
    if not path.exists():
        return ("_PyTorch peer not measured: there is no torch_peer.json (run `scripts/dev bench torch`)._\n", [])
    doc = read_json(path)
    st = doc.get("settings", {})
    model = "GPT-2 124M" if st.get("model") == "gpt2" else str(st.get("model"))
    when = f"{doc.get('context', {}).get('machine') or 'machine not recorded'}, {date_of(doc.get('context', {}).get('date', ''))}"
    rows = [[str(i + 1), f"{m:.6f}", f"{t:.6f}", f"{mm:.1f}", f"{tm:.1f}"]
            for i, (m, t, mm, tm) in enumerate(zip(doc["mini_gpt"]["loss"], doc["torch"]["loss"],
                                                   doc["mini_gpt"]["ms"], doc["torch"]["ms"]))]
    text = (f"**Against PyTorch** ({doc.get('context', {}).get('torch', '')}, the same run: {when}): {model}, "
            f"B={st.get('batch')}, T={st.get('seq')}, {st.get('threads')} threads, the same checkpoint, tokens "
            f"and AdamW (`bench/peers/torch_gpt2.py`). Step time mini-GPT / PyTorch "
            f"**{fmt(doc.get('step_ratio'))}** (medians after the first step: {fmt(doc.get('mini_gpt_ms'), 1)} / "
            f"{fmt(doc.get('torch_ms'), 1)} ms); largest relative loss difference "
            f"{doc.get('max_loss_rel_diff', float('nan')):.1e}.\n\n"
            + md_table(["step", "loss mini-GPT", "loss PyTorch", "ms mini-GPT", "ms PyTorch"], rows))
    head = Headline(f"mini-GPT, {model}, against PyTorch (same run)",
                    f"losses within {PEER_LOSS_DIFF:g} (relative)",
                    f"step time {fmt(doc.get('step_ratio'))} of PyTorch's; losses within "
                    f"{doc.get('max_loss_rel_diff', float('nan')):.1e}",
                    doc.get("max_loss_rel_diff", 1.0) <= PEER_LOSS_DIFF, when)
    return text, [head]


def premise_note(full: Row) -> str:
    """Whether the path's bandwidth suffices for a row, with the figures it was judged on."""
    suffices = full.get("bandwidth_suffices")
    if suffices is None:
        return ""
    fw, fn = full.get("forward_write_floor_ms"), full.get("forward_ms_none")
    # The `none` step the premise was judged against: the paired runs' median, which
    # path_needed_bytes_per_s divides the step's bytes by.
    floor, moved, needed = (full.get(k) for k in ("path_floor_ms", "path_bytes_per_step", "path_needed_bytes_per_s"))
    step = moved / needed * 1e3 if moved and needed else None
    parts = []
    if floor is not None and step is not None:
        parts.append(f"path traffic {fmt(floor, 0)} ms per {fmt(step, 0)} ms step")
    if fw is not None and fn is not None:
        parts.append(f"forward's writes {fmt(fw, 1)} ms per {fmt(fn, 1)} ms forward")
    return ("yes" if suffices else "no") + (" (" + "; ".join(parts) + ")" if parts else "")


def figure_mini_gpt_steps(rows, vs_none, rep: BenchReport, ctx: Context) -> str:
    """Step time of every row over `none` of the same model and ranks, one panel per model
    (so that models of very different sizes do not share an axis)."""
    models = list(dict.fromkeys(cfg.split("_shm")[0].split("_2path")[0].split("_sync")[0] for cfg, _, _, _ in rows))
    fig, axes = subplots(1, len(models), squeeze=False, figsize=(4.2 * len(models) + 2, 3.8), sharey=True)
    palette = {"none": "tab:gray", "optimizer": "tab:blue", "activations": "tab:orange", "all": "tab:green"}
    for ax, model in zip(axes[0], models):
        mine = [(cfg, mode, ranks, r) for cfg, mode, ranks, r in rows
                if cfg.split("_shm")[0].split("_2path")[0].split("_sync")[0] == model]
        vals = [vs_none(cfg, mode, ranks, r) or 0.0 for cfg, mode, ranks, r in mine]
        bars = ax.bar(range(len(mine)), vals, 0.6, color=[palette.get(mode, "tab:purple") for _, mode, _, _ in mine])
        annotate_bars(ax, bars, [fmt(v) for v in vals], fontsize=6)
        ax.axhline(1.0, color="tab:gray", linestyle=":", linewidth=1)
        labels = []
        for cfg, mode, ranks, r in mine:
            variant = config_text(cfg).partition(", ")[2]
            labels.append(f"{mode}" + (f", {variant}" if variant else "") + (f", {ranks} ranks" if ranks > 1 else ""))
        ax.set_xticks(range(len(mine)), labels, fontsize=6, rotation=35, ha="right")
        none = by_mode(mine, "none")
        ax.set_title(f"{_GPT_MODELS.get(model, model)}" +
                     (f" (none: {fmt(none.get('ms_per_step'), 0 if none.get('ms_per_step', 0) > 100 else 1)} ms)"
                      if none is not None and none.get("ms_per_step") else ""), fontsize=9)
    axes[0][0].set_ylabel("step time over --offload none")
    top = max([v for _, _, _, r in rows for v in [r.get("vs_none") or 0.0]] + [1.0])
    axes[0][0].set_ylim(0, top * 1.15)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in palette.values()]
    legend_outside(axes[0][-1], handles, [f"--offload {m}" for m in palette])
    return ctx.figures.save(fig, "mini_gpt", "mini-GPT step time per offload mode", rep.machine(), rep.date())


def by_mode(rows, mode: str) -> Row | None:
    """The one-rank row of `mode` among a model's rows, or None."""
    return next((r for cfg, m, ranks, r in rows if m == mode and ranks == 1), None)


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


def figure_mini_gpt(series: dict, ctx: Context) -> str:
    """The default config's loss per offload mode, overlaid (they must be the same bits)."""
    runs = series["runs"]
    fig, ax = subplots(figsize=(8, 3.6))
    default = [r for r in runs if r.get("config") == "default" and r.get("ranks", 1) == 1] or \
              [r for r in runs if r.get("config") == "default"]
    styles = ["-", "--", ":", "-."]
    widths = [3.5, 2.5, 1.5, 1.0]
    for i, r in enumerate(default):
        ax.plot(range(1, len(r["loss"]) + 1), r["loss"], linestyle=styles[i % 4], linewidth=widths[i % 4],
                label=f"--offload {r.get('offload')}")
    diff = loss_difference(default)
    if diff is not None:
        note = ("the curves are the same bits\n(largest difference 0)" if diff == 0
                else f"largest difference between modes: {diff:.3g}")
        ranks = default[0].get("ranks", 1)
        note += f"\n{ranks} rank" + ("s" if ranks > 1 else "")
        ax.text(0.98, 0.6, note, transform=ax.transAxes, ha="right", fontsize=8,
                bbox={"facecolor": "white", "edgecolor": "0.7"})
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title("mini-GPT demo model: loss per offload mode (overlaid)", fontsize=9)
    legend_outside(ax)
    ax.grid(alpha=0.3)
    return ctx.figures.save(fig, "mini_gpt_loss", "mini-GPT loss curves per offload mode", series.get("machine", ""),
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

# Row names of bench_cuda.cu.
_CUDA_COPY_ROW = re.compile(r"^(pinned_h2d|pinned_d2h|pageable_h2d)(?:/|$)")
_CUDA_STAGED_ROW = re.compile(r"^staged_disk_to_device/slots:(\d+)/chunk_MiB:(\d+)")
_CUDA_ADAM_ROW = re.compile(r"^device_adam(?:/|$)")
_CUDA_STASH_ROW = re.compile(r"^device_stash_overhead/passes:(\d+)")
_CUDA_COPY_NAMES = {"pinned_h2d": "host → device, pinned", "pinned_d2h": "device → host, pinned",
                    "pageable_h2d": "host → device, pageable"}
# Goals of the CUDA pieces: staged copies against their slower hop, the device AdamW step against a
# device copy of its bytes, the device stash's overhead and peak (where compute covers its
# copies). Pinned copies are shown against the PCIe link, without a goal.
CUDA_GOAL_STAGED, CUDA_GOAL_ADAM = 0.9, 0.8
CUDA_GOAL_STASH_OVERHEAD, CUDA_GOAL_STASH_PEAK_REDUCTION = 0.05, 0.45


def gpu_name(context: dict) -> str:
    return context.get("gpu_model") or "GPU not recorded"


def gpu_line(context: dict) -> str:
    """The GPU the run used, from bench_cuda's context: name, memory, CUDA versions, link,
    nvidia-smi's line."""
    if not context.get("gpu_model"):
        return f"_GPU: {context.get('gpu', 'not recorded in the JSON context')}._\n"
    parts = [f"**GPU**: {context['gpu_model']}"]
    facts = []
    if context.get("gpu_memory_GiB"):
        facts.append(f"{context['gpu_memory_GiB']} GiB")
    if context.get("gpu_compute_capability"):
        facts.append(f"compute capability {context['gpu_compute_capability']}")
    if context.get("cuda_driver") or context.get("cuda_runtime"):
        facts.append(f"CUDA driver {context.get('cuda_driver', '?')}, runtime {context.get('cuda_runtime', '?')}")
    if facts:
        parts[0] += " (" + ", ".join(facts) + ")"
    if context.get("gpu_pcie"):
        parts.append(f"PCI device {context['gpu_pcie']}")
    if context.get("nvidia_smi"):
        parts.append(f"`nvidia-smi`: {context['nvidia_smi']}")
    return "; ".join(parts) + ".\n"


def gbps(row: Row, counter: str | None = None) -> float | None:
    """A row's GB/s: the counter when given and present, else Google Benchmark's bytes/s."""
    if counter and row.get(counter) is not None:
        return row.get(counter)
    return gb(row.get("bytes_per_second"))


def over(x: float | None, y: float | None) -> float | None:
    return None if x is None or y is None or y == 0 else x / y


def cuda_limit_rows(copies, staged, adam) -> list[list[str]]:
    """One line per copy, staged and Adam row: what it reached, its limit and the ratio."""
    body = []
    for key, r in copies:
        rate = gbps(r, "GBps")
        if key == "pageable_h2d":
            body.append([_CUDA_COPY_NAMES[key], fmt(rate, 1), "the pinned copy, same iteration",
                         fmt(over(rate, r.get("vs_limit")), 1), fmt(r.get("vs_limit")), fmt_cv(r), "no goal"])
        elif r.get("vs_limit") is not None:
            gen, width = r.get("pcie_gen"), r.get("pcie_width")
            link = f"PCIe Gen{gen:.0f} x{width:.0f} link" if gen and width else "PCIe link"
            body.append([_CUDA_COPY_NAMES[key], fmt(rate, 1), link, fmt(r.get("link_GBps"), 1),
                         fmt(r.get("vs_limit")), fmt_cv(r), "no goal"])
        else:  # sysfs showed no usable link: the label says why
            body.append([_CUDA_COPY_NAMES[key], fmt(rate, 1), r.label or "PCIe link unknown", "–", "–", "–",
                         "no goal"])
    for slots, chunk, r in staged:
        disk, pcie = r.get("disk_GBps"), r.get("pcie_GBps")
        disk_slower = disk is not None and (pcie is None or disk <= pcie)
        limit = disk if disk_slower else pcie
        hops = (f"disk hop alone (PCIe hop {fmt(pcie, 1)} GB/s)" if disk_slower
                else f"PCIe hop alone (disk hop {fmt(disk, 2)} GB/s)")
        ok = at_least(r.get("vs_limit"), CUDA_GOAL_STAGED)
        body.append([f"staged disk → device, {slots} slots of {chunk} MiB", fmt(gbps(r, "staged_GBps"), 2),
                     hops, fmt(limit, 2),
                     fmt(r.get("vs_limit")), fmt_cv(r), f"{verdict(ok)} (≥ {CUDA_GOAL_STAGED})"])
    for r in adam:
        rate = gbps(r)
        ok = at_least(r.get("vs_limit"), CUDA_GOAL_ADAM)
        gparams = r.get("items_per_second")
        body.append(["device AdamW step, fp16 gradients and copy" +
                     (f" ({gparams / 1e9:.1f} G params/s)" if gparams else ""), fmt(rate, 0),
                     "a device-to-device copy of the same bytes", fmt(over(rate, r.get("vs_limit")), 0),
                     fmt(r.get("vs_limit")), fmt_cv(r), f"{verdict(ok)} (≥ {CUDA_GOAL_ADAM})"])
    return body


def stash_covered(r: Row) -> bool:
    """The goal's premise: keep-all's compute per layer is at least one stash copy's time."""
    return (r.get("covers") or 0.0) >= 1.0


def stash_met(r: Row) -> bool:
    return at_most(r.get("overhead"), CUDA_GOAL_STASH_OVERHEAD) and \
        (r.get("peak_reduction") or 0.0) >= CUDA_GOAL_STASH_PEAK_REDUCTION


def stash_passes_text(passes: int, r: Row) -> str:
    actual = r.get("passes")
    if passes == 0:
        return f"sized to the stash: {actual:.0f}" if actual is not None else "sized to the stash"
    return str(passes)


def mib_pair(a: float | None, b: float | None) -> str:
    return f"{fmt(to_mib(a), 0)} → {fmt(to_mib(b), 0)}"


def to_mib(x: float | None) -> float | None:
    return None if x is None else x / (1 << 20)


def cuda_stash_rows(stash) -> list[list[str]]:
    body = []
    for passes, r in stash:
        overhead = r.get("overhead")
        red = r.get("peak_reduction")
        goal = f"{verdict(stash_met(r))}" if stash_covered(r) else "– (copies not covered)"
        body.append([stash_passes_text(passes, r), fmt(r.get("covers")), fmt(mul(r.get("keep_all_s"), 1e3), 1),
                     fmt(mul(r.get("stash_s"), 1e3), 1), fmt(mul(overhead, 100), 1, " %"), fmt_cv(r, "overhead"),
                     mib_pair(r.get("peak_bytes_keep_all"), r.get("peak_bytes_stash")) +
                     f" ({fmt(mul(red, 100), 0)}% lower)",
                     mib_pair(r.get("device_bytes_keep_all"), r.get("device_bytes_stash")), goal])
    return body


def mul(x: float | None, k: float) -> float | None:
    return None if x is None else x * k


def render_cuda(rep: BenchReport, ctx: Context) -> SectionOutput:
    measured = [r for r in rep.rows if not r.error]
    if not measured:
        reasons = sorted({r.error for r in rep.rows})
        return SectionOutput(f"Every row was skipped ({'; '.join(reasons) or 'no rows'}): run it on a machine with "
                             "a GPU.\n", [Headline("CUDA path", f"staged ≥ {CUDA_GOAL_STAGED}, device AdamW ≥ "
                                                   f"{CUDA_GOAL_ADAM}, stash ≤ 5% at ≥ 45% lower peak",
                                                   "skipped (no GPU)", None)])
    (copy_m, staged_m, adam_m, stash_m), rest = classify(rep.rows, _CUDA_COPY_ROW, _CUDA_STAGED_ROW, _CUDA_ADAM_ROW,
                                                         _CUDA_STASH_ROW)
    copies = [(m.group(1), r) for m, r in copy_m]
    staged = [(int(m.group(1)), int(m.group(2)), r) for m, r in staged_m]
    adam = [r for _, r in adam_m]
    stash = [(int(m.group(1)), r) for m, r in stash_m]
    when = f"{gpu_name(rep.context)}, {rep.date()[:10]}"
    out = [gpu_line(rep.context)]
    if copies or staged or adam:
        out.append("**Copies and the AdamW step against their limits** (medians; GB/s = 10^9 bytes/s; *cv*: the "
                   "ratio's spread over repetitions):\n\n" +
                   md_table(["row", "GB/s", "limit", "limit GB/s", "ratio", "cv", "goal"],
                            cuda_limit_rows(copies, staged, adam), numeric_from=1))
    if stash:
        first = stash[0][1]
        out.append(f"**The device stash against keeping every activation** ({fmt(first.get('layers'), 0)} layers "
                   f"of {fmt(first.get('MiB'), 0)} MiB, {fmt(first.get('buffers'), 0)} device buffers, "
                   f"{fmt(first.get('stashed_layers'), 0)} layers stashed; the stash's copies alone "
                   f"{fmt(first.get('stash_out_GBps'), 1)} GB/s out, {fmt(first.get('stash_in_GBps'), 1)} GB/s in; "
                   "*covers*: keep-all's compute per layer over one copy's time, the goal applies from 1):\n\n" +
                   md_table(["passes per layer", "covers", "keep-all ms", "stash ms", "overhead", "cv",
                             "peak MiB, keep-all → stash", "measured MiB", "goal"],
                            cuda_stash_rows(stash), numeric_from=1))
    if copies or staged or adam or stash:
        out.append(figure_cuda(copies, staged, adam, stash, rep, ctx))
    out.append(details(f"All rows ({len(rep.rows)})", generic_table(rep.rows)))
    out.append(other_rows(rest))
    out.append(skipped_rows(rep.rows))
    return SectionOutput("\n".join(x for x in out if x), cuda_headlines(rep.rows, copies, staged, adam, stash, when))


def failed_text(rows: list[Row], prefix: str) -> str | None:
    """'failed: <error>' when a row of the group failed with an error other than no GPU."""
    bad = [r for r in rows if r.error and r.name.startswith(prefix)]
    return "failed: " + textwrap.shorten(bad[0].error, width=60, placeholder=" …") if bad else None


def cuda_headlines(rows, copies, staged, adam, stash, when: str) -> list[Headline]:
    heads = []
    pinned = [(k, r) for k, r in copies if k.startswith("pinned")]
    ratios = [(k, r) for k, r in pinned if r.get("vs_limit") is not None]
    what, goal = "CUDA: pinned copies against the PCIe link", "none: the link's rate is a ceiling"
    if ratios:
        gen, width = ratios[0][1].get("pcie_gen"), ratios[0][1].get("pcie_width")
        link = f" of Gen{gen:.0f} x{width:.0f}" if gen and width else ""
        text = ", ".join(f"{'H2D' if k == 'pinned_h2d' else 'D2H'} {fmt(r.get('vs_limit'))}" for k, r in ratios) + link
        heads.append(Headline(what, goal, text, None))
    elif pinned:
        heads.append(Headline(what, goal, "no ratio: sysfs shows no usable link", None))
    for what, goal, group, prefix in (
            ("CUDA: staged disk-to-device against its slower hop", CUDA_GOAL_STAGED, [r for _, _, r in staged],
             "staged_disk_to_device"),
            ("CUDA: device AdamW against a device copy", CUDA_GOAL_ADAM, adam, "device_adam")):
        vals = [r.get("vs_limit") for r in group if r.get("vs_limit") is not None]
        failed = failed_text(rows, prefix)
        if failed:
            heads.append(Headline(what, f"≥ {goal}", failed, False))
        elif vals:
            text = fmt(vals[0]) if len(vals) == 1 else f"min {fmt(min(vals))} of {len(vals)} rows"
            heads.append(Headline(what, f"≥ {goal}", text, all(v >= goal for v in vals)))
        else:
            heads.append(Headline(what, f"≥ {goal}", "not measured", None))
    what = "CUDA: device stash against keep-all, compute covering copies"
    goal = f"≤ {100 * CUDA_GOAL_STASH_OVERHEAD:.0f}% at ≥ {100 * CUDA_GOAL_STASH_PEAK_REDUCTION:.0f}% lower peak"
    covered = [(p, r) for p, r in stash if stash_covered(r)]
    failed = failed_text(rows, "device_stash_overhead")
    if failed:
        heads.append(Headline(what, goal, failed, False))
    elif covered:
        p, worst = max(covered, key=lambda x: x[1].get("overhead") or 0.0)
        passes = f"{fmt(worst.get('passes'), 0)} passes" + (" (sized to the stash)" if p == 0 else "")
        text = (f"{fmt(mul(worst.get('overhead'), 100), 1)}% at a {fmt(mul(worst.get('peak_reduction'), 100), 0)}% "
                f"lower peak, {passes}")
        heads.append(Headline(what, goal, text, all(stash_met(r) for _, r in covered)))
    elif stash:
        best = max((r.get("covers") or 0.0) for _, r in stash)
        heads.append(Headline(what, goal, f"no row's compute covered the copies (best {fmt(best)})", None))
    else:
        heads.append(Headline(what, goal, "not measured", None))
    for h in heads:
        h.when = when
    return heads


def figure_cuda(copies, staged, adam, stash, rep: BenchReport, ctx: Context) -> str:
    """Left: every copy, staged and Adam row's share of its limit, with the goals; right: the
    stash's overhead over keep-all by passes per layer, coloured by whether compute covers
    its copies."""
    panels = (1 if copies or staged or adam else 0) + (1 if stash else 0)
    fig, axes = subplots(1, panels, squeeze=False, figsize=(6.2 * panels + 1.5, 4.0))
    i = 0
    if copies or staged or adam:
        ax = axes[0][i]
        i += 1
        bars = []  # (label, ratio, goal, colour)
        for key, r in copies:
            name = _CUDA_COPY_NAMES[key].replace(", ", "\n")
            bars.append((name + ("\nvs pinned" if key == "pageable_h2d" else "\nvs PCIe link"), r.get("vs_limit"),
                         None, "tab:gray" if key == "pageable_h2d" else "tab:blue"))
        for slots, chunk, r in staged:
            bars.append((f"staged disk\n→ device\n{slots} × {chunk} MiB", r.get("vs_limit"), CUDA_GOAL_STAGED,
                         "tab:green"))
        for r in adam:
            bars.append(("device AdamW\nvs device copy", r.get("vs_limit"), CUDA_GOAL_ADAM, "tab:purple"))
        xs = list(range(len(bars)))
        drawn = ax.bar(xs, [b[1] or 0.0 for b in bars], 0.6, color=[b[3] for b in bars])
        annotate_bars(ax, drawn, [fmt(b[1]) for b in bars], fontsize=6)
        for x, b in zip(xs, bars):
            if b[2] is not None:
                ax.plot([x - 0.35, x + 0.35], [b[2], b[2]], color="tab:red", linestyle="--", linewidth=1)
        ax.axhline(1.0, color="0.4", linewidth=0.8)
        ax.set_ylim(0, max([1.15] + [(b[1] or 0.0) * 1.12 for b in bars]))
        ax.set_xticks(xs, [b[0] for b in bars], fontsize=6)
        ax.set_ylabel("share of the row's limit")
        ax.set_title("Copies and the AdamW step against their limits", fontsize=9)
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ("tab:blue", "tab:gray", "tab:green", "tab:purple")]
        handles.append(plt.Line2D([], [], color="tab:red", linestyle="--", linewidth=1))
        legend_outside(ax, handles, ["pinned copy over the\nPCIe link's rate", "pageable copy over\nthe pinned one",
                                     "staged copy over its\nslower hop alone", "AdamW step over a\ndevice copy",
                                     "goal"])
    if stash:
        ax = axes[0][i]
        labels = [stash_passes_text(p, r).replace("sized to the stash: ", "sized to\nthe stash:\n") for p, r in stash]
        vals = [100 * (r.get("overhead") or 0.0) for _, r in stash]
        # A linear axis around the goal: rows far above it are cut at the top (hatched) and
        # carry their value.
        covered_vals = [v for v, (_, r) in zip(vals, stash) if stash_covered(r)]
        top = max([4 * 100 * CUDA_GOAL_STASH_OVERHEAD] + [1.3 * v for v in covered_vals])
        xs = list(range(len(stash)))
        drawn = ax.bar(xs, [min(v, top) for v in vals], 0.6,
                       color=["tab:green" if stash_covered(r) else "tab:orange" for _, r in stash])
        for bar, v in zip(drawn, vals):
            if v > top:
                bar.set_hatch("//")
        annotate_bars(ax, drawn, [f"{v:.1f}%\ncovers {fmt(r.get('covers'))}" for v, (_, r) in zip(vals, stash)],
                      fontsize=6)
        ax.axhline(100 * CUDA_GOAL_STASH_OVERHEAD, color="tab:red", linestyle="--", linewidth=1)
        ax.axhline(0, color="0.4", linewidth=0.8)
        ax.set_ylim(min([0.0] + [1.3 * v for v in vals]), top * 1.2)
        ax.set_xticks(xs, labels, fontsize=7)
        ax.set_xlabel("passes per layer (compute per layer)", fontsize=8)
        ax.set_ylabel("stash step time over keep-all, %")
        red = stash[0][1].get("peak_reduction")
        ax.set_title(f"Device stash: overhead at a {fmt(mul(red, 100), 0)}% lower peak", fontsize=9)
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ("tab:green", "tab:orange")]
        handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="0.3", hatch="//"))
        handles.append(plt.Line2D([], [], color="tab:red", linestyle="--", linewidth=1))
        legend_outside(ax, handles, ["compute covers\nthe copies", "copies longer than\nthe compute",
                                     "cut at the top\n(value on the bar)", "goal where compute\ncovers the copies: ≤ 5%"])
    return ctx.figures.save(fig, "cuda", f"the CUDA path on {gpu_name(rep.context)}", rep.machine(), rep.date())


# ---- Scale: GPT-2 sizes under a memory cap (scripts/bench_scale.py) ----------------------------


@dataclass
class ScaleReport(BenchReport):
    """scale.json (not Google Benchmark's format): its rows as Rows, and the document itself."""

    doc: dict = field(default_factory=dict)


def load_scale(path: Path) -> ScaleReport:
    doc = read_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list) or not isinstance(doc.get("goals"), list):
        raise ReportError(f"{path}: not scripts/bench_scale.py's JSON (no 'rows' and 'goals' lists)")
    machine = doc.get("machine") or {}
    context = {"cpu_model": machine.get("cpu_model"), "num_cpus": machine.get("num_cpus"), "date": doc.get("date", "")}
    rows = []
    for i, r in enumerate(doc["rows"]):
        if not isinstance(r, dict) or "model" not in r or "mode" not in r:
            raise ReportError(f"{path}: rows[{i}] has no 'model' and 'mode'")
        values = {k: float(v) for k, v in r.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        rows.append(Row(name=f"{r['model']}/{r['mode']}", values=values, label=str(r.get("status", "")),
                        time_unit="s"))
    return ScaleReport(path, context, rows, doc)


def scale_table(doc: dict) -> str:
    body = []
    for r in doc["rows"]:
        ok = r.get("status") == "ok"
        none = r.get("mode") == "none"
        traffic = "–" if none else (f"{fmt(mb(r.get('read_bytes_per_step')), 0)} / "
                                     f"{fmt(mb(r.get('write_bytes_per_step')), 0)}")
        compute = fmt(r.get("compute_s")) + (" (est.)" if "estimate" in str(r.get("compute_source", "")) else "")
        body.append([r.get("label", r["model"]), f"`{r['mode']}`", r.get("status", "–") if ok else f"**{r.get('status')}**",
                     fmt(gib(r.get("peak_rss_bytes")) if ok else None), fmt(gib(r.get("cgroup_peak_bytes"))),
                     fmt(r.get("step_s")), traffic, compute, fmt(r.get("io_s")), fmt(r.get("bound_s")),
                     fmt(r.get("ratio"))])
    return md_table(["model", "offload", "status", "peak RSS GiB", "cgroup peak GiB", "step s",
                     "path MB/step read / write", "compute s", "I/O s", "bound s", "step / bound"], body, numeric_from=3)


def gib(x: float | None) -> float | None:
    return None if x is None else x / (1 << 30)


def scale_headlines(doc: dict) -> list[Headline]:
    return [Headline(str(g.get("what", "")), str(g.get("goal", "")), str(g.get("measured", "")),
                     g.get("met")) for g in doc.get("goals", [])]


def render_scale(rep: ScaleReport, ctx: Context) -> SectionOutput:
    doc = rep.doc
    st = doc.get("settings", {})
    bw = doc.get("path_bandwidth") or {}
    cap = st.get("cap_bytes")
    out = [f"B={st.get('batch')}, T={st.get('seq')}, {st.get('threads')} threads, {st.get('steps')} steps (the first "
           f"{st.get('warmup')} not timed); each run in its own process in a memory cgroup "
           f"(v{(doc.get('cgroup') or {}).get('version', '?')}) capped at {fmt(gib(cap))} GiB; the offloaded rows "
           f"with `--memory-budget` {fmt(gib(st.get('budget_bytes')))} GiB. The path: {doc.get('path_fs', '–')}, "
           f"fio {fmt(gb(bw.get('write_bytes_per_s')))} GB/s writing and {fmt(gb(bw.get('read_bytes_per_s')))} GB/s "
           "reading in this run.\n", scale_table(doc)]
    for note in doc.get("notes", []):
        out.append(f"_{note}_\n")
    out.append(figure_scale(doc, rep, ctx))
    demo_path = ctx.json_dir / "scale_demo.json"
    if demo_path.exists():
        demo = load_scale(demo_path)
        title = str(demo.doc.get("title", "")).removeprefix("Demonstration: ")
        out.append(f"**The demonstration** ({demo.machine()}, {demo.date()}): {title}.\n")
        out.append(scale_table(demo.doc))
        losses = [f"{x:.4f}" for run in demo.doc.get("runs", []) if run.get("capped") for x in run.get("losses", [])]
        if losses:
            out.append(f"Loss at each step: {', '.join(losses)}.\n")
        for note in demo.doc.get("notes", []):
            out.append(f"_{note}_\n")
    out.append(details(f"All rows ({len(rep.rows)})", generic_table(rep.rows)))
    return SectionOutput("\n".join(out), scale_headlines(doc))


def figure_scale(doc: dict, rep: ScaleReport, ctx: Context) -> str:
    rows = doc["rows"]
    models = list(dict.fromkeys(r["model"] for r in rows))
    labels = {r["model"]: r.get("label", r["model"]) for r in rows}
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    cap = (doc.get("settings") or {}).get("cap_bytes")
    fig, (ax1, ax2) = subplots(1, 2, figsize=(10, 3.8))
    width = 0.8 / max(1, len(modes))
    colors = ["tab:gray", "tab:blue", "tab:green", "tab:orange"]
    for j, mode in enumerate(modes):
        xs, hs, texts, hatches = [], [], [], []
        for i, m in enumerate(models):
            r = next((x for x in rows if x["model"] == m and x["mode"] == mode), None)
            if r is None:
                continue
            ok = r.get("status") == "ok" and r.get("peak_rss_bytes") is not None
            xs.append(i + (j - (len(modes) - 1) / 2) * width)
            hs.append(gib(r["peak_rss_bytes"]) if ok else gib(cap) or 0)
            texts.append(fmt(gib(r["peak_rss_bytes"])) if ok else None)
            hatches.append("" if ok else r.get("status", "did not finish").replace(" by the ", "\nby the "))
        bars = ax1.bar(xs, hs, width, color=colors[j % len(colors)], label=f"--offload {mode}")
        for b, h in zip(bars, hatches):
            if h:  # a run that did not finish: hatched, its status inside the bar
                b.set_hatch("//")
                b.set_alpha(0.4)
                ax1.annotate(h, (b.get_x() + b.get_width() / 2, b.get_height() / 2), ha="center", va="center",
                             fontsize=6, rotation=90, bbox=dict(facecolor="white", edgecolor="none", pad=1))
        annotate_bars(ax1, bars, texts, fontsize=6)
    if cap:
        goal_line(ax1, gib(cap), f"the cap, {fmt(gib(cap))} GiB", color="tab:red", on_plot=False)
        ax1.set_ylim(0, gib(cap) * 1.12)
    ax1.set_xticks(range(len(models)), [labels[m] for m in models], fontsize=8)
    ax1.set_ylabel("peak RSS, GiB")
    ax1.set_title("Peak memory of a training run (hatched: did not finish)", fontsize=9)
    legend_outside(ax1)
    off = [r for r in rows if r["mode"] != "none"]
    xs = range(len(off))
    ax2.bar([x - 0.2 for x in xs], [r.get("step_s") or 0 for r in off], 0.4, color="tab:blue", label="step time")
    ax2.bar([x + 0.2 for x in xs], [r.get("bound_s") or 0 for r in off], 0.4, color="0.7",
            label="bound: max(compute, path bytes / fio)")
    ax2.set_xticks(list(xs), [f"{labels[r['model']]}\n{r['mode']}" for r in off], fontsize=8)
    ax2.set_ylabel("seconds per step")
    ax2.set_title("Offloaded step time and its bound", fontsize=9)
    legend_outside(ax2)
    return ctx.figures.save(fig, "scale", "peak memory and step time of GPT-2 sizes under a memory cap",
                            rep.machine(), rep.date())


# ---- The report -------------------------------------------------------------------------------

SECTIONS = [
    Section("tiers", "Storage tiers: the file tier against fio", "bench/bench_tiers.cpp",
            "scripts/dev bench tiers", render_tiers, "File tier against fio",
            "add `--full` for every block size from 128 KiB to 64 MiB and queue depth from 1 to 64"),
    Section("virtual_tier", "The virtual tier against the sum of its paths", "bench/bench_virtual_tier.cpp",
            "scripts/dev bench virtual_tier --benchmark_repetitions=2 --benchmark_report_aggregates_only=true",
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
            "--benchmark_repetitions=3 --benchmark_report_aggregates_only=true", render_cuda, "CUDA path",
            "with the cuda preset built, on a machine with a GPU; scripts/gpu_checks.sh writes the same run as "
            "bench_cuda_r3.json"),
    Section("scale", "Scale: GPT-2 sizes under a memory cap", "scripts/bench_scale.py", "scripts/dev bench scale",
            render_scale, "GPT-2 sizes under a memory cap", "as root, with a memory cgroup; "
            "`scripts/dev bench scale --demo` adds GPT-2 XL", load=load_scale),
]
# Read by their sections, not reports of their own.
SIDE_FILES = {"stash_series", "mini_gpt_series", "scale_demo", "torch_peer"}


def narrative(ctx: Context, key: str) -> str:
    path = ctx.narrative_dir / f"{key}.md"
    return path.read_text().strip() + "\n" if path.exists() else ""


def not_measured(section: Section, ctx: Context) -> str:
    where = f" ({section.where})" if section.where else ""
    # The file's name only: the folder is the machine's (the report names no local path).
    return (f"**Not measured**: there is no {section.key}.json among the benchmark JSON. Run "
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
        text = [f"## {s.title}\n"]
        story = narrative(ctx, s.key)
        if story:
            text.append(story)
        if not path.exists():
            text.append(not_measured(s, ctx))
            summary.append(Headline(s.what, "", "not measured", None))
        else:
            try:
                rep = (s.load or load_bench)(path)
                text.append(machine_line(rep))
                result = s.render(rep, ctx)
                for h in result.headlines:
                    h.when = h.when or short_machine(rep)
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
            text.append(goal_block(result.headlines))
            summary.extend(result.headlines)
        text.append(f"_Source: `{s.source}`; run: `{s.command}`{where}._\n")
        parts.append("\n".join(x for x in text if x))
    head = [narrative(ctx, "intro") or "# Spillway benchmarks\n",
            "_Generated by `scripts/dev bench report` (scripts/bench_report.py) from build/bench/*.json; "
            "edit the narrative in docs/report/, not this file._\n",
            "| what | goal | this run | measured on | |\n| --- | --- | --- | --- | --- |\n" +
            "".join(f"| {h.what} | {h.goal or '–'} | {h.measured} | {h.when or '–'} | {verdict(h.met)} |\n"
                    for h in summary)]
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
