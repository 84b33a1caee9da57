// SPDX-License-Identifier: Apache-2.0
// spillway/cuda/cuda_error.hpp: CUDA runtime errors as std::system_error.
//
// Guarantees: cuda_category() is a std::error_category whose values are cudaError_t codes
// and whose messages read "cudaErrorMemoryAllocation: out of memory"; check_cuda() turns a
// failed runtime call into std::system_error(code, cuda_category()) whose message names
// the thing, the call and the CUDA error, so CUDA failures are caught and reported like
// every other failure in Spillway. Needs the CUDA runtime headers (nvcc or -I<cuda>/include).
#pragma once

#include <string>
#include <string_view>
#include <system_error>

#include <cuda_runtime_api.h>

namespace spillway::cuda {

namespace detail {
class cuda_error_category final : public std::error_category {
public:
    [[nodiscard]] const char* name() const noexcept override { return "cuda"; }
    [[nodiscard]] std::string message(int value) const override {
        auto err = static_cast<cudaError_t>(value);
        return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
    }
};
}  // namespace detail

/// The error category of cudaError_t values.
inline const std::error_category& cuda_category() noexcept {
    static const detail::cuda_error_category category;
    return category;
}

/// Throws std::system_error(err, cuda_category()) with "<what>: <call> failed" as message
/// (what() then appends the CUDA error's name and text).
[[noreturn]] inline void throw_cuda_error(cudaError_t err, std::string_view call, std::string_view what) {
    std::string msg(what);
    msg += ": ";
    msg += call;
    msg += " failed";
    throw std::system_error(static_cast<int>(err), cuda_category(), msg);
}

/// Throws (see throw_cuda_error) unless err is cudaSuccess.
inline void check_cuda(cudaError_t err, std::string_view call, std::string_view what) {
    if (err != cudaSuccess) throw_cuda_error(err, call, what);
}

}  // namespace spillway::cuda
