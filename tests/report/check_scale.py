#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""report.scale: scripts/bench_scale.py's logic, without the trainer.

Usage: check_scale.py --script scripts/bench_scale.py [--work DIR] [--report scripts/bench_report.py]
(or `scripts/bench_scale.py --self-test`).

Checks:
1. The arithmetic: sizes, GPT-2's parameter counts and embedding bytes, the path's time for a
   step's bytes, the bound max(compute, I/O), the ratio, the 25% growth rule apart from the
   embeddings (exactly at the goal and just past it), the bit-identity of losses (one float32
   ulp apart is a difference), and the status of an exit (SIGKILL with an OOM event in the
   group is "killed by the cap", without one it is not).
2. The trainer's JSON is read through the one table of names: the default names, other
   names nested under "summary", bytes listed per path (summed), or per step as today's
   mini_gpt prints them (VmHWM and the parameter and m|v streams' bytes in each step's object).
3. In a real memory cgroup (skipped, saying why, where this process cannot create one): the
   benchmark against tests/report/fake_trainer.py, a trainer that allocates what it is told.
   A `none` row over the cap is reported killed by the cap, and the model's compute time then
   comes from a run without the cap; a row under the cap reports its peak (the trainer's
   VmHWM and the group's peak, both at least what it allocated and under the cap); the
   bound, the ratio, the goals and the flags the trainer receives are as computed by hand;
   a loss one ulp off fails bit-identity naming the step. The demonstration estimates its
   compute time from the reference model's by the parameter ratio and prints each step's loss.
4. Without a usable cgroup the benchmark says so and exits 3.
5. Where /usr/bin/python3 has matplotlib: scripts/bench_report.py renders the run's JSON as
   its "scale" section with the table and the goals' verdicts.
"""

import argparse
import contextlib
import importlib.util
import io
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

ARGS = None
HERE = Path(__file__).resolve().parent
MiB = 1 << 20


def load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def next_float32(x: float) -> float:
    """The float32 after x, as a Python float (one ulp up)."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    return struct.unpack("<f", struct.pack("<I", bits + 1))[0]


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def print9(x: float) -> float:
    """What mini_gpt's %.9g prints for the float32 x, read back."""
    return float(f"{x:.9g}")


class Arithmetic(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = load("bench_scale", ARGS.script)

    def test_sizes(self):
        s = self.s
        self.assertEqual(s.parse_size("4G"), 4 << 30)
        self.assertEqual(s.parse_size("3.5GiB"), 7 << 29)
        self.assertEqual(s.parse_size("512M"), 512 * MiB)
        self.assertEqual(s.parse_size("1048576"), MiB)
        self.assertRaises(ValueError, s.parse_size, "four gigs")
        self.assertEqual(s.format_size_flag(7 << 29), "3.5G")
        self.assertEqual(s.format_size_flag(96 * MiB), "96M")
        self.assertEqual(s.format_size_flag(4 << 30), "4G")
        # 1234.125 MiB: every decimal kept (the trainer refuses a fraction of a byte).
        self.assertEqual(s.format_size_flag(1234 * MiB + MiB // 8), "1234.125M")

    def test_gpt2_shapes(self):
        s = self.s
        self.assertEqual(s.model_shape("gpt2")["params"], 124_475_904)  # llm.c's count for 124M
        self.assertEqual(s.model_shape("gpt2-xl")["params"], 1_557_686_400)
        # (Vp*C + maxT*C) * 4 B * 4 arrays
        self.assertEqual(s.embedding_bytes(s.model_shape("gpt2")), (50304 * 768 + 1024 * 768) * 16)
        self.assertEqual(s.embedding_bytes(s.model_shape("gpt2-large")), (50304 * 1280 + 1024 * 1280) * 16)
        # What the trainer reports wins over the table.
        shape = s.model_shape("gpt2", {"padded_vocab_size": 256, "channels": 64, "max_seq_len": 64})
        self.assertEqual(s.embedding_bytes(shape), (256 * 64 + 64 * 64) * 16)

    def test_bound_and_ratio(self):
        s = self.s
        io_s = s.io_seconds(1e9, 0.5e9, 0.5e9, 0.25e9)  # 2 s reading + 2 s writing
        self.assertAlmostEqual(io_s, 4.0)
        self.assertAlmostEqual(s.bound_seconds(2.0, io_s), 4.0)  # I/O-bound
        self.assertAlmostEqual(s.bound_seconds(5.0, io_s), 5.0)  # compute-bound
        self.assertAlmostEqual(s.ratio(4.5, 4.0), 1.125)
        self.assertIsNone(s.io_seconds(1e9, 0, None, 1e9))  # bytes without a bandwidth: unknown
        self.assertEqual(s.io_seconds(0, 0, None, None), 0.0)  # no bytes: no time
        self.assertAlmostEqual(s.bound_seconds(2.0, None), 2.0)
        self.assertIsNone(s.bound_seconds(None, 4.0))
        self.assertIsNone(s.ratio(1.0, None))

    def rows(self, small_peak, large_peak, **kw):
        s = self.s
        base = dict(status="ok", losses=[1.0, 0.5], ratio=1.0, mode="params")
        small = dict(base, model="gpt2", label="GPT-2 124M", params=124_475_904, peak_rss_bytes=small_peak,
                     embedding_bytes=s.embedding_bytes(s.model_shape("gpt2")))
        large = dict(base, model="gpt2-large", label="GPT-2 774M", params=774_090_240, peak_rss_bytes=large_peak,
                     embedding_bytes=s.embedding_bytes(s.model_shape("gpt2-large")))
        small.update(kw.get("small", {}))
        large.update(kw.get("large", {}))
        return [small, large]

    def goals(self, rows, cap=4 << 30, refs=None):
        refs = refs or {"gpt2": [1.0, 0.5], "gpt2-large": [1.0, 0.5]}
        goals = self.s.evaluate_goals(rows, cap, "params", refs)
        self.assertEqual(len(goals), 4)
        # By a word of each goal's text: under (the cap), growth, bound, identical.
        return {key: next(g for g in goals if word in g["what"]) for key, word in
                (("under", "under the cap"), ("growth", "growth"), ("step", "over the bound"),
                 ("losses", "bit-identical"))}

    def test_growth_rule(self):
        s = self.s
        es, el = (s.embedding_bytes(s.model_shape(m)) for m in ("gpt2", "gpt2-large"))
        small = 2 << 30
        at_goal = int((small - es) * 1.25) + el
        self.assertAlmostEqual(s.growth_excluding_embeddings(small, es, at_goal, el), 0.25, places=9)
        g = self.goals(self.rows(small, at_goal))
        self.assertTrue(g["growth"]["met"], g["growth"])
        self.assertIn("+25.0%", g["growth"]["measured"])
        g = self.goals(self.rows(small, at_goal + MiB))
        self.assertFalse(g["growth"]["met"])
        # The embeddings are what may grow: the same peak apart from them is +0%.
        self.assertAlmostEqual(s.growth_excluding_embeddings(small, es, small - es + el, el), 0.0)
        self.assertIsNone(s.growth_excluding_embeddings(es, es, 3 << 30, el))  # nothing left to compare
        # A row killed by the cap measures no growth and fails "under the cap".
        g = self.goals(self.rows(small, at_goal, large={"status": "killed by the cap"}))
        self.assertIsNone(g["growth"]["met"])
        self.assertFalse(g["under"]["met"])
        # Over the cap at one size: not met.
        g = self.goals(self.rows(small, 5 << 30))
        self.assertFalse(g["under"]["met"])
        self.assertTrue(self.goals(self.rows(small, at_goal))["under"]["met"])

    def test_ratio_goal(self):
        g = self.goals(self.rows(1 << 30, 1 << 30, small={"ratio": 1.25}, large={"ratio": 1.0}))
        self.assertTrue(g["step"]["met"])
        g = self.goals(self.rows(1 << 30, 1 << 30, small={"ratio": 1.26}))
        self.assertFalse(g["step"]["met"])
        g = self.goals(self.rows(1 << 30, 1 << 30, small={"ratio": None}))
        self.assertIsNone(g["step"]["met"])

    def test_bit_identity(self):
        s = self.s
        losses = [print9(f32(x)) for x in (10.987654321, 10.5, 10.1234567)]
        self.assertEqual(s.loss_identity(losses, list(losses))[0], True)
        off = list(losses)
        off[1] = print9(next_float32(f32(10.5)))
        self.assertNotEqual(off[1], losses[1])  # one ulp survives %.9g
        same, why = s.loss_identity(off, losses)
        self.assertFalse(same)
        self.assertIn("step 2", why)  # the second step; steps count from 1
        self.assertFalse(s.loss_identity(losses[:2], losses)[0])
        self.assertIsNone(s.loss_identity([], losses)[0])
        g = self.goals(self.rows(1 << 30, 1 << 30, large={"losses": off}),
                       refs={"gpt2": [1.0, 0.5], "gpt2-large": losses})
        self.assertFalse(g["losses"]["met"])
        self.assertIn("GPT-2 774M step 2", g["losses"]["measured"])
        g = self.goals(self.rows(1 << 30, 1 << 30))
        self.assertTrue(g["losses"]["met"])

    def test_exit_status(self):
        s = self.s
        k = -signal.SIGKILL
        self.assertEqual(s.classify_exit(k, {"oom_kills": 1})[0], "killed by the cap")
        self.assertEqual(s.classify_exit(k, {"oom_kills": 0, "limit_hits": 3})[0], "killed")
        self.assertEqual(s.classify_exit(k, {"oom_kills": None, "limit_hits": 3})[0], "killed by the cap")
        self.assertEqual(s.classify_exit(0, {"oom_kills": 0})[0], "ok")
        self.assertEqual(s.classify_exit(2, {})[0], "refused")
        self.assertEqual(s.classify_exit(1, {})[0], "failed")
        self.assertEqual(s.classify_exit(-signal.SIGSEGV, {})[1], "signal SIGSEGV")
        self.assertEqual(s.classify_exit(k, {"oom_kills": 1}, timed_out=True)[0], "timed out")

    def test_trainer_output(self):
        s = self.s
        lines = ['{"step":0,"loss":10.5,"ms":900.0}', 'a line of text', '{"step":1,"loss":10.25,"ms":1000.5}',
                 '{"step":2,"loss":10.0,"ms":1100.0}',
                 '{"summary":true,"peak_rss_bytes":123,"path_read_bytes_per_step":7,"path_write_bytes_per_step":5}']
        steps, summary, other = s.parse_trainer_output(lines)
        self.assertEqual([x["step"] for x in steps], [0, 1, 2])
        self.assertEqual(other, ["a line of text"])
        self.assertEqual(s.step_losses(steps), [10.5, 10.25, 10.0])
        self.assertEqual(s.timed_ms(steps, 1), [1000.5, 1100.0])
        self.assertEqual(s.first(summary, s.SUMMARY_FIELDS["peak_rss"]), 123)
        t = s.path_traffic(summary, steps, 1)
        self.assertEqual((t["read_bytes"], t["write_bytes"]), (7, 5))
        # Other names, nested, bytes per path.
        _, summary, _ = s.parse_trainer_output(['{"type":"summary","summary":{"vm_hwm_bytes":9,'
                                                '"paths":[{"dir":"/a","read_bytes":3,"write_bytes":1},'
                                                '{"dir":"/b","read_bytes":4,"write_bytes":2}]}}'])
        self.assertEqual(s.first(summary, s.SUMMARY_FIELDS["peak_rss"]), 9)
        t = s.path_traffic(summary, [], 1)
        self.assertEqual((t["read_bytes"], t["write_bytes"]), (7, 3))
        self.assertEqual([p["path"] for p in t["paths"]], ["/a", "/b"])
        # Paths as an object keyed by path.
        t = s.path_traffic({"paths": {"/a": {"read_bytes_per_step": 2, "write_bytes_per_step": 1}}}, [], 1)
        self.assertEqual((t["read_bytes"], t["write_bytes"], t["paths"][0]["path"]), (2, 1, "/a"))
        # Per step only: the median of the timed steps, a total or the sum of the parts.
        steps, summary, _ = s.parse_trainer_output(
            ['{"step":0,"loss":1,"ms":1,"path_read_bytes":100,"path_write_bytes":1}',
             '{"step":1,"loss":1,"ms":1,"path_read_bytes":10,"path_write_bytes":4}',
             '{"step":2,"loss":1,"ms":1,"path_read_bytes":20,"path_write_bytes":6}'])
        t = s.path_traffic(summary, steps, 1)
        self.assertEqual((t["read_bytes"], t["write_bytes"]), (15, 5))
        self.assertIn("per-step", t["source"])
        # Today's mini_gpt --offload params --json: the streams' parts and VmHWM in each step.
        steps, summary, _ = s.parse_trainer_output(
            ['{"step":0,"loss":1,"ms":1,"peak_rss_bytes":50,"memory_budget":99,"param_read_bytes":7,'
             '"param_written_bytes":1,"state_read_bytes":3,"state_written_bytes":2}',
             '{"step":1,"loss":1,"ms":1,"peak_rss_bytes":70,"memory_budget":99,"param_read_bytes":8,'
             '"param_written_bytes":2,"state_read_bytes":4,"state_written_bytes":3}',
             '{"step":2,"loss":1,"ms":1,"peak_rss_bytes":60,"memory_budget":99,"param_read_bytes":10,'
             '"param_written_bytes":2,"state_read_bytes":4,"state_written_bytes":5}'])
        self.assertEqual(summary, {})
        t = s.path_traffic(summary, steps, 1)
        self.assertEqual((t["read_bytes"], t["write_bytes"]), (13, 6))  # medians of 12, 14 and 5, 7
        self.assertEqual(s.trainer_peak_rss(summary, steps), 70)
        self.assertEqual(s.trainer_budget(summary, steps), 99)
        # A summary's parts per step.
        t = s.path_traffic({"param_read_bytes_per_step": 5, "state_read_bytes_per_step": 6,
                            "param_written_bytes_per_step": 1}, [], 1)
        self.assertEqual((t["read_bytes"], t["write_bytes"]), (11, 1))
        self.assertIn("not reported", s.path_traffic({}, [], 1)["source"])


def spec_models():
    """The fake runs: 124M fits the cap with `none`, 774M does not; params fits both."""
    L1 = [print9(f32(x)) for x in (10.98, 10.51, 10.07)]
    L2 = [print9(f32(x)) for x in (11.02, 10.61, 10.12)]
    L2_off = list(L2)
    L2_off[2] = print9(next_float32(f32(10.12)))
    return {
        "gpt2": {
            "none": {"alloc_mib": 40, "losses": L1, "ms": [900, 1000, 1200]},
            "params": {"alloc_mib": 64, "losses": L1, "ms": [1500, 1600, 1800],
                       "read_bytes": 10**9, "write_bytes": 5 * 10**8, "fields": "per_step"},
        },
        "gpt2-large": {
            "none": {"alloc_mib": 400, "losses": L2, "ms": [3000, 3000, 3000]},
            "params": {"alloc_mib": 72, "losses": L2_off, "ms": [5000, 4000, 4000],
                       "read_bytes": 2e9, "write_bytes": 1e9, "fields": "alt"},
        },
        "gpt2-xl": {"params": {"alloc_mib": 48, "losses": [11.5, 11.25, 11.0, 10.75, 10.5],
                               "ms": [9000, 8000, 8000, 8000, 8000], "read_bytes": 4e9, "write_bytes": 2e9}},
    }


class RealCgroup(unittest.TestCase):
    """The benchmark end to end in a real memory cgroup, the trainer faked."""

    CAP = 160 * MiB
    BUDGET = 96 * MiB

    @classmethod
    def setUpClass(cls):
        cls.s = load("bench_scale", ARGS.script)
        try:
            cls.host = cls.s.CgroupHost.detect()
        except cls.s.CgroupUnavailable as e:
            raise unittest.SkipTest(f"no memory cgroup to create groups in ({e}): the cgroup part was not run")
        # The group's own test: can a child group be created and capped here?
        try:
            cls.s.Cgroup(cls.host, cls.CAP).remove()
        except OSError as e:
            raise unittest.SkipTest(f"cannot create a capped group under {cls.host.parent} ({e})")
        cls.temporary = not ARGS.work
        cls.work = Path(ARGS.work or tempfile.mkdtemp(prefix="check_scale."))
        shutil.rmtree(cls.work, ignore_errors=True)
        cls.work.mkdir(parents=True)
        cls.argv_log = cls.work / "argv.jsonl"
        spec = {"argv_log": str(cls.argv_log), "models": spec_models()}
        (cls.work / "spec.json").write_text(json.dumps(spec))
        os.environ["SPILLWAY_FAKE_TRAINER_SPEC"] = str(cls.work / "spec.json")
        cls.trainer = f"{sys.executable} {HERE / 'fake_trainer.py'}"
        cls.out = cls.work / "bench" / "scale.json"
        cls.rc, cls.stdout, cls.stderr = cls.main(
            "--sizes", "gpt2,gpt2-large", "--cap", "160M", "--budget", "96M", "--out", str(cls.out))
        cls.doc = json.loads(cls.out.read_text()) if cls.out.exists() else None
        cls.bench_argv = [json.loads(x) for x in cls.argv_log.read_text().splitlines()]
        # The demonstration, its compute time estimated from the run above's 774M.
        cls.demo_out = cls.out.parent / "scale_demo.json"
        cls.demo_rc, cls.demo_stdout, cls.demo_stderr = cls.main(
            "--demo", "--cap", "160M", "--budget", "96M", "--out", str(cls.demo_out), "--reference-json", str(cls.out))

    @classmethod
    def tearDownClass(cls):
        if cls.temporary:
            shutil.rmtree(cls.work, ignore_errors=True)

    @classmethod
    def main(cls, *args):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cls.s.main(["--trainer", cls.trainer, "--steps", "3", "--path", str(cls.work / "path"),
                             "--path-bandwidth", "1,0.5", "--timeout", "120", *args])
        return rc, out.getvalue(), err.getvalue()

    def row(self, model, mode):
        return next(r for r in self.doc["rows"] if r["model"] == model and r["mode"] == mode)

    def test_ran(self):
        self.assertEqual(self.rc, 0, self.stderr)
        self.assertIsNotNone(self.doc)
        self.assertEqual(self.doc["cgroup"]["version"], self.host.version)
        self.assertEqual(len(self.doc["rows"]), 4)
        # Every group it made is gone.
        self.assertEqual(list(self.host.parent.glob(f"spillway-bench-scale-{os.getpid()}-*")), [])

    def test_over_the_cap_is_killed(self):
        r = self.row("gpt2-large", "none")
        self.assertEqual(r["status"], "killed by the cap", r)
        self.assertEqual(r["exit_code"], -signal.SIGKILL)
        self.assertGreaterEqual(r["cgroup_oom_kills"] or 0, 1)
        self.assertIsNone(r["ratio"])
        self.assertIn("killed by the cap", self.stdout)
        # Its compute time then comes from a run without the cap, which allocated its 400 MiB.
        self.assertEqual(r["compute_source"], "`none` without the cap")
        self.assertAlmostEqual(r["compute_s"], 3.0)
        uncapped = [x for x in self.doc["runs"] if x["model"] == "gpt2-large" and not x["capped"]]
        self.assertEqual(len(uncapped), 1)
        self.assertEqual(uncapped[0]["status"], "ok")
        self.assertGreaterEqual(uncapped[0]["cgroup"]["peak_bytes"], 400 * MiB)

    def test_under_the_cap_reports_its_peak(self):
        for model, alloc in (("gpt2", 64), ("gpt2-large", 72)):
            r = self.row(model, "params")
            self.assertEqual(r["status"], "ok", r)
            self.assertGreaterEqual(r["peak_rss_bytes"], alloc * MiB)
            self.assertLess(r["peak_rss_bytes"], self.CAP)
            self.assertGreaterEqual(r["cgroup_peak_bytes"], alloc * MiB)
            self.assertLessEqual(r["cgroup_peak_bytes"], self.CAP)
            self.assertEqual(r["peak_rss_source"], "trainer VmHWM")  # per step (124M) or in the summary
            self.assertEqual(r["cgroup_oom_kills"] or 0, 0)
        none = self.row("gpt2", "none")
        self.assertEqual(none["status"], "ok")
        self.assertGreaterEqual(none["peak_rss_bytes"], 40 * MiB)
        # The capped `none` never reached its limit: it is the compute time's run too.
        self.assertIn("never reached", none["compute_source"])
        self.assertAlmostEqual(none["compute_s"], 1.1)  # median of 1000 and 1200 ms

    def test_bound_and_ratio(self):
        # 124M: compute 1.1 s; I/O 1 GB at 1 GB/s + 0.5 GB at 0.5 GB/s = 2 s; step 1.7 s.
        r = self.row("gpt2", "params")
        self.assertEqual(r["traffic_source"], "per-step objects (median of the timed steps)")
        self.assertEqual((r["read_bytes_per_step"], r["write_bytes_per_step"]), (1e9, 5e8))
        self.assertEqual(r["budget_bytes"], None)  # "96M" as given: not a number of bytes
        self.assertAlmostEqual(r["step_s"], 1.7)
        self.assertAlmostEqual(r["io_s"], 2.0)
        self.assertAlmostEqual(r["bound_s"], 2.0)
        self.assertAlmostEqual(r["ratio"], 0.85)
        # 774M (other field names, two paths): compute 3.0 s; I/O 2 + 2 = 4 s; step 4.0 s.
        r = self.row("gpt2-large", "params")
        self.assertEqual(r["traffic_source"], "summary, summed over its paths")
        self.assertEqual((r["read_bytes_per_step"], r["write_bytes_per_step"]), (2e9, 1e9))
        self.assertAlmostEqual(r["step_s"], 4.0)
        self.assertAlmostEqual(r["bound_s"], 4.0)
        self.assertAlmostEqual(r["ratio"], 1.0)

    def test_goals(self):
        g = {x["what"]: x for x in self.doc["goals"]}
        under = next(v for k, v in g.items() if "under the cap" in k)
        self.assertTrue(under["met"])
        step = next(v for k, v in g.items() if "over the bound" in k)
        self.assertTrue(step["met"])
        ident = next(v for k, v in g.items() if "bit-identical" in k)
        self.assertFalse(ident["met"])  # 774M's last loss is one ulp off
        self.assertIn("GPT-2 774M step 3", ident["measured"])
        self.assertIn("GPT-2 124M identical", ident["measured"])
        growth = next(v for k, v in g.items() if "growth" in k)
        small, large = self.row("gpt2", "params"), self.row("gpt2-large", "params")
        expect = self.s.growth_excluding_embeddings(small["peak_rss_bytes"], small["embedding_bytes"],
                                                    large["peak_rss_bytes"], large["embedding_bytes"])
        self.assertEqual(small["embedding_bytes"], (256 * 64 + 64 * 64) * 16)  # the shape the trainer reported
        self.assertEqual(growth["met"], expect <= 0.25)
        self.assertIn(f"{100 * expect:+.1f}%", growth["measured"])
        for line in ("**met**: `params` peak RSS under the cap", "**not met**: `params` losses bit-identical"):
            self.assertIn(line, self.stdout)

    def test_flags_passed(self):
        runs = self.bench_argv
        self.assertEqual(len(runs), 5)  # 124M none, params; 774M none, none uncapped, params
        params = [r for r in runs if r[r.index("--offload") + 1] == "params"]
        for r in params:
            self.assertEqual(r[r.index("--memory-budget") + 1], "96M")
        for r in runs:
            for flag, value in (("--batch", "4"), ("--seq", "64"), ("--threads", "2"), ("--steps", "3")):
                self.assertEqual(r[r.index(flag) + 1], value)
            self.assertIn("--json", r)
            # Each run has its own folder under --path, removed after it.
            path = Path(r[r.index("--path") + 1])
            self.assertEqual(path.parent, (self.work / "path").resolve())
            self.assertTrue(path.name.startswith(f"{r[r.index('--init') + 1]}-{r[r.index('--offload') + 1]}-"), path)
            self.assertFalse(path.exists())
        self.assertTrue(all("--memory-budget" not in r for r in runs if r[r.index("--offload") + 1] == "none"))

    def test_demo(self):
        rc, stdout, stderr = self.demo_rc, self.demo_stdout, self.demo_stderr
        self.assertEqual(rc, 0, stderr)
        doc = json.loads(self.demo_out.read_text())
        r = doc["rows"][0]
        self.assertEqual((r["model"], r["mode"], r["status"]), ("gpt2-xl", "params", "ok"))
        factor = 1_557_686_400 / 774_090_240
        self.assertAlmostEqual(r["compute_s"], 3.0 * factor)
        self.assertIn("estimate", r["compute_source"])
        self.assertIn("estimate", " ".join(doc["notes"]))
        self.assertAlmostEqual(r["step_s"], 8.0)
        self.assertAlmostEqual(r["bound_s"], max(3.0 * factor, 4 + 4))
        for i, loss in enumerate([11.5, 11.25, 11.0, 10.75, 10.5]):
            self.assertIn(f"step {i + 1}/5: loss {loss:.4f}", stdout)
        self.assertFalse(any("bit-identical" in x["what"] for x in doc["goals"]))

    def test_report_section(self):
        report_script = Path(ARGS.report)
        probe = subprocess.run(["/usr/bin/python3", "-c", "import matplotlib"], capture_output=True) \
            if Path("/usr/bin/python3").exists() else None
        if probe is None or probe.returncode != 0 or not report_script.exists():
            self.skipTest("no /usr/bin/python3 with matplotlib: the report's scale section was not rendered")
        d = self.work / "report"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        p = subprocess.run(["/usr/bin/python3", str(report_script), "--json-dir", str(self.out.parent),
                            "--out", str(d)], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        text = (d / "benchmarks.md").read_text()
        section = text.split("\n## Scale")[1].split("\n## ")[0]
        self.assertNotIn("Not measured", section)
        self.assertIn("killed by the cap", section)
        self.assertIn("| GPT-2 774M |", section)
        self.assertIn("**not met**: `params` losses bit-identical", section)
        self.assertIn("Latest run: ", section)
        self.assertIn("GPT-2 XL", section)  # the demonstration, from scale_demo.json beside it


class NoCgroup(unittest.TestCase):
    def test_says_so_and_exits_3(self):
        s = load("bench_scale", ARGS.script)
        with tempfile.TemporaryDirectory() as empty:
            with self.assertRaises(s.CgroupUnavailable) as e:
                s.CgroupHost.detect(empty)
            self.assertIn("memory controller", str(e.exception))
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                rc = s.main(["--trainer", f"{sys.executable} {HERE / 'fake_trainer.py'}", "--cgroup-root", empty,
                             "--path", str(Path(empty) / "p"), "--out", str(Path(empty) / "o.json"),
                             "--path-bandwidth", "1,1"])
            self.assertEqual(rc, 3)
            self.assertIn("cannot cap memory here", err.getvalue())
            self.assertFalse((Path(empty) / "o.json").exists())


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--script", default=str(HERE.parent.parent / "scripts" / "bench_scale.py"))
    ap.add_argument("--report", default=str(HERE.parent.parent / "scripts" / "bench_report.py"))
    ap.add_argument("--work", default=None, help="scratch folder (default: a new temporary one)")
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
