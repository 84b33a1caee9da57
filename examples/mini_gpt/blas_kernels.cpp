// examples/mini_gpt/blas_kernels.cpp: see blas_kernels.hpp.
#include "blas_kernels.hpp"

#include <cblas.h>

#include <cstdlib>
#include <sstream>

namespace mini_gpt::blas {

std::string describe() {
    std::istringstream config(openblas_get_config());  // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ..."
    std::string name, version;
    config >> name >> version;
    const char* core = openblas_get_corename();
    std::ostringstream out;
    out << name << " " << version << ", " << (core ? core : "unknown") << " kernels";
    if (const char* chosen = std::getenv("OPENBLAS_CORETYPE"); chosen && *chosen) {
        out << " (OPENBLAS_CORETYPE=" << chosen << ")";
    } else {
        __builtin_cpu_init();
        out << " (detected; the CPU has " << (__builtin_cpu_supports("avx512f") ? "AVX-512" : "no AVX-512") << ")";
    }
    return out.str();
}

void single_threaded() { openblas_set_num_threads(1); }

}  // namespace mini_gpt::blas
