// SPDX-License-Identifier: Apache-2.0
// spillway/cuda/thrust_widen.hpp: lazy gradient widening as a Thrust kernel: fp16 or bf16
// values become fp32, optionally multiplied by a scale (the inverse loss scale), in one
// elementwise pass: out[i] = to_float(in[i]) * scale.
//
// Guarantees:
// - The conversion is spillway::to_float (optim/half.hpp): exact for all 65,536 bit
//   patterns; the product is one correctly rounded fp32 multiply, so the result equals the
//   host reference bit for bit (NaNs stay NaNs) on every Thrust backend.
// - Written against Thrust only, so the same code runs on the GPU (nvcc, CUDA backend) and
//   on the CPU (THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP or _CPP), where its logic is
//   tested on machines without a GPU.
// - widen() takes an execution policy (stream_policy(stream) from stream_policy.hpp, or a
//   stream, on the CUDA backend; thrust::device on the CPU backends) and spans in memory that
//   policy can reach (device memory for the CUDA backend). It throws std::invalid_argument when the
//   spans' sizes differ, before touching anything. With stream_policy it returns once the kernel is
//   enqueued on the stream: the caller orders readers of `out` after the stream.
#pragma once

#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>

#include <thrust/execution_policy.h>
#include <thrust/transform.h>

#include "spillway/config.hpp"
#include "spillway/cuda/stream_policy.hpp"
#include "spillway/optim/detail/half_core.hpp"

namespace spillway::cuda {

/// The elementwise function: widen one Half (float16 or bfloat16) and scale it.
template <class Half>
struct widen_scaled_fn {
    static_assert(is_half_v<Half>, "widen_scaled_fn<Half>: Half must be float16 or bfloat16");
    float scale = 1.0f;  ///< the factor applied after widening (the inverse loss scale)
    /// to_float(h) * scale.
    SPILLWAY_HOST_DEVICE float operator()(Half h) const noexcept { return to_float(h) * scale; }
};

/// out[i] = to_float(in[i]) * scale for every i, with Thrust on `policy`.
/// in (count), out (count): Half and fp32 elements.
template <class Policy, class Half>
void widen(const Policy& policy, std::span<const Half> in, std::span<float> out,
           float scale = 1.0f) {
    if (in.size() != out.size())
        throw std::invalid_argument("spillway::cuda::widen: input has " +
                                    std::to_string(in.size()) + " elements but output has " +
                                    std::to_string(out.size()));
    if (in.empty()) return;
    thrust::transform(policy, in.data(), in.data() + in.size(), out.data(),
                      widen_scaled_fn<Half>{scale});
}

#if defined(__CUDACC__) || THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
/// The same on `stream` (stream_policy(stream)): ordered with the library's non-blocking
/// streams. There is deliberately no overload without a stream here: thrust::device runs on
/// the legacy default stream, which has no ordering with non-blocking streams.
template <class Half>
void widen(cudaStream_t stream, std::span<const Half> in, std::span<float> out,
           float scale = 1.0f) {
    widen(stream_policy(stream), in, out, scale);
}
#else
/// The same on thrust::device: Thrust's CPU backend (OMP or CPP), which has no streams.
template <class Half>
void widen(std::span<const Half> in, std::span<float> out, float scale = 1.0f) {
    widen(thrust::device, in, out, scale);
}
#endif

}  // namespace spillway::cuda
