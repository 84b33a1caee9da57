// SPDX-License-Identifier: Apache-2.0
// examples/gpu_offload: an MLP (L hidden layers of width H) trained the ZeRO-Offload way,
// with every Spillway CUDA piece in the path, within a device-memory budget, and the same
// training on the CPU only to prove the GPU path changes nothing.
//
// Where everything lives in the GPU run:
// - the fp16 compute copy of every layer's weights: pinned host memory (the optimizer
//   writes it there); the device holds only a ring of K weight slots;
// - the fp16 gradients: pinned host memory; the device holds G gradient slots;
// - the saved activations: the device stash (through a host stash to a file tier); the
//   device holds A activation buffers;
// - the optimizer state (fp32 params, m, v): a host tier, or a file tier (--optimizer-dir).
// K, G and A come from --device-budget (layer_ring.hpp; without a budget every layer keeps
// its own weight slot); a budget below the minimum is refused.
//
// GPU run, per step:
//  1. Make the batch (x, t) in pinned host memory.
//  2. The forward and backward pass (offload_step.hpp, whose header has the protocol):
//     weights stream into the slots on a copy stream ahead of the layer that needs them, a
//     slot refilled only after the compute that used it finished; each layer's gradients
//     leave through a gradient slot on a second copy stream; the hidden pre-activations go
//     through the device stash and come back ahead of backward. It returns once the
//     gradients and the per-sample losses are in pinned host memory.
//  3. The optimizer on the CPU: update_pipeline runs AdamW over subgroups of the fp32 state
//     kept on its tier and writes the new fp16 weights into the pinned compute copy, from
//     which the next step's loads read.
//  4. Record the step's figures: wall time, the GPU pass, the optimizer, the time compute
//     waited for copies, the bytes moved and the device memory in use (cudaMemGetInfo,
//     sampled after the forward pass is enqueued and after the step).
// At the end the run reports the model's size against the device budget, the device bytes
// it allocated and the memory in use measured by the driver, and the step's figures.
// CPU-only run: the same kernels with thrust::host on host memory, the whole model and its
// activations in memory, the same optimizer. With --mode both the program compares the two
// runs' losses and final params bit for bit and fails when they differ.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include <thrust/execution_policy.h>

#include <spillway/cuda/device_stash.hpp>
#include <spillway/cuda/pinned_buffer.hpp>
#include <spillway/cuda/stream_policy.hpp>
#include <spillway/optim/update_pipeline.hpp>
#include <spillway/thread_pool.hpp>
#include <spillway/tier/file_tier.hpp>
#include <spillway/tier/host_tier.hpp>

#include "layer_ring.hpp"
#include "mlp_step.hpp"
#include "offload_step.hpp"

namespace {
// Using-declarations, not `using namespace spillway`: nvcc's generated code names the
// global ::cuda namespace, which spillway::cuda would make ambiguous.
using spillway::activation_stash;
using spillway::file_tier;
using spillway::float16;
using spillway::from_float;
using spillway::host_tier;
using spillway::pipeline_config;
using spillway::split_mode;
using spillway::step_result;
using spillway::update_pipeline;
using gpu_offload::format_bytes;
using gpu_offload::mlp_shape;
using gpu_offload::mlp_tensors;
using gpu_offload::ring_plan;
namespace sc = spillway::cuda;
using clock_type = std::chrono::steady_clock;

constexpr float loss_scale = 1024.0f;

struct run_options {
    int steps = 20;
    std::string mode = "both";  // gpu, cpu or both
    std::uint32_t seed = 1;
    std::filesystem::path dir;  // activation files; empty: a temporary directory
    mlp_shape shape;
    std::size_t device_budget = gpu_offload::no_budget;
    std::filesystem::path optimizer_dir;  // empty: the optimizer state on a host tier
    float lr = 0;                         // 0: the default for the width
    std::filesystem::path report;         // the GPU run's report as JSON; empty: none
    bool plan_only = false;               // print the model and the device plan, run nothing
    int device = 0;                       // the CUDA device of the GPU run
};

/// The learning rate: --lr, else 2e-3 for one hidden layer of up to 1024 (2e-3 * 1024 / H
/// when wider). Adam's first steps move every weight by about lr in the direction of its
/// gradient's sign, and a relu layer's inputs are all positive, so its outputs move by about
/// lr times its fan-in, and the layers' moves compound: deeper models get
/// min(2e-3, 0.1 / (H sqrt(L / 2))) (measured on the CPU with up to 16 hidden layers and
/// widths up to 8192: 4 to 10 times more makes the loss jump in step 2).
float learning_rate(const run_options& o) {
    if (o.lr > 0) return o.lr;
    const float h = static_cast<float>(o.shape.hidden), l = static_cast<float>(o.shape.layers);
    if (o.shape.layers == 1) return 2e-3f * std::min(1.0f, 1024.0f / h);
    return std::min(2e-3f, 0.1f / (h * std::sqrt(l / 2.0f)));
}

/// splitmix64: a counter-based generator, so the initial params need no sequential state.
std::uint64_t mix(std::uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/// The model's initial params and a fixed linear teacher for the targets.
struct problem {
    mlp_shape s;
    std::uint32_t seed;
    std::vector<float> teacher;  // (I, O)
    problem(const mlp_shape& shape, std::uint32_t seed_value) : s(shape), seed(seed_value) {
        std::mt19937 rng(seed);
        std::uniform_real_distribution<float> tv(-0.1f, 0.1f);
        teacher.resize(s.in * s.out);
        for (auto& v : teacher) v = tv(rng);
    }
    /// The fp32 initial params: W_l uniform in +-sqrt(6 / fan_in) for the hidden layers (the
    /// relu halves the variance), +-sqrt(3 / fan_in) for the output layer; biases 0. Each
    /// value depends only on the seed and its index, so the threads' split does not matter.
    [[nodiscard]] std::vector<float> initial_params() const {
        std::vector<float> p(s.params(), 0.0f);
        const std::uint64_t key = mix(seed);
        for (std::size_t l = 0; l <= s.layers; ++l) {
            const float bound = std::sqrt((l < s.layers ? 6.0f : 3.0f) / static_cast<float>(s.fan_in(l)));
            const std::size_t first = s.offset(l);
            spillway::thread_pool::shared_pool().parallel_for(
                s.fan_in(l) * s.fan_out(l),
                [&](std::size_t begin, std::size_t end) {
                    for (std::size_t i = first + begin; i < first + end; ++i) {
                        const float u = static_cast<float>(mix(key ^ i) >> 40) * 0x1p-24f;  // [0, 1)
                        p[i] = (2.0f * u - 1.0f) * bound;
                    }
                },
                std::size_t{1} << 16);
        }
        return p;
    }
    /// The batch of step `step`: x uniform in [-1, 1], t = x * teacher (host arithmetic, the
    /// same for both runs).
    void batch(int step, float* x, float* t) const {
        std::mt19937 rng(1000 + static_cast<std::uint32_t>(step));
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        for (std::size_t i = 0; i < s.batch * s.in; ++i) x[i] = u(rng);
        for (std::size_t b = 0; b < s.batch; ++b)
            for (std::size_t k = 0; k < s.out; ++k) {
                float acc = 0.0f;
                for (std::size_t i = 0; i < s.in; ++i) acc = fmaf(x[b * s.in + i], teacher[i * s.out + k], acc);
                t[b * s.out + k] = acc;
            }
    }
};

pipeline_config optimizer_config(const mlp_shape& s, float lr) {
    pipeline_config c;
    c.param_count = s.params();
    // 64 subgroups or more; 64 Ki to 4 Mi params each (48 MiB of fp32 state per buffer).
    c.subgroup_size = std::clamp<std::size_t>(s.params() / 64, 65536, std::size_t{1} << 22);
    c.host_buffers = 4;
    c.adam.lr = lr;
    return c;
}

/// copy[i] = fp16 of params[i], on the shared thread pool.
void to_compute_copy(std::span<const float> params, std::span<float16> copy) {
    spillway::thread_pool::shared_pool().parallel_for(
        params.size(),
        [&](std::size_t begin, std::size_t end) {
            for (std::size_t i = begin; i < end; ++i) copy[i] = from_float<float16>(params[i]);
        },
        std::size_t{1} << 16);
}

float mean_loss(const float* sample_loss, const mlp_shape& s) {
    double sum = 0;
    for (std::size_t b = 0; b < s.batch; ++b) sum += sample_loss[b];
    return static_cast<float>(sum / static_cast<double>(s.batch * s.out));
}

struct run_result {
    std::vector<float> losses;
    std::vector<float16> params;  // the final compute copy (only with --mode both)
    int skipped_steps = 0;        // steps the optimizer skipped (fp16 overflow)
};

/// The CUDA side of offloaded_pass (offload_step.hpp): streams, events and device memory it
/// owns and frees, calls checked with check_cuda.
class cuda_gpu {
public:
    using stream_type = cudaStream_t;
    using event_type = cudaEvent_t;

    cuda_gpu() = default;
    cuda_gpu(const cuda_gpu&) = delete;
    cuda_gpu& operator=(const cuda_gpu&) = delete;
    ~cuda_gpu() {
        cudaDeviceSynchronize();
        for (auto e : events_) cudaEventDestroy(e);
        for (auto s : streams_) cudaStreamDestroy(s);
        for (auto p : memory_) cudaFree(p);
    }

    stream_type make_stream() {
        cudaStream_t s = nullptr;
        sc::check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", "gpu_offload");
        streams_.push_back(s);
        return s;
    }
    event_type make_event(gpu_offload::event_use use) {
        cudaEvent_t e = nullptr;
        const unsigned flags = use == gpu_offload::event_use::timing ? cudaEventDefault : cudaEventDisableTiming;
        sc::check_cuda(cudaEventCreateWithFlags(&e, flags), "cudaEventCreateWithFlags", "gpu_offload");
        events_.push_back(e);
        return e;
    }
    std::byte* allocate(std::size_t nbytes) {
        void* p = nullptr;
        sc::check_cuda(cudaMalloc(&p, nbytes), "cudaMalloc", "gpu_offload: device buffers of " + format_bytes(nbytes));
        memory_.push_back(p);
        allocated_ += nbytes;
        return static_cast<std::byte*>(p);
    }
    void copy(void* dst, const void* src, std::size_t nbytes, stream_type s) {
        sc::check_cuda(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, s), "cudaMemcpyAsync",
                       "gpu_offload: " + format_bytes(nbytes));
    }
    void record(event_type e, stream_type s) {
        sc::check_cuda(cudaEventRecord(e, s), "cudaEventRecord", "gpu_offload");
    }
    void wait(stream_type s, event_type e) {
        sc::check_cuda(cudaStreamWaitEvent(s, e, 0), "cudaStreamWaitEvent", "gpu_offload");
    }
    template <class Fn>
    void run(stream_type s, Fn&& fn) {
        fn(sc::stream_policy(s));
    }
    void synchronize(stream_type s) {
        sc::check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize", "gpu_offload");
    }
    float elapsed_ms(event_type from, event_type to) {
        float ms = 0;
        sc::check_cuda(cudaEventElapsedTime(&ms, from, to), "cudaEventElapsedTime", "gpu_offload");
        return ms;
    }
    /// Device bytes allocated through allocate().
    [[nodiscard]] std::size_t allocated_bytes() const noexcept { return allocated_; }

private:
    std::vector<cudaStream_t> streams_;
    std::vector<cudaEvent_t> events_;
    std::vector<void*> memory_;
    std::size_t allocated_ = 0;
};

/// Device memory in use on the current device (total - free, cudaMemGetInfo: every
/// process's allocations and the contexts).
std::size_t device_used(std::size_t* total = nullptr) {
    std::size_t free_b = 0, total_b = 0;
    sc::check_cuda(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo", "gpu_offload");
    if (total) *total = total_b;
    return total_b - free_b;
}

/// This process's peak resident host memory (VmHWM), 0 where /proc is missing.
std::size_t peak_rss() {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("VmHWM:", 0) == 0) return static_cast<std::size_t>(std::stoull(line.substr(6))) * 1024;
    return 0;
}

double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

/// The figures a GPU run reports.
struct gpu_report {
    std::string device;
    ring_plan plan;
    std::size_t minimum_bytes = 0;
    std::size_t allocated = 0;
    std::size_t mem_total = 0, mem_before = 0, mem_peak = 0;
    std::vector<double> step_s, pass_s, gpu_ms, optimizer_s, wait_weights_ms, wait_grads_ms, wait_activations_ms;
    gpu_offload::pass_stats bytes;  // the last step's byte counts
    std::size_t activations_offloaded = 0;
    std::string activation_tier, optimizer_tier;
    std::size_t host_peak = 0;
};

/// The per-step figures from step 2 on (step 1 also pays for first touches and lazy kernel
/// loading), or step 1 alone.
std::vector<double> steady(const std::vector<double>& v) {
    return v.size() > 1 ? std::vector<double>(v.begin() + 1, v.end()) : v;
}

void print_report(const gpu_report& g, const run_options& o, const run_result& r) {
    const mlp_shape& s = o.shape;
    const auto& p = g.plan;
    const double w_ms = median(steady(g.wait_weights_ms)), gr_ms = median(steady(g.wait_grads_ms)),
                 a_ms = median(steady(g.wait_activations_ms)), gpu = median(steady(g.gpu_ms));
    std::printf("gpu report (%s):\n", g.device.c_str());
    std::printf("  model: %zu params: %zu hidden layers of %zu (in %zu, out %zu), batch %zu; fp16 weights %s,"
                " AdamW state %s on %s\n",
                s.params(), s.layers, s.hidden, s.in, s.out, s.batch, format_bytes(s.params() * 2).c_str(),
                format_bytes(s.params() * 12).c_str(), g.optimizer_tier.c_str());
    std::printf("  device budget: %s; plan: %zu of %zu layers' weight slots (%s), %zu gradient slots, %zu activation"
                " buffers; minimum %s\n",
                o.device_budget == gpu_offload::no_budget ? "none" : format_bytes(o.device_budget).c_str(),
                p.weight_slots, p.layers, p.streams_weights() ? "weights stream" : "every layer resident",
                p.grad_slots, p.activation_buffers, format_bytes(g.minimum_bytes).c_str());
    const std::size_t grown = g.mem_peak > g.mem_before ? g.mem_peak - g.mem_before : 0;
    std::printf("  device memory: allocated by the run %s (own accounting%s); in use (cudaMemGetInfo) before the run"
                " %s, peak %s, peak - before %s%s, device total %s\n",
                format_bytes(g.allocated).c_str(),
                o.device_budget == gpu_offload::no_budget ? ""
                : g.allocated <= o.device_budget  ? ", within the budget"
                                                  : ", OVER THE BUDGET",
                format_bytes(g.mem_before).c_str(), format_bytes(g.mem_peak).c_str(), format_bytes(grown).c_str(),
                o.device_budget == gpu_offload::no_budget ? ""
                : grown <= o.device_budget         ? " (within the budget)"
                                                   : " (over the budget: CUDA's own allocations, kernels and streams)",
                format_bytes(g.mem_total).c_str());
    std::printf("  step time (median of %zu): %.3f s = GPU pass %.3f s (compute stream %.1f ms) + optimizer %.3f s;"
                " step 1 %.3f s\n",
                steady(g.step_s).size(), median(steady(g.step_s)), median(steady(g.pass_s)), gpu,
                median(steady(g.optimizer_s)), g.step_s.front());
    std::printf("  streamed per step: weights in %s, gradients out %s, activations out %s and in %s, batch %s\n",
                format_bytes(g.bytes.weight_bytes_in).c_str(), format_bytes(g.bytes.grad_bytes_out).c_str(),
                format_bytes(g.bytes.activation_bytes_out).c_str(), format_bytes(g.bytes.activation_bytes_in).c_str(),
                format_bytes(g.bytes.batch_bytes).c_str());
    std::printf("  compute waiting for copies per step (median): weights %.1f ms, gradient slots %.1f ms,"
                " activations %.1f ms: %.1f%% of the compute stream's time\n",
                w_ms, gr_ms, a_ms, gpu > 0 ? 100.0 * (w_ms + gr_ms + a_ms) / gpu : 0.0);
    std::printf("  activations offloaded %s in all through %s; host memory peak (VmHWM) %s; skipped steps %d\n",
                format_bytes(g.activations_offloaded).c_str(), g.activation_tier.c_str(),
                format_bytes(g.host_peak).c_str(), r.skipped_steps);
    if (o.report.empty()) return;
    std::FILE* f = std::fopen(o.report.c_str(), "w");
    if (!f) throw std::runtime_error("cannot write --report " + o.report.string());
    std::fprintf(f, "{\n  \"device\": \"%s\",\n", g.device.c_str());
    std::fprintf(f, "  \"model\": {\"params\": %zu, \"layers\": %zu, \"hidden\": %zu, \"in\": %zu, \"out\": %zu, "
                    "\"batch\": %zu, \"weight_bytes_fp16\": %zu, \"optimizer_state_bytes\": %zu, "
                    "\"optimizer_tier\": \"%s\"},\n",
                 s.params(), s.layers, s.hidden, s.in, s.out, s.batch, s.params() * 2, s.params() * 12,
                 g.optimizer_tier.c_str());
    if (o.device_budget == gpu_offload::no_budget)
        std::fprintf(f, "  \"device_budget\": null,\n");
    else
        std::fprintf(f, "  \"device_budget\": %zu,\n", o.device_budget);
    std::fprintf(f, "  \"plan\": {\"layers\": %zu, \"weight_slots\": %zu, \"grad_slots\": %zu, "
                    "\"activation_buffers\": %zu, \"minimum_bytes\": %zu},\n",
                 p.layers, p.weight_slots, p.grad_slots, p.activation_buffers, g.minimum_bytes);
    std::fprintf(f, "  \"device_bytes_allocated\": %zu,\n", g.allocated);
    std::fprintf(f, "  \"device_memory\": {\"total\": %zu, \"used_before\": %zu, \"peak_used\": %zu},\n", g.mem_total,
                 g.mem_before, g.mem_peak);
    std::fprintf(f, "  \"steps\": %d,\n  \"step_seconds_median\": %.6f,\n  \"pass_seconds_median\": %.6f,\n"
                    "  \"gpu_ms_median\": %.3f,\n  \"optimizer_seconds_median\": %.6f,\n  \"step1_seconds\": %.6f,\n",
                 o.steps, median(steady(g.step_s)), median(steady(g.pass_s)), gpu, median(steady(g.optimizer_s)),
                 g.step_s.front());
    std::fprintf(f, "  \"copy_wait_ms_per_step\": {\"weights\": %.3f, \"grads\": %.3f, \"activations\": %.3f},\n", w_ms,
                 gr_ms, a_ms);
    std::fprintf(f, "  \"streamed_bytes_per_step\": {\"weights_in\": %zu, \"grads_out\": %zu, \"activations_out\": %zu, "
                    "\"activations_in\": %zu, \"batch\": %zu},\n",
                 g.bytes.weight_bytes_in, g.bytes.grad_bytes_out, g.bytes.activation_bytes_out,
                 g.bytes.activation_bytes_in, g.bytes.batch_bytes);
    std::fprintf(f, "  \"host_peak_rss\": %zu,\n  \"skipped_steps\": %d,\n", g.host_peak, r.skipped_steps);
    std::fprintf(f, "  \"loss_first\": %.7g,\n  \"loss_last\": %.7g\n}\n", static_cast<double>(r.losses.front()),
                 static_cast<double>(r.losses.back()));
    std::fclose(f);
    std::printf("  report written to %s\n", o.report.c_str());
}

template <class Tier>
run_result run_gpu(const problem& pb, const run_options& o, Tier& optimizer_tier, const std::string& tier_name) {
    const mlp_shape& s = pb.s;
    sc::check_cuda(cudaSetDevice(o.device), "cudaSetDevice", "gpu_offload: --device " + std::to_string(o.device));
    sc::check_cuda(cudaFree(nullptr), "cudaFree", "gpu_offload: creating the context");
    gpu_report rep;
    {
        cudaDeviceProp prop{};
        sc::check_cuda(cudaGetDeviceProperties(&prop, o.device), "cudaGetDeviceProperties", "gpu_offload");
        rep.device = prop.name;
    }
    rep.mem_before = device_used(&rep.mem_total);
    rep.mem_peak = rep.mem_before;
    rep.plan = gpu_offload::plan_ring(gpu_offload::ring_sizes_of(s), s.linear_layers(), o.device_budget);
    rep.minimum_bytes = gpu_offload::minimum_plan(rep.plan.sizes, rep.plan.layers).device_bytes();
    rep.optimizer_tier = tier_name;

    // The compute copy and the gradients in pinned host memory; the optimizer state on its
    // tier, initialised from fp32 params that are dropped once both exist.
    sc::pinned_buffer copy_buf(s.params() * sizeof(float16)), grads_buf(s.params() * sizeof(float16));
    std::span<float16> copy = copy_buf.as<float16>(), grads = grads_buf.as<float16>();
    std::optional<update_pipeline<Tier, float16, float16>> optimizer;
    {
        std::vector<float> init = pb.initial_params();
        optimizer.emplace(optimizer_tier, optimizer_config(s, learning_rate(o)), init);
        to_compute_copy(init, copy);
    }
    std::vector<float, sc::pinned_allocator<float>> x(s.batch * s.in), t(s.batch * s.out), loss(s.batch);

    std::filesystem::path dir = o.dir.empty() ? std::filesystem::temp_directory_path() / ("gpu_offload-" + std::to_string(::getpid())) : o.dir;
    std::filesystem::create_directories(dir);
    run_result r;
    {
        file_tier<> activation_tier(dir);
        activation_stash<file_tier<>> host_stash(activation_tier, {.keep_below_bytes = 4096, .split = split_mode::offload_all});
        sc::device_stash<file_tier<>> stash(host_stash, {.device = o.device});
        cuda_gpu gpu;
        gpu_offload::offloaded_pass<cuda_gpu, sc::device_stash<file_tier<>>> pass(gpu, stash, s, rep.plan, loss_scale);
        rep.allocated = gpu.allocated_bytes();
        auto sample = [&] { rep.mem_peak = std::max(rep.mem_peak, device_used()); };
        sample();
        for (int step = 1; step <= o.steps; ++step) {
            const auto t0 = clock_type::now();
            pb.batch(step, x.data(), t.data());  // 1.
            const gpu_offload::pass_stats st =   // 2.
                pass.run(static_cast<std::uint64_t>(step), x.data(), t.data(), copy.data(), grads.data(), loss.data(), sample);
            sample();
            r.losses.push_back(mean_loss(loss.data(), s));
            const auto t1 = clock_type::now();
            if (optimizer->update(grads, copy, {.grad_scale = loss_scale}) == step_result::skipped_overflow)  // 3.
                ++r.skipped_steps;
            const auto t2 = clock_type::now();
            rep.step_s.push_back(std::chrono::duration<double>(t2 - t0).count());  // 4.
            rep.pass_s.push_back(std::chrono::duration<double>(t1 - t0).count());
            rep.optimizer_s.push_back(std::chrono::duration<double>(t2 - t1).count());
            rep.gpu_ms.push_back(st.gpu_ms);
            rep.wait_weights_ms.push_back(st.wait_weights_ms);
            rep.wait_grads_ms.push_back(st.wait_grads_ms);
            rep.wait_activations_ms.push_back(st.wait_activations_ms);
            rep.bytes = st;
        }
        stash.flush();
        rep.activations_offloaded = host_stash.stats().bytes_offloaded;
        rep.activation_tier = activation_tier.name();
    }
    if (o.dir.empty()) std::filesystem::remove_all(dir);
    rep.host_peak = peak_rss();
    print_report(rep, o, r);
    if (o.mode == "both") r.params.assign(copy.begin(), copy.end());
    return r;
}

template <class Tier>
run_result run_cpu(const problem& pb, const run_options& o, Tier& optimizer_tier) {
    const mlp_shape& s = pb.s;
    std::vector<float16> params(s.params()), grads(s.params());
    std::optional<update_pipeline<Tier, float16, float16>> optimizer;
    {
        std::vector<float> init = pb.initial_params();
        optimizer.emplace(optimizer_tier, optimizer_config(s, learning_rate(o)), init);
        to_compute_copy(init, params);
    }
    std::vector<float> x(s.batch * s.in), t(s.batch * s.out), hidden(s.layers * s.batch * s.hidden), y(s.batch * s.out),
        loss(s.batch), d0(s.backward_elements()), d1(s.backward_elements());
    mlp_tensors m{.s = s, .x = x.data(), .t = t.data(), .params = params.data(), .hidden = hidden.data(), .y = y.data(),
                  .sample_loss = loss.data(), .d0 = d0.data(), .d1 = d1.data(), .grads = grads.data(),
                  .dy_coef = 2.0f * loss_scale / static_cast<float>(s.batch * s.out)};
    run_result r;
    for (int step = 1; step <= o.steps; ++step) {
        pb.batch(step, x.data(), t.data());
        gpu_offload::forward(thrust::host, m);
        gpu_offload::backward(thrust::host, m);
        r.losses.push_back(mean_loss(loss.data(), s));
        if (optimizer->update(grads, params, {.grad_scale = loss_scale}) == step_result::skipped_overflow)
            ++r.skipped_steps;
    }
    r.params = std::move(params);
    return r;
}

/// Runs `fn(tier)` with the optimizer state on a file tier in `dir`, or on a host tier
/// when `dir` is empty.
template <class Fn>
run_result with_optimizer_tier(const std::filesystem::path& dir, Fn fn) {
    if (dir.empty()) {
        host_tier tier;
        return fn(tier, std::string("host memory (host_tier)"));
    }
    std::filesystem::create_directories(dir);
    file_tier<> tier(dir);
    return fn(tier, tier.name() + " (file_tier)");
}

constexpr const char* usage =
    "gpu_offload [--steps N] [--mode gpu|cpu|both] [--seed S] [--dir DIR]\n"
    "            [--layers L] [--hidden H] [--in I] [--out O] [--batch B] [--lr LR]\n"
    "            [--device-budget BYTES] [--optimizer-dir DIR] [--report FILE] [--plan-only]\n"
    "            [--device N]\n"
    "  Trains an MLP of L hidden layers of width H (default 1, 1024; in 256, out 64, batch\n"
    "  64) for N steps (default 20) with AdamW on the CPU (lr default 2e-3, times\n"
    "  1024/H when wider; min(2e-3, 0.1 / (H sqrt(L/2))) for L > 1).\n"
    "  --mode both (default) runs the GPU step and the CPU-only step and checks that the\n"
    "  losses and final params are identical bit for bit (exit 1 otherwise; exit 77 when\n"
    "  no GPU is found). gpu runs the GPU step only (no CPU reference: for large models),\n"
    "  cpu the CPU-only step.\n"
    "  --device-budget BYTES (e.g. 512M, 2G; K, M, G, T are powers of 1024): the device\n"
    "  memory the GPU run may allocate. The weights of every layer stay in pinned host\n"
    "  memory and stream through a ring of weight slots (as many as the budget holds, at\n"
    "  least 2); a budget below the minimum is refused (exit 2). Without it every layer\n"
    "  keeps its own slot.\n"
    "  --optimizer-dir DIR: the optimizer state (fp32 params, m, v) on a file tier in DIR\n"
    "  instead of host memory (the GPU run's, or the CPU run's with --mode cpu; the CPU\n"
    "  reference of --mode both stays in memory).\n"
    "  --dir DIR: where the device stash writes activations (default: a temporary folder).\n"
    "  --report FILE: the GPU run's report as JSON.\n"
    "  --device N: the CUDA device of the GPU run (default 0; CUDA_VISIBLE_DEVICES renumbers).\n"
    "  --plan-only: print the model's size and the device plan, then exit (no GPU needed).\n"
    "  Exit status: 0 when the loss dropped (and, with both, the runs agree).";

std::size_t positive(const std::string& flag, const std::string& v) {
    std::size_t used = 0;
    unsigned long long n = 0;
    try {
        n = std::stoull(v, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    if (used != v.size() || n == 0 || n > (1ull << 24) || v[0] == '-')
        throw std::invalid_argument(flag + " " + v + ": expected a whole number from 1 to 16777216");
    return static_cast<std::size_t>(n);
}

run_options parse(int argc, char** argv) {
    run_options o;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
            return argv[++i];
        };
        if (a == "--steps") o.steps = std::stoi(value());
        else if (a == "--mode") o.mode = value();
        else if (a == "--seed") o.seed = static_cast<std::uint32_t>(std::stoul(value()));
        else if (a == "--dir") o.dir = value();
        else if (a == "--layers") o.shape.layers = positive(a, value());
        else if (a == "--hidden") o.shape.hidden = positive(a, value());
        else if (a == "--in") o.shape.in = positive(a, value());
        else if (a == "--out") o.shape.out = positive(a, value());
        else if (a == "--batch") o.shape.batch = positive(a, value());
        else if (a == "--lr") o.lr = std::stof(value());
        else if (a == "--device-budget") o.device_budget = gpu_offload::parse_bytes(a, value());
        else if (a == "--optimizer-dir") o.optimizer_dir = value();
        else if (a == "--report") o.report = value();
        else if (a == "--plan-only") o.plan_only = true;
        else if (a == "--device") o.device = static_cast<int>(std::stoul(value()));
        else if (a == "--help") {
            std::puts(usage);
            std::exit(0);
        } else
            throw std::invalid_argument("unknown argument " + a + " (see --help)");
    }
    if (o.steps < 1) throw std::invalid_argument("--steps must be >= 1");
    if (o.mode != "gpu" && o.mode != "cpu" && o.mode != "both")
        throw std::invalid_argument("--mode " + o.mode + ": expected gpu, cpu or both");
    if (!(o.lr >= 0) || !std::isfinite(o.lr)) throw std::invalid_argument("--lr must be a positive number (0: the default)");
    const mlp_shape& s = o.shape;
    if (s.hidden > 65536 || s.in > 65536 || s.out > 65536 || s.layers > 65536)
        throw std::invalid_argument("--layers, --hidden, --in and --out are at most 65536");
    return o;
}
}  // namespace

int main(int argc, char** argv) try {
    run_options o = parse(argc, argv);
    const mlp_shape& s = o.shape;
    // The plan first: a budget below the minimum is refused on any machine.
    ring_plan plan;
    try {
        plan = gpu_offload::plan_ring(gpu_offload::ring_sizes_of(s), s.linear_layers(), o.device_budget);
    } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(std::string(e.what()) +
                                    "; raise --device-budget or shrink the model (--hidden, --in, --out, --batch)");
    }
    problem pb(s, o.seed);
    std::printf("MLP %zu -> %zu x %zu hidden -> %zu, batch %zu, %zu params (%s fp16), %d steps, lr %g\n", s.in,
                s.layers, s.hidden, s.out, s.batch, s.params(), format_bytes(s.params() * 2).c_str(), o.steps,
                static_cast<double>(learning_rate(o)));
    std::printf("device plan: %zu weight slots for %zu layers (%s), %s each; %zu gradient slots; %zu activation"
                " buffers of %s; %s in all, budget %s\n",
                plan.weight_slots, plan.layers, plan.streams_weights() ? "weights stream" : "all resident",
                format_bytes(plan.sizes.weight_slot).c_str(), plan.grad_slots, plan.activation_buffers,
                format_bytes(plan.sizes.activation).c_str(), format_bytes(plan.device_bytes()).c_str(),
                o.device_budget == gpu_offload::no_budget ? "none" : format_bytes(o.device_budget).c_str());
    if (o.plan_only) return 0;
    run_result gpu, cpu;
    if (o.mode != "cpu") {
        int devices = 0;
        if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
            cudaGetLastError();
            std::fprintf(stderr, "gpu_offload: no usable CUDA device; run with --mode cpu\n");
            return 77;
        }
        gpu = with_optimizer_tier(o.optimizer_dir,
                                  [&](auto& tier, const std::string& name) { return run_gpu(pb, o, tier, name); });
    }
    if (o.mode != "gpu")
        cpu = with_optimizer_tier(o.mode == "cpu" ? o.optimizer_dir : std::filesystem::path(),
                                  [&](auto& tier, const std::string&) { return run_cpu(pb, o, tier); });
    for (int i = 0; i < o.steps; ++i) {
        std::printf("step %3d", i + 1);
        if (!gpu.losses.empty()) std::printf("  loss gpu %.7f", static_cast<double>(gpu.losses[i]));
        if (!cpu.losses.empty()) std::printf("  loss cpu %.7f", static_cast<double>(cpu.losses[i]));
        std::printf("\n");
    }
    const auto& losses = gpu.losses.empty() ? cpu.losses : gpu.losses;
    std::printf("loss %.5f -> %.5f\n", static_cast<double>(losses.front()), static_cast<double>(losses.back()));
    if (o.mode == "both") {
        bool same_loss = std::memcmp(gpu.losses.data(), cpu.losses.data(), gpu.losses.size() * sizeof(float)) == 0;
        bool same_params = gpu.params.size() == cpu.params.size() &&
                           std::memcmp(gpu.params.data(), cpu.params.data(), gpu.params.size() * sizeof(float16)) == 0;
        std::printf("GPU and CPU-only runs: losses %s, final params %s\n", same_loss ? "identical" : "DIFFER",
                    same_params ? "identical" : "DIFFER");
        if (!same_loss || !same_params) return 1;
    }
    return losses.back() < losses.front() ? 0 : 1;
} catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_offload: %s\n", e.what());
    return 2;
}
