// SPDX-License-Identifier: Apache-2.0
// tests/support/skip.hpp: doctest skip decorators for what a machine cannot do.
//
// A case this machine cannot run is registered with doctest::skip(true), so the run reports
// it as skipped (doctest's summary counts it) and never as passed. The conditions are
// evaluated once, when the cases register, before main.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <system_error>

#include <spillway/io/uring_engine.hpp>

#include "support/temp_dir.hpp"

namespace spillway::test {

/// Skips the case where io_uring is unusable here (no liburing in the build, an old kernel,
/// seccomp, io_uring_disabled); uring_probe().reason says which.
inline doctest::skip skip_without_uring() {
    return doctest::skip(!uring_probe().available);
}

/// Skips the case where `path` is not a directory (for example /dev/shm in a container).
inline doctest::skip skip_without_directory(const std::filesystem::path& path) {
    std::error_code ec;
    return doctest::skip(!std::filesystem::is_directory(path, ec));
}

/// Skips the case where the file system of the tests' directories (temp_dir::root()) has
/// more than `bytes` free: a case that needs a model larger than the free space.
inline doctest::skip skip_with_free_space_over(std::uintmax_t bytes) {
    std::error_code ec;
    std::filesystem::create_directories(temp_dir::root(), ec);
    const std::filesystem::space_info space = std::filesystem::space(temp_dir::root(), ec);
    return doctest::skip(!ec && space.available > bytes);
}

}  // namespace spillway::test
