// SPDX-License-Identifier: Apache-2.0
// examples/gpu_offload: one GPU training step the ZeRO-Offload way, with every Spillway CUDA
// piece in the path, and the same step on the CPU only to prove the GPU path changes nothing.
//
// GPU run, per step:
//  1. Upload the batch (x, t) on the compute stream; the fp16 compute copy of the params
//     already sits in device memory.
//  2. Forward layer 1 (h_pre), then hand h_pre to the device stash: it leaves device memory
//     on the side stream after an event on the compute stream (compute does not wait) and
//     goes through the host stash to a file tier.
//  3. Forward layer 2 and the loss; start backward: prefetch brings h_pre back into another
//     device buffer (after the compute work enqueued so far, which may still read it) while
//     dy is computed; load() orders the compute stream after it.
//  4. Backward: fp16 gradients (scaled by the loss scale) in device memory, copied to pinned
//     host memory.
//  5. The optimizer on the CPU: update_pipeline runs AdamW over subgroups of the fp32 state
//     kept on a host tier and writes the fp16 compute copy into pinned memory, which goes
//     back to the device for the next step.
// CPU-only run: the same kernels with thrust::host on host memory, activations kept in
// memory, the same optimizer. With --mode both the program compares the two runs' losses
// and final params bit for bit and fails when they differ.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include <thrust/execution_policy.h>

#include <spillway/cuda/device_stash.hpp>
#include <spillway/cuda/pinned_buffer.hpp>
#include <spillway/cuda/stream_policy.hpp>
#include <spillway/optim/update_pipeline.hpp>
#include <spillway/tier/file_tier.hpp>
#include <spillway/tier/host_tier.hpp>

#include "mlp_step.hpp"

namespace {
// Using-declarations, not `using namespace spillway`: nvcc's generated code names the
// global ::cuda namespace, which spillway::cuda would make ambiguous.
using spillway::activation_stash;
using spillway::dtype;
using spillway::file_tier;
using spillway::float16;
using spillway::from_float;
using spillway::host_tier;
using spillway::pipeline_config;
using spillway::split_mode;
using spillway::tensor_desc;
using spillway::update_pipeline;
using gpu_offload::mlp_shape;
using gpu_offload::mlp_tensors;
namespace sc = spillway::cuda;

constexpr float loss_scale = 1024.0f;

struct run_options {
    int steps = 20;
    std::string mode = "both";  // gpu, cpu or both
    std::uint32_t seed = 1;
    std::filesystem::path dir;  // activation files; empty: a temporary directory
};

/// The model's initial fp32 params and a fixed linear teacher for the targets.
struct problem {
    mlp_shape s;
    std::vector<float> init;
    std::vector<float> teacher;  // (I, O)
    explicit problem(std::uint32_t seed) {
        std::mt19937 rng(seed);
        std::uniform_real_distribution<float> w1(-1.0f / 16, 1.0f / 16), w2(-1.0f / 32, 1.0f / 32), tv(-0.1f, 0.1f);
        init.assign(s.params(), 0.0f);
        for (std::size_t i = s.w1(); i < s.b1(); ++i) init[i] = w1(rng);
        for (std::size_t i = s.w2(); i < s.b2(); ++i) init[i] = w2(rng);
        teacher.resize(s.in * s.out);
        for (auto& v : teacher) v = tv(rng);
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

pipeline_config optimizer_config(const mlp_shape& s) {
    pipeline_config c;
    c.param_count = s.params();
    c.subgroup_size = 65536;
    c.host_buffers = 4;
    c.adam.lr = 2e-3f;
    return c;
}

float mean_loss(const float* sample_loss, const mlp_shape& s) {
    double sum = 0;
    for (std::size_t b = 0; b < s.batch; ++b) sum += sample_loss[b];
    return static_cast<float>(sum / static_cast<double>(s.batch * s.out));
}

struct run_result {
    std::vector<float> losses;
    std::vector<float16> params;  // the final compute copy
};

/// Device memory of `count` T, freed at scope exit.
template <class T>
struct device_array {
    explicit device_array(std::size_t count) {
        sc::check_cuda(cudaMalloc(&ptr, count * sizeof(T)), "cudaMalloc", "gpu_offload: " + std::to_string(count) + " elements");
    }
    ~device_array() { cudaFree(ptr); }
    device_array(const device_array&) = delete;
    device_array& operator=(const device_array&) = delete;
    T* ptr = nullptr;
};

run_result run_gpu(const problem& pb, const run_options& o) {
    const mlp_shape& s = pb.s;
    host_tier optimizer_tier;
    update_pipeline<host_tier, float16, float16> optimizer(optimizer_tier, optimizer_config(s), pb.init);
    std::filesystem::path dir = o.dir.empty() ? std::filesystem::temp_directory_path() / ("gpu_offload-" + std::to_string(::getpid())) : o.dir;
    std::filesystem::create_directories(dir);
    run_result r;
    {
        file_tier<> activation_tier(dir);
        activation_stash<file_tier<>> host_stash(activation_tier, {.keep_below_bytes = 4096, .split = split_mode::offload_all});
        sc::device_stash<file_tier<>> stash(host_stash);
        cudaStream_t compute;
        sc::check_cuda(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), "cudaStreamCreate", "gpu_offload");
        auto policy = sc::stream_policy(compute);  // kernels return once enqueued

        std::vector<float, sc::pinned_allocator<float>> x(s.batch * s.in), t(s.batch * s.out), loss(s.batch);
        std::vector<float16, sc::pinned_allocator<float16>> grads(s.params()), copy(s.params());
        for (std::size_t i = 0; i < s.params(); ++i) copy[i] = from_float<float16>(pb.init[i]);
        device_array<float> dx(x.size()), dt(t.size()), h_pre(s.batch * s.hidden), h_back(s.batch * s.hidden),
            y(s.batch * s.out), dloss(s.batch), dy(s.batch * s.out), dh(s.batch * s.hidden);
        device_array<float16> dparams(s.params()), dgrads(s.params());
        cudaMemcpyAsync(dparams.ptr, copy.data(), s.params() * sizeof(float16), cudaMemcpyHostToDevice, compute);
        mlp_tensors m{.s = s, .x = dx.ptr, .t = dt.ptr, .params = dparams.ptr, .h_pre = h_pre.ptr, .y = y.ptr,
                      .sample_loss = dloss.ptr, .dy = dy.ptr, .dh = dh.ptr, .grads = dgrads.ptr,
                      .dy_coef = 2.0f * loss_scale / static_cast<float>(s.batch * s.out)};
        for (int step = 1; step <= o.steps; ++step) {
            pb.batch(step, x.data(), t.data());  // 1.
            cudaMemcpyAsync(dx.ptr, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice, compute);
            cudaMemcpyAsync(dt.ptr, t.data(), t.size() * sizeof(float), cudaMemcpyHostToDevice, compute);
            stash.begin_layer(0);  // 2.
            m.h_pre = h_pre.ptr;
            gpu_offload::forward_hidden(policy, m);
            tensor_desc desc;
            desc.name = "h_pre";
            desc.storage_id = 1;
            desc.version = static_cast<std::uint64_t>(step);  // a new tensor every step
            desc.type = dtype::f32;
            desc.shape = {static_cast<std::int64_t>(s.batch), static_cast<std::int64_t>(s.hidden)};
            auto saved = stash.save(desc, h_pre.ptr, compute);
            stash.end_layer();
            stash.begin_layer(1);  // 3.
            gpu_offload::forward_output(policy, m);
            stash.end_layer();
            cudaMemcpyAsync(loss.data(), dloss.ptr, loss.size() * sizeof(float), cudaMemcpyDeviceToHost, compute);
            stash.start_backward();
            stash.prefetch(saved, h_back.ptr, compute);
            stash.load(saved, h_back.ptr, compute);
            m.h_pre = h_back.ptr;  // 4.
            gpu_offload::backward(policy, m);
            cudaMemcpyAsync(grads.data(), dgrads.ptr, s.params() * sizeof(float16), cudaMemcpyDeviceToHost, compute);
            sc::check_cuda(cudaStreamSynchronize(compute), "cudaStreamSynchronize", "gpu_offload step " + std::to_string(step));
            stash.release(saved);
            r.losses.push_back(mean_loss(loss.data(), s));
            optimizer.update(grads, copy, {.grad_scale = loss_scale});  // 5.
            cudaMemcpyAsync(dparams.ptr, copy.data(), s.params() * sizeof(float16), cudaMemcpyHostToDevice, compute);
        }
        sc::check_cuda(cudaStreamSynchronize(compute), "cudaStreamSynchronize", "gpu_offload");
        stash.flush();
        auto st = host_stash.stats();
        std::printf("gpu: activations offloaded %.1f MiB through %s, side stream copies overlapped compute\n",
                    static_cast<double>(st.bytes_offloaded) / (1 << 20), activation_tier.name().c_str());
        cudaStreamDestroy(compute);
        r.params.assign(copy.begin(), copy.end());
    }
    if (o.dir.empty()) std::filesystem::remove_all(dir);
    return r;
}

run_result run_cpu(const problem& pb, const run_options& o) {
    const mlp_shape& s = pb.s;
    host_tier optimizer_tier;
    update_pipeline<host_tier, float16, float16> optimizer(optimizer_tier, optimizer_config(s), pb.init);
    std::vector<float> x(s.batch * s.in), t(s.batch * s.out), h_pre(s.batch * s.hidden), y(s.batch * s.out),
        loss(s.batch), dy(s.batch * s.out), dh(s.batch * s.hidden);
    std::vector<float16> params(s.params()), grads(s.params());
    for (std::size_t i = 0; i < s.params(); ++i) params[i] = from_float<float16>(pb.init[i]);
    mlp_tensors m{.s = s, .x = x.data(), .t = t.data(), .params = params.data(), .h_pre = h_pre.data(), .y = y.data(),
                  .sample_loss = loss.data(), .dy = dy.data(), .dh = dh.data(), .grads = grads.data(),
                  .dy_coef = 2.0f * loss_scale / static_cast<float>(s.batch * s.out)};
    run_result r;
    for (int step = 1; step <= o.steps; ++step) {
        pb.batch(step, x.data(), t.data());
        gpu_offload::forward_hidden(thrust::host, m);
        gpu_offload::forward_output(thrust::host, m);
        gpu_offload::backward(thrust::host, m);
        r.losses.push_back(mean_loss(loss.data(), s));
        optimizer.update(grads, params, {.grad_scale = loss_scale});
    }
    r.params = std::move(params);
    return r;
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
        else if (a == "--help") {
            std::puts("gpu_offload [--steps N] [--mode gpu|cpu|both] [--seed S] [--dir DIR]\n"
                      "  both (default) runs the GPU step and the CPU-only step and checks that the\n"
                      "  losses and final params are identical bit for bit (exit 1 otherwise;\n"
                      "  exit 77 when no GPU is found).");
            std::exit(0);
        } else
            throw std::invalid_argument("unknown argument " + a + " (see --help)");
    }
    if (o.steps < 1) throw std::invalid_argument("--steps must be >= 1");
    if (o.mode != "gpu" && o.mode != "cpu" && o.mode != "both")
        throw std::invalid_argument("--mode " + o.mode + ": expected gpu, cpu or both");
    return o;
}
}  // namespace

int main(int argc, char** argv) try {
    run_options o = parse(argc, argv);
    problem pb(o.seed);
    std::printf("2-layer MLP %zu -> %zu -> %zu, batch %zu, %zu params, %d steps\n", pb.s.in, pb.s.hidden, pb.s.out,
                pb.s.batch, pb.s.params(), o.steps);
    run_result gpu, cpu;
    if (o.mode != "cpu") {
        int devices = 0;
        if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
            std::fprintf(stderr, "gpu_offload: no usable CUDA device; run with --mode cpu\n");
            return 77;
        }
        gpu = run_gpu(pb, o);
    }
    if (o.mode != "gpu") cpu = run_cpu(pb, o);
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
        bool same_params = gpu.params == cpu.params;
        std::printf("GPU and CPU-only runs: losses %s, final params %s\n", same_loss ? "identical" : "DIFFER",
                    same_params ? "identical" : "DIFFER");
        if (!same_loss || !same_params) return 1;
    }
    return losses.back() < losses.front() ? 0 : 1;
} catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_offload: %s\n", e.what());
    return 2;
}
