// SPDX-License-Identifier: Apache-2.0
// tests/cuda/emulated_test_support.hpp: what the tests on the host emulation of the CUDA
// runtime (host_cudart.cpp) share: host work standing in for a kernel on a stream, a gate
// that holds a stream until opened, an owned stream, and an fp32 tensor description.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <future>
#include <string>
#include <thread>

#include <cuda_runtime_api.h>

#include <spillway/stash/tensor_desc.hpp>

#include "cuda/host_cudart.hpp"

namespace spillway::test::emulated {

/// A stand-in for a kernel that runs `ms` milliseconds on `stream`.
inline void spin(cudaStream_t stream, int ms) {
    host_cudart::enqueue(stream,
                         [ms] { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); });
}

/// Holds `stream` until open() (or destruction): work enqueued behind it provably waits.
class gate {
public:
    explicit gate(cudaStream_t stream) {
        host_cudart::enqueue(stream, [f = open_.get_future().share()] { f.wait(); });
    }
    gate(const gate&) = delete;
    gate& operator=(const gate&) = delete;
    ~gate() { open(); }
    void open() {
        if (!opened_) open_.set_value();
        opened_ = true;
    }

private:
    std::promise<void> open_;
    bool opened_ = false;
};

/// A stream created with `flags` (non-blocking by default), destroyed at scope exit.
struct stream_owner {
    explicit stream_owner(unsigned flags = cudaStreamNonBlocking) {
        cudaStreamCreateWithFlags(&s, flags);
    }
    ~stream_owner() { cudaStreamDestroy(s); }
    stream_owner(const stream_owner&) = delete;
    stream_owner& operator=(const stream_owner&) = delete;
    cudaStream_t s = nullptr;
};

/// A 1-D fp32 tensor of `count` elements named `name` with storage id `id`.
inline tensor_desc float_tensor(const std::string& name, std::uint64_t id, std::size_t count) {
    tensor_desc desc;
    desc.name = name;
    desc.storage_id = id;
    desc.type = dtype::f32;
    desc.shape = {static_cast<std::int64_t>(count)};
    return desc;
}

}  // namespace spillway::test::emulated
