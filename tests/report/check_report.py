#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""report.generate: scripts/bench_report.py on trimmed benchmark JSON (tests/report/fixtures).

Usage: check_report.py --script scripts/bench_report.py --fixtures tests/report/fixtures --work DIR
       check_report.py --consistent docs/benchmarks.md   (report.benchmarks_consistent)

Checks, on real (smoke-size, trimmed) benchmark output:
1. Every section and every plot is produced, each section names its machine and date, and
   repetitions are reduced to their medians.
2. A missing JSON gives the "not measured" text with the command, and the rest still renders;
   a JSON no section knows gets a generic section; rows and counters added to a known
   benchmark are listed, not dropped.
3. A malformed JSON is an error naming the file, and the previous report stays untouched;
   with --keep-going the other sections are written and the error stands in its section.
4. Non-finite values (NaN) are left out of medians and cv; a figure with none shows "–".
5. The update section's comparison with MLP-Offload finds its rows by name: without the
   baseline its figures are "–" (not another row's), and with only the reference row the
   section still renders.
6. The CUDA section, from a synthetic cuda.json shaped as bench_cuda writes it (there is no
   fixture: it needs a GPU): the GPU named, each row against its limit, the stash's rows and
   goal (only where compute covers its copies), a plot; a run whose sysfs shows no link, a
   failed row, and a run without a GPU (every row skipped).
7. (--consistent, and on every generated report) The summary table and the sections agree:
   each summary row is a goal line of one section, with the same goal, figure, verdict,
   machine and date as that section's latest run; no machine-local temporary path and no
   comparison with an earlier run is written in.
"""

import argparse
import contextlib
import importlib.util
import io
import json
import math
import re
import shutil
import statistics
import sys
import unittest
from pathlib import Path

ARGS = None
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# The plots each section must draw from the fixtures (the GPU benchmark has no fixture: its
# section must say "not measured").
EXPECTED_PLOTS = {
    "tiers": ["bench_tiers_vs_fio.png", "bench_tiers_bandwidth.png"],
    "virtual_tier": ["bench_virtual_tier.png"],
    "adam": ["bench_adam.png"],
    "update": ["bench_update_phase.png"],
    "stash": ["bench_stash.png", "bench_stash_memory.png"],
    "mini_gpt": ["bench_mini_gpt.png", "bench_mini_gpt_loss.png"],
}


# The sections whose every row does not fit the short table: the rest are folded away.
FOLDED = {"tiers", "adam", "update", "mini_gpt"}


def load_script():
    spec = importlib.util.spec_from_file_location("bench_report", ARGS.script)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_report"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def run_report(report, json_dir: Path, out: Path, *extra: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = report.main(["--json-dir", str(json_dir), "--out", str(out), *extra])
    return rc, err.getvalue()


def sections_of(text: str) -> dict[str, str]:
    """Section title -> its text, split at '## ' headings."""
    parts = {}
    for chunk in text.split("\n## ")[1:]:
        title, _, body = chunk.partition("\n")
        parts[title.strip()] = body
    return parts


SUMMARY_ROW = re.compile(r"^\| (?P<what>.+?) \| (?P<goal>.*?) \| (?P<measured>.*?) \| (?P<when>.*?) \| "
                         r"(?P<verdict>met|not met|–) \|$")
GOAL_LINE = re.compile(r"^- \*\*(?P<verdict>met|not met|–)\*\*: (?P<what>.+?): goal (?P<goal>.*?); "
                       r"this run (?P<measured>.*)\.$")
FORBIDDEN = [(re.compile(r"/tmp/|/var/tmp/"), "a machine-local temporary path"),
             (re.compile(r"previous run|earlier run|the last run", re.I), "a comparison with an earlier run")]


def inconsistencies(text: str) -> list[str]:
    """What the summary table says that no section says alike, and forbidden text (check 7)."""
    problems = []
    head, _, rest = text.partition("\n## ")
    summary = [m.groupdict() for m in map(SUMMARY_ROW.match, head.splitlines()) if m and m["what"] != "what"]
    if not summary:
        problems.append("the report has no summary table")
    goals = {}  # what -> (goal, measured, verdict, the section's title, its run's date)
    for title, body in sections_of(text).items():
        run = re.search(r"_Latest run: [^,]*, [^,]*, (\d{4}-\d{2}-\d{2})", body)
        for line in body.splitlines():
            m = GOAL_LINE.match(line)
            if m:
                goals.setdefault(m["what"], []).append((m["goal"], m["measured"], m["verdict"], title,
                                                        run.group(1) if run else None))
    for row in summary:
        if row["measured"] == "not measured":
            continue
        found = goals.get(row["what"])
        if not found:
            problems.append(f"summary row '{row['what']}' is the goal of no section")
            continue
        goal, measured, verdict, title, date = found[0]
        for name, theirs in (("goal", goal), ("figure", measured), ("verdict", verdict)):
            ours = row[name if name != "figure" else "measured"]
            if ours.strip() != theirs.strip() and not (name == "goal" and ours == "–" and theirs == "–"):
                problems.append(f"summary row '{row['what']}': the summary's {name} '{ours}' is not "
                                f"section '{title}''s '{theirs}'")
        if date and date not in row["when"] and "same run" not in row["what"]:
            problems.append(f"summary row '{row['what']}' says '{row['when']}', section '{title}''s run is of {date}")
    for pattern, what in FORBIDDEN:
        for number, line in enumerate(text.splitlines(), 1):
            if pattern.search(line):
                problems.append(f"line {number} writes in {what}: {line.strip()[:120]}")
    return problems


class ConsistencyTest(unittest.TestCase):
    """Check 7 on hand-made text: each kind of disagreement is found, and only those."""

    DOC = """# Report

| what | goal | this run | measured on | |
| --- | --- | --- | --- | --- |
| A step | ≤ 1.25x | 1.10x | Box, 2026-12-06 | met |

## Section

_Latest run: Box, 2 CPUs, 2026-12-06 02:08 UTC._

**Goals**

- **met**: A step: goal ≤ 1.25x; this run 1.10x.
"""

    def test_agreeing_text_passes(self):
        self.assertEqual(inconsistencies(self.DOC), [])

    def test_each_disagreement_is_found(self):
        for old, new, said in (("1.10x.", "1.34x.", "figure"), ("- **met**", "- **not met**", "verdict"),
                               ("Box, 2026-12-06 |", "Box, 2026-12-05 |", "run is of 2026-12-06"),
                               ("- **met**: A step", "- **met**: Another step", "the goal of no section")):
            with self.subTest(said=said):
                problems = inconsistencies(self.DOC.replace(old, new))
                self.assertTrue(any(said in p for p in problems), problems)

    def test_forbidden_text_is_found(self):
        for extra in ("Not measured: /tmp/latest/json/cuda.json", "The previous run read 1.34."):
            with self.subTest(extra=extra):
                self.assertEqual(len(inconsistencies(self.DOC + extra + "\n")), 1)


class ReportTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.report = load_script()
        cls.work = Path(ARGS.work)
        shutil.rmtree(cls.work, ignore_errors=True)
        cls.work.mkdir(parents=True)
        cls.fixtures = Path(ARGS.fixtures)
        missing = [key for key in EXPECTED_PLOTS if not (cls.fixtures / f"{key}.json").exists()]
        assert not missing, f"fixtures lack {missing}"
        cls.measured = [s for s in cls.report.SECTIONS if s.key in EXPECTED_PLOTS]
        cls.unmeasured = [s for s in cls.report.SECTIONS if s.key not in EXPECTED_PLOTS]

    def copy_fixtures(self, name: str, keys) -> Path:
        d = self.work / name
        d.mkdir()
        for key in keys:
            shutil.copy(self.fixtures / f"{key}.json", d / f"{key}.json")
        return d

    def test_every_section_and_plot(self):
        out = self.work / "full-out"
        rc, err = run_report(self.report, self.fixtures, out)
        self.assertEqual(rc, 0, err)
        text = (out / "benchmarks.md").read_text()
        sections = sections_of(text)
        self.assertEqual(len(sections), len(self.report.SECTIONS))
        self.assertEqual(inconsistencies(text), [])  # check 7: the summary is the sections'
        for s in self.unmeasured:
            self.assertIn("**Not measured**", sections[s.title], s.key)
        for s in self.measured:
            self.assertIn(s.title, sections, f"section {s.key} missing")
            body = sections[s.title]
            self.assertNotIn("Not measured", body, s.key)
            self.assertIn("Latest run: ", body, f"{s.key}: no machine line")
            # The layout every section shares: narrative, machine, a table, goals with verdicts,
            # the source; the full rows folded away.
            self.assertLess(body.index("Latest run: "), body.index("| --- |"), s.key)
            self.assertIn("**Goals**", body, f"{s.key}: no goals")
            self.assertRegex(body, r"- \*\*(met|not met)\*\*: ", f"{s.key}: a goal without a verdict")
            self.assertIn(f"_Source: `{s.source}`", body, s.key)
            if s.key in FOLDED:
                self.assertIn("<details><summary>All rows", body, f"{s.key}: full rows not folded")
            self.assertLessEqual(visible_lines(body), 60, f"{s.key}: the section is too long to read")
            # No internal row or config names where a reader sees them (outside the folded rows).
            for internal in ("+lazy_widening", "+node_lock_2proc", "gpt2_124M", "BM_", "file_io_uring"):
                self.assertNotIn(internal, fold_out(body), f"{s.key}: internal name {internal}")
            self.assertRegex(body, r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", f"{s.key}: no date")
            self.assertIn("| --- |", body, f"{s.key}: no table")
            # Every fixture row is one its section knows: none falls through to "Other rows".
            self.assertNotIn("Other rows", body, f"{s.key}: a known row was not recognised")
            for png in EXPECTED_PLOTS[s.key]:
                self.assertIn(f"(img/{png})", body, f"{s.key}: {png} not shown")
                data = (out / "img" / png).read_bytes()
                self.assertTrue(data.startswith(PNG_MAGIC) and len(data) > 10_000, f"{png} is not a plot")
        # The summary table has a line per goal; only the unmeasured sections say "not measured".
        summary = text.split("\n## ")[0]
        self.assertEqual(summary.count("not measured"), len(self.unmeasured))
        self.assertGreaterEqual(summary.count("\n| "), len(self.report.SECTIONS) + 1)
        # Short cells: each summary line names the machine and day and ends with the verdict.
        cpu_short = "AMD EPYC"
        for line in [x for x in summary.splitlines() if x.startswith("| ") and "---" not in x][1:]:
            cells = [c.strip() for c in line.strip("|").split("|")]
            self.assertEqual(len(cells), 5, line)
            self.assertIn(cells[-1], ("met", "not met", "–"), line)
            self.assertTrue(all(len(c) <= 80 for c in cells), f"a long summary cell: {line}")
            if cells[2] != "not measured":
                self.assertRegex(cells[3], re.escape(cpu_short) + r", \d{4}-\d\d-\d\d", line)
        # The fixtures' CPU model reaches the report.
        cpu = json.loads((self.fixtures / "adam.json").read_text())["context"]["cpu_model"]
        self.assertIn(cpu, sections[self.report.SECTIONS[2].title])
        # The update table shows each path's busy share of the call, as the fixture has it.
        update = next(s for s in self.report.SECTIONS if s.key == "update")
        rows = json.loads((self.fixtures / "update.json").read_text())["benchmarks"]
        full = next(r for r in rows if r["name"].startswith("update_phase/+second_path"))
        self.assertIn("| disk busy | shm busy |", sections[update.title])
        # The update plot shows this run only; the paper's figures are in the comparison table.
        self.assertIn("MLP-Offload", sections[update.title])
        self.assertIn("1.68-2.34x", sections[update.title])
        self.assertIn("lazy fp16 widening", fold_out(sections[update.title]))
        busy = f"| {100 * full['disk_busy']:.0f}% | {100 * full['shm_busy']:.0f}% |"
        self.assertIn(busy, sections[update.title])
        # The disk beside the Adam kernel: a line per thread count with its ratio to the idle disk.
        contended = [r for r in rows if r["name"].startswith("disk_under_adam/threads:")]
        self.assertEqual(len(contended), 2)
        self.assertIn("**The disk while the Adam step runs**", sections[update.title])
        self.assertNotIn("**The disk while the Adam step runs**", fold_out(sections[update.title]))
        for r in contended:
            threads = r["name"].split(":")[1].split("/")[0]
            self.assertIn(f"| {threads} | ", sections[update.title])
            self.assertIn(f" | {r['loaded_vs_idle']:.2f} | ", sections[update.title])

    def test_missing_unknown_and_added_rows(self):
        # Only the tiers' JSON (and a new one): the stash's is missing, among others.
        d = self.copy_fixtures("partial", ["tiers"])
        # A benchmark no section knows.
        shutil.copy(self.fixtures / "virtual_tier.json", d / "newbench.json")
        # A row and a counter the tiers section does not know.
        tiers = json.loads((d / "tiers.json").read_text())
        extra = dict(tiers["benchmarks"][0])
        extra.update(name="write/file_newengine/bs_KiB:1024/qd:8", run_name="write/file_newengine/bs_KiB:1024/qd:8",
                     new_counter_xyz=1.5)
        tiers["benchmarks"].append(extra)
        (d / "tiers.json").write_text(json.dumps(tiers))
        out = self.work / "partial-out"
        rc, err = run_report(self.report, d, out)
        self.assertEqual(rc, 0, err)
        sections = sections_of((out / "benchmarks.md").read_text())
        stash = next(s for s in self.report.SECTIONS if s.key == "stash")
        self.assertIn("**Not measured**", sections[stash.title])
        self.assertIn("scripts/dev bench stash", sections[stash.title])
        self.assertFalse((out / "img" / "bench_stash_memory.png").exists())
        self.assertNotIn("Not measured", sections[self.report.SECTIONS[0].title])
        generic = sections["Benchmark `newbench`"]
        self.assertIn("BM_aggregate", generic)
        self.assertTrue((out / "img" / "bench_newbench.png").exists())
        tiers_text = sections[self.report.SECTIONS[0].title]
        self.assertIn("Other rows", tiers_text)
        self.assertIn("new_counter_xyz", tiers_text)

    def test_huge_page_rows_get_their_table_and_headline(self):
        d = self.copy_fixtures("huge", ["tiers"])
        tiers = json.loads((d / "tiers.json").read_text())
        base = next(b for b in tiers["benchmarks"] if b["name"].startswith("write/file_io_uring/bs_KiB:1024/qd:"))
        for qd, ratio in ((8, 0.5), (32, 3.25)):
            row = dict(base)
            name = f"write/file_io_uring_huge_pages/bs_KiB:1024/qd:{qd}/iterations:6/real_time"
            row.update(name=name, run_name=name, vs_limit=ratio, buf_run_KiB=2048.0,
                       fio_base_pages_bytes_per_second=0.4e9)
            tiers["benchmarks"].append(row)
        (d / "tiers.json").write_text(json.dumps(tiers))
        out = self.work / "huge-out"
        rc, err = run_report(self.report, d, out)
        self.assertEqual(rc, 0, err)
        text = (out / "benchmarks.md").read_text()
        tiers_text = sections_of(text)[self.report.SECTIONS[0].title]
        self.assertIn("**Huge-page buffers**", tiers_text)
        self.assertIn("| write | 1 MiB | 32 |", tiers_text)
        self.assertIn("fio GB/s (base pages)", tiers_text)
        self.assertIn("| 0.40 |", tiers_text)  # fio from base pages, in GB/s
        self.assertNotIn("file_io_uring_huge_pages", tiers_text)  # not among the unknown rows
        line = next(x for x in text.splitlines() if "huge-page buffers on both sides" in x)
        self.assertIn("1 of 2 cells, min 0.50", line)
        self.assertIn("| write | 1 MiB | 32 |", fold_out(tiers_text))  # a goal cell of the short table
        self.assertIn("**0.50**", fold_out(tiers_text))  # below the goal: bold
        self.assertTrue(line.rstrip().endswith("not met |"), line)

    def test_malformed_json_names_file_and_keeps_old_report(self):
        d = self.copy_fixtures("broken", [p.stem for p in self.fixtures.glob("*.json")])
        (d / "adam.json").write_text('{"context": {}, "benchmarks": [')
        out = self.work / "broken-out"
        out.mkdir()
        (out / "benchmarks.md").write_text("previous report\n")
        rc, err = run_report(self.report, d, out)
        self.assertNotEqual(rc, 0)
        self.assertIn(str(d / "adam.json"), err)
        self.assertEqual((out / "benchmarks.md").read_text(), "previous report\n")
        self.assertFalse((out / "img").exists() and any((out / "img").iterdir()))

    def test_unreadable_values_name_file_and_keep_going_goes_on(self):
        d = self.copy_fixtures("badvalue", [p.stem for p in self.fixtures.glob("*.json")])
        adam = json.loads((d / "adam.json").read_text())
        adam["benchmarks"][0]["repetitions"] = "five"  # valid JSON, not a count
        (d / "adam.json").write_text(json.dumps(adam))
        rc, err = run_report(self.report, d, self.work / "badvalue-out")
        self.assertNotEqual(rc, 0)
        self.assertIn(str(d / "adam.json"), err)
        self.assertNotIn("Traceback", err)
        self.assertFalse((self.work / "badvalue-out" / "benchmarks.md").exists())
        out = self.work / "badvalue-keep-out"
        rc, err = run_report(self.report, d, out, "--keep-going")
        self.assertEqual(rc, 1)
        self.assertIn("adam", err)
        sections = sections_of((out / "benchmarks.md").read_text())
        adam_text = sections[next(s.title for s in self.report.SECTIONS if s.key == "adam")]
        self.assertIn("**This section could not be generated**", adam_text)
        self.assertIn(str(d / "adam.json"), adam_text)
        self.assertIn("| --- |", sections[self.report.SECTIONS[0].title])  # the others are there

    def test_nan_repetitions_are_left_out(self):
        # The tiers' JSON with NaN counters (Google Benchmark writes a counter divided by zero
        # as NaN): one row's vs_limit NaN everywhere, repetitions and aggregates; another row
        # with a third repetition whose vs_limit is NaN and bytes_per_second inf, and no
        # aggregates, so that its median and cv come from the repetitions.
        d = self.copy_fixtures("nan", [p.stem for p in self.fixtures.glob("*.json")])
        tiers = json.loads((d / "tiers.json").read_text())
        runs = {}
        for b in tiers["benchmarks"]:
            if b.get("run_type") == "iteration" and "vs_limit" in b:
                runs.setdefault(b.get("run_name", b["name"]), []).append(b)
        multi = [name for name, entries in runs.items() if len(entries) >= 2]
        self.assertGreaterEqual(len(multi), 2, "the tiers fixture needs two rows with repetitions")
        name_all, name_one = multi[0], multi[1]
        for b in tiers["benchmarks"]:
            if b.get("run_name", b["name"]) == name_all:
                b["vs_limit"] = float("nan")
        finite = [b["vs_limit"] for b in runs[name_one]]
        extra = dict(runs[name_one][0], repetition_index=len(finite), vs_limit=float("nan"),
                     bytes_per_second=float("inf"))
        tiers["benchmarks"] = [b for b in tiers["benchmarks"]
                               if not (b.get("run_name", b["name"]) == name_one and b.get("run_type") == "aggregate")]
        tiers["benchmarks"].append(extra)
        (d / "tiers.json").write_text(json.dumps(tiers))
        self.assertIn("NaN", (d / "tiers.json").read_text())
        rep = self.report.load_bench(d / "tiers.json")
        by = {r.name: r for r in rep.rows}
        self.assertIsNone(by[name_all].get("vs_limit"))
        self.assertNotIn("vs_limit", by[name_all].cv)
        self.assertAlmostEqual(by[name_one].get("vs_limit"), statistics.median(finite))
        self.assertAlmostEqual(by[name_one].cv["vs_limit"], statistics.stdev(finite) / statistics.fmean(finite))
        self.assertTrue(math.isfinite(by[name_one].get("bytes_per_second")))
        out = self.work / "nan-out"
        rc, err = run_report(self.report, d, out)
        self.assertEqual(rc, 0, err)
        tiers_text = sections_of((out / "benchmarks.md").read_text())[self.report.SECTIONS[0].title]
        self.assertNotRegex(tiers_text, r"\b(nan|inf)\b")
        self.assertRegex(tiers_text, r"\| – \|")  # the row without a finite vs_limit

    def update_variant(self, name: str, keep) -> Path:
        """The fixtures with update.json's update_phase rows other than `keep` (names) turned
        into skipped rows, as SPILLWAY_UPDATE_PHASE_ROWS leaves them; without the baseline, the
        rows have no speedup (it is over the baseline)."""
        d = self.copy_fixtures(name, [p.stem for p in self.fixtures.glob("*.json")])
        doc = json.loads((d / "update.json").read_text())
        for b in doc["benchmarks"]:
            m = re.match(r"update_phase/([^/]+)/", b["name"])
            if not m:
                continue
            if m.group(1) not in keep:
                for k in [k for k in b if k not in ("name", "run_name", "run_type", "repetitions",
                                                      "repetition_index", "threads", "iterations", "real_time",
                                                      "cpu_time", "time_unit", "family_index",
                                                      "per_family_instance_index")]:
                    del b[k]
                b.update(error_occurred=True, error_message="not selected (SPILLWAY_UPDATE_PHASE_ROWS)")
            elif "baseline" not in keep:
                b.pop("speedup", None)
                b.pop("speedup_with_handover", None)
        (d / "update.json").write_text(json.dumps(doc))
        return d

    def update_section(self, d: Path, out: Path) -> tuple[str, str]:
        """The update section's text and its summary line."""
        rc, err = run_report(self.report, d, out)
        self.assertEqual(rc, 0, err)
        text = (out / "benchmarks.md").read_text()
        update = next(s for s in self.report.SECTIONS if s.key == "update")
        head = next(x for x in text.split("\n## ")[0].splitlines() if x.startswith("| Update phase, full"))
        return sections_of(text)[update.title], head

    def test_update_comparison_without_baseline(self):
        doc = json.loads((self.fixtures / "update.json").read_text())
        rows = {r["name"].split("/")[1]: r for r in doc["benchmarks"] if r["name"].startswith("update_phase/")}
        d = self.update_variant("nobaseline", {"+lazy_widening", "+alternating_resident", "+second_path",
                                               "+node_lock_2proc", "baseline_read_ahead"})
        body, head = self.update_section(d, self.work / "nobaseline-out")
        # The baseline's figures are "–", not those of the first row left (lazy widening).
        self.assertIn("| baseline update time waiting for reads | 97% (52B: 202 of 209 s) | – |", body)
        self.assertIn("| – in the baseline, ", body)
        self.assertIn("| – baseline, ", body)
        lazy = rows["+lazy_widening"]
        self.assertNotIn(f"| {fmt_pct(lazy['read_wait_s'] / lazy['update_s'])} |", body)
        # The full row is still found by its name.
        full = rows["+node_lock_2proc"]
        self.assertIn(f"at {full['vs_limit']:.2f} of the floor", head)
        self.assertIn("| – at ", head)  # no speedup without the baseline, and no other row's
        self.assertIn("update_phase/baseline/", body)  # among the skipped rows
        self.assertTrue((self.work / "nobaseline-out" / "img" / "bench_update_phase.png").exists())

    def test_update_comparison_only_reference(self):
        d = self.update_variant("onlyref", {"baseline_read_ahead"})
        body, head = self.update_section(d, self.work / "onlyref-out")
        self.assertNotIn("MLP-Offload (published)", body)
        self.assertIn("No row of the ablation was measured", body)
        self.assertIn("reference: baseline reading ahead through the whole budget", body)  # its row
        self.assertIn("not measured", head)

    def test_update_comparison_without_full_row(self):
        d = self.update_variant("nofull", {"baseline", "+lazy_widening", "+alternating_resident", "+second_path",
                                           "baseline_read_ahead"})
        body, head = self.update_section(d, self.work / "nofull-out")
        self.assertIn("| update speedup, full configuration | ", body)
        self.assertIn("| –; best row ", body)  # no other row's speedup as the full row's
        self.assertIn(" s in the baseline, – in the full row |", body)
        self.assertIn("not measured", head)

    def test_repetitions_reduce_to_medians(self):
        d = self.work / "medians"
        d.mkdir()
        rows = [{"name": "r", "run_name": "r", "run_type": "iteration", "repetitions": 3, "repetition_index": i,
                 "real_time": t, "time_unit": "ms", "vs_limit": v} for i, (t, v) in enumerate([(1, 0.5), (3, 1.0),
                                                                                               (2, 0.9)])]
        rows.append({"name": "a_median", "run_name": "a", "run_type": "aggregate", "aggregate_name": "median",
                     "repetitions": 5, "real_time": 7.0, "time_unit": "s", "vs_limit": 0.8})
        rows.append({"name": "a_cv", "run_name": "a", "run_type": "aggregate", "aggregate_name": "cv",
                     "aggregate_unit": "percentage", "repetitions": 5, "real_time": 0.1, "time_unit": "s",
                     "vs_limit": 0.25})
        rows.append({"name": "e", "run_name": "e", "error_occurred": True, "error_message": "no fio"})
        (d / "x.json").write_text(json.dumps({"context": {}, "benchmarks": rows}))
        rep = self.report.load_bench(d / "x.json")
        by = {r.name: r for r in rep.rows}
        self.assertEqual(by["r"].get("vs_limit"), 0.9)
        self.assertAlmostEqual(by["r"].seconds(), 2e-3)
        self.assertAlmostEqual(by["r"].cv["vs_limit"], 0.3307, places=4)  # stdev 0.2646 / mean 0.8
        self.assertEqual(by["a"].get("vs_limit"), 0.8)
        self.assertEqual(by["a"].cv["vs_limit"], 0.25)
        self.assertEqual(by["a"].seconds(), 7.0)
        self.assertEqual(by["e"].error, "no fio")


    def cuda_report(self, name: str, doc: dict) -> tuple[str, list[list[str]]]:
        """The CUDA section of a report made from `doc` alone, and its summary lines' cells."""
        d = self.work / name
        d.mkdir()
        (d / "cuda.json").write_text(json.dumps(doc))
        out = self.work / f"{name}-out"
        rc, err = run_report(self.report, d, out)
        self.assertEqual(rc, 0, err)
        text = (out / "benchmarks.md").read_text()
        cuda = next(s for s in self.report.SECTIONS if s.key == "cuda")
        summary = [[c.strip() for c in x.strip().strip("|").split("|")] for x in text.split("\n## ")[0].splitlines()
                   if x.startswith("| CUDA")]
        return sections_of(text)[cuda.title], summary

    def test_cuda_section(self):
        body, summary = self.cuda_report("cuda", synthetic_cuda())
        self.assertNotIn("Not measured", body)
        self.assertIn("Latest run: ", body)
        self.assertIn("**GPU**: NVIDIA H100 80GB HBM3 (79.1 GiB", body)
        self.assertIn("`nvidia-smi`: NVIDIA H100 80GB HBM3, 81559 MiB", body)
        self.assertIn("| host → device, pinned | 53.1 | PCIe Gen5 x16 link | 63.0 | 0.84 |", body)
        self.assertIn("| staged disk → device, 2 slots of 16 MiB | 2.29 | disk hop alone", body)
        self.assertIn("| 0.88 | 2% | not met (≥ 0.9) |", body)
        self.assertIn("| sized to the stash: 183 | 1.25 |", body)
        self.assertIn("| 1152 → 320 (72% lower) |", body)
        self.assertIn("– (copies not covered)", body)  # the rows whose copies the compute cannot hide
        self.assertIn("(img/bench_cuda.png)", body)
        png = (self.work / "cuda-out" / "img" / "bench_cuda.png").read_bytes()
        self.assertTrue(png.startswith(PNG_MAGIC) and len(png) > 10_000)
        self.assertIn("<details><summary>All rows", body)
        self.assertLessEqual(visible_lines(body), 60)
        for internal in ("device_stash_overhead", "pinned_h2d", "staged_disk_to_device", "device_adam"):
            self.assertNotIn(internal, fold_out(body))
        self.assertNotRegex(fold_out(body), r"\b(nan|inf)\b")
        self.assertEqual(len(summary), 4)
        for cells in summary:
            self.assertEqual(len(cells), 5, cells)
            self.assertTrue(all(len(c) <= 80 for c in cells), cells)
            self.assertEqual(cells[3], "NVIDIA H100 80GB HBM3, 2026-12-06")
        by = {cells[0]: cells for cells in summary}
        self.assertEqual(by["CUDA: pinned copies against the PCIe link"][2], "H2D 0.84, D2H 0.82 of Gen5 x16")
        self.assertEqual(by["CUDA: pinned copies against the PCIe link"][4], "–")
        self.assertEqual(by["CUDA: staged disk-to-device against its slower hop"][4], "not met")
        self.assertEqual(by["CUDA: device AdamW against a device copy"][4], "met")
        stash = by["CUDA: device stash against keep-all, compute covering copies"]
        self.assertEqual(stash[2], "3.4% at a 72% lower peak, 183 passes (sized to the stash)")
        self.assertEqual(stash[4], "met")

    def test_cuda_section_without_link_with_failures_and_without_gpu(self):
        body, summary = self.cuda_report("cuda-nolink", synthetic_cuda(no_link=True, failed_stash=True))
        self.assertIn("| host → device, pinned | 53.1 | PCIe limit unknown: sysfs shows no PCIe link", body)
        self.assertIn("Skipped rows: `device_stash_overhead/passes:0/", body)
        by = {cells[0]: cells for cells in summary}
        self.assertEqual(by["CUDA: pinned copies against the PCIe link"][2], "no ratio: sysfs shows no usable link")
        stash = by["CUDA: device stash against keep-all, compute covering copies"]
        self.assertTrue(stash[2].startswith("failed: the stash's backward"), stash)
        self.assertEqual(stash[4], "not met")
        # No row whose compute covers the copies: no verdict, and the best covers named.
        _, summary = self.cuda_report("cuda-uncovered", synthetic_cuda(covers_scale=0.5))
        stash = next(c for c in summary if c[0].startswith("CUDA: device stash"))
        self.assertEqual(stash[2], "no row's compute covered the copies (best 0.70)")
        self.assertEqual(stash[4], "–")
        # No GPU: every row skipped, one summary line saying so.
        doc = synthetic_cuda()
        for b in doc["benchmarks"]:
            b.update(error_occurred=True, error_message="no usable CUDA device")
        doc["context"] = {"date": "2026-12-06T10:15:00+00:00", "cpu_model": "AMD EPYC 7B13",
                          "gpu": "no usable CUDA device (cudaErrorNoDevice)"}
        body, summary = self.cuda_report("cuda-nogpu", doc)
        self.assertIn("Every row was skipped (no usable CUDA device)", body)
        self.assertEqual(len(summary), 1)
        self.assertEqual(summary[0][2], "skipped (no GPU)")

def synthetic_cuda(no_link: bool = False, failed_stash: bool = False, covers_scale: float = 1.0) -> dict:
    """A cuda.json as bench_cuda writes it with --benchmark_repetitions=3
    --benchmark_report_aggregates_only=true on an H100 (made-up figures)."""
    def rows(run: str, ms: float, counters: dict, label: str = "", error: str = "") -> list[dict]:
        out = []
        for agg in ("mean", "median", "stddev", "cv"):
            e = {"name": f"{run}_{agg}", "run_name": run, "run_type": "aggregate", "repetitions": 3, "threads": 1,
                 "aggregate_name": agg, "time_unit": "ms", "family_index": 0, "per_family_instance_index": 0}
            if error:
                e.update(error_occurred=True, error_message=error)
                out.append(e)
                continue
            k = {"mean": 1.0, "median": 1.0, "stddev": 0.02, "cv": 0.02}[agg]
            e.update(real_time=ms * k, cpu_time=ms * k, **{c: (0.02 if agg == "cv" else v * k)
                                                            for c, v in counters.items()})
            if label:
                e["label"] = label
            out.append(e)
        return out

    gb, mib = 1e9, float(1 << 20)
    link = {} if no_link else {"link_GBps": 63.0, "pcie_gen": 5, "pcie_width": 16}
    label = ("PCIe limit unknown: sysfs shows no PCIe link for 0000:00:05.0 (a VM may hide it)" if no_link
             else "PCIe Gen5 x16 (32.0 GT/s): 63.0 GB/s")
    out = []
    for run, rate in (("pinned_h2d/manual_time", 53.1), ("pinned_d2h/manual_time", 51.5)):
        out += rows(run, 10.0, {"bytes_per_second": rate * gb, "GBps": rate, **link,
                                **({} if no_link else {"vs_limit": rate / 63.0})}, label)
    out += rows("pageable_h2d/manual_time", 28.0, {"bytes_per_second": 19.2 * gb, "vs_limit": 0.36})
    for slots, chunk, v in ((2, 4, 0.93), (3, 4, 0.96), (2, 16, 0.88)):
        out += rows(f"staged_disk_to_device/slots:{slots}/chunk_MiB:{chunk}/manual_time", 420.0,
                    {"bytes_per_second": 2.4 * gb, "disk_GBps": 2.6, "pcie_GBps": 52.0, "staged_GBps": 2.6 * v,
                     "vs_limit": v})
    out += rows("device_adam/manual_time", 1.1, {"bytes_per_second": 2900 * gb, "items_per_second": 1.2e11,
                                                  "vs_limit": 0.86})
    for passes, covers, overhead in ((16, 0.09, 5.9), (64, 0.35, 1.4), (256, 1.4, 0.021), (0, 1.25, 0.034)):
        run = f"device_stash_overhead/passes:{passes}/iterations:3/manual_time"
        if failed_stash and passes == 0:
            out += rows(run, 0, {}, error="the stash's backward computed another gradient than keep-all's")
            continue
        actual = passes or 183
        keep = 16 * actual * 0.12e-3
        out += rows(run, keep * (1 + overhead) * 1e3, {
            "passes": actual, "layers": 16, "stashed_layers": 13, "buffers": 3, "MiB": 64, "keep_all_s": keep,
            "stash_s": keep * (1 + overhead), "overhead": overhead, "vs_limit": 1 / (1 + overhead),
            "peak_bytes_keep_all": 18 * 64 * mib, "peak_bytes_stash": 5 * 64 * mib, "peak_reduction": 1 - 5 / 18,
            "device_bytes_keep_all": 18 * 64 * mib, "device_bytes_stash": 5 * 64 * mib, "stash_out_GBps": 9.6,
            "stash_in_GBps": 8.7, "covers": covers * covers_scale, "bytes_per_second": 8.5 * gb},
            f"sized to the stash: {actual} passes" if passes == 0 else "")
    context = {"date": "2026-12-06T10:15:00+00:00", "num_cpus": 16, "cpu_model": "Intel(R) Xeon(R) Platinum 8480+",
               "cuda_driver": "13.0", "cuda_runtime": "13.0", "gpu_model": "NVIDIA H100 80GB HBM3",
               "gpu_memory_GiB": "79.1", "gpu_compute_capability": "9.0",
               "gpu_pcie": "0000:19:00.0: max PCIe Gen5 x16 (32.0 GT/s), 63.0 GB/s per direction",
               "nvidia_smi": "NVIDIA H100 80GB HBM3, 81559 MiB, 580.65.06, 5, 16"}
    return {"context": context, "benchmarks": out}


def fold_out(body: str) -> str:
    """A section's text without its folded parts (what a reader sees without opening them)."""
    return re.sub(r"<details>.*?</details>\n", "", body, flags=re.S)


def visible_lines(body: str) -> int:
    return len(fold_out(body).splitlines())


def fmt_pct(share: float) -> str:
    return f"{100 * share:.0f}%"


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--consistent", type=Path, help="check 7 on this report, and nothing else")
    ap.add_argument("--script")
    ap.add_argument("--fixtures")
    ap.add_argument("--work")
    ARGS, rest = ap.parse_known_args()
    if ARGS.consistent:
        problems = inconsistencies(ARGS.consistent.read_text())
        for p in problems:
            print(f"{ARGS.consistent}: {p}")
        print(f"{ARGS.consistent}: summary and sections {'disagree' if problems else 'agree'}")
        sys.exit(1 if problems else 0)
    if not (ARGS.script and ARGS.fixtures and ARGS.work):
        ap.error("--script, --fixtures and --work are required (or --consistent FILE)")
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
