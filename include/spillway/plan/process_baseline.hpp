// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/plan/process_baseline.hpp: the process's own memory (binary, libraries, start-up
/// allocations) as a memory plan counts it, in a figure that identical runs agree on.
///
/// A process's peak RSS (VmHWM) when it starts planning moves by a few hundred KiB between
/// identical runs (allocator arenas, thread start-up, page-cache timing). A plan that starts
/// from it names a smallest budget that the next identical run may refuse. The baseline is
/// therefore a figure fixed in advance, the allowance: measured once for the program and
/// given with a margin, plus what the run's inputs add (its data, sized from the inputs).
/// The measured peak only matters when it exceeds the allowance (a program that grew, an
/// MPI library): then it is rounded up to a coarse granule, so that runs agree unless their
/// peaks straddle a granule boundary.
///
/// Guarantees: reproducible_baseline() is a pure function; peak_rss_bytes() reads
/// /proc/self/status (Linux) and returns 0 where it cannot.
#pragma once

#include <cstddef>
#include <fstream>
#include <sstream>
#include <string>

namespace spillway {

/// This process's peak resident set (VmHWM of /proc/self/status) in bytes; 0 when unknown.
[[nodiscard]] inline std::size_t peak_rss_bytes() {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line)) {
        if (line.rfind("VmHWM:", 0) == 0) {
            std::istringstream in(line.substr(6));
            std::size_t kib = 0;
            in >> kib;
            return kib * 1024;
        }
    }
    return 0;
}

/// Granule a measured peak above the allowance is rounded up to.
inline constexpr std::size_t baseline_granule = std::size_t{16} << 20;

/// The baseline a memory plan counts for the process: `allowance` (the program's fixed
/// figure plus what its inputs add) when the measured peak fits in it, else the measured
/// peak rounded up to `granule` bytes (> 0).
[[nodiscard]] constexpr std::size_t reproducible_baseline(
    std::size_t measured, std::size_t allowance, std::size_t granule = baseline_granule) noexcept {
    if (measured <= allowance) return allowance;
    return (measured + granule - 1) / granule * granule;
}

}  // namespace spillway
