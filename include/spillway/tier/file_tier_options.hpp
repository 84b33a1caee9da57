// SPDX-License-Identifier: Apache-2.0
// spillway/tier/file_tier_options.hpp: the settings of a file_tier (tier/file_tier.hpp):
// capacity, O_DIRECT mode, engine and spare files. Included by file_tier.hpp; include it on
// its own to build options without the tier.
#pragma once

#include <cstddef>
#include <limits>
#include <string>

#include "spillway/io/io_engine.hpp"

namespace spillway {

/// Whether a file tier uses O_DIRECT.
enum class direct_io_mode {
    /// O_DIRECT when the file system allows it (probed at construction, e.g.\ refused on
    /// tmpfs), else buffered I/O; file_tier::direct_io() says which was chosen.
    automatic,
    /// O_DIRECT or a std::system_error at construction naming the directory.
    required,
    /// Buffered I/O through the page cache.
    off,
};

/// Settings of a file_tier.
struct file_tier_options {
    /// The most bytes of blobs held at once (unbounded by default).
    std::size_t capacity = std::numeric_limits<std::size_t>::max();
    /// Whether transfers use O_DIRECT (see direct_io_mode).
    direct_io_mode direct_io = direct_io_mode::automatic;
    /// Settings of the tier's engine (queue depth, block size, ...).
    io_engine_config engine{};
    /// Which engine file_tier<io_engine> uses; ignored by the fixed-engine tiers.
    io_backend backend = io_backend::automatic;
    /// The tier's name in messages and reports.
    std::string name = "file";
    /// Files that rewrites replaced, kept (under reserved names) to be written again by
    /// later writes instead of creating new files: their blocks are allocated and written
    /// already, so O_DIRECT overwrites them at full speed, while ext4 and XFS write
    /// freshly allocated blocks markedly slower (unwritten-extent conversion, and freeing
    /// the replaced file's blocks). Costs up to this many replaced blobs of disk space
    /// (not counted in used()); removed when the tier is destroyed. 0: no recycling. A spare
    /// is written again only when it is still a regular file of this user with one link (a
    /// `cp -al` snapshot of the directory shares it otherwise): see file_tier.hpp.
    std::size_t spare_files = 2;
};

}  // namespace spillway
