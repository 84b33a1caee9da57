// SPDX-License-Identifier: Apache-2.0
// bench_virtual_tier: the virtual tier against the sum of its paths, and node-level
// contention control.
//
// Aggregate rows (BM_aggregate/<paths>): paths are file tiers that do not share a device: a
// file tier on the disk (O_DIRECT) and file tiers on /dev/shm behind a throttle set to a
// fixed bandwidth (2 paths: disk + shm at 400 MB/s; 3 paths: + shm at 200 MB/s; low
// enough that the throttle, not the CPU copying into tmpfs, bounds those paths). One
// repetition measures, in this order and interleaved so that drift hits all alike:
//   1. each path alone: write K blobs of S bytes one at a time, then read them back
//      (B_i = 2 K S / time);
//   2. the virtual tier (thread_lock: one writer and one reader per path, the same depth
//      as the alone runs) over the same paths: write_batch of the K keys, then read_batch.
// `vs_limit` = virtual tier bytes/s / (B_1 + ... + B_n); goal >= 0.9. The virtual tier is
// built once (probe at construction), adapts during the warm-up pass, and keeps its keys
// across repetitions (every pass rewrites them, as an optimizer's update does).
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
#include <cstdio>
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
sizes aggregate_sizes() { return bench::smoke() ? sizes{MiB, 8} : sizes{8 * MiB, 32}; }
sizes contention_sizes() { return bench::smoke() ? sizes{MiB, 4} : sizes{4 * MiB, 16}; }

double seconds_since(clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count();
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

/// The paths of one aggregate row, alive for the whole row.
struct paths {
    std::unique_ptr<file_tier<>> disk;
    std::vector<std::unique_ptr<shm_path>> shm;

    explicit paths(std::size_t count) {
        file_tier_options o;
        o.name = "disk";
        disk = std::make_unique<file_tier<>>(fresh_dir(bench::scratch_dir(), "vt-disk"), o);
        const double rates[] = {400e6, 200e6};
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

/// Writes K blobs one at a time, reads them back, erases them; returns bytes/s.
template <class Tier>
double alone(Tier& tier, const sizes& sz, std::vector<std::byte>& buf) {
    auto t0 = clock_type::now();
    for (std::size_t k = 0; k < sz.keys; ++k) tier.write(std::string("alone-") + std::to_string(k), buf).wait();
    for (std::size_t k = 0; k < sz.keys; ++k) tier.read(std::string("alone-") + std::to_string(k), buf).wait();
    double secs = seconds_since(t0);
    for (std::size_t k = 0; k < sz.keys; ++k) tier.erase(std::string("alone-") + std::to_string(k));
    return static_cast<double>(2 * sz.keys * sz.blob) / secs;
}

/// One pass of the virtual tier: every key written, then read back; returns seconds.
template <class VT>
double vt_pass(VT& vt, const sizes& sz, std::vector<std::vector<std::byte>>& bufs) {
    std::vector<std::string> names;
    for (std::size_t k = 0; k < sz.keys; ++k) names.push_back(std::string("key-") + std::to_string(k));
    std::vector<write_request> w;
    std::vector<read_request> r;
    for (std::size_t k = 0; k < sz.keys; ++k) {
        w.push_back({names[k], bufs[k]});
        r.push_back({names[k], bufs[k]});
    }
    auto t0 = clock_type::now();
    for (auto& c : vt.write_batch(w)) c.wait();
    for (auto& c : vt.read_batch(r)) c.wait();
    return seconds_since(t0);
}

template <class VT, class... Children>
void run_aggregate(benchmark::State& state, VT& vt, paths& p, const sizes& sz) {
    std::vector<std::vector<std::byte>> bufs(sz.keys, std::vector<std::byte>(sz.blob, std::byte{0x5a}));
    std::vector<std::byte> buf(sz.blob, std::byte{0x3c});
    vt_pass(vt, sz, bufs);  // warm-up: places every key, measures the paths
    double limit_sum = 0, vt_bytes = 0, vt_secs = 0;
    std::vector<double> alone_bw(1 + p.shm.size(), 0);
    int n = 0;
    for (auto _ : state) {
        double limit = 0;
        double b = alone(*p.disk, sz, buf);
        alone_bw[0] += b;
        limit += b;
        for (std::size_t i = 0; i < p.shm.size(); ++i) {
            b = alone(*p.shm[i], sz, buf);
            alone_bw[i + 1] += b;
            limit += b;
        }
        double secs = vt_pass(vt, sz, bufs);
        state.SetIterationTime(secs);
        vt_bytes += static_cast<double>(2 * sz.keys * sz.blob);
        vt_secs += secs;
        limit_sum += limit;
        ++n;
    }
    double agg = vt_bytes / vt_secs;
    state.SetBytesProcessed(static_cast<std::int64_t>(vt_bytes));
    state.counters["limit_bytes_per_second"] = limit_sum / n;
    state.counters["vs_limit"] = agg / (limit_sum / n);
    for (std::size_t i = 0; i < alone_bw.size(); ++i) state.counters[std::string("B") + std::to_string(i + 1)] = alone_bw[i] / n;
    std::string label;
    for (auto& r : vt.report()) {
        char text[160];
        std::snprintf(text, sizeof text, "%s: %zu keys (est. write %.0f, read %.0f MB/s); ", r.name.c_str(), r.keys,
                      r.write_bandwidth / 1e6, r.read_bandwidth / 1e6);
        label += text;
    }
    state.SetLabel(label);
}

void BM_aggregate(benchmark::State& state) {
    const auto sz = aggregate_sizes();
    const auto count = static_cast<std::size_t>(state.range(0));
    paths p(count);
    virtual_tier_options o;
    o.name = "bench-vt";
    o.probe_nbytes = sz.blob;
    if (count == 2) {
        virtual_tier<thread_lock, file_tier<>&, shm_path&> vt(o, *p.disk, *p.shm[0]);
        run_aggregate(state, vt, p, sz);
    } else {
        virtual_tier<thread_lock, file_tier<>&, shm_path&, shm_path&> vt(o, *p.disk, *p.shm[0], *p.shm[1]);
        run_aggregate(state, vt, p, sz);
    }
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
    auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
    };
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * procs * 4 *
                            static_cast<std::int64_t>(sz.keys * sz.blob));
    state.counters["aggregate_bytes_per_second"] = median(bw);
    state.counters["p50_ms"] = median(p50) * 1e3;
    state.counters["p99_ms"] = median(p99) * 1e3;
    if (alone_bw > 0) state.counters["vs_limit"] = median(bw) / alone_bw;
    state.SetLabel(std::string(node ? "node_lock" : "null_lock") + ", " + std::to_string(procs) + " processes");
}

}  // namespace

BENCHMARK(BM_aggregate)->Arg(2)->Arg(3)->UseManualTime()->Unit(benchmark::kMillisecond)
    ->Iterations(spillway::bench::smoke() ? 1 : 3);
BENCHMARK(BM_contention)->Args({2, 0})->Args({2, 1})->Args({4, 0})->Args({4, 1})->UseManualTime()
    ->Unit(benchmark::kMillisecond)->Iterations(spillway::bench::smoke() ? 1 : 3);

BENCHMARK_MAIN();
