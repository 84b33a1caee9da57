// spillway/config.hpp: version and feature macros.
//
// Guarantees: SPILLWAY_HAS_LIBURING is 1 when the build found liburing (the CMake target
// defines it), else 0; SPILLWAY_HAS_CUDA is 1 when compiled by nvcc with the CUDA target,
// else 0. SPILLWAY_HOST_DEVICE expands to `__host__ __device__ inline` under nvcc and to
// plain `inline` elsewhere, so shared arithmetic compiles with any C++20 compiler.
#pragma once

#define SPILLWAY_VERSION_MAJOR 0
#define SPILLWAY_VERSION_MINOR 1
#define SPILLWAY_VERSION_PATCH 0
#define SPILLWAY_VERSION_STRING "0.1.0"

#ifndef SPILLWAY_HAS_LIBURING
#  define SPILLWAY_HAS_LIBURING 0
#endif

#if defined(__CUDACC__)
#  define SPILLWAY_HAS_CUDA 1
#  define SPILLWAY_HOST_DEVICE __host__ __device__ inline
#else
#  ifndef SPILLWAY_HAS_CUDA
#    define SPILLWAY_HAS_CUDA 0
#  endif
#  define SPILLWAY_HOST_DEVICE inline
#endif

namespace spillway {
inline constexpr int version_major = SPILLWAY_VERSION_MAJOR;
inline constexpr int version_minor = SPILLWAY_VERSION_MINOR;
inline constexpr int version_patch = SPILLWAY_VERSION_PATCH;
}  // namespace spillway
