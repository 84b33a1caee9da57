// SPDX-License-Identifier: Apache-2.0
// spillway/config.hpp: version and feature macros.
//
// Guarantees: SPILLWAY_HAS_LIBURING is 1 when the build found liburing (the CMake target
// defines it), else 0; SPILLWAY_HAS_CUDA is 1 when compiled by nvcc with the CUDA target,
// else 0. SPILLWAY_HOST_DEVICE expands to `__host__ __device__ inline` under nvcc and to
// plain `inline` elsewhere, so shared arithmetic compiles with any C++20 compiler.
#pragma once

// The version is set by project(VERSION) in CMakeLists.txt; these macros repeat it so that
// a plain `-I include` build sees it too, and the test version.sources_agree fails when
// they differ. A release changes both, and CHANGELOG.md.

/// Major version (incompatible API changes).
#define SPILLWAY_VERSION_MAJOR 0
/// Minor version (compatible additions).
#define SPILLWAY_VERSION_MINOR 2
/// Patch version (fixes).
#define SPILLWAY_VERSION_PATCH 0
/// The version as "major.minor.patch".
#define SPILLWAY_VERSION_STRING "0.2.0"
/// The version as one number, major * 10000 + minor * 100 + patch (0.2.0 is 200), for
/// `#if SPILLWAY_VERSION >= 200`. Minor and patch stay below 100.
#define SPILLWAY_VERSION \
    (SPILLWAY_VERSION_MAJOR * 10000 + SPILLWAY_VERSION_MINOR * 100 + SPILLWAY_VERSION_PATCH)

#ifndef SPILLWAY_HAS_LIBURING
/// 1 when the io_uring engine is built on liburing (the CMake target defines it), else 0.
#  define SPILLWAY_HAS_LIBURING 0
#endif

#if defined(__CUDACC__)
/// 1 when compiled by nvcc (the CUDA pieces are usable), else 0.
#  define SPILLWAY_HAS_CUDA 1
/// Marks a function for host and device under nvcc (`__host__ __device__ inline`), and as
/// plain `inline` for every other compiler, so shared arithmetic is written once.
#  define SPILLWAY_HOST_DEVICE __host__ __device__ inline
#else
#  ifndef SPILLWAY_HAS_CUDA
/// 1 when compiled by nvcc (the CUDA pieces are usable), else 0.
#    define SPILLWAY_HAS_CUDA 0
#  endif
/// Marks a function for host and device under nvcc; plain `inline` for other compilers.
#  define SPILLWAY_HOST_DEVICE inline
#endif

namespace spillway {
/// SPILLWAY_VERSION_MAJOR as a constant.
inline constexpr int version_major = SPILLWAY_VERSION_MAJOR;
/// SPILLWAY_VERSION_MINOR as a constant.
inline constexpr int version_minor = SPILLWAY_VERSION_MINOR;
/// SPILLWAY_VERSION_PATCH as a constant.
inline constexpr int version_patch = SPILLWAY_VERSION_PATCH;
/// SPILLWAY_VERSION (major * 10000 + minor * 100 + patch) as a constant.
inline constexpr int version = SPILLWAY_VERSION;
}  // namespace spillway
