// SPDX-License-Identifier: Apache-2.0
// bench_virtual_tier: the virtual tier against the sum of its paths, and node-level
// contention control.
//
// Aggregate rows: paths are file tiers that do not share a device: a file tier on the disk
// (O_DIRECT) and file tiers on /dev/shm behind a throttle (low enough that the throttle, not
// the CPU copying into tmpfs, bounds those paths).
//   BM_aggregate/<paths>: 32 blobs of 8 MiB; 2 paths: disk + shm at 400 MB/s; 3 paths: +
//       shm at 200 MB/s.
//   BM_aggregate_12_2_1/<paths>: the same blobs over paths at 12:2:1 on any machine: the
//       throttles are set to 2/12 and 1/12 of the disk's bandwidth, measured alone when the
//       row starts (a fast disk beside slow paths, so the slowest path's
//       share is about two keys).
//   BM_aggregate_mixed/<paths>: paths as in BM_aggregate; 16 blobs of mixed sizes, 2 to 48
//       MiB (272 MiB), as an optimizer's subgroups and a stash's tensors are.
// One iteration measures, in this order and interleaved so that drift hits all alike:
//   1. each throttled path alone: write the blobs one at a time, then read them back
//      (B_i = bytes moved / time), from the very buffers the virtual tier's pass moves; the
//      alone runs' keys stay from one iteration to the next, so their writes are rewrites,
//      as the virtual tier's are (see alone(): with new keys and one reused buffer the disk
//      alone ran at another speed than in the pass, which the ratio then counted);
//   2. the disk alone, the same way;
//   3. the virtual tier (thread_lock: one writer and one reader per path, the same depth
//      as the alone runs) over the same paths: write_batch of the keys, then read_batch;
//   4. the disk alone again: B_1 is the mean of steps 2 and 4, so that the disk's drift
//      during the iteration hits both sides alike (`disk_drift`: the median of |4 - 2| / B_1).
//      An iteration whose disk changed speed by more than 10% between steps 2 and 4 (another
//      process used it) cannot tell placement from noise: `vs_limit_steady` is the median
//      ratio of the other iterations, `steady_iterations` their number.
// Per iteration, ratio = virtual tier bytes/s / (B_1 + ... + B_n). Counters: `vs_limit`,
// the median ratio over the iterations (at least 5), with `vs_limit_min` and `vs_limit_max`;
// B_i and `limit_bytes_per_second`, medians; `placement`, the median of what the pass would
// reach if each path ran at its alone speed on the bytes placed on it (ideal time over the
// slowest path's time): below 1 by the placement's own loss (whole keys), so that vs_limit
// below placement is execution (a path slower beside the others, disk noise), not placement.
// `disk_in_tier`: the disk's bandwidth during the pass as its own stats() count it (bytes
// over busy time), over its alone bandwidth: below 1 when the disk ran slower beside the
// other paths than alone (the machine's CPUs are shared by all the paths' transfers).
// SPILLWAY_BENCH_VERBOSE=1 prints each iteration's figures per path on stderr.
// Goal: vs_limit >= 0.9. The virtual tier is built once per row (probe at construction),
// adapts during a warm-up pass, and keeps its keys across iterations (every pass rewrites
// them, as an optimizer's update does).
//
// Contention rows (BM_contention/<procs>/<lock>): `procs` processes offload at once to one
// path (each its own file tier directory on the same disk, one virtual tier each with
// that path as its only child, lock name shared): each writes its K blobs one at a time
// and reads them back, twice. Lock 0 = null_lock (no exclusion), 1 = node_lock (one writer
// and one reader on the node at a time). Reported: aggregate bytes/s (all processes, from
// a common start to the last finish), p50 and p99 latency of one blob operation (issue to
// completion, lock wait included), and `vs_limit` = aggregate / the same workload run by
// one process alone (measured first, in the same run).
//
// SPILLWAY_BENCH_SMOKE=1 shrinks sizes and repetitions so the binary runs in seconds.
#include <benchmark/benchmark.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <spillway/lock/lock_policy.hpp>
#include <spillway/lock/node_lock.hpp>
#include <spillway/tier/file_tier.hpp>
#include <spillway/tier/throttled_tier.hpp>
#include <spillway/tier/virtual_tier.hpp>

#include "support/bench_env.hpp"

namespace {

using namespace spillway;
namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;

struct sizes {
    std::size_t blob, keys;
};
sizes contention_sizes() { return bench::smoke() ? sizes{MiB, 4} : sizes{4 * MiB, 16}; }

/// The blob sizes of an aggregate row, one per key, in submission order.
std::vector<std::size_t> uniform_blobs() {
    return std::vector<std::size_t>(bench::smoke() ? 8 : 32, bench::smoke() ? MiB : 8 * MiB);
}
/// 2 to 48 MiB, shuffled (a fixed order: placement sees them as a flush would).
std::vector<std::size_t> mixed_blobs() {
    if (bench::smoke()) return {MiB, 3 * MiB, 2 * MiB, 1 * MiB};
    const std::size_t mib[] = {24, 3, 40, 8, 2, 16, 32, 5, 12, 48, 4, 20, 6, 28, 10, 14};
    std::vector<std::size_t> out;
    for (std::size_t m : mib) out.push_back(m * MiB);
    return out;
}
std::size_t total_of(const std::vector<std::size_t>& blobs) {
    std::size_t t = 0;
    for (std::size_t b : blobs) t += b;
    return t;
}

double seconds_since(clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/// A fresh empty directory under `root`.
fs::path fresh_dir(const fs::path& root, const std::string& name) {
    auto p = root / name;
    fs::remove_all(p);
    fs::create_directories(p);
    return p;
}

fs::path shm_root() {
    std::error_code ec;
    if (fs::is_directory("/dev/shm", ec)) return fs::path("/dev/shm") / (std::string("spillway-bench-vt-") + std::to_string(::getpid()));
    return bench::scratch_dir() / "vt-shm";  // no tmpfs: the paths share the disk (reported)
}

using shm_path = throttled_tier<file_tier<>>;

throttle_config rate(double bytes_per_second) {
    bandwidth_limit l{bytes_per_second, 4 * MiB};
    return throttle_config::separate(l, l);
}

/// The paths of one aggregate row, alive for the whole row; `rates` are the shm paths'.
struct paths {
    std::unique_ptr<file_tier<>> disk;
    std::vector<std::unique_ptr<shm_path>> shm;

    paths(std::size_t count, const std::vector<double>& rates) {
        file_tier_options o;
        o.name = "disk";
        disk = std::make_unique<file_tier<>>(fresh_dir(bench::scratch_dir(), "vt-disk"), o);
        for (std::size_t i = 1; i < count; ++i) {
            file_tier_options so;
            so.name = std::string("shm") + std::to_string(i);
            shm.push_back(std::make_unique<shm_path>(rate(rates[i - 1]), std::in_place,
                                                     fresh_dir(shm_root(), std::string("p") + std::to_string(i)), so));
        }
    }
    ~paths() {
        shm.clear();
        std::error_code ec;
        fs::remove_all(shm_root(), ec);
    }
};

std::string alone_key(std::size_t k) { return std::string("alone-") + std::to_string(k); }

/// Writes the blobs one at a time, then reads them back; returns bytes/s. The keys stay, so
/// that the next call rewrites them as the virtual tier's passes rewrite theirs: a file
/// tier's rewrite reuses the file it replaced (a spare) where a write of a new key lays out a
/// new file, and a limit measured with new keys was slower than the same path under the
/// virtual tier (a ratio above 1 that said nothing about placement).
/// Key k moves bufs[k], the buffer the virtual tier's pass moves for its key k: the same
/// memory on both sides (a direct transfer pins the caller's pages, and one buffer used over
/// and over is not what the tier sees).
template <class Tier>
double alone(Tier& tier, std::vector<std::vector<std::byte>>& bufs) {
    std::size_t total = 0;
    auto t0 = clock_type::now();
    for (std::size_t k = 0; k < bufs.size(); ++k) total += tier.write(alone_key(k), bufs[k]).wait();
    for (std::size_t k = 0; k < bufs.size(); ++k) total += tier.read(alone_key(k), bufs[k]).wait();
    return static_cast<double>(total) / seconds_since(t0);
}
template <class Tier>
void erase_alone(Tier& tier, std::size_t keys) {
    for (std::size_t k = 0; k < keys; ++k) tier.erase(alone_key(k));
}
/// One buffer per blob.
std::vector<std::vector<std::byte>> buffers_for(const std::vector<std::size_t>& blobs) {
    std::vector<std::vector<std::byte>> bufs;
    for (std::size_t b : blobs) bufs.emplace_back(b, std::byte{0x5a});
    return bufs;
}

/// One pass of the virtual tier: every key written, then read back; returns seconds.
template <class VT>
double vt_pass(VT& vt, std::vector<std::vector<std::byte>>& bufs) {
    std::vector<std::string> names;
    for (std::size_t k = 0; k < bufs.size(); ++k) names.push_back(std::string("key-") + std::to_string(k));
    std::vector<write_request> w;
    std::vector<read_request> r;
    for (std::size_t k = 0; k < bufs.size(); ++k) {
        w.push_back({names[k], bufs[k]});
        r.push_back({names[k], bufs[k]});
    }
    auto t0 = clock_type::now();
    for (auto& c : vt.write_batch(w)) c.wait();
    for (auto& c : vt.read_batch(r)) c.wait();
    return seconds_since(t0);
}

/// What the pass would reach with each path at its alone speed on the bytes placed on it:
/// the ideal time (all bytes over the sum) over the slowest path's time.
double placement_ratio(const std::vector<std::size_t>& placed, const std::vector<double>& alone_bw) {
    double total = 0, sum = 0, slowest = 0;
    for (std::size_t i = 0; i < placed.size(); ++i) {
        total += static_cast<double>(placed[i]);
        sum += alone_bw[i];
        slowest = std::max(slowest, static_cast<double>(placed[i]) / alone_bw[i]);
    }
    return slowest > 0 ? (total / sum) / slowest : 0;
}

/// SPILLWAY_BENCH_VERBOSE=1: one line per iteration on stderr (each path's bytes and speeds).
bool verbose() {
    const char* v = std::getenv("SPILLWAY_BENCH_VERBOSE");
    return v && *v && std::string(v) != "0";
}

/// The most the disk's alone bandwidth may change across an iteration for it to count as steady.
constexpr double steady_drift = 0.10;

template <class VT>
void run_aggregate(benchmark::State& state, VT& vt, paths& p, const std::vector<std::size_t>& blobs) {
    auto bufs = buffers_for(blobs);
    const double pass_bytes = static_cast<double>(2 * total_of(blobs));
    vt_pass(vt, bufs);  // warm-up: places every key, measures the paths
    // Warm-up of the alone runs: their keys exist from here on, so every timed write is a
    // rewrite on both sides.
    (void)alone(*p.disk, bufs);
    for (auto& shm : p.shm) (void)alone(*shm, bufs);
    const std::size_t alone_bytes = total_of(blobs);
    const std::size_t n = 1 + p.shm.size();
    std::vector<std::vector<double>> alone_bw(n);
    std::vector<double> limits, ratios, vt_rates, placement;
    std::vector<double> drift, disk_in_tier;
    for (auto _ : state) {
        // The throttled paths first (steady), then the disk right before and right after the
        // pass: its mean is B1, so drift of the disk during the iteration hits both sides.
        std::vector<double> b(n);
        for (std::size_t i = 1; i < n; ++i) b[i] = alone(*p.shm[i - 1], bufs);
        const double disk_before = alone(*p.disk, bufs);
        std::vector<tier_stats> seen{p.disk->stats()};
        for (auto& shm : p.shm) seen.push_back(shm->stats());
        double secs = vt_pass(vt, bufs);
        // Each path's own count of the pass: bytes over busy time (one direction at a time).
        std::vector<double> in_pass(n);
        for (std::size_t i = 0; i < n; ++i) {
            const tier_stats d = (i == 0 ? p.disk->stats() : p.shm[i - 1]->stats()).since(seen[i]);
            const double busy = d.read_busy_seconds + d.write_busy_seconds;
            in_pass[i] = busy > 0 ? static_cast<double>(d.bytes_read + d.bytes_written) / busy : 0;
        }
        const double disk_after = alone(*p.disk, bufs);
        b[0] = (disk_before + disk_after) / 2;
        drift.push_back(std::abs(disk_after - disk_before) / b[0]);
        double limit = 0;
        for (std::size_t i = 0; i < n; ++i) {
            alone_bw[i].push_back(b[i]);
            limit += b[i];
        }
        state.SetIterationTime(secs);
        // What each path stores now, less the alone runs' blobs: the bytes placed on it.
        std::vector<std::size_t> placed{p.disk->used() - alone_bytes};
        for (auto& shm : p.shm) placed.push_back(shm->used() - alone_bytes);
        limits.push_back(limit);
        vt_rates.push_back(pass_bytes / secs);
        ratios.push_back(pass_bytes / secs / limit);
        placement.push_back(placement_ratio(placed, b));
        disk_in_tier.push_back(in_pass[0] / b[0]);
        if (verbose()) {
            std::fprintf(stderr, "%zu paths, %zu blobs, iteration %zu: ratio %.3f placement %.3f drift %.2f, pass %.0f ms;", n,
                         blobs.size(), ratios.size(), ratios.back(), placement.back(), drift.back(), secs * 1e3);
            for (std::size_t i = 0; i < n; ++i)
                std::fprintf(stderr, " [path %zu: %zu MiB, alone %.0f MB/s (in the pass %.0f), %.0f ms at the alone speed]", i + 1,
                             placed[i] / MiB, b[i] / 1e6, in_pass[i] / 1e6, 2e3 * static_cast<double>(placed[i]) / b[i]);
            std::fprintf(stderr, "\n");
        }
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(pass_bytes) * state.iterations());
    state.counters["limit_bytes_per_second"] = median(limits);
    state.counters["vt_bytes_per_second"] = median(vt_rates);
    state.counters["vs_limit"] = median(ratios);
    state.counters["vs_limit_min"] = *std::min_element(ratios.begin(), ratios.end());
    state.counters["vs_limit_max"] = *std::max_element(ratios.begin(), ratios.end());
    state.counters["placement"] = median(placement);
    state.counters["disk_drift"] = median(drift);
    state.counters["disk_in_tier"] = median(disk_in_tier);
    // The iterations whose disk kept its speed (drift <= 10%): their median ratio, and how
    // many there were (none: the counter is absent).
    std::vector<double> steady;
    for (std::size_t k = 0; k < ratios.size(); ++k)
        if (drift[k] <= steady_drift) steady.push_back(ratios[k]);
    state.counters["steady_iterations"] = static_cast<double>(steady.size());
    if (!steady.empty()) state.counters["vs_limit_steady"] = median(steady);
    state.counters["keys"] = static_cast<double>(blobs.size());
    for (std::size_t i = 0; i < n; ++i) state.counters[std::string("B") + std::to_string(i + 1)] = median(alone_bw[i]);
    std::string label;
    std::vector<std::size_t> stored{p.disk->used() - alone_bytes};
    for (auto& shm : p.shm) stored.push_back(shm->used() - alone_bytes);
    erase_alone(*p.disk, blobs.size());
    for (auto& shm : p.shm) erase_alone(*shm, blobs.size());
    for (auto& r : vt.report()) {
        char text[200];
        std::snprintf(text, sizeof text, "%s: %zu keys, %zu MiB (est. write %.0f, read %.0f MB/s); ", r.name.c_str(), r.keys,
                      stored[r.index] / MiB, r.write_bandwidth / 1e6, r.read_bandwidth / 1e6);
        label += text;
    }
    state.SetLabel(label);
}

/// Builds the paths at `rates` and the virtual tier over them, and runs the row.
void aggregate_row(benchmark::State& state, const std::vector<std::size_t>& blobs, const std::vector<double>& rates) {
    const auto count = static_cast<std::size_t>(state.range(0));
    paths p(count, rates);
    virtual_tier_options o;
    o.name = "bench-vt";
    o.probe_nbytes = *std::min_element(blobs.begin(), blobs.end());
    if (count == 2) {
        virtual_tier<thread_lock, file_tier<>&, shm_path&> vt(o, *p.disk, *p.shm[0]);
        run_aggregate(state, vt, p, blobs);
    } else {
        virtual_tier<thread_lock, file_tier<>&, shm_path&, shm_path&> vt(o, *p.disk, *p.shm[0], *p.shm[1]);
        run_aggregate(state, vt, p, blobs);
    }
}

const std::vector<double> fixed_rates{400e6, 200e6};

void BM_aggregate(benchmark::State& state) { aggregate_row(state, uniform_blobs(), fixed_rates); }

void BM_aggregate_mixed(benchmark::State& state) { aggregate_row(state, mixed_blobs(), fixed_rates); }

void BM_aggregate_12_2_1(benchmark::State& state) {
    // The disk alone, twice (the first warms the file system up), sets the throttles.
    const auto blobs = uniform_blobs();
    double disk = 0;
    {
        file_tier_options o;
        o.name = "disk";
        file_tier<> probe(fresh_dir(bench::scratch_dir(), "vt-disk-probe"), o);
        auto bufs = buffers_for(blobs);
        for (int r = 0; r < 2; ++r) disk = alone(probe, bufs);  // the second rewrites
    }
    std::error_code ec;
    fs::remove_all(bench::scratch_dir() / "vt-disk-probe", ec);
    state.counters["disk_at_start"] = disk;
    aggregate_row(state, blobs, {disk * 2 / 12, disk / 12});
}

// ---- Contention ------------------------------------------------------------------------

struct contention_result {
    double bytes_per_second = 0;
    double p50 = 0, p99 = 0;  // seconds
    bool ok = false;
};

/// One process's work: K blobs written one at a time, then read back, twice. Latencies
/// (seconds) go to `out`; returns false on any error.
template <class Policy>
bool offload(const fs::path& dir, const fs::path& lock_dir, const sizes& sz, std::vector<double>& lat, int start_fd) {
    file_tier_options fo;
    fo.name = dir.filename().string();
    virtual_tier_options o;
    o.name = "contend";  // one lock name for every process: the path's lock
    o.bandwidths = {1};
    o.placement = placement_mode::fixed;
    o.workers = 2;
    o.locks.directory = lock_dir;
    virtual_tier<Policy, file_tier<>> vt(o, child_args(dir, fo));
    std::vector<std::byte> buf(sz.blob, std::byte{0x11});
    char c;
    while (::read(start_fd, &c, 1) < 0 && errno == EINTR) {
    }  // start together: EOF when the parent closes its end
    for (int round = 0; round < 2; ++round) {
        for (int phase = 0; phase < 2; ++phase) {
            for (std::size_t k = 0; k < sz.keys; ++k) {
                auto key = std::string("b") + std::to_string(k);
                auto t0 = clock_type::now();
                if (phase == 0) vt.write(key, buf).wait();
                else vt.read(key, buf).wait();
                lat.push_back(seconds_since(t0));
            }
        }
    }
    return true;
}

template <class Policy>
contention_result contend(int procs, const sizes& sz) {
    contention_result res;
    auto root = fresh_dir(bench::scratch_dir(), "vt-contention");
    auto lock_dir = fresh_dir(shm_root(), "locks");
    int start[2];
    if (::pipe(start) != 0) return res;
    std::vector<pid_t> pids;
    std::vector<int> result_fds;
    for (int p = 0; p < procs; ++p) {
        auto dir = fresh_dir(root, std::string("proc") + std::to_string(p));
        int out[2];
        if (::pipe(out) != 0) return res;
        pid_t pid = ::fork();
        if (pid == 0) {
            ::close(start[1]);
            ::close(out[0]);
            std::vector<double> lat;
            bool ok = false;
            try {
                ok = offload<Policy>(dir, lock_dir, sz, lat, start[0]);
            } catch (...) {
            }
            if (ok) {
                const char* data = reinterpret_cast<const char*>(lat.data());
                std::size_t left = lat.size() * sizeof(double);
                while (left > 0) {
                    ssize_t n = ::write(out[1], data, left);
                    if (n <= 0) break;
                    data += n;
                    left -= static_cast<std::size_t>(n);
                }
            }
            ::_exit(ok ? 0 : 1);
        }
        ::close(out[1]);
        pids.push_back(pid);
        result_fds.push_back(out[0]);
    }
    ::close(start[0]);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let every process open its tier
    auto t0 = clock_type::now();
    ::close(start[1]);  // go
    std::vector<double> all;
    for (int fd : result_fds) {
        std::vector<char> bytes;
        char chunk[65536];
        ssize_t n;
        while ((n = ::read(fd, chunk, sizeof chunk)) > 0) bytes.insert(bytes.end(), chunk, chunk + n);
        ::close(fd);
        std::size_t count = bytes.size() / sizeof(double);
        std::vector<double> lat(count);
        std::memcpy(lat.data(), bytes.data(), count * sizeof(double));
        all.insert(all.end(), lat.begin(), lat.end());
    }
    double secs = seconds_since(t0);
    bool ok = true;
    for (pid_t pid : pids) {
        int st = 0;
        ::waitpid(pid, &st, 0);
        ok = ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    std::error_code ec;
    fs::remove_all(root, ec);
    fs::remove_all(shm_root(), ec);
    if (!ok || all.empty()) return res;
    std::sort(all.begin(), all.end());
    auto pct = [&](double q) { return all[std::min(all.size() - 1, static_cast<std::size_t>(q * static_cast<double>(all.size())))]; };
    res.p50 = pct(0.50);
    res.p99 = pct(0.99);
    res.bytes_per_second = static_cast<double>(procs) * 4.0 * static_cast<double>(sz.keys * sz.blob) / secs;
    res.ok = true;
    return res;
}

double single_process_throughput() {
    static const double bw = [] {
        auto r = contend<null_lock>(1, contention_sizes());
        return r.ok ? r.bytes_per_second : -1.0;
    }();
    return bw;
}

void BM_contention(benchmark::State& state) {
    const int procs = static_cast<int>(state.range(0));
    const bool node = state.range(1) == 1;
    const auto sz = contention_sizes();
    double alone_bw = single_process_throughput();
    std::vector<double> bw, p50, p99;
    for (auto _ : state) {
        auto r = node ? contend<node_lock>(procs, sz) : contend<null_lock>(procs, sz);
        if (!r.ok) {
            state.SkipWithError("a worker process failed");
            return;
        }
        state.SetIterationTime(static_cast<double>(procs) * 4.0 * static_cast<double>(sz.keys * sz.blob) / r.bytes_per_second);
        bw.push_back(r.bytes_per_second);
        p50.push_back(r.p50);
        p99.push_back(r.p99);
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * procs * 4 *
                            static_cast<std::int64_t>(sz.keys * sz.blob));
    state.counters["aggregate_bytes_per_second"] = median(bw);
    state.counters["p50_ms"] = median(p50) * 1e3;
    state.counters["p99_ms"] = median(p99) * 1e3;
    if (alone_bw > 0) state.counters["vs_limit"] = median(bw) / alone_bw;
    state.SetLabel(std::string(node ? "node_lock" : "null_lock") + ", " + std::to_string(procs) + " processes");
}

}  // namespace

// At least 5 iterations: vs_limit is their median (the disk alone swings from one to the next).
BENCHMARK(BM_aggregate)->Arg(2)->Arg(3)->UseManualTime()->Unit(benchmark::kMillisecond)
    ->Iterations(spillway::bench::smoke() ? 1 : 5);
BENCHMARK(BM_aggregate_12_2_1)->Arg(2)->Arg(3)->UseManualTime()->Unit(benchmark::kMillisecond)
    ->Iterations(spillway::bench::smoke() ? 1 : 5);
BENCHMARK(BM_aggregate_mixed)->Arg(3)->UseManualTime()->Unit(benchmark::kMillisecond)
    ->Iterations(spillway::bench::smoke() ? 1 : 5);
BENCHMARK(BM_contention)->Args({2, 0})->Args({2, 1})->Args({4, 0})->Args({4, 1})->UseManualTime()
    ->Unit(benchmark::kMillisecond)->Iterations(spillway::bench::smoke() ? 1 : 3);

BENCHMARK_MAIN();
