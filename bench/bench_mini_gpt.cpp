// bench/bench_mini_gpt.cpp: training step time of examples/mini_gpt, --offload none vs all,
// on the demo config and on GPT-2 124M (B=4, T=64), against limits measured in this run.
//
// Rows:
//  - sgemm_limit: a large fp32 matrix product (M=N=K=2048) through the trainer's own matmul
//    path (our thread pool over OpenBLAS slices): the FLOP/s ceiling of this machine for the
//    model's arithmetic. Counter flops_per_s.
//  - step/<config>/<offload>: one training run; the row's time is the median step time over
//    the steps after the first (the first step allocates and, with the stash, profiles).
//    Counters: model_flops_per_s, vs_limit (model FLOP/s over the sgemm row's), act_peak_bytes
//    and act_peak_vs_all_kept (median peak after the first step over keeping every layer),
//    update_ms and io_wait_ms (medians), and for 124M speedup_vs_llmc: llm.c's CPU trainer
//    (train_gpt2.c) takes about 2.9 s per step for this config with 2 threads on the
//    development machine, so this is 2.9 s over our median step time. The sgemm limit is
//    measured again around every run (sgemm_flops_per_s, the better of before and after) and
//    vs_limit uses it; cpu_ms_per_step is the process CPU time per step (all threads) and
//    speedup_vs_llmc_cpu compares llm.c's 2.9 s with cpu_ms_per_step / threads, the step time
//    an idle machine would give with perfectly busy threads (the shared machine's load does
//    not inflate it).
// The `all` rows use --act-split offload (every layer's activations go to the tier).
// SPILLWAY_BENCH_SMOKE=1 runs only the demo config, briefly.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <thread>
#include <vector>

#include "support/bench_env.hpp"

#if __has_include("trainer.hpp")
#include <cblas.h>

#include "gpt2.hpp"
#include "trainer.hpp"

namespace {

double sgemm_flops_per_s = 0;  // set by the limit row, read by the step rows

int bench_threads() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

/// Seconds of `reps` M=N=K=n products through the trainer's matmul path (median).
double time_sgemm(int n, int reps) {
    openblas_set_num_threads(1);
    spillway::detail::thread_pool pool(static_cast<std::size_t>(bench_threads() - 1));
    std::vector<float> a(static_cast<std::size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size());
    std::vector<double> secs;
    for (int r = 0; r < reps; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        mini_gpt::matmul_forward(pool, c.data(), a.data(), b.data(), nullptr, n, n, n);
        secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        benchmark::DoNotOptimize(c.data());
    }
    return median(secs);
}

int sgemm_n() { return spillway::bench::smoke() ? 256 : 2048; }

void sgemm_limit(benchmark::State& state) {
    const int n = sgemm_n();
    for (auto _ : state) {
        double s = time_sgemm(n, 3);
        state.SetIterationTime(s);
        sgemm_flops_per_s = 2.0 * n * n * static_cast<double>(n) / s;
    }
    state.counters["flops_per_s"] = sgemm_flops_per_s;
}

void train_step(benchmark::State& state, bool gpt2_124m, mini_gpt::offload_mode mode) {
    mini_gpt::options o;
    o.threads = bench_threads();
    o.quiet = true;
    o.offload = mode;
    o.paths = {spillway::bench::scratch_dir() / "mini_gpt"};
    // Offload every layer's activations: the row measures the memory the stash saves and what
    // its I/O costs (the adaptive rule's choice depends on the bandwidth it measures on a
    // shared machine).
    o.act_split = 1 << 30;
    if (gpt2_124m) {
        o.layers = 12;
        o.channels = 768;
        o.heads = 12;
        o.vocab = 50257;  // padded to 50304 as llm.c does
        o.max_seq = 1024;
        o.batch = 4;
        o.seq = 64;
        o.steps = 4;
        o.subgroup = std::size_t{1} << 22;  // 4 Mi params (48 MiB of state) per subgroup
        o.buffers = 8;
    } else {
        o.steps = spillway::bench::smoke() ? 2 : 12;
    }
    mini_gpt::run_report rep;
    for (auto _ : state) {
        std::ostringstream sink;
        rep = {};
        // The limit again, right before the run: the machines are shared, so a ratio is
        // only meaningful against a limit measured under the same load.
        const int n = sgemm_n();
        double limit = 2.0 * n * n * static_cast<double>(n) / time_sgemm(n, 3);
        mini_gpt::train(o, sink, &rep);
        limit = std::max(limit, 2.0 * n * n * static_cast<double>(n) / time_sgemm(n, 3));
        auto tail = [](const std::vector<double>& v) { return std::vector<double>(v.begin() + 1, v.end()); };
        double step_s = median(tail(rep.step_ms)) / 1e3;
        state.SetIterationTime(step_s);
        double flops = rep.flops_per_step / step_s;
        state.counters["ms_per_step"] = step_s * 1e3;
        state.counters["model_flops_per_s"] = flops;
        state.counters["sgemm_flops_per_s"] = limit;
        state.counters["vs_limit"] = flops / limit;
        // CPU seconds per step over the threads: the step time an idle machine would give if
        // the threads were perfectly busy (a lower bound; the shared machine's load hides it).
        double cpu_s = median(tail(rep.cpu_ms)) / 1e3;
        state.counters["cpu_ms_per_step"] = cpu_s * 1e3;
        state.counters["cpu_per_thread_ms"] = cpu_s * 1e3 / o.threads;
        if (gpt2_124m) state.counters["speedup_vs_llmc_cpu"] = 2.9 / (cpu_s / o.threads);
        state.counters["update_ms"] = median(tail(rep.update_ms));
        state.counters["io_wait_ms"] = median(tail(rep.io_wait_ms));
        std::vector<double> peaks(rep.act_peak_bytes.begin() + 1, rep.act_peak_bytes.end());
        state.counters["act_peak_bytes"] = median(peaks);
        state.counters["act_peak_vs_all_kept"] = median(peaks) / static_cast<double>(rep.all_kept_bytes);
        state.counters["tokens_per_s"] = o.batch * o.seq / step_s;
        if (gpt2_124m) state.counters["speedup_vs_llmc"] = 2.9 / step_s;
    }
}

void register_all() {
    benchmark::RegisterBenchmark("sgemm_limit", sgemm_limit)->UseManualTime()->Iterations(spillway::bench::smoke() ? 2 : 5)->Unit(benchmark::kMillisecond);
    using mini_gpt::offload_mode;
    struct row {
        const char* name;
        bool big;
        offload_mode mode;
    };
    std::vector<row> rows = {{"step/demo/none", false, offload_mode::none}, {"step/demo/all", false, offload_mode::all}};
    if (!spillway::bench::smoke()) {
        rows.push_back({"step/gpt2_124m/none", true, offload_mode::none});
        rows.push_back({"step/gpt2_124m/all", true, offload_mode::all});
    }
    for (const auto& r : rows) {
        benchmark::RegisterBenchmark(r.name, [r](benchmark::State& s) { train_step(s, r.big, r.mode); })
            ->UseManualTime()
            ->Iterations(1)
            ->Unit(benchmark::kMillisecond);
    }
}

}  // namespace

int main(int argc, char** argv) {
    register_all();
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}

#else  // examples/mini_gpt was not configured (no OpenBLAS): say so instead of measuring.

static void mini_gpt_unavailable(benchmark::State& state) {
    for (auto _ : state) state.SkipWithError("examples/mini_gpt is not built (OpenBLAS not found)");
}
BENCHMARK(mini_gpt_unavailable);
BENCHMARK_MAIN();

#endif
