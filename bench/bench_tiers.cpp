// bench_tiers: read and write throughput of the file tier (io_uring and POSIX engines) and
// the host tier, over block sizes and queue depths, each row against its limit measured in
// the same run.
//
// File tier rows: one blob of S bytes is written (or read) per operation; the tier's engine
// splits it into `bs` pieces with up to `qd` in flight, with O_DIRECT. The limit is fio on
// the same file system with the same pattern: bs, iodepth=qd, direct=1, ioengine=io_uring,
// size=S, sequential (JSON output, bw_bytes); `vs_limit` = our bytes/s / fio's bytes/s, both
// measured in the same call. fio runs on the tier's own blob file (same file system, same
// blocks), before our loop on every other call and after it on the others. Each tier row
// warms up with two writes so that its timed writes recycle a spare file
// (file_tier_options::spare_files): the steady state of a tier whose blobs are rewritten,
// and, like fio's, overwrites of written blocks. Host tier rows: blobs of `bs` bytes; the limit is a
// memcpy of the same size between resident buffers.
//
// Flags (besides Google Benchmark's): --full sweeps bs 128 KiB..64 MiB (powers of two) and
// qd 1..64 (powers of two); the default is a subset. SPILLWAY_BENCH_SMOKE=1: tiny sizes.
// Run with --benchmark_repetitions=5 --benchmark_report_aggregates_only=true for medians.
#include <benchmark/benchmark.h>

#include <spillway/io/aligned_buffer.hpp>
#include <spillway/tier/file_tier.hpp>
#include <spillway/tier/host_tier.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "support/bench_env.hpp"
#include "support/fio.hpp"

namespace {

using namespace spillway;
namespace fs = std::filesystem;

constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;

enum class tier_kind { uring, posix, host };
enum class direction { read, write };

const char* kind_name(tier_kind k) {
    switch (k) {
        case tier_kind::uring: return "file_io_uring";
        case tier_kind::posix: return "file_posix";
        case tier_kind::host: return "host";
    }
    return "?";
}

/// fio's bandwidth (bytes/s) for the same pattern, or a negative value when fio failed.
/// fio reads or overwrites `file` itself (the tier's own blob: same file system, same
/// blocks), with the tier's pattern.
double fio_limit(direction dir, const fs::path& file, std::size_t bs, unsigned qd, std::size_t size,
                 unsigned loops) {
    auto r = bench::run_fio("--name=limit --filename=" + file.string() + " --rw=" +
                            (dir == direction::read ? "read" : "write") + " --bs=" + std::to_string(bs) +
                            " --iodepth=" + std::to_string(qd) + " --direct=1 --ioengine=io_uring --size=" +
                            std::to_string(size) + " --loops=" + std::to_string(loops));
    if (!r.ok()) return -1;
    return dir == direction::read ? r.read_bytes_per_second : r.write_bytes_per_second;
}

void fill_random(std::span<std::byte> bytes) {
    std::mt19937_64 rng(42);
    for (std::size_t i = 0; i + 8 <= bytes.size(); i += 8) {
        std::uint64_t w = rng();
        std::memcpy(bytes.data() + i, &w, 8);
    }
}

/// The blob size of a file tier row: enough pieces to keep qd in flight, within 128..512 MiB.
std::size_t file_blob_size(std::size_t bs, unsigned qd) {
    if (bench::smoke()) return std::max(bs, 4 * MiB);
    std::size_t s = std::clamp<std::size_t>(bs * qd * 4, 128 * MiB, 512 * MiB);
    return (s + bs - 1) / bs * bs;
}

template <class Engine>
void file_row(benchmark::State& state, direction dir, std::size_t bs, unsigned qd) {
    const std::size_t size = file_blob_size(bs, qd);
    auto dir_path = bench::scratch_dir() / "tiers";
    fs::create_directories(dir_path);
    file_tier_options opt;
    opt.engine.block_size = bs;
    opt.engine.queue_depth = qd;
    std::unique_ptr<file_tier<Engine>> tier;
    try {
        tier = std::make_unique<file_tier<Engine>>(dir_path, opt);
    } catch (const std::exception& e) {
        state.SkipWithError(e.what());
        return;
    }
    aligned_buffer buf(size, memory_lock::unlocked, 4096, buffer_fill::uninitialized);
    fill_random(buf.bytes());
    const std::string key = "blob";
    // Warm-up: the first write creates the file, the second replaces it and leaves a spare,
    // so timed writes are steady-state rewrites (as in an optimizer's flush) and reads find
    // the blob.
    tier->write(key, buf.bytes()).wait();
    if (dir == direction::write) tier->write(key, buf.bytes()).wait();

    // The limit: fio on the tier's own file with the same pattern, measured in the same call,
    // before ours on every other call and after it on the others (so that drift in a busy
    // machine's load does not favour one side).
    static unsigned calls = 0;
    const bool fio_first = (++calls % 2) == 0;
    const auto file = tier->path_of(key);
    const auto loops = static_cast<unsigned>(state.max_iterations);
    double fio = fio_first ? fio_limit(dir, file, bs, qd, size, loops) : 0;

    auto t0 = std::chrono::steady_clock::now();
    for (auto _ : state) {
        if (dir == direction::read) tier->read(key, buf.bytes()).wait();
        else tier->write(key, buf.bytes()).wait();
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double bytes = static_cast<double>(size) * static_cast<double>(state.iterations());
    state.SetBytesProcessed(static_cast<std::int64_t>(bytes));
    std::string label = tier->direct_io() ? "O_DIRECT" : "buffered (" + tier->direct_io_note() + ")";
    if (!fio_first) fio = fio_limit(dir, file, bs, qd, size, loops);
    tier->erase(key);
    tier.reset();

    state.counters["blob_MiB"] = static_cast<double>(size) / MiB;
    if (fio > 0) {
        state.counters["fio_bytes_per_second"] = fio;
        state.counters["vs_limit"] = bytes / secs / fio;
    } else {
        label += bench::fio_available() ? "; fio failed: no vs_limit" : "; fio not installed: no vs_limit";
    }
    state.SetLabel(label);
}

void host_row(benchmark::State& state, direction dir, std::size_t bs) {
    host_tier tier;
    std::vector<std::byte> src(bs), dst(bs);
    fill_random(src);
    std::memset(dst.data(), 1, dst.size());
    const std::string key = "blob";
    tier.write(key, src).wait();
    auto t0 = std::chrono::steady_clock::now();
    for (auto _ : state) {
        if (dir == direction::read) tier.read(key, dst).wait();
        else tier.write(key, src).wait();
        benchmark::ClobberMemory();
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double bytes = static_cast<double>(bs) * static_cast<double>(state.iterations());
    state.SetBytesProcessed(static_cast<std::int64_t>(bytes));

    // The limit: memcpy of the same size between resident buffers, as often.
    auto t1 = std::chrono::steady_clock::now();
    for (std::int64_t i = 0; i < state.iterations(); ++i) {
        std::memcpy(dst.data(), src.data(), bs);
        benchmark::ClobberMemory();
    }
    const double limit_secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    const double limit = bytes / limit_secs;
    state.counters["memcpy_bytes_per_second"] = limit;
    state.counters["vs_limit"] = bytes / secs / limit;
}

std::string row_name(direction dir, tier_kind kind, std::size_t bs, unsigned qd) {
    std::string n = std::string(dir == direction::read ? "read" : "write") + "/" + kind_name(kind) +
                    "/bs_KiB:" + std::to_string(bs / KiB);
    if (kind != tier_kind::host) n += "/qd:" + std::to_string(qd);
    return n;
}

void register_rows(bool full) {
    std::vector<std::size_t> sizes;
    std::vector<unsigned> depths;
    if (bench::smoke()) {
        sizes = {1 * MiB};
        depths = {8};
    } else if (full) {
        for (std::size_t b = 128 * KiB; b <= 64 * MiB; b *= 2) sizes.push_back(b);
        depths = {1, 2, 4, 8, 16, 32, 64};
    } else {
        sizes = {128 * KiB, 1 * MiB, 8 * MiB, 64 * MiB};
        depths = {1, 8, 32};
    }
    std::vector<tier_kind> kinds;
#if SPILLWAY_HAS_LIBURING
    if (uring_probe().available) kinds.push_back(tier_kind::uring);
    else std::printf("io_uring unavailable (%s): io_uring rows left out\n", uring_probe().reason.c_str());
#else
    std::printf("built without liburing: io_uring rows left out\n");
#endif
    kinds.push_back(tier_kind::posix);
    const std::int64_t total = bench::smoke() ? 4 * MiB : 512 * MiB;
    for (direction dir : {direction::write, direction::read}) {
        for (tier_kind kind : kinds)
            for (std::size_t bs : sizes)
                for (unsigned qd : depths) {
                    const auto size = static_cast<std::int64_t>(file_blob_size(bs, qd));
                    auto* b = benchmark::RegisterBenchmark(
                        row_name(dir, kind, bs, qd).c_str(), [=](benchmark::State& st) {
#if SPILLWAY_HAS_LIBURING
                            if (kind == tier_kind::uring) return file_row<uring_engine>(st, dir, bs, qd);
#endif
                            file_row<posix_engine>(st, dir, bs, qd);
                        });
                    b->Iterations(std::max<std::int64_t>(1, total / size))->UseRealTime()->Unit(benchmark::kMillisecond);
                }
        for (std::size_t bs : sizes) {
            auto* b = benchmark::RegisterBenchmark(row_name(dir, tier_kind::host, bs, 1).c_str(),
                                                   [=](benchmark::State& st) { host_row(st, dir, bs); });
            b->Iterations(std::max<std::int64_t>(4, total / static_cast<std::int64_t>(bs)))
                ->UseRealTime()
                ->Unit(benchmark::kMillisecond);
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    bool full = false;
    int kept = 1;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--full") == 0) full = true;
        else argv[kept++] = argv[i];
    }
    argc = kept;
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    if (!bench::fio_available())
        std::printf("fio is not installed: file tier rows report no vs_limit (apt-get install fio)\n");
    else
        std::printf("limit: fio (ioengine=io_uring, direct=1, same bs/iodepth/size) on the tier's own file in %s\n",
                    (bench::scratch_dir() / "tiers").c_str());
    register_rows(full);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
