// SPDX-License-Identifier: Apache-2.0
// tests/cuda/gpu_skip.hpp: included once by each GPU test. Without a usable device the whole
// binary reports itself skipped (exit 77, which CTest maps to "Skipped"), naming the
// reason, instead of failing every case.
#pragma once

#include <cstdio>
#include <cstdlib>

#include <cuda_runtime_api.h>

namespace spillway::test {
[[maybe_unused]] inline const bool gpu_present = [] {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        std::fprintf(stderr, "GPU tests skipped: no usable CUDA device (%s)\n",
                     err != cudaSuccess ? cudaGetErrorString(err) : "device count is 0");
        std::exit(77);
    }
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) std::fprintf(stderr, "GPU: %s\n", prop.name);
    return true;
}();
}  // namespace spillway::test
