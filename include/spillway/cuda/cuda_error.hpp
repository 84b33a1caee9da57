// SPDX-License-Identifier: Apache-2.0
// spillway/cuda/cuda_error.hpp: CUDA runtime errors as std::system_error.
//
// Guarantees:
// - cuda_category() is a std::error_category whose values are cudaError_t codes and whose
//   messages read "cudaErrorMemoryAllocation: out of memory" (the runtime's
//   cudaGetErrorName and cudaGetErrorString). A value the runtime does not know reads
//   "cudaError <n>: unrecognized error code".
// - The texts come from a table the category builds when it is first constructed; after
//   that, message() and make_cuda_error() make no CUDA call, so a stream callback (where
//   CUDA forbids every API call) may build an error once the category exists.
// - check_cuda() and throw_cuda_error() turn a failed runtime call into
//   std::system_error(code, cuda_category()) whose message names the thing, the call and
//   the CUDA error, and clear the thread's last error (cudaGetLastError) before throwing:
//   Thrust and CUB check cudaPeekAtLastError after each launch, and would otherwise report
//   a caught failure again as their own. A sticky error (a corrupted context) stays; the
//   runtime cannot clear it.
// - query_done() reads the answer of a non-blocking query (cudaEventQuery,
//   cudaStreamQuery). The runtime keeps a not-ready answer as the thread's last error, so
//   query_done() clears it: every poll in the library goes through it, and the next Thrust
//   or CUB launch on the thread does not throw "device not ready".
// Needs the CUDA runtime headers (nvcc or -I<cuda>/include).
#pragma once

#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <cuda_runtime_api.h>

namespace spillway::cuda {

namespace detail {
class cuda_error_category final : public std::error_category {
public:
    // Builds the message table: one entry per value in [cudaSuccess, cudaErrorUnknown],
    // empty where the runtime does not know the value.
    cuda_error_category() {
        // Looking up unknown values may set the thread's last error; a pending error of the
        // caller's stays as it was, and one the lookups set is cleared.
        const bool clear_after = cudaPeekAtLastError() == cudaSuccess;
        constexpr int last = static_cast<int>(cudaErrorUnknown);
        messages_.resize(static_cast<std::size_t>(last) + 1);
        const std::string unknown = cudaGetErrorName(static_cast<cudaError_t>(last + 1));
        for (int v = 0; v <= last; ++v) {
            const auto err = static_cast<cudaError_t>(v);
            std::string name = cudaGetErrorName(err);
            if (name != unknown)
                messages_[static_cast<std::size_t>(v)] = name + ": " + cudaGetErrorString(err);
        }
        unknown_text_ = cudaGetErrorString(static_cast<cudaError_t>(last + 1));
        if (clear_after) cudaGetLastError();
    }
    [[nodiscard]] const char* name() const noexcept override { return "cuda"; }
    // No CUDA call: a table lookup.
    [[nodiscard]] std::string message(int value) const override {
        if (value >= 0 && static_cast<std::size_t>(value) < messages_.size() &&
            !messages_[static_cast<std::size_t>(value)].empty())
            return messages_[static_cast<std::size_t>(value)];
        return "cudaError " + std::to_string(value) + ": " + unknown_text_;
    }

private:
    std::vector<std::string> messages_;
    std::string unknown_text_;
};
}  // namespace detail

/// The error category of cudaError_t values. The first call builds the message table
/// (CUDA calls, so never first from a stream callback); later calls make no CUDA call.
inline const std::error_category& cuda_category() {
    static const detail::cuda_error_category category;
    return category;
}

/// std::system_error(err, cuda_category()) with "<what>: <call> failed" as message (what()
/// then appends the CUDA error's name and text). Leaves the thread's last error alone and
/// makes no CUDA call once cuda_category() exists: for stream callbacks.
[[nodiscard]] inline std::system_error make_cuda_error(cudaError_t err, std::string_view call,
                                                       std::string_view what) {
    std::string msg(what);
    msg += ": ";
    msg += call;
    msg += " failed";
    return std::system_error(static_cast<int>(err), cuda_category(), msg);
}

/// Clears the thread's last error (cudaGetLastError), then throws make_cuda_error(err, call,
/// what). Not for stream callbacks: use make_cuda_error there.
[[noreturn]] inline void throw_cuda_error(cudaError_t err, std::string_view call,
                                          std::string_view what) {
    cudaGetLastError();  // the failure is reported here; the next Thrust launch must not see it
    throw make_cuda_error(err, call, what);
}

/// Throws (see throw_cuda_error) unless err is cudaSuccess.
inline void check_cuda(cudaError_t err, std::string_view call, std::string_view what) {
    if (err != cudaSuccess) throw_cuda_error(err, call, what);
}

/// The answer of a non-blocking query `call` (cudaEventQuery, cudaStreamQuery): true for
/// cudaSuccess (the work is done), false for cudaErrorNotReady, which it clears from the
/// thread's last error; any other error throws (see throw_cuda_error).
[[nodiscard]] inline bool query_done(cudaError_t err, std::string_view call,
                                     std::string_view what) {
    if (err == cudaErrorNotReady) {
        cudaGetLastError();  // the runtime recorded "not ready" as the last error
        return false;
    }
    check_cuda(err, call, what);
    return true;
}

}  // namespace spillway::cuda
