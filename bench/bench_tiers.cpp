// SPDX-License-Identifier: Apache-2.0
// bench_tiers: read and write throughput of the file tier (io_uring and POSIX engines) and
// the host tier, over block sizes and queue depths, each row against its limit measured in
// the same run.
//
// File tier rows: one blob of S bytes is written (or read) per operation; the tier's engine
// splits it into `bs` pieces with up to `qd` in flight, with O_DIRECT. The limit is fio on
// the tier's own blob file (same file system, same blocks) with the same pattern: bs, size=S,
// direct=1, sequential, no fsync on either side; io_uring rows run fio's io_uring engine at
// iodepth=qd, POSIX rows fio's psync engine with one job per worker thread of the tier's
// POSIX engine (see fio_job). fio and the tier alternate within the row (F T T F F T ...),
// each repetition moving the same bytes and starting, like fio's, on freshly allocated
// memory after the disk idled as long as fio's start-up (see file_row: on a virtual disk the
// physical contiguity of the buffer alone can halve the bandwidth, and idle time may let it
// catch up), and the row reports both medians (`bytes_per_second`, `fio_bytes_per_second`)
// and `vs_limit` = their ratio, with the per-round ratios' smallest and largest as
// `vs_limit_lo` / `vs_limit_hi`. Timed writes are steady-state rewrites: the tier recycles
// its replaced files (file_tier_options::spare_files), so it overwrites written blocks, as
// fio does. The tier's buffers use base pages (page_size::base), like fio's, so the grid
// compares the engines alone; the `_huge_pages` rows (io_uring, 1 and 8 MiB, qd 8 and 32) repeat
// a few cells with aligned_buffer's default, transparent huge pages for large buffers, against
// the same fio job with its buffers on transparent huge pages too (bench::fio_memory), so
// both sides again have the same memory; `fio_base_pages_bytes_per_second` adds fio from its
// default memory in the same rounds (what the page kind alone is worth on this disk).
// Host tier rows: blobs of `bs` bytes, timed writes are steady-state rewrites; the limit is a
// memcpy of the same size between resident buffers, one after each tier operation (see
// host_row).
//
// Flags (besides Google Benchmark's): --full sweeps bs 128 KiB..64 MiB (powers of two) and
// qd 1..64 (powers of two); the default is a subset. --rounds=N: fio/tier rounds per file
// row (default 6). SPILLWAY_BENCH_SMOKE=1: tiny sizes, one round.
#include <benchmark/benchmark.h>

#include <spillway/io/aligned_buffer.hpp>
#include <spillway/tier/file_tier.hpp>
#include <spillway/tier/host_tier.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
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

/// The fio job that is the limit of a file tier row: the tier's pattern (sequential, `bs`
/// pieces, O_DIRECT, `size` bytes per pass, `passes` passes) on `file`, driven the way the
/// tier's engine drives the disk:
/// - io_uring rows: one job, --ioengine=io_uring --iodepth=qd (one ring, qd in flight);
/// - POSIX rows: --ioengine=psync with as many jobs as the engine has worker threads
///   (io_engine_config::posix_threads(), at most one per piece of the blob), each job
///   reading or writing its own contiguous share of the file (--offset_increment), and
///   --group_reporting so that the bandwidth is the jobs' sum.
/// Neither side fsyncs (the tier does not) and both overwrite written blocks of a file of
/// the same size (the tier recycles its replaced files, fio overwrites the tier's file).
/// Both use O_DIRECT throughout, so the page cache holds none of the file on either side
/// (fio's default --invalidate=1 finds nothing to drop).
std::string fio_job(tier_kind kind, direction dir, const fs::path& file, std::size_t bs, unsigned qd,
                    std::size_t size, unsigned passes) {
    std::string args = "--name=limit --filename=" + file.string() + " --rw=" +
                       (dir == direction::read ? "read" : "write") + " --bs=" + std::to_string(bs) +
                       " --direct=1 --loops=" + std::to_string(passes);
    if (kind == tier_kind::uring)
        return args + " --ioengine=io_uring --iodepth=" + std::to_string(qd) + " --size=" + std::to_string(size);
    io_engine_config engine;
    engine.queue_depth = qd;
    const std::size_t pieces = size / bs;
    const std::size_t jobs = std::clamp<std::size_t>(pieces, 1, engine.posix_threads());
    const std::size_t share = pieces / jobs * bs;
    return args + " --ioengine=psync --numjobs=" + std::to_string(jobs) + " --size=" + std::to_string(share) +
           " --offset_increment=" + std::to_string(share) + " --group_reporting";
}

/// fio's bandwidth (bytes/s) for `job` with its buffers in `memory`, or a negative value when
/// fio failed.
double fio_bandwidth(direction dir, const std::string& job, bench::fio_memory memory) {
    auto r = bench::run_fio(job, memory);
    if (!r.ok()) return -1;
    return dir == direction::read ? r.read_bytes_per_second : r.write_bytes_per_second;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void fill_random(std::span<std::byte> bytes) {
    std::mt19937_64 rng(42);
    for (std::size_t i = 0; i + 8 <= bytes.size(); i += 8) {
        std::uint64_t w = rng();
        std::memcpy(bytes.data() + i, &w, 8);
    }
}

/// The blob size of a file tier row: 8 x qd pieces, within 128..512 MiB. Every operation
/// waits for its blob, so the queue drains at the end of each blob (and so does fio's
/// io_uring job at the end of each pass, but fio's psync jobs never wait for each other):
/// with 8 waves of qd pieces per blob the drain is a small part of the time.
std::size_t file_blob_size(std::size_t bs, unsigned qd) {
    if (bench::smoke()) return std::max(bs, 4 * MiB);
    std::size_t s = std::clamp<std::size_t>(bs * qd * 8, 128 * MiB, 512 * MiB);
    return (s + bs - 1) / bs * bs;
}

/// Blobs moved per repetition of a file tier row (each side): about 64 x bs x qd bytes,
/// within 128 MiB..1 GiB, so that a repetition lasts long enough (tenths of a second and
/// more) for start-up and drain to be a small part of it.
unsigned file_blobs_per_rep(std::size_t bs, unsigned qd) {
    if (bench::smoke()) return 1;
    const std::size_t volume = std::clamp<std::size_t>(bs * qd * 64, 128 * MiB, 1024 * MiB);
    return static_cast<unsigned>(std::max<std::size_t>(1, volume / file_blob_size(bs, qd)));
}

/// Rounds of a file tier row (--rounds=N); each round is one repetition of fio and one of
/// the tier.
unsigned& file_rounds() {
    static unsigned rounds = 6;
    return rounds;
}

/// The average length, in KiB, of the physically contiguous runs of pages in `bytes`
/// (from /proc/self/pagemap), or 0 when the page frame numbers are hidden (they need
/// CAP_SYS_ADMIN). A request's pieces are cut into block-layer requests of at most
/// max_segments runs, so on a virtual disk, whose cost is per request, a buffer of scattered
/// 4 KiB pages can move data at half the speed of a contiguous one (measured here: 1 MiB
/// pieces at qd 32 from a buffer of ~6 KiB runs vs ~30 KiB runs: 0.5-0.6x).
double contiguous_run_kib(std::span<const std::byte> bytes) {
    constexpr std::size_t page = 4096;
    constexpr std::uint64_t pfn_mask = (std::uint64_t{1} << 55) - 1;
    std::FILE* f = std::fopen("/proc/self/pagemap", "rb");
    if (!f) return 0;
    const auto first = reinterpret_cast<std::uintptr_t>(bytes.data()) / page;
    const std::size_t pages = bytes.size() / page;
    std::vector<std::uint64_t> entries(pages);
    const bool ok = std::fseek(f, static_cast<long>(first * sizeof(std::uint64_t)), SEEK_SET) == 0 &&
                    std::fread(entries.data(), sizeof(std::uint64_t), pages, f) == pages;
    std::fclose(f);
    if (!ok || pages == 0) return 0;
    std::size_t runs = 0;
    for (std::size_t i = 0; i < pages; ++i) {
        const std::uint64_t pfn = entries[i] & pfn_mask;
        if (pfn == 0) return 0;
        if (i == 0 || pfn != (entries[i - 1] & pfn_mask) + 1) ++runs;
    }
    return static_cast<double>(pages * page) / 1024.0 / static_cast<double>(runs);
}

/// One file tier row. The limit and the tier are measured in the same call, interleaved:
///  1. warm up: the first write creates the blob's file, the second replaces it and leaves
///     a spare, so timed writes are steady-state rewrites (as in an optimizer's flush) that,
///     like fio's, overwrite written blocks; reads find the blob;
///  2. each round (one benchmark iteration) runs one fio repetition (timer paused) and one
///     tier repetition, each moving `blobs` x the blob size, in the order fio-tier on even
///     rounds and tier-fio on odd ones (F T T F F T ...), so that drift in a busy machine's
///     load and the after-effects of either side fall on both alike;
///  3. each side starts its repetition on fresh memory after an idle disk, as fio does: fio
///     is a new process (new buffers, whose pages the kernel hands out anew) that idles
///     through its start-up before its first I/O; so before each tier repetition (timer
///     paused) the blob moves to a newly allocated buffer (allocated before the old one is
///     freed, so it gets other pages) and the disk is left idle as long as the latest fio
///     run's wall time minus its I/O time;
///  4. the row reports the medians of both sides and vs_limit = our median / fio's median,
///     with the smallest and largest per-round ratio (ours / fio of the same round) as the
///     spread, and buf_run_KiB, the median contiguity of the tier's buffers (see
///     contiguous_run_kib).
template <class Engine>
void file_row(benchmark::State& state, tier_kind kind, direction dir, std::size_t bs, unsigned qd, page_size pages) {
    const std::size_t size = file_blob_size(bs, qd);
    const unsigned blobs = file_blobs_per_rep(bs, qd);
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
    aligned_buffer buf(size, memory_lock::unlocked, 4096, buffer_fill::uninitialized, pages);
    fill_random(buf.bytes());
    const std::string key = "blob";
    tier->write(key, buf.bytes()).wait();
    if (dir == direction::write) tier->write(key, buf.bytes()).wait();

    const std::string job = fio_job(kind, dir, tier->path_of(key), bs, qd, size, blobs);
    std::vector<double> ours, theirs, theirs_base_pages, runs_kib;
    const auto fio_pages = pages == page_size::automatic ? bench::fio_memory::huge_pages : bench::fio_memory::base_pages;
    bool fio_failed = false;
    std::chrono::duration<double> fio_idle{0};  // step 3: the latest fio run's time without I/O
    auto run_fio = [&] {
        state.PauseTiming();
        if (fio_pages == bench::fio_memory::huge_pages)  // outside the idle-time measurement
            if (double base = fio_bandwidth(dir, job, bench::fio_memory::base_pages); base > 0)
                theirs_base_pages.push_back(base);
        const auto t0 = std::chrono::steady_clock::now();
        const double bw = fio_bandwidth(dir, job, fio_pages);
        const std::chrono::duration<double> wall = std::chrono::steady_clock::now() - t0;
        if (bw > 0) {
            theirs.push_back(bw);
            const std::chrono::duration<double> io(static_cast<double>(size) * blobs / bw);
            fio_idle = std::max(wall - io, std::chrono::duration<double>::zero());
        } else {
            fio_failed = true;
        }
        state.ResumeTiming();
    };
    for (auto _ : state) {
        const bool fio_first = ours.size() % 2 == 0;
        if (fio_first) run_fio();
        state.PauseTiming();
        aligned_buffer fresh(size, memory_lock::unlocked, 4096, buffer_fill::uninitialized, pages);
        std::memcpy(fresh.data(), buf.data(), size);
        buf = std::move(fresh);
        runs_kib.push_back(contiguous_run_kib(buf.bytes()));
        std::this_thread::sleep_for(fio_idle);
        state.ResumeTiming();
        auto t0 = std::chrono::steady_clock::now();
        for (unsigned b = 0; b < blobs; ++b) {
            if (dir == direction::read) tier->read(key, buf.bytes()).wait();
            else tier->write(key, buf.bytes()).wait();
        }
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ours.push_back(static_cast<double>(size) * blobs / secs);
        if (!fio_first) run_fio();
    }
    std::string label = tier->direct_io() ? "O_DIRECT" : "buffered (" + tier->direct_io_note() + ")";
    tier->erase(key);
    tier.reset();

    // bytes_per_second is our median (not Google Benchmark's mean over the row), so that
    // bytes_per_second / fio_bytes_per_second is vs_limit.
    state.counters["bytes_per_second"] = median(ours);
    state.counters["blob_MiB"] = static_cast<double>(size) / MiB;
    state.counters["rep_MiB"] = static_cast<double>(size * blobs) / MiB;
    if (median(runs_kib) > 0) state.counters["buf_run_KiB"] = median(runs_kib);
    if (!fio_failed && theirs.size() == ours.size()) {
        std::vector<double> ratios;
        for (std::size_t i = 0; i < ours.size(); ++i) ratios.push_back(ours[i] / theirs[i]);
        state.counters["fio_bytes_per_second"] = median(theirs);
        state.counters["vs_limit"] = median(ours) / median(theirs);
        state.counters["vs_limit_lo"] = *std::min_element(ratios.begin(), ratios.end());
        state.counters["vs_limit_hi"] = *std::max_element(ratios.begin(), ratios.end());
        if (!theirs_base_pages.empty()) state.counters["fio_base_pages_bytes_per_second"] = median(theirs_base_pages);
    } else {
        label += bench::fio_available() ? "; fio failed: no vs_limit" : "; fio not installed: no vs_limit";
    }
    state.SetLabel(label);
}

/// One host tier row: blobs of `bs` bytes, the limit a memcpy of the same size between
/// resident buffers, measured in the same iterations:
///  1. warm up: a write row writes its key twice, so the tier holds a spare block and timed
///     writes are steady-state rewrites (host_tier.hpp: a rewrite copies into the block the
///     previous rewrite replaced, whose pages are resident), as file rows' are;
///  2. the limit copies between the caller's buffer (a std::vector, as the tier's caller
///     uses) and resident buffers allocated the way the tier allocates its blocks (2 MiB-
///     aligned and advised MADV_HUGEPAGE from 2 MiB up: aligned_buffer's page_size::automatic),
///     in the row's direction, so both sides touch the same kinds of pages. A write's limit
///     alternates between two destinations, as the tier must: the old blob stays readable
///     while the new one is written, so a rewrite never lands in the block it replaces, and
///     near a cache's size the second block costs a memcpy as much as the tier (a single
///     destination would flatter the memcpy wherever the block fits the L2 cache);
///  3. each iteration times one tier operation and one memcpy, in turns (T L, then L T; with
///     the tier always first, the memcpy after it would run on a warmer cache), so load
///     on a busy machine and the cache each side leaves fall on both alike; the iteration's
///     time is the tier's;
///  4. bytes_per_second and memcpy_bytes_per_second are the size over the median time of
///     one operation of each side, and vs_limit their ratio (memcpy's median time / ours).
void host_row(benchmark::State& state, direction dir, std::size_t bs) {
    host_tier tier;
    std::vector<std::byte> src(bs), dst(bs);
    fill_random(src);
    std::memset(dst.data(), 1, dst.size());
    aligned_buffer resident[2] = {
        aligned_buffer(bs, memory_lock::unlocked, 4096, buffer_fill::zeroed, page_size::automatic),
        aligned_buffer(bs, memory_lock::unlocked, 4096, buffer_fill::zeroed, page_size::automatic)};
    std::size_t turn = 0;
    const std::string key = "blob";
    tier.write(key, src).wait();
    if (dir == direction::write) tier.write(key, src).wait();
    std::vector<double> ours, limit;  // seconds per operation
    ours.reserve(static_cast<std::size_t>(state.max_iterations));
    limit.reserve(static_cast<std::size_t>(state.max_iterations));
    auto time = [](auto&& op) {
        const auto t0 = std::chrono::steady_clock::now();
        op();
        benchmark::ClobberMemory();
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    auto tier_op = [&] {
        if (dir == direction::read) tier.read(key, dst).wait();
        else tier.write(key, src).wait();
    };
    auto limit_op = [&] {
        if (dir == direction::read) std::memcpy(dst.data(), resident[0].data(), bs);
        else std::memcpy(resident[turn++ % 2].data(), src.data(), bs);
    };
    for (auto _ : state) {
        // Turns (T L L T T L ...): neither side always runs right after the other.
        const bool tier_first = ours.size() % 2 == 0;
        if (!tier_first) limit.push_back(time(limit_op));
        ours.push_back(time(tier_op));
        if (tier_first) limit.push_back(time(limit_op));
        state.SetIterationTime(ours.back());
    }
    // Medians per operation: an operation the busy machine preempted is an outlier on
    // either side, and the median drops it (a sum would keep it).
    const double b = static_cast<double>(bs);
    state.counters["bytes_per_second"] = b / median(ours);
    state.counters["memcpy_bytes_per_second"] = b / median(limit);
    state.counters["vs_limit"] = median(limit) / median(ours);
    [&state](const auto& t) {  // blocks the tier allocated, warm-up included (where it counts)
        if constexpr (requires { t.allocations(); })
            state.counters["allocations"] = static_cast<double>(t.allocations());
    }(tier);
}

std::string row_name(direction dir, tier_kind kind, std::size_t bs, unsigned qd, page_size pages = page_size::base) {
    std::string n = std::string(dir == direction::read ? "read" : "write") + "/" + kind_name(kind) +
                    (pages == page_size::automatic ? "_huge_pages" : "") + "/bs_KiB:" + std::to_string(bs / KiB);
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
    const std::int64_t host_total = bench::smoke() ? 4 * MiB : 1024 * MiB;  // per host row, each side
    for (direction dir : {direction::write, direction::read}) {
        for (tier_kind kind : kinds)
            for (std::size_t bs : sizes)
                for (unsigned qd : depths) {
                    auto* b = benchmark::RegisterBenchmark(
                        row_name(dir, kind, bs, qd).c_str(), [=](benchmark::State& st) {
#if SPILLWAY_HAS_LIBURING
                            if (kind == tier_kind::uring) return file_row<uring_engine>(st, kind, dir, bs, qd, page_size::base);
#endif
                            file_row<posix_engine>(st, kind, dir, bs, qd, page_size::base);
                        });
                    b->Iterations(bench::smoke() ? 1 : file_rounds())->UseRealTime()->Unit(benchmark::kMillisecond);
                }
#if SPILLWAY_HAS_LIBURING
        // The same engine from huge-page buffers (aligned_buffer's default for large ones).
        if (!bench::smoke() && uring_probe().available)
            for (std::size_t bs : {1 * MiB, 8 * MiB})
                for (unsigned qd : {8u, 32u}) {
                    auto* b = benchmark::RegisterBenchmark(
                        row_name(dir, tier_kind::uring, bs, qd, page_size::automatic).c_str(), [=](benchmark::State& st) {
                            file_row<uring_engine>(st, tier_kind::uring, dir, bs, qd, page_size::automatic);
                        });
                    b->Iterations(file_rounds())->UseRealTime()->Unit(benchmark::kMillisecond);
                }
#endif
        for (std::size_t bs : sizes) {
            auto* b = benchmark::RegisterBenchmark(row_name(dir, tier_kind::host, bs, 1).c_str(),
                                                   [=](benchmark::State& st) { host_row(st, dir, bs); });
            b->Iterations(std::max<std::int64_t>(16, host_total / static_cast<std::int64_t>(bs)))
                ->UseManualTime()
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
        else if (std::strncmp(argv[i], "--rounds=", 9) == 0) file_rounds() = static_cast<unsigned>(std::max(1, std::atoi(argv[i] + 9)));
        else argv[kept++] = argv[i];
    }
    argc = kept;
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    if (!bench::fio_available())
        std::printf("fio is not installed: file tier rows report no vs_limit (apt-get install fio)\n");
    else
        std::printf("limit: fio (direct=1, same bs/size; io_uring rows: ioengine=io_uring, same iodepth; POSIX rows: "
                    "ioengine=psync, one job per engine thread) on the tier's own file in %s, interleaved with the "
                    "tier in %u rounds\n",
                    (bench::scratch_dir() / "tiers").c_str(), bench::smoke() ? 1u : file_rounds());
    register_rows(full);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
