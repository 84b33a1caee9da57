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
//   need_GBps    = S / t, the bandwidth that hides one layer's I/O behind its compute
//   tier_GBps    = the bandwidth the stash planned with (probe), first_kept = split layer
//   load_wait_ms = time backward waited for reads per step
// Run with --benchmark_repetitions=5 --benchmark_report_aggregates_only=true for medians.
#include <benchmark/benchmark.h>

#include <spillway/stash/activation_stash.hpp>
#include <spillway/tier/file_tier.hpp>
#include <spillway/tier/host_tier.hpp>
#include <spillway/tier/throttled_tier.hpp>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
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
// match what was saved.
template <class Tier>
step_times run_step(activation_stash<Tier>& stash, const schedule& s, int step) {
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
    }
    auto t1 = clock_type::now();
    stash.start_backward();
    bool ok = true;
    for (int l = s.layers - 1; l >= 0; --l) {
        auto bytes = stash.load(handles[static_cast<std::size_t>(l)]);
        deadline = std::max(deadline, clock_type::now()) + 2 * per_forward;  // a wait delays the rest
        ok = ok && bytes[0] == pattern(l, step) && bytes[bytes.size() - 1] == pattern(l, step) &&
             bytes[bytes.size() / 2] == pattern(l, step);
        compute_until(deadline);
        stash.release(handles[static_cast<std::size_t>(l)]);
    }
    auto t2 = clock_type::now();
    return {std::chrono::duration<double>(t1 - t0).count(), std::chrono::duration<double>(t2 - t1).count(), ok};
}

template <class Tier>
void run(benchmark::State& state, Tier& tier, const schedule& s, split_mode mode) {
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
    state.counters["tier_GBps"] = plan.tier_bandwidth / 1e9;
    state.counters["first_kept"] = plan.first_kept_layer > static_cast<std::size_t>(s.layers)
                                       ? static_cast<double>(s.layers)
                                       : static_cast<double>(plan.first_kept_layer);
    state.counters["load_wait_ms"] = (after.load_wait_seconds - before.load_wait_seconds) * 1e3 / steps;
    state.counters["offloaded_MiB"] =
        static_cast<double>(after.bytes_offloaded - before.bytes_offloaded) / MiB / steps;
    state.counters["forwarded_MiB"] =
        static_cast<double>(after.bytes_forwarded - before.bytes_forwarded) / MiB / steps;
    state.counters["write_skips"] = static_cast<double>(after.write_skips - before.write_skips) / steps;
    state.SetBytesProcessed(static_cast<std::int64_t>(after.bytes_offloaded - before.bytes_offloaded));
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
    auto cfg = throttle_config::separate(limit, limit);
    if (file) {
        auto dir = bench::scratch_dir() / "stash";
        std::filesystem::remove_all(dir);
        std::filesystem::create_directories(dir);
        file_tier_options fopts;
        fopts.name = "file";
        throttled_tier<file_tier<>> tier(cfg, std::in_place, dir, std::move(fopts));
        run(state, tier, s, mode);
    } else {
        throttled_tier<host_tier> tier(cfg, std::in_place);
        run(state, tier, s, mode);
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

BENCHMARK_MAIN();
