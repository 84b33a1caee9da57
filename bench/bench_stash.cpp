// SPDX-License-Identifier: Apache-2.0
// bench_stash: the activation stash on a synthetic forward/backward schedule, against keeping
// every activation in memory, in the same run.
//
// Schedule (one step): for each of L layers, forward "computes" for t ms (fills a fresh
// activation buffer of S bytes from the stash's allocate(), then sleeps to the layer's
// deadline: compute is on an accelerator, the CPU is free) and saves the buffer (handed
// over, no copy); backward walks the layers in reverse, loads the layer's activation,
// checks it, "computes" for 2t ms and releases it. Arguments:
//   layers, MiB per layer, ms per forward layer, tier bandwidth in MB/s (throttled, 0 = the
//   raw tier), tier (0 host, 1 file), split (0 adaptive with a profiling step, 1 offload all).
//
// Each iteration runs one step with split_mode::keep_all (the limit: every activation
// resident, no I/O) and one step with the stash under test, back to back in alternating
// order, so noise hits both.
// Counters:
//   overhead     = stash wall time / keep-all wall time - 1   (goal <= 0.05, or <= 0.10 when
//                  the bandwidth cannot hide the I/O and the adaptive split keeps layers)
//   vs_limit     = keep-all wall time / stash wall time; fwd_/bwd_overhead split by phase
//   peak_ratio   = stash peak resident bytes / keep-all peak resident bytes (goal <= 0.55)
//   need_GBps    = S / t, the bandwidth that hides one layer's I/O behind its compute;
//                  rate_GBps = the throttle's rate in each direction (0: not throttled)
//   tier_GBps    = the bandwidth the stash planned with (probe), first_kept = split layer
//                  (= layers when none is kept)
//   load_wait_ms = time backward waited for reads per step
// Run with --benchmark_repetitions=5 --benchmark_report_aggregates_only=true for medians.
//
// Side file stash_series.json (beside --benchmark_out's file, else in the current directory):
// after the timed steps of each row, one more keep-all step and one more stash step are
// recorded, sampling the stash's resident bytes (and the pooled part of them) after every
// save, load and release and every tenth of a forward layer's time: the memory over one
// training step that peak_ratio summarises. A row
// run several times (repetitions) keeps its last recording. Shape:
//   {"machine": str, "date": str, "runs": [{"label", "tier", "MBps", "split", "layers",
//     "MiB", "forward_ms", "need_GBps", "keep_all": {"backward_start_ms", "t_ms": [...],
//     "resident_bytes": [...], "pooled_bytes": [...]}, "stash": {same}}]}
#include <benchmark/benchmark.h>

#include <nlohmann/json.hpp>

#include <spillway/stash/activation_stash.hpp>
#include <spillway/tier/file_tier.hpp>
#include <spillway/tier/host_tier.hpp>
#include <spillway/tier/throttled_tier.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "support/bench_env.hpp"

namespace {

using namespace spillway;
using clock_type = std::chrono::steady_clock;
constexpr std::size_t MiB = std::size_t{1} << 20;

struct schedule {
    int layers = 16;
    std::size_t bytes = 4 * MiB;
    double forward_ms = 6;
};

std::byte pattern(int layer, int step) { return static_cast<std::byte>(layer * 31 + step * 7 + 1); }

// "Compute" until `deadline`: the accelerator works, the CPU thread waits.
void compute_until(clock_type::time_point deadline) { std::this_thread::sleep_until(deadline); }

struct step_times {
    double forward = 0, backward = 0;
    bool ok = true;
    [[nodiscard]] double total() const { return forward + backward; }
};

// One forward + backward step: its wall times; ok is false when a loaded activation did not
// match what was saved. `on_change` (if any) runs after every save, load and release.
template <class Tier>
step_times run_step(activation_stash<Tier>& stash, const schedule& s, int step,
                    const std::function<void()>& on_change = {}) {
    auto t0 = clock_type::now();
    auto deadline = t0;
    auto per_forward = std::chrono::duration_cast<clock_type::duration>(
        std::chrono::duration<double, std::milli>(s.forward_ms));
    std::vector<stash_handle> handles;
    handles.reserve(static_cast<std::size_t>(s.layers));
    for (int l = 0; l < s.layers; ++l) {
        deadline += per_forward;
        stash.begin_layer(static_cast<std::uint32_t>(l));
        aligned_buffer act = stash.allocate(s.bytes);
        std::memset(act.data(), static_cast<int>(pattern(l, step)), s.bytes);  // the layer writes its output
        compute_until(deadline);
        tensor_desc d;
        d.name = "act" + std::to_string(l);
        d.storage_id = static_cast<std::uint64_t>(l + 1);
        d.version = static_cast<std::uint64_t>(step);
        d.type = dtype::u8;
        d.shape = {static_cast<std::int64_t>(s.bytes)};
        handles.push_back(stash.save(d, std::move(act)));
        stash.end_layer();
        if (on_change) on_change();
    }
    auto t1 = clock_type::now();
    stash.start_backward();
    bool ok = true;
    for (int l = s.layers - 1; l >= 0; --l) {
        auto bytes = stash.load(handles[static_cast<std::size_t>(l)]);
        if (on_change) on_change();
        deadline = std::max(deadline, clock_type::now()) + 2 * per_forward;  // a wait delays the rest
        ok = ok && bytes[0] == pattern(l, step) && bytes[bytes.size() - 1] == pattern(l, step) &&
             bytes[bytes.size() / 2] == pattern(l, step);
        compute_until(deadline);
        stash.release(handles[static_cast<std::size_t>(l)]);
        if (on_change) on_change();
    }
    auto t2 = clock_type::now();
    return {std::chrono::duration<double>(t1 - t0).count(), std::chrono::duration<double>(t2 - t1).count(), ok};
}

// ---- The memory over one step (side file) ---------------------------------------------------

/// The stash's resident bytes sampled over one step.
struct step_series {
    double backward_start_ms = 0;
    std::vector<double> t_ms;
    std::vector<std::size_t> resident_bytes, pooled_bytes;
};

/// What a row is, for the side file (the same for every repetition of the row).
struct row_config {
    std::string tier;  // "host" or "file"
    double mbps = 0;   // the throttle's rate each way, MB/s (0: none)
    std::string split;  // "adaptive" or "offload_all"
    [[nodiscard]] std::string label() const {
        return tier + ", " + std::to_string(static_cast<long>(mbps)) + " MB/s, " + split;
    }
};

struct row_series {
    row_config row;
    schedule shape;
    step_series keep_all, stash;
};

std::map<std::string, row_series>& recorded_series() {
    static std::map<std::string, row_series> rows;  // by label; a later repetition replaces
    return rows;
}

/// Runs one step, sampling stats().resident_bytes after every save, load and release and,
/// from a second thread, every tenth of a forward layer (writes and reads complete on the
/// stash's own threads).
template <class Tier>
step_series record_step(activation_stash<Tier>& stash, const schedule& s, int step, bool& ok) {
    step_series out;
    const auto period = std::chrono::duration<double, std::milli>(s.forward_ms / 10);
    const auto t0 = clock_type::now();
    std::mutex samples;
    auto take_sample = [&] {
        std::lock_guard lock(samples);
        auto st = stash.stats();
        out.t_ms.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t0).count());
        out.resident_bytes.push_back(st.resident_bytes);
        out.pooled_bytes.push_back(st.pooled_bytes);
    };
    std::atomic<bool> done{false};
    std::thread sampler([&] {
        while (!done.load(std::memory_order_relaxed)) {
            take_sample();
            std::this_thread::sleep_for(period);
        }
    });
    step_times t = run_step(stash, s, step, take_sample);
    done = true;
    sampler.join();
    take_sample();
    out.backward_start_ms = t.forward * 1e3;
    ok = t.ok;
    return out;
}

nlohmann::json to_json(const step_series& s) {
    return {{"backward_start_ms", s.backward_start_ms},
            {"t_ms", s.t_ms},
            {"resident_bytes", s.resident_bytes},
            {"pooled_bytes", s.pooled_bytes}};
}

/// Writes every recorded row to `path`; a failure is reported, not fatal (the JSON report
/// is already written).
void write_series(const std::filesystem::path& path) {
    if (recorded_series().empty()) return;
    nlohmann::json runs = nlohmann::json::array();
    for (const auto& [label, r] : recorded_series()) {
        runs.push_back({{"label", label},
                        {"tier", r.row.tier},
                        {"MBps", r.row.mbps},
                        {"split", r.row.split},
                        {"layers", r.shape.layers},
                        {"MiB", static_cast<double>(r.shape.bytes) / MiB},
                        {"forward_ms", r.shape.forward_ms},
                        {"need_GBps", static_cast<double>(r.shape.bytes) / (r.shape.forward_ms * 1e-3) / 1e9},
                        {"keep_all", to_json(r.keep_all)},
                        {"stash", to_json(r.stash)}});
    }
    nlohmann::json doc = {{"machine", bench::machine_description()}, {"date", bench::utc_now()}, {"runs", runs}};
    std::ofstream out(path);
    out << doc.dump() << "\n";
    if (!out) std::fprintf(stderr, "bench_stash: could not write the memory series to %s\n", path.c_str());
}

// ---- The benchmark ---------------------------------------------------------------------------

template <class Tier>
void run(benchmark::State& state, Tier& tier, const schedule& s, split_mode mode, const row_config& row) {
    stash_options keep;
    keep.split = split_mode::keep_all;
    keep.pool_limit = std::numeric_limits<std::size_t>::max();  // the baseline never allocates twice
    activation_stash<Tier> baseline(tier, keep);

    stash_options opts;
    opts.split = mode;
    opts.keep_below_bytes = 0;
    opts.pool_limit = s.bytes;
    opts.prefetch_layers = 2;
    opts.probe_bytes = bench::smoke() ? s.bytes : std::max<std::size_t>(s.bytes, 4 * MiB);
    activation_stash<Tier> stash(tier, opts);

    int step = 0;
    // Warm-up: fills the baseline's pool; profiling step of the adaptive split.
    if (!run_step(baseline, s, step).ok || !run_step(stash, s, step).ok) {
        state.SkipWithError("a loaded activation did not match what was saved");
        return;
    }
    ++step;
    baseline.reset_peak();
    stash.reset_peak();
    auto before = stash.stats();
    step_times keep_sum, stash_sum;
    for (auto _ : state) {
        step_times a, b;
        if (step % 2 == 0) {  // alternate the order: neither run always follows the other
            a = run_step(baseline, s, step);
            b = run_step(stash, s, step);
        } else {
            b = run_step(stash, s, step);
            a = run_step(baseline, s, step);
        }
        if (!a.ok || !b.ok) {
            state.SkipWithError("a loaded activation did not match what was saved");
            return;
        }
        keep_sum.forward += a.forward;
        keep_sum.backward += a.backward;
        stash_sum.forward += b.forward;
        stash_sum.backward += b.backward;
        state.SetIterationTime(b.total());
        ++step;
    }
    const double t_keep = keep_sum.total(), t_stash = stash_sum.total();
    auto after = stash.stats();
    auto base = baseline.stats();
    auto plan = stash.plan();
    double steps = static_cast<double>(state.iterations());
    state.counters["overhead"] = t_stash / t_keep - 1.0;
    state.counters["vs_limit"] = t_keep / t_stash;
    state.counters["fwd_overhead"] = stash_sum.forward / keep_sum.forward - 1.0;
    state.counters["bwd_overhead"] = stash_sum.backward / keep_sum.backward - 1.0;
    state.counters["keep_all_ms"] = t_keep * 1e3 / static_cast<double>(state.iterations());
    state.counters["peak_ratio"] = static_cast<double>(after.peak_resident_bytes) /
                                   static_cast<double>(base.peak_resident_bytes);
    state.counters["peak_MiB"] = static_cast<double>(after.peak_resident_bytes) / MiB;
    state.counters["keep_all_peak_MiB"] = static_cast<double>(base.peak_resident_bytes) / MiB;
    state.counters["need_GBps"] = static_cast<double>(s.bytes) / (s.forward_ms * 1e-3) / 1e9;
    state.counters["rate_GBps"] = row.mbps / 1e3;
    state.counters["tier_GBps"] = plan.tier_bandwidth / 1e9;
    state.counters["layers"] = s.layers;
    state.counters["first_kept"] = plan.first_kept_layer > static_cast<std::size_t>(s.layers)
                                       ? static_cast<double>(s.layers)
                                       : static_cast<double>(plan.first_kept_layer);
    const auto moved = after.since(before);
    state.counters["load_wait_ms"] = moved.load_wait_seconds * 1e3 / steps;
    state.counters["offloaded_MiB"] = static_cast<double>(moved.bytes_offloaded) / MiB / steps;
    state.counters["forwarded_MiB"] = static_cast<double>(moved.bytes_forwarded) / MiB / steps;
    state.counters["write_skips"] = static_cast<double>(moved.write_skips) / steps;
    state.SetBytesProcessed(static_cast<std::int64_t>(moved.bytes_offloaded));

    // One more step of each, untimed, sampled for the side file.
    row_series rec{row, s, {}, {}};
    bool keep_ok = true, stash_ok = true;
    rec.keep_all = record_step(baseline, s, step, keep_ok);
    rec.stash = record_step(stash, s, step, stash_ok);
    if (!keep_ok || !stash_ok) {
        state.SkipWithError("a loaded activation did not match what was saved (recorded step)");
        return;
    }
    recorded_series()[row.label()] = std::move(rec);
}

void BM_stash(benchmark::State& state) {
    schedule s;
    s.layers = static_cast<int>(state.range(0));
    s.bytes = static_cast<std::size_t>(state.range(1)) * MiB;
    s.forward_ms = static_cast<double>(state.range(2));
    if (bench::smoke()) {
        s.layers = 4;
        s.bytes = MiB;
        s.forward_ms = 2;
    }
    const double rate = static_cast<double>(state.range(3)) * 1e6;
    const bool file = state.range(4) == 1;
    const split_mode mode = state.range(5) == 0 ? split_mode::adaptive : split_mode::offload_all;
    bandwidth_limit limit;
    if (rate > 0) limit.bytes_per_second = bench::smoke() ? rate / 4 : rate;
    const row_config row{file ? "file" : "host", limit.unlimited() ? 0.0 : limit.bytes_per_second / 1e6,
                         mode == split_mode::adaptive ? "adaptive" : "offload_all"};
    auto cfg = throttle_config::separate(limit, limit);
    if (file) {
        auto dir = bench::scratch_dir() / "stash";
        std::filesystem::remove_all(dir);
        std::filesystem::create_directories(dir);
        file_tier_options fopts;
        fopts.name = "file";
        throttled_tier<file_tier<>> tier(cfg, std::in_place, dir, std::move(fopts));
        run(state, tier, s, mode, row);
    } else {
        throttled_tier<host_tier> tier(cfg, std::in_place);
        run(state, tier, s, mode, row);
    }
}

void args(benchmark::internal::Benchmark* b) {
    b->ArgNames({"layers", "MiB", "ms", "MBps", "file", "offload_all"});
    // 16 layers of 4 MiB, 10 ms each: hiding one layer's I/O needs about 0.42 GB/s.
    for (int file : {0, 1}) {
        b->Args({16, 4, 10, 1600, file, 0});  // 4x the need: everything can be offloaded
        b->Args({16, 4, 10, 210, file, 0});   // half the need: the adaptive split keeps the tail
        b->Args({16, 4, 10, 105, file, 0});   // a quarter of the need
        b->Args({16, 4, 10, 105, file, 1});   // a quarter, offloading everything anyway
    }
    b->UseManualTime()->Unit(benchmark::kMillisecond);
    b->Iterations(bench::smoke() ? 1 : 5);
    if (!bench::smoke()) b->Repetitions(3);
}

BENCHMARK(BM_stash)->Apply(args);

}  // namespace

int main(int argc, char** argv) {
    const auto series_path = bench::side_file(argc, argv, "stash_series.json");
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    write_series(series_path);
    return 0;
}
