// SPDX-License-Identifier: Apache-2.0
// bench_cuda: the CUDA path against limits measured in the same run (needs a GPU; without
// one every benchmark reports itself skipped, "no usable CUDA device").
//
// - pinned_h2d / pinned_d2h: copy bandwidth from and to pinned host memory against the
//   card's PCIe link, read from sysfs (current_link_speed and _width of the GPU's PCI
//   device, read while a copy runs): link_GBps = GT/s x lanes x encoding (128/130 from
//   8 GT/s, 8/10 below) / 8, per direction; vs_limit = measured / link_GBps (no goal). Where
//   sysfs shows no link, or one slower than the copy measured (a VM's virtual link), the
//   label says so and vs_limit is left out. pageable_h2d: the same copy from pageable
//   memory, vs_limit = its bandwidth over the pinned one, timed in the same iteration.
// - staged_disk_to_device: stage_to_device from a file tier (O_DIRECT where the file system
//   allows) into device memory; in every iteration the two hops are also timed alone with
//   the same chunks and slots: the tier reads into the pinned slots, and the host-to-device
//   copies out of them. vs_limit = the slower hop's time / the staged time (goal >= 0.9).
// - device_adam: cuda::adamw_step (fp16 grads, fp16 compute copy, no scan) against a
//   device-to-device copy of the same bytes (the step reads 14 and writes 14 bytes per
//   parameter; the copy moves 14 bytes per parameter, read and written). vs_limit = copy
//   time / step time (goal >= 0.8).
// - device_stash_overhead: a memory-bound training loop, the same work two ways in every
//   iteration (alternating which goes first); see "The device stash's loop" below. Goal:
//   overhead <= 5% at >= 45% lower device-memory peak where the compute covers the copies.
// The GPU (name, memory, driver and runtime versions, PCIe link, nvidia-smi's line) is in
// the JSON context. Copy and Adam times come from CUDA events (manual time); the stash
// rows from the wall clock around a whole step. Use --benchmark_repetitions and medians.
// Exit status 1 when a row failed (a CUDA or tier error, a wrong gradient); rows skipped
// for want of a GPU are not failures.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>
#include <thrust/execution_policy.h>
#include <thrust/functional.h>
#include <thrust/reduce.h>

#include <spillway/cuda/cuda_error.hpp>
#include <spillway/cuda/device_stash.hpp>
#include <spillway/cuda/pinned_buffer.hpp>
#include <spillway/cuda/staged_copy.hpp>
#include <spillway/cuda/stream_policy.hpp>
#include <spillway/cuda/thrust_optim.hpp>
#include <spillway/stash/activation_stash.hpp>
#include <spillway/tier/file_tier.hpp>
#include <spillway/tier/host_tier.hpp>

#include "support/bench_env.hpp"

namespace {
namespace sc = spillway::cuda;
using spillway::float16;
using clock_type = std::chrono::steady_clock;

constexpr std::size_t MiB = std::size_t{1} << 20;

bool have_gpu(benchmark::State& state) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        cudaGetLastError();  // the failed query is answered here
        state.SkipWithError("no usable CUDA device");
        return false;
    }
    return true;
}

/// Rows that failed in this run (the exit status).
int failed_rows = 0;

/// Ends the row as failed with `why` (Google Benchmark's error; the exit status becomes 1).
void fail(benchmark::State& state, const char* why) {
    ++failed_rows;
    state.SkipWithError(why);
}

/// Runs a benchmark's body; an exception (a CUDA or tier error) fails the row with its
/// message instead of ending the program. The body's RAII owners free what it held.
template <class Fn>
void guarded(benchmark::State& state, Fn&& body) {
    try {
        body();
    } catch (const std::exception& e) {
        fail(state, e.what());
    }
}

/// Device memory freed at scope exit.
struct device_bytes {
    explicit device_bytes(std::size_t n) {
        sc::check_cuda(cudaMalloc(&ptr, n == 0 ? 1 : n), "cudaMalloc", "bench buffer of " + std::to_string(n) + " bytes");
    }
    ~device_bytes() { cudaFree(ptr); }
    device_bytes(const device_bytes&) = delete;
    device_bytes& operator=(const device_bytes&) = delete;
    void* ptr = nullptr;
};

/// A non-blocking stream, synchronised and destroyed at scope exit.
class stream_owner {
public:
    stream_owner() {
        sc::check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags",
                       "bench stream");
    }
    ~stream_owner() {
        cudaStreamSynchronize(stream_);
        cudaStreamDestroy(stream_);
    }
    stream_owner(const stream_owner&) = delete;
    stream_owner& operator=(const stream_owner&) = delete;
    [[nodiscard]] cudaStream_t get() const noexcept { return stream_; }

private:
    cudaStream_t stream_ = nullptr;
};

/// A timing event, destroyed at scope exit.
class timing_event {
public:
    timing_event() { sc::check_cuda(cudaEventCreate(&event_), "cudaEventCreate", "bench timing event"); }
    ~timing_event() { cudaEventDestroy(event_); }
    timing_event(const timing_event&) = delete;
    timing_event& operator=(const timing_event&) = delete;
    void record(cudaStream_t s) { sc::check_cuda(cudaEventRecord(event_, s), "cudaEventRecord", "bench timing event"); }
    /// Seconds from `earlier` to this event; both recorded, this one complete.
    [[nodiscard]] double seconds_since(const timing_event& earlier) const {
        float ms = 0;
        sc::check_cuda(cudaEventElapsedTime(&ms, earlier.event_, event_), "cudaEventElapsedTime", "bench timing");
        return ms / 1e3;
    }
    [[nodiscard]] cudaEvent_t get() const noexcept { return event_; }

private:
    cudaEvent_t event_ = nullptr;
};

/// Times work enqueued on `stream` by `enqueue` with CUDA events, in seconds.
template <class Fn>
double time_on(cudaStream_t stream, Fn&& enqueue) {
    timing_event a, b;
    a.record(stream);
    enqueue();
    b.record(stream);
    sc::check_cuda(cudaEventSynchronize(b.get()), "cudaEventSynchronize", "bench timing");
    return b.seconds_since(a);
}
double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

void copy_async(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind, cudaStream_t s, const char* what) {
    sc::check_cuda(cudaMemcpyAsync(dst, src, n, kind, s), "cudaMemcpyAsync", what);
}

int current_device() {
    int device = 0;
    sc::check_cuda(cudaGetDevice(&device), "cudaGetDevice", "bench_cuda");
    return device;
}

// ---- The PCIe link ------------------------------------------------------------------------

/// The GPU's PCIe link as sysfs shows it (/sys/bus/pci/devices/<address>/).
struct pcie_link {
    std::string address;  // "0000:3b:00.0"
    double gts = 0;       // current_link_speed, GT/s per lane (0: not shown)
    int width = 0;        // current_link_width, lanes
    double max_gts = 0;   // max_link_speed
    int max_width = 0;    // max_link_width
    std::string problem;  // why nothing was read (empty when the current link was)
};

std::string first_line(const std::filesystem::path& path) {
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);
    return line;
}

/// "32.0 GT/s PCIe" -> 32.0; "Unknown", "" -> 0.
double parse_gts(const std::string& text) {
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    return end != text.c_str() && std::isfinite(v) && v > 0 ? v : 0.0;
}
int parse_width(const std::string& text) {
    char* end = nullptr;
    const long v = std::strtol(text.c_str(), &end, 10);
    return end != text.c_str() && v > 0 && v <= 64 ? static_cast<int>(v) : 0;
}

pcie_link read_pcie_link(int device) {
    pcie_link link;
    char bus_id[64] = {};
    if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device) != cudaSuccess) {
        cudaGetLastError();
        link.problem = "cudaDeviceGetPCIBusId failed";
        return link;
    }
    // CUDA writes "0000:3B:00.0" or "00000000:3B:00.0"; sysfs names it "0000:3b:00.0".
    unsigned domain = 0, bus = 0, dev = 0, fn = 0;
    if (std::sscanf(bus_id, "%x:%x:%x.%x", &domain, &bus, &dev, &fn) != 4) {
        link.problem = std::string("PCI bus id '") + bus_id + "' not understood";
        return link;
    }
    char address[32];
    std::snprintf(address, sizeof address, "%04x:%02x:%02x.%x", domain, bus, dev, fn);
    link.address = address;
    const std::filesystem::path dir = std::filesystem::path("/sys/bus/pci/devices") / address;
    link.gts = parse_gts(first_line(dir / "current_link_speed"));
    link.width = parse_width(first_line(dir / "current_link_width"));
    link.max_gts = parse_gts(first_line(dir / "max_link_speed"));
    link.max_width = parse_width(first_line(dir / "max_link_width"));
    if (link.gts == 0 || link.width == 0)
        link.problem = "sysfs shows no PCIe link for " + link.address + " (a VM may hide it)";
    return link;
}

/// Data bytes per second and direction of a link, in GB/s: GT/s x lanes x encoding / 8.
/// Encoding: 8b/10b below 8 GT/s, 128b/130b from 8 GT/s (PCIe 3 to 5), FLIT (242/256) from
/// 64 GT/s (PCIe 6). Packet headers are not subtracted: real copies reach about 80-90%.
double link_GBps(double gts, int width) {
    if (gts <= 0 || width <= 0) return 0;
    const double encoding = gts >= 64 ? 242.0 / 256.0 : gts >= 8 ? 128.0 / 130.0 : 8.0 / 10.0;
    return gts * width * encoding / 8.0;
}

/// The PCIe generation of a per-lane rate (0 when it is none of them).
int pcie_gen(double gts) {
    const double rates[] = {2.5, 5, 8, 16, 32, 64};
    for (int g = 0; g < 6; ++g)
        if (std::fabs(gts - rates[g]) < 0.1) return g + 1;
    return 0;
}

std::string link_text(double gts, int width) {
    char text[64];
    const int gen = pcie_gen(gts);
    if (gen > 0) std::snprintf(text, sizeof text, "PCIe Gen%d x%d (%.1f GT/s)", gen, width, gts);
    else std::snprintf(text, sizeof text, "PCIe x%d at %.1f GT/s", width, gts);
    return text;
}

/// The limit of a copy measured at `measured_GBps` on `link`: the current link's rate; the
/// maximum link's where the current one reads slower than the copy ran (a link that idled
/// down between the copy and the read); none where even that is slower (sysfs does not show
/// the real link). Fills the row's label and counters.
void report_link(benchmark::State& state, const pcie_link& link, double measured_GBps) {
    if (!link.problem.empty()) {
        state.SetLabel("PCIe limit unknown: " + link.problem);
        return;
    }
    double limit = link_GBps(link.gts, link.width);
    std::string text = link_text(link.gts, link.width);
    if (limit < measured_GBps) {
        const double max_limit = link_GBps(link.max_gts, link.max_width);
        if (max_limit >= measured_GBps) {
            text = link_text(link.max_gts, link.max_width) + ", its max (read at " + link_text(link.gts, link.width) +
                   ", slower than the copy ran)";
            limit = max_limit;
            state.counters["pcie_gen"] = pcie_gen(link.max_gts);
            state.counters["pcie_width"] = link.max_width;
        } else {
            state.SetLabel("PCIe limit unknown: sysfs shows " + link_text(link.gts, link.width) +
                           ", slower than the copy ran (a VM's virtual link?)");
            return;
        }
    } else {
        state.counters["pcie_gen"] = pcie_gen(link.gts);
        state.counters["pcie_width"] = link.width;
    }
    state.counters["link_GBps"] = limit;
    state.counters["vs_limit"] = measured_GBps / limit;
    char rate[32];
    std::snprintf(rate, sizeof rate, ": %.1f GB/s", limit);
    state.SetLabel(text + rate);
}

// ---- The GPU in the JSON context -----------------------------------------------------------

std::string cuda_version_text(int v) {
    return v <= 0 ? std::string("none") : std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

/// nvidia-smi's line for the GPUs (name, memory, driver, PCIe generation and width), or "".
std::string nvidia_smi_line() {
    FILE* p = popen("timeout 10 nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,"
                    "pcie.link.width.max --format=csv,noheader 2>/dev/null",
                    "r");
    if (!p) return {};
    std::string out;
    char buf[256];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    for (auto& c : out)
        if (c == '\n') c = ';';  // one line per GPU
    return out;
}

/// Adds the GPU (device 0, the one every row uses), the CUDA versions and nvidia-smi's line
/// to Google Benchmark's context, so the JSON report names what it measured.
void add_gpu_context() {
    int driver = 0, runtime = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
    if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = 0;
    benchmark::AddCustomContext("cuda_driver", cuda_version_text(driver));
    benchmark::AddCustomContext("cuda_runtime", cuda_version_text(runtime));
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0) {
        cudaGetLastError();
        benchmark::AddCustomContext("gpu", std::string("no usable CUDA device (") +
                                               (err != cudaSuccess ? cudaGetErrorName(err) : "none found") + ")");
        return;
    }
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
        benchmark::AddCustomContext("gpu_model", prop.name);
        char text[64];
        std::snprintf(text, sizeof text, "%.1f", static_cast<double>(prop.totalGlobalMem) / (1u << 30));
        benchmark::AddCustomContext("gpu_memory_GiB", text);
        benchmark::AddCustomContext("gpu_compute_capability",
                                    std::to_string(prop.major) + "." + std::to_string(prop.minor));
        benchmark::AddCustomContext("gpu_sm_count", std::to_string(prop.multiProcessorCount));
    } else {
        cudaGetLastError();
    }
    const pcie_link link = read_pcie_link(0);
    if (link.max_gts > 0 && link.max_width > 0) {
        char rate[32];
        std::snprintf(rate, sizeof rate, ", %.1f GB/s per direction", link_GBps(link.max_gts, link.max_width));
        benchmark::AddCustomContext("gpu_pcie", link.address + ": max " + link_text(link.max_gts, link.max_width) + rate);
    } else {
        benchmark::AddCustomContext("gpu_pcie", link.problem.empty() ? "sysfs shows no maximum link" : link.problem);
    }
    if (auto smi = nvidia_smi_line(); !smi.empty()) benchmark::AddCustomContext("nvidia_smi", smi);
}

// ---- Copies ---------------------------------------------------------------------------------

std::size_t copy_bytes() { return spillway::bench::smoke() ? 8 * MiB : 512 * MiB; }

void pinned_copy(benchmark::State& state, cudaMemcpyKind kind) {
    if (!have_gpu(state)) return;
    guarded(state, [&] {
        const std::size_t n = copy_bytes();
        sc::pinned_buffer host(n);
        std::memset(host.data(), 1, n);
        device_bytes dev(n);
        stream_owner stream;
        const cudaStream_t s = stream.get();
        auto copy = [&] {
            if (kind == cudaMemcpyHostToDevice) copy_async(dev.ptr, host.data(), n, kind, s, "pinned copy to the device");
            else copy_async(host.data(), dev.ptr, n, kind, s, "pinned copy to the host");
        };
        double total = 0;
        for (auto _ : state) {
            const double t = time_on(s, copy);
            state.SetIterationTime(t);
            total += t;
        }
        state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n));
        // The link is read while one more copy runs: an idle GPU's link may train down.
        copy();
        const pcie_link link = read_pcie_link(current_device());
        sc::check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize", "pinned copy");
        const double measured = static_cast<double>(n) * static_cast<double>(state.iterations()) / total / 1e9;
        state.counters["GBps"] = measured;
        report_link(state, link, measured);
    });
}
void pinned_h2d(benchmark::State& state) { pinned_copy(state, cudaMemcpyHostToDevice); }
void pinned_d2h(benchmark::State& state) { pinned_copy(state, cudaMemcpyDeviceToHost); }

void pageable_h2d(benchmark::State& state) {
    if (!have_gpu(state)) return;
    guarded(state, [&] {
        const std::size_t n = copy_bytes();
        std::vector<std::byte> pageable(n, std::byte{1});
        sc::pinned_buffer pinned(n);
        std::memset(pinned.data(), 1, n);
        device_bytes dev(n);
        stream_owner stream;
        const cudaStream_t s = stream.get();
        double pinned_total = 0, pageable_total = 0;
        for (auto _ : state) {
            const double t = time_on(s, [&] {
                copy_async(dev.ptr, pageable.data(), n, cudaMemcpyHostToDevice, s, "pageable copy to the device");
            });
            state.SetIterationTime(t);
            pageable_total += t;
            pinned_total += time_on(s, [&] {
                copy_async(dev.ptr, pinned.data(), n, cudaMemcpyHostToDevice, s, "pinned copy to the device");
            });
        }
        state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n));
        state.counters["vs_limit"] = pinned_total / pageable_total;
    });
}

// ---- Staged disk-to-device ----------------------------------------------------------------

void staged_disk_to_device(benchmark::State& state) {
    if (!have_gpu(state)) return;
    guarded(state, [&] {
        const std::size_t slots = static_cast<std::size_t>(state.range(0));
        const std::size_t chunk = static_cast<std::size_t>(state.range(1)) * MiB;
        const std::size_t n = spillway::bench::smoke() ? 16 * MiB : 1024 * MiB;
        auto dir = spillway::bench::scratch_dir() / "cuda_staged";
        std::filesystem::create_directories(dir);
        spillway::file_tier<> tier(dir);
        // Erases the staged blob when the row ends, an error included (before the tier goes).
        struct erase_at_exit {
            spillway::file_tier<>& tier;
            ~erase_at_exit() {
                try {
                    sc::erase_staged(tier, "blob");
                } catch (...) {  // a scratch file left behind is not worth a second error
                }
            }
        } cleanup{tier};
        sc::staging_ring ring(chunk, slots);
        device_bytes dev(n);
        stream_owner stream;
        const cudaStream_t s = stream.get();
        sc::check_cuda(cudaMemsetAsync(dev.ptr, 7, n, s), "cudaMemsetAsync", "staged source");
        sc::stage_from_device(tier, "blob", dev.ptr, n, s, ring);
        const std::size_t count = sc::chunk_count(n, chunk);
        auto len = [&](std::size_t k) { return std::min(chunk, n - k * chunk); };
        double disk_total = 0, pcie_total = 0, staged_total = 0;
        for (auto _ : state) {
            // The tier hop alone: the same chunk reads into the same slots, `slots` in flight.
            auto t0 = clock_type::now();
            {
                std::vector<spillway::io_completion> reads(slots);
                for (std::size_t k = 0; k < count; ++k) {
                    auto& r = reads[k % slots];
                    if (r.valid()) r.wait();
                    r = tier.read(sc::chunk_key("blob", k), ring.buffer(k % slots).bytes().first(len(k)));
                }
                for (auto& r : reads)
                    if (r.valid()) r.wait();
            }
            disk_total += seconds_since(t0);
            // The PCIe hop alone: the same chunk copies out of the slots.
            pcie_total += time_on(s, [&] {
                for (std::size_t k = 0; k < count; ++k)
                    copy_async(static_cast<std::byte*>(dev.ptr) + k * chunk, ring.buffer(k % slots).data(), len(k),
                               cudaMemcpyHostToDevice, s, "PCIe hop alone");
            });
            // Both, overlapped.
            t0 = clock_type::now();
            sc::stage_to_device(tier, "blob", dev.ptr, n, s, ring);
            sc::check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize", "stage_to_device");
            const double t = seconds_since(t0);
            staged_total += t;
            state.SetIterationTime(t);
        }
        const double moved = static_cast<double>(n) * static_cast<double>(state.iterations());
        state.SetBytesProcessed(static_cast<std::int64_t>(moved));
        state.counters["disk_GBps"] = moved / disk_total / 1e9;
        state.counters["pcie_GBps"] = moved / pcie_total / 1e9;
        state.counters["staged_GBps"] = moved / staged_total / 1e9;
        state.counters["vs_limit"] = std::max(disk_total, pcie_total) / staged_total;
    });
}

// ---- Device AdamW ---------------------------------------------------------------------------

void device_adam(benchmark::State& state) {
    if (!have_gpu(state)) return;
    guarded(state, [&] {
        const std::size_t n = spillway::bench::smoke() ? (std::size_t{1} << 20) : (std::size_t{1} << 27);
        const std::size_t bytes_per_param = 14;  // read p, m, v (12) + g (2); written: p, m, v + copy
        device_bytes p(n * 4), m(n * 4), v(n * 4), g(n * 2), copy(n * 2), copy_src(n * bytes_per_param),
            copy_dst(n * bytes_per_param);
        stream_owner stream;
        const cudaStream_t s = stream.get();
        sc::check_cuda(cudaMemsetAsync(p.ptr, 0, n * 4, s), "cudaMemsetAsync", "params");
        sc::check_cuda(cudaMemsetAsync(m.ptr, 0, n * 4, s), "cudaMemsetAsync", "m");
        sc::check_cuda(cudaMemsetAsync(v.ptr, 0, n * 4, s), "cudaMemsetAsync", "v");
        sc::check_cuda(cudaMemsetAsync(g.ptr, 0x21, n * 2, s), "cudaMemsetAsync", "grads");  // small finite fp16
        sc::check_cuda(cudaMemsetAsync(copy_src.ptr, 0, n * bytes_per_param, s), "cudaMemsetAsync", "copy source");
        const auto policy = sc::stream_policy(s);
        spillway::adamw_config config;
        double adam_total = 0, copy_total = 0;
        std::int64_t step = 0;
        for (auto _ : state) {
            spillway::adamw_step_args args{.step = ++step, .check = spillway::grad_check::caller_verified};
            const double t = time_on(s, [&] {
                sc::adamw_step(policy, config, args, std::span<float>(static_cast<float*>(p.ptr), n),
                               std::span<float>(static_cast<float*>(m.ptr), n),
                               std::span<float>(static_cast<float*>(v.ptr), n),
                               std::span<const float16>(static_cast<const float16*>(g.ptr), n),
                               std::span<float16>(static_cast<float16*>(copy.ptr), n));
            });
            state.SetIterationTime(t);
            adam_total += t;
            copy_total += time_on(s, [&] {
                copy_async(copy_dst.ptr, copy_src.ptr, n * bytes_per_param, cudaMemcpyDeviceToDevice, s,
                           "device-to-device copy");
            });
        }
        state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * n));
        state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n * 2 * bytes_per_param));
        state.counters["vs_limit"] = copy_total / adam_total;
    });
}

// ---- The device stash's loop ------------------------------------------------------------
//
// A training loop of L layers over activations of A bytes (uint32 words), memory-bound:
//   forward, layer l: act[l] = f(act[l-1]) (act[-1] = the input), then P - 1 more passes of
//     f over act[l] in place; every pass reads and writes A bytes.
//   loss: grad = act[L-1] (a device-to-device copy).
//   backward, layer l = L-1 .. 0: P passes of grad = g(grad ^ act[l]); each reads 2A bytes
//     and writes A.
// keep-all: every activation has its own device buffer (L x A).
// stash: K = 3 device buffers, layer l's activation in buffer l % K. The activations of
//   layers 0 .. L-K-1 go through a device_stash over an activation_stash<host_tier>
//   (split_mode::offload_all): save() after the layer's forward; wait_copied() before its
//   buffer is reused K layers later; in backward, at layer l, prefetch() of layer l-K+1
//   into its buffer (the one layer l+1, already enqueued, read), load() before the layer's
//   passes, release() after them. The last K layers' activations are still in their
//   buffers when backward starts, so they are not stashed (a trainer would not offload
//   what backward uses first).
// Both keep the input and the gradient (2A). Peak device bytes: keep-all (L + 2) x A, stash
// (K + 2) x A; both are also measured (cudaMemGetInfo before and after each allocation).
// A step is timed by the wall clock from its first launch to the end of backward, with the
// compute stream synchronised and the stash flushed (the stash's work runs on host threads
// and a side stream). Every step ends with a checksum of the gradient (a wrapping sum of
// its words); every stash step must give keep-all's, else the row fails.
// The stash's copies are also timed alone (saves with no compute, then loads), and
// covers = min over forward and backward of (keep-all's time per layer / one copy's time):
// from 1 up, the compute per layer is long enough to hide a copy. P = 0 (the row
// "passes:0") sizes the loop to the stash: P = ceil(1.25 x what makes covers 1), capped at
// 1024, chosen once per run: hiding the copies then needs 80% of the stash's bandwidth.

constexpr int stash_buffers = 3;  // K
constexpr double auto_margin = 1.25;
constexpr int auto_max_passes = 1024;

__device__ __forceinline__ std::uint32_t mix(std::uint32_t x, std::uint32_t salt) {
    x ^= x >> 15;
    x *= 0x2C1B3C6Du;
    x ^= x >> 12;
    return x + salt;
}

// in, out: n uint4 each (in == out for a pass in place).
__global__ void forward_pass(const uint4* in, uint4* out, std::size_t n, std::uint32_t salt) {
    const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const uint4 v = in[i];
    out[i] = make_uint4(mix(v.x, salt), mix(v.y, salt + 1u), mix(v.z, salt + 2u), mix(v.w, salt + 3u));
}

// act, grad: n uint4 each; grad = g(grad ^ act).
__global__ void backward_pass(const uint4* act, uint4* grad, std::size_t n, std::uint32_t salt) {
    const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const uint4 a = act[i];
    const uint4 g = grad[i];
    grad[i] = make_uint4(mix(g.x ^ a.x, salt), mix(g.y ^ a.y, salt + 1u), mix(g.z ^ a.z, salt + 2u),
                         mix(g.w ^ a.w, salt + 3u));
}

// out: n uint4; word w = w * 2654435761 + 0x9E3779B9 (mod 2^32).
__global__ void fill_pattern(uint4* out, std::size_t n) {
    const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const auto w = static_cast<std::uint32_t>(4 * i);
    out[i] = make_uint4(w * 2654435761u + 0x9E3779B9u, (w + 1u) * 2654435761u + 0x9E3779B9u,
                        (w + 2u) * 2654435761u + 0x9E3779B9u, (w + 3u) * 2654435761u + 0x9E3779B9u);
}

constexpr unsigned threads_per_block = 256;

std::size_t free_device_bytes() {
    std::size_t free = 0, total = 0;
    sc::check_cuda(cudaMemGetInfo(&free, &total), "cudaMemGetInfo", "device memory in use");
    return free;
}

/// One step's times (seconds) and the gradient's checksum.
struct step_time {
    double wall = 0;      // first launch to the end of backward (stash flushed)
    double forward = 0;   // CUDA events on the compute stream
    double backward = 0;
    std::uint32_t checksum = 0;
    /// Adds o's times (the checksum stays: sums of steps have none).
    step_time& operator+=(const step_time& o) {
        wall += o.wall;
        forward += o.forward;
        backward += o.backward;
        return *this;
    }
};

/// Both variants' buffers, the compute stream and the stash.
class stash_loop {
public:
    stash_loop(int layers, std::size_t bytes) : layers_(layers), bytes_(bytes), n4_(bytes / 16) {
        spillway::expect_argument(layers > stash_buffers && bytes % 16 == 0 && bytes > 0,
                                  "stash_loop: layers > 3 and a multiple of 16 bytes");
        const std::size_t f0 = free_device_bytes();
        input_ = std::make_unique<device_bytes>(bytes);
        grad_ = std::make_unique<device_bytes>(bytes);
        const std::size_t f1 = free_device_bytes();
        for (int l = 0; l < layers; ++l) keep_.push_back(std::make_unique<device_bytes>(bytes));
        const std::size_t f2 = free_device_bytes();
        for (int k = 0; k < stash_buffers; ++k) slots_.push_back(std::make_unique<device_bytes>(bytes));
        const std::size_t f3 = free_device_bytes();
        measured_shared_ = f0 > f1 ? f0 - f1 : 0;
        measured_keep_ = f1 > f2 ? f1 - f2 : 0;
        measured_slots_ = f2 > f3 ? f2 - f3 : 0;
        fill_pattern<<<blocks(), threads_per_block, 0, s()>>>(static_cast<uint4*>(input_->ptr), n4_);
        check_launch("fill_pattern");
        for (int l = 0; l < layers; ++l) {
            spillway::tensor_desc d;
            d.name = "act" + std::to_string(l);
            d.storage_id = static_cast<std::uint64_t>(l + 1);
            d.type = spillway::dtype::i32;
            d.shape = {static_cast<std::int64_t>(bytes / 4)};
            descs_.push_back(std::move(d));
        }
        sc::check_cuda(cudaStreamSynchronize(s()), "cudaStreamSynchronize", "stash loop set-up");
    }

    [[nodiscard]] int layers() const noexcept { return layers_; }
    [[nodiscard]] int stashed() const noexcept { return layers_ - stash_buffers; }
    [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
    [[nodiscard]] std::size_t measured_keep_all() const noexcept { return measured_shared_ + measured_keep_; }
    [[nodiscard]] std::size_t measured_stash() const noexcept { return measured_shared_ + measured_slots_; }

    /// One step with every activation in its own buffer.
    step_time run_keep_all(int passes) {
        step_time t;
        const auto t0 = clock_type::now();
        start_.record(s());
        for (int l = 0; l < layers_; ++l) forward_layer(l == 0 ? input_->ptr : keep_[l - 1]->ptr, keep_[l]->ptr, l, passes);
        copy_async(grad_->ptr, keep_[layers_ - 1]->ptr, bytes_, cudaMemcpyDeviceToDevice, s(), "loss gradient");
        middle_.record(s());
        for (int l = layers_ - 1; l >= 0; --l) backward_layer(keep_[l]->ptr, l, passes);
        end_.record(s());
        sc::check_cuda(cudaStreamSynchronize(s()), "cudaStreamSynchronize", "keep-all step");
        t.wall = seconds_since(t0);
        finish(t);
        return t;
    }

    /// One step with K buffers and the device stash (see the loop's comment).
    step_time run_stash(int passes) {
        step_time t;
        std::vector<sc::device_handle> handles(static_cast<std::size_t>(layers_));
        const auto t0 = clock_type::now();
        start_.record(s());
        for (int l = 0; l < layers_; ++l) {
            if (l >= stash_buffers) stash_.wait_copied(handles[l - stash_buffers]);  // its buffer is reused now
            forward_layer(l == 0 ? input_->ptr : slot(l - 1), slot(l), l, passes);
            if (l < stashed()) {
                stash_.begin_layer(static_cast<std::uint32_t>(l));
                handles[l] = stash_.save(descs_[l], slot(l), s());
                stash_.end_layer();
            }
        }
        copy_async(grad_->ptr, slot(layers_ - 1), bytes_, cudaMemcpyDeviceToDevice, s(), "loss gradient");
        middle_.record(s());
        stash_.start_backward();
        for (int l = layers_ - 1; l >= 0; --l) {
            // K-1 layers ahead, into the buffer of layer l + 1, whose backward is enqueued
            // (the prefetch's copies wait for it).
            const int ahead = l - (stash_buffers - 1);
            if (ahead >= 0 && ahead < stashed()) stash_.prefetch(handles[ahead], slot(ahead), s());
            if (l < stashed()) stash_.load(handles[l], slot(l), s());
            backward_layer(slot(l), l, passes);
            if (l < stashed()) stash_.release(handles[l]);
        }
        end_.record(s());
        sc::check_cuda(cudaStreamSynchronize(s()), "cudaStreamSynchronize", "stash step");
        stash_.flush();
        t.wall = seconds_since(t0);
        finish(t);
        return t;
    }

    /// The stash's copies with no compute: {seconds to copy the stashed activations out,
    /// seconds to bring them back}, in the order and with the prefetch distance of run_stash.
    std::pair<double, double> copies_alone() {
        std::vector<sc::device_handle> handles(static_cast<std::size_t>(stashed()));
        auto t0 = clock_type::now();
        for (int l = 0; l < stashed(); ++l) {
            if (l >= stash_buffers) stash_.wait_copied(handles[l - stash_buffers]);
            stash_.begin_layer(static_cast<std::uint32_t>(l));
            handles[l] = stash_.save(descs_[l], slot(l), s());
            stash_.end_layer();
        }
        for (int l = std::max(0, stashed() - stash_buffers); l < stashed(); ++l) stash_.wait_copied(handles[l]);
        const double out = seconds_since(t0);
        t0 = clock_type::now();
        stash_.start_backward();
        for (int l = stashed() - 1; l >= 0; --l) {
            const int ahead = l - (stash_buffers - 1);
            if (ahead >= 0) stash_.prefetch(handles[ahead], slot(ahead), s());
            stash_.load(handles[l], slot(l), s());
            stash_.release(handles[l]);
        }
        sc::check_cuda(cudaStreamSynchronize(s()), "cudaStreamSynchronize", "stash copies alone");
        stash_.flush();
        return {out, seconds_since(t0)};
    }

private:
    static spillway::stash_options host_options() {
        spillway::stash_options o;
        o.split = spillway::split_mode::offload_all;
        o.keep_below_bytes = 0;  // every activation goes to the tier, whatever its size
        return o;
    }
    static sc::device_stash_options device_options() {
        sc::device_stash_options o;
        o.chunk_bytes = sc::staging_ring::default_chunk_bytes;
        o.staging_slots = 2;
        return o;
    }

    [[nodiscard]] cudaStream_t s() const noexcept { return stream_.get(); }
    [[nodiscard]] void* slot(int layer) const noexcept { return slots_[static_cast<std::size_t>(layer % stash_buffers)]->ptr; }
    [[nodiscard]] unsigned blocks() const noexcept {
        return static_cast<unsigned>((n4_ + threads_per_block - 1) / threads_per_block);
    }
    static void check_launch(const char* what) { sc::check_cuda(cudaGetLastError(), "kernel launch", what); }
    static std::uint32_t salt(int layer, int pass) {
        return static_cast<std::uint32_t>(layer) * 1000003u + static_cast<std::uint32_t>(pass);
    }

    void forward_layer(const void* in, void* out, int layer, int passes) {
        forward_pass<<<blocks(), threads_per_block, 0, s()>>>(static_cast<const uint4*>(in), static_cast<uint4*>(out),
                                                             n4_, salt(layer, 0));
        check_launch("forward_pass");
        for (int p = 1; p < passes; ++p) {
            forward_pass<<<blocks(), threads_per_block, 0, s()>>>(static_cast<const uint4*>(out),
                                                                 static_cast<uint4*>(out), n4_, salt(layer, p));
            check_launch("forward_pass");
        }
    }
    void backward_layer(const void* act, int layer, int passes) {
        for (int p = 0; p < passes; ++p) {
            backward_pass<<<blocks(), threads_per_block, 0, s()>>>(static_cast<const uint4*>(act),
                                                                  static_cast<uint4*>(grad_->ptr), n4_,
                                                                  salt(layer, p) ^ 0xA5A5A5A5u);
            check_launch("backward_pass");
        }
    }
    // The phases' GPU times and the gradient's checksum, after the step's synchronisation.
    void finish(step_time& t) {
        t.forward = middle_.seconds_since(start_);
        t.backward = end_.seconds_since(middle_);
        const auto* g = static_cast<const std::uint32_t*>(grad_->ptr);
        // Waits for the stream up to the reduction (stream_policy: scratch ordered on it).
        t.checksum = thrust::reduce(sc::stream_policy(s()), g, g + bytes_ / 4, std::uint32_t{0},
                                    thrust::plus<std::uint32_t>());
    }

    int layers_;
    std::size_t bytes_, n4_;
    // Declared before the stash so that they outlive it (its destructor finishes its copies).
    stream_owner stream_;
    timing_event start_, middle_, end_;
    std::unique_ptr<device_bytes> input_, grad_;
    std::vector<std::unique_ptr<device_bytes>> keep_, slots_;
    std::size_t measured_shared_ = 0, measured_keep_ = 0, measured_slots_ = 0;
    std::vector<spillway::tensor_desc> descs_;
    spillway::host_tier tier_;
    spillway::activation_stash<spillway::host_tier> host_{tier_, host_options()};
    sc::device_stash<spillway::host_tier> stash_{host_, device_options()};
};

/// Passes per layer that make covers = auto_margin (see the loop's comment), from a short
/// keep-all probe and the copies timed alone; chosen once per loop shape and run.
int auto_passes(stash_loop& loop, std::pair<double, double> copies) {
    static std::map<std::pair<int, std::size_t>, int> chosen;
    const auto key = std::make_pair(loop.layers(), loop.bytes());
    if (auto it = chosen.find(key); it != chosen.end()) return it->second;
    constexpr int probe_passes = 8;
    loop.run_keep_all(probe_passes);  // the first step loads the kernels
    const step_time probe = loop.run_keep_all(probe_passes);
    const double passes_per_layer = static_cast<double>(loop.layers()) * probe_passes;
    const double fwd_pass = probe.forward / passes_per_layer, bwd_pass = probe.backward / passes_per_layer;
    const double copy_out = copies.first / loop.stashed(), copy_in = copies.second / loop.stashed();
    const double need = auto_margin * std::max(copy_out / fwd_pass, copy_in / bwd_pass);
    const int passes = static_cast<int>(std::clamp(std::ceil(need), 1.0, static_cast<double>(auto_max_passes)));
    chosen.emplace(key, passes);
    return passes;
}

void device_stash_overhead(benchmark::State& state) {
    if (!have_gpu(state)) return;
    guarded(state, [&] {
        const bool smoke = spillway::bench::smoke();
        stash_loop loop(smoke ? 6 : 16, smoke ? 4 * MiB : 64 * MiB);
        loop.copies_alone();  // the first round faults in the host stash's buffers
        const auto copies = loop.copies_alone();
        int passes = static_cast<int>(state.range(0));
        if (passes == 0) {
            passes = auto_passes(loop, copies);
            state.SetLabel("sized to the stash: " + std::to_string(passes) + " passes");
        }
        // Untimed warm-up (kernels loaded, pools filled) and the check.
        const step_time reference = loop.run_keep_all(passes);
        if (loop.run_stash(passes).checksum != reference.checksum) {
            fail(state, "the stash's backward computed another gradient than keep-all's");
            return;
        }
        step_time keep_sum, stash_sum;
        int step = 0;
        for (auto _ : state) {
            step_time a, b;
            if (step % 2 == 0) {  // alternate the order: neither variant always follows the other
                a = loop.run_keep_all(passes);
                b = loop.run_stash(passes);
            } else {
                b = loop.run_stash(passes);
                a = loop.run_keep_all(passes);
            }
            if (a.checksum != reference.checksum || b.checksum != reference.checksum) {
                fail(state, "a step computed another gradient than the first keep-all step");
                return;
            }
            state.SetIterationTime(b.wall);
            keep_sum += a;
            stash_sum += b;
            ++step;
        }
        const double steps = static_cast<double>(state.iterations());
        const double L = loop.layers(), A = static_cast<double>(loop.bytes());
        const double K = stash_buffers;
        const double keep_s = keep_sum.wall / steps, stash_s = stash_sum.wall / steps;
        state.counters["passes"] = passes;
        state.counters["layers"] = L;
        state.counters["stashed_layers"] = loop.stashed();
        state.counters["buffers"] = K;
        state.counters["MiB"] = A / MiB;
        state.counters["keep_all_s"] = keep_s;
        state.counters["stash_s"] = stash_s;
        state.counters["overhead"] = stash_s / keep_s - 1.0;
        state.counters["vs_limit"] = keep_s / stash_s;
        state.counters["fwd_overhead"] = stash_sum.forward / keep_sum.forward - 1.0;
        state.counters["bwd_overhead"] = stash_sum.backward / keep_sum.backward - 1.0;
        const double peak_keep = (L + 2) * A, peak_stash = (K + 2) * A;
        state.counters["peak_bytes_keep_all"] = peak_keep;
        state.counters["peak_bytes_stash"] = peak_stash;
        state.counters["peak_reduction"] = 1.0 - peak_stash / peak_keep;
        state.counters["device_bytes_keep_all"] = static_cast<double>(loop.measured_keep_all());
        state.counters["device_bytes_stash"] = static_cast<double>(loop.measured_stash());
        // The stash's bandwidth alone against what hiding one copy per layer needs.
        const double layer_fwd = keep_sum.forward / steps / L, layer_bwd = keep_sum.backward / steps / L;
        const double copy_out = copies.first / loop.stashed(), copy_in = copies.second / loop.stashed();
        state.counters["layer_ms"] = layer_fwd * 1e3;
        state.counters["stash_out_GBps"] = A / copy_out / 1e9;
        state.counters["stash_in_GBps"] = A / copy_in / 1e9;
        state.counters["need_GBps"] = A / std::min(layer_fwd, layer_bwd) / 1e9;
        state.counters["covers"] = std::min(layer_fwd / copy_out, layer_bwd / copy_in);
        state.SetBytesProcessed(static_cast<std::int64_t>(2.0 * loop.stashed() * A * steps));
    });
}
}  // namespace

BENCHMARK(pinned_h2d)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(pinned_d2h)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(pageable_h2d)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(staged_disk_to_device)
    ->ArgNames({"slots", "chunk_MiB"})
    ->Args({2, 4})
    ->Args({3, 4})
    ->Args({2, 16})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(device_adam)->UseManualTime()->Unit(benchmark::kMillisecond);
// passes:0 is sized to the stash's bandwidth (see the loop's comment).
BENCHMARK(device_stash_overhead)
    ->ArgNames({"passes"})
    ->Arg(16)
    ->Arg(64)
    ->Arg(256)
    ->Arg(0)
    ->Iterations(spillway::bench::smoke() ? 1 : 3)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
    add_gpu_context();
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    if (failed_rows > 0) {
        std::fprintf(stderr, "bench_cuda: %d row(s) failed (ERROR OCCURRED above)\n", failed_rows);
        return 1;
    }
    return 0;
}
