// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/blas_kernels.cpp: see blas_kernels.hpp.
#include "blas_kernels.hpp"

#include <cblas.h>

#include <cstdlib>
#include <sstream>
#include <string_view>

namespace mini_gpt::blas {

std::string describe() {
    std::istringstream config(
        openblas_get_config());  // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ..."
    std::string name, version;
    config >> name >> version;
    const char* core = openblas_get_corename();
    std::ostringstream out;
    out << name << " " << version << ", " << (core ? core : "unknown") << " kernels";
    if (const char* chosen = std::getenv("OPENBLAS_CORETYPE"); chosen && *chosen) {
        out << " (OPENBLAS_CORETYPE=" << chosen << ")";
    } else {
        __builtin_cpu_init();
        const bool avx512 = __builtin_cpu_supports("avx512f"),
                   avx2 = __builtin_cpu_supports("avx2");
        out << " (detected; the CPU has " << (avx512 ? "AVX-512" : "no AVX-512") << ")";
        // A CPU model newer than the OpenBLAS release falls back to its oldest x86-64
        // kernels (SSE3): say which setting gives the kernels the CPU can run.
        const std::string_view kernels = core ? core : "";
        const bool sse_only = kernels == "Prescott" || kernels == "Core2" || kernels == "Penryn" ||
                              kernels == "Dunnington" || kernels == "Nehalem" || kernels == "Atom";
        if (sse_only && (avx512 || avx2))
            out << ": this OpenBLAS does not know the CPU's model; OPENBLAS_CORETYPE="
                << (avx512 ? "SkylakeX" : "Haswell") << " runs the matmuls several times faster";
    }
    return out.str();
}

void single_threaded() {
    openblas_set_num_threads(1);
}

}  // namespace mini_gpt::blas
