// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/blas_kernels.hpp: which matrix kernels OpenBLAS runs, in one line.
//
// OpenBLAS (built with DYNAMIC_ARCH, as Debian ships it) picks its kernels once, when the
// library loads: from the environment variable OPENBLAS_CORETYPE when it is set, else from
// the CPU. The choice can change the throughput of every matrix product severalfold (AVX2
// kernels on an AVX-512 CPU), so the trainer's summary and the benchmark's context say which
// kernels ran and why; mini_gpt never overrides the choice. A CPU model newer than the
// OpenBLAS release gets its SSE3 "Prescott" kernels, severalfold slower at GPT-2 124M's
// step than the AVX-512 ones: describe() then names the OPENBLAS_CORETYPE that fits the CPU.
#pragma once

#include <string>

namespace mini_gpt::blas {

/// The OpenBLAS release, the kernels in use and who chose them, e.g. "OpenBLAS 0.3.21,
/// Haswell kernels (OPENBLAS_CORETYPE=Haswell)" or "OpenBLAS 0.3.21, Cooperlake kernels
/// (detected; the CPU has AVX-512)".
std::string describe();

/// Makes OpenBLAS run every call on its caller's thread. The kernels (gpt2.hpp) split each
/// product over their own thread pool, one slice per thread; OpenBLAS's threads would take
/// the same cores, and ThreadSanitizer cannot see how they synchronise. Call it before the
/// first kernel (the trainer does; so do the tests and benchmarks that call kernels).
void single_threaded();

}  // namespace mini_gpt::blas
