// SPDX-License-Identifier: Apache-2.0
// bench_cuda: the CUDA path against limits measured in the same run (needs a GPU; without
// one every benchmark reports itself skipped).
//
// - pinned_h2d / pinned_d2h: copy bandwidth from and to pinned host memory (the PCIe limit
//   every other figure here is bounded by); pageable_h2d: the same copy from pageable memory,
//   vs_limit = its bandwidth over the pinned one, timed in the same iteration.
// - staged_disk_to_device: stage_to_device from a file tier (O_DIRECT where the file system
//   allows) into device memory; in every iteration the two hops are also timed alone with
//   the same chunks and slots: the tier reads into the pinned slots, and the host-to-device
//   copies out of them. vs_limit = the slower hop's time / the staged time (goal >= 0.9).
// - device_adam: cuda::adamw_step (fp16 grads, fp16 compute copy, no scan) against a
//   device-to-device copy of the same bytes (the step reads 14 and writes 14 bytes per
//   parameter; the copy moves 14 bytes per parameter, read and written). vs_limit = copy
//   time / step time (goal >= 0.8).
// Times come from CUDA events (manual time); use --benchmark_repetitions and medians.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <thrust/execution_policy.h>

#include <spillway/cuda/pinned_buffer.hpp>
#include <spillway/cuda/staged_copy.hpp>
#include <spillway/cuda/stream_policy.hpp>
#include <spillway/cuda/thrust_optim.hpp>
#include <spillway/tier/file_tier.hpp>

#include "support/bench_env.hpp"

namespace {
namespace sc = spillway::cuda;
using spillway::float16;
using clock_type = std::chrono::steady_clock;

constexpr std::size_t MiB = std::size_t{1} << 20;

bool have_gpu(benchmark::State& state) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        state.SkipWithError("no usable CUDA device");
        return false;
    }
    return true;
}

/// Device memory freed at scope exit.
struct device_bytes {
    explicit device_bytes(std::size_t n) { sc::check_cuda(cudaMalloc(&ptr, n), "cudaMalloc", "bench buffer"); }
    ~device_bytes() { cudaFree(ptr); }
    device_bytes(const device_bytes&) = delete;
    device_bytes& operator=(const device_bytes&) = delete;
    void* ptr = nullptr;
};

/// Times work enqueued on `stream` by `enqueue` with CUDA events, in seconds.
template <class Fn>
double time_on(cudaStream_t stream, Fn&& enqueue) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaEventRecord(a, stream);
    enqueue();
    cudaEventRecord(b, stream);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms / 1e3;
}
double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

std::size_t copy_bytes() { return spillway::bench::smoke() ? 8 * MiB : 512 * MiB; }

void pinned_copy(benchmark::State& state, cudaMemcpyKind kind) {
    if (!have_gpu(state)) return;
    const std::size_t n = copy_bytes();
    sc::pinned_buffer host(n);
    std::memset(host.data(), 1, n);
    device_bytes dev(n);
    cudaStream_t s;
    cudaStreamCreate(&s);
    for (auto _ : state) {
        double t = time_on(s, [&] {
            if (kind == cudaMemcpyHostToDevice) cudaMemcpyAsync(dev.ptr, host.data(), n, kind, s);
            else cudaMemcpyAsync(host.data(), dev.ptr, n, kind, s);
        });
        state.SetIterationTime(t);
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n));
    cudaStreamDestroy(s);
}
void pinned_h2d(benchmark::State& state) { pinned_copy(state, cudaMemcpyHostToDevice); }
void pinned_d2h(benchmark::State& state) { pinned_copy(state, cudaMemcpyDeviceToHost); }

void pageable_h2d(benchmark::State& state) {
    if (!have_gpu(state)) return;
    const std::size_t n = copy_bytes();
    std::vector<std::byte> pageable(n, std::byte{1});
    sc::pinned_buffer pinned(n);
    std::memset(pinned.data(), 1, n);
    device_bytes dev(n);
    cudaStream_t s;
    cudaStreamCreate(&s);
    double pinned_total = 0, pageable_total = 0;
    for (auto _ : state) {
        double t = time_on(s, [&] { cudaMemcpyAsync(dev.ptr, pageable.data(), n, cudaMemcpyHostToDevice, s); });
        state.SetIterationTime(t);
        pageable_total += t;
        pinned_total += time_on(s, [&] { cudaMemcpyAsync(dev.ptr, pinned.data(), n, cudaMemcpyHostToDevice, s); });
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n));
    state.counters["vs_limit"] = pinned_total / pageable_total;
    cudaStreamDestroy(s);
}

void staged_disk_to_device(benchmark::State& state) {
    if (!have_gpu(state)) return;
    const std::size_t slots = static_cast<std::size_t>(state.range(0));
    const std::size_t chunk = static_cast<std::size_t>(state.range(1)) * MiB;
    const std::size_t n = spillway::bench::smoke() ? 16 * MiB : 1024 * MiB;
    auto dir = spillway::bench::scratch_dir() / "cuda_staged";
    std::filesystem::create_directories(dir);
    spillway::file_tier<> tier(dir);
    sc::staging_ring ring(chunk, slots);
    device_bytes dev(n);
    cudaStream_t s;
    cudaStreamCreate(&s);
    cudaMemsetAsync(dev.ptr, 7, n, s);
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
                cudaMemcpyAsync(static_cast<std::byte*>(dev.ptr) + k * chunk, ring.buffer(k % slots).data(), len(k),
                                cudaMemcpyHostToDevice, s);
        });
        // Both, overlapped.
        t0 = clock_type::now();
        sc::stage_to_device(tier, "blob", dev.ptr, n, s, ring);
        cudaStreamSynchronize(s);
        double t = seconds_since(t0);
        staged_total += t;
        state.SetIterationTime(t);
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n));
    state.counters["disk_GBps"] = static_cast<double>(n) * static_cast<double>(state.iterations()) / disk_total / 1e9;
    state.counters["pcie_GBps"] = static_cast<double>(n) * static_cast<double>(state.iterations()) / pcie_total / 1e9;
    state.counters["vs_limit"] = std::max(disk_total, pcie_total) / staged_total;
    sc::erase_staged(tier, "blob");
    cudaStreamDestroy(s);
}

void device_adam(benchmark::State& state) {
    if (!have_gpu(state)) return;
    const std::size_t n = spillway::bench::smoke() ? (std::size_t{1} << 20) : (std::size_t{1} << 27);
    const std::size_t bytes_per_param = 14;  // read p, m, v (12) + g (2); written: p, m, v + copy
    device_bytes p(n * 4), m(n * 4), v(n * 4), g(n * 2), copy(n * 2), copy_src(n * bytes_per_param),
        copy_dst(n * bytes_per_param);
    cudaStream_t s;
    cudaStreamCreate(&s);
    cudaMemsetAsync(p.ptr, 0, n * 4, s);
    cudaMemsetAsync(m.ptr, 0, n * 4, s);
    cudaMemsetAsync(v.ptr, 0, n * 4, s);
    cudaMemsetAsync(g.ptr, 0x21, n * 2, s);  // small finite fp16 gradients
    auto policy = sc::stream_policy(s);
    spillway::adamw_config config;
    double adam_total = 0, copy_total = 0;
    std::int64_t step = 0;
    for (auto _ : state) {
        spillway::adamw_step_args args{.step = ++step, .check = spillway::grad_check::caller_verified};
        double t = time_on(s, [&] {
            sc::adamw_step(policy, config, args, std::span<float>(static_cast<float*>(p.ptr), n),
                           std::span<float>(static_cast<float*>(m.ptr), n), std::span<float>(static_cast<float*>(v.ptr), n),
                           std::span<const float16>(static_cast<const float16*>(g.ptr), n),
                           std::span<float16>(static_cast<float16*>(copy.ptr), n));
        });
        state.SetIterationTime(t);
        adam_total += t;
        copy_total += time_on(s, [&] {
            cudaMemcpyAsync(copy_dst.ptr, copy_src.ptr, n * bytes_per_param, cudaMemcpyDeviceToDevice, s);
        });
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * n));
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n * 2 * bytes_per_param));
    state.counters["vs_limit"] = copy_total / adam_total;
    cudaStreamDestroy(s);
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
BENCHMARK_MAIN();
