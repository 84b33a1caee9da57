// SPDX-License-Identifier: Apache-2.0
// spillway/optim/detail/pipeline_save.hpp: an update_pipeline's save directory, written from
// and restored into its subgroup buffers, and the initial state the constructor writes the
// same way (not public). The manifest's text format is in
// pipeline_manifest.hpp; docs/design.md ("Save and restore") numbers the steps.
//
// Guarantees:
// - save_state() writes every subgroup's params, m and v (whatever the pipeline's mode) as
//   "subgroup-<i>.bin" plus manifest.txt, all mode 0600 and fsynced, into a temporary
//   owned_directory beside `dir` that then replaces `dir` atomically: a crash never destroys
//   the previous good save, and the next save removes a dead save's temporary directory. A
//   directory that is not a save (no manifest.txt) and not empty is never replaced.
// - load_state() checks the manifest, then every subgroup file's size and CRC-32C, before
//   it is used; with master params in the caller's memory every file is checked before those
//   params change. Errors name the subgroup and the path.
// - Every file load_state() reads is opened through open_regular_file() (read_file() and
//   read_manifest_text()): a FIFO, a device, a directory or a symbolic link in a file's place
//   is refused at once with a std::system_error naming the path and what it is, so a restore
//   never blocks on one, nor calls a directory a truncated file.
// - Neither leaves a write in flight when it returns or throws a file error.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>

#include "spillway/error.hpp"
#include "spillway/io/aligned_buffer.hpp"
#include "spillway/io/durable_file.hpp"
#include "spillway/lock/owned_directory.hpp"
#include "spillway/optim/detail/pipeline_manifest.hpp"
#include "spillway/optim/detail/subgroup_buffers.hpp"
#include "spillway/optim/pipeline_config.hpp"
#include "spillway/tier/storage_tier.hpp"

namespace spillway::detail {

/// Saves the state held by `bufs` (and `master_params`, when the caller holds them: else
/// empty) at `step` and `iteration` to `dir_given`.
/// @throws std::logic_error when a subgroup is not at `step` (an update failed part-way);
///         std::invalid_argument when `dir` exists and is not a save or an empty directory;
///         std::system_error naming the path for file errors, and the subgroup for tier errors
template <storage_tier Tier>
void save_state(const std::filesystem::path& dir_given, const pipeline_config& cfg,
                subgroup_buffers<Tier>& bufs, std::span<const float> master_params,
                std::int64_t step, std::uint64_t iteration) {
    namespace fs = std::filesystem;
    const std::size_t n = bufs.subgroup_count();
    // "ckpt/" names the directory ckpt: the temporary one goes beside it, not inside.
    fs::path dir = dir_given.lexically_normal();
    if (!dir.has_filename() && dir.has_parent_path() && dir != dir.root_path())
        dir = dir.parent_path();
    bufs.expect_all_at(step, "update_pipeline::save");
    std::error_code ec;
    if (fs::exists(dir, ec)) {
        expect_argument(fs::is_directory(dir, ec),
                        "update_pipeline::save: " + dir.string() + " is not a directory");
        expect_argument(fs::exists(dir / "manifest.txt") || fs::is_empty(dir, ec),
                        "update_pipeline::save: " + dir.string() +
                            " exists and is not an optimizer save (no manifest.txt); refusing "
                            "to replace it");
    }
    fs::path parent = dir.parent_path().empty() ? fs::path(".") : dir.parent_path();
    const std::string tmp_prefix = dir.filename().string() + ".tmp-";
    owned_directory::reclaim_abandoned(parent, tmp_prefix);  // saves whose process died
    auto owned = owned_directory::create(parent, tmp_prefix);
    fs::path tmp = owned.path();
    try {
        pipeline_manifest manifest{.param_count = cfg.param_count,
                                   .subgroup_size = cfg.subgroup_size,
                                   .step = step,
                                   .iteration = iteration,
                                   .subgroups = {}};
        std::size_t scratch = bufs.scratch();
        // With master_params a save still holds params, m and v: assembled here.
        aligned_buffer whole;
        if (!master_params.empty())
            whole = aligned_buffer(3 * sizeof(float) * cfg.subgroup_elements(0));
        for (std::size_t s = 0; s < n; ++s) {
            std::span<const std::byte> bytes;
            if (const auto r = bufs.resident_of(s); r >= 0) {
                bytes = bufs[static_cast<std::size_t>(r)].mem.bytes().first(bufs.blob_bytes(s));
            } else {
                auto out = bufs[scratch].mem.bytes().first(bufs.blob_bytes(s));
                bufs.read_now(s, out);
                bytes = out;
            }
            if (!master_params.empty()) {
                auto params = std::as_bytes(
                    master_params.subspan(s * cfg.subgroup_size, cfg.subgroup_elements(s)));
                auto out = whole.bytes().first(saved_blob_bytes(cfg, s));
                std::memcpy(out.data(), params.data(), params.size());
                std::memcpy(out.data() + params.size(), bytes.data(), bytes.size());
                bytes = out;
            }
            const std::uint32_t crc = crc32c(bytes);
            write_file(tmp / subgroup_file_name(s), bytes,
                       "update_pipeline::save of subgroup " + std::to_string(s));
            manifest.subgroups.push_back({bytes.size(), crc});
        }
        const std::string text = manifest_text(manifest);
        write_file(tmp / "manifest.txt", std::as_bytes(std::span(text.data(), text.size())),
                   "update_pipeline::save manifest");
        owned.disown();  // from here on this call removes tmp itself on failure
        sync_directory(tmp);
        replace_directory(tmp, dir);
    } catch (...) {
        fs::remove_all(tmp, ec);
        throw;
    }
}

/// Writes the initial state to the tier through `bufs`: params from `params` (into
/// `master_params` when the caller holds them: else empty), m = v = 0, at step 0. Pipelined:
/// fill a free buffer, issue its write; wait for the oldest when none is free.
/// @throws the tier's error naming the subgroup (the caller erases what was written)
template <storage_tier Tier>
void initialise_state(const pipeline_config& cfg, subgroup_buffers<Tier>& bufs,
                      std::span<const float> params, std::span<float> master_params) {
    const bool master_in_caller = !master_params.empty();
    if (master_in_caller && params.data() != master_params.data())
        std::copy(params.begin(), params.end(), master_params.begin());
    for (std::size_t s = 0; s < bufs.subgroup_count(); ++s) {
        std::size_t b = bufs.take_free(nullptr);
        auto& buf = bufs[b];
        const std::size_t c = cfg.subgroup_elements(s);
        float* f = buf.mem.template as<float>().data();
        float* mv = f;  // m and v: after the params, or the whole blob
        if (!master_in_caller) {
            std::memcpy(f, params.data() + s * cfg.subgroup_size, c * sizeof(float));
            mv = f + c;
        }
        std::memset(mv, 0, 2 * c * sizeof(float));
        buf.sg = static_cast<std::ptrdiff_t>(s);
        buf.version = 0;
        buf.dirty = true;
        bufs.start_write(b);
    }
    bufs.wait_all_writes(nullptr);
    bufs.rethrow_pending();
}

/// Loads the save in `dir` into `bufs` (and `master_params`, when the caller holds them:
/// else empty): every subgroup is checked, then written to the tier, and the writes waited
/// for. Returns the manifest (its step and iteration are the pipeline's).
/// @throws std::invalid_argument when the save's shape differs from `cfg`'s;
///         std::runtime_error naming the subgroup for a truncated or corrupted file or a bad
///         manifest; std::system_error for a missing file or a tier error
template <storage_tier Tier>
pipeline_manifest load_state(const std::filesystem::path& dir, const pipeline_config& cfg,
                             subgroup_buffers<Tier>& bufs, std::span<float> master_params) {
    // Manifest first: its own checksum (format 2), the shape and the subgroups' checksums.
    const pipeline_manifest manifest = parse_manifest(read_manifest_text(dir), cfg, dir);
    const std::size_t n = bufs.subgroup_count();
    // Then each subgroup: size, checksum, write to the tier. With master_params a first
    // pass checks every file before the caller's params change (a refused save leaves
    // them as they were); the second puts the params there and m and v on the tier.
    aligned_buffer whole;
    auto read_checked = [&](std::size_t s, std::span<std::byte> bytes) {
        auto path = dir / subgroup_file_name(s);
        std::size_t got =
            read_file(path, bytes, "update_pipeline::restore of subgroup " + std::to_string(s));
        if (got != bytes.size())
            throw std::runtime_error("update_pipeline::restore: subgroup " + std::to_string(s) +
                                     " is truncated: " + path.string() + " has " + bytes_str(got) +
                                     ", the manifest says " + bytes_str(bytes.size()));
        if (crc32c(bytes) != manifest.subgroups[s].crc)
            throw std::runtime_error("update_pipeline::restore: subgroup " + std::to_string(s) +
                                     " is corrupted: the CRC-32C of " + path.string() +
                                     " does not match the manifest");
    };
    if (!master_params.empty()) {
        whole = aligned_buffer(3 * sizeof(float) * cfg.subgroup_elements(0));
        for (std::size_t s = 0; s < n; ++s)
            read_checked(s, whole.bytes().first(saved_blob_bytes(cfg, s)));
    }
    for (std::size_t s = 0; s < n; ++s) {
        std::size_t b = bufs.take_free(nullptr);
        auto& buf = bufs[b];
        if (!master_params.empty()) {
            auto bytes = whole.bytes().first(saved_blob_bytes(cfg, s));
            read_checked(s, bytes);
            const std::size_t params = sizeof(float) * cfg.subgroup_elements(s);
            std::memcpy(master_params.data() + s * cfg.subgroup_size, bytes.data(), params);
            std::memcpy(buf.mem.data(), bytes.data() + params, bufs.blob_bytes(s));
        } else {
            read_checked(s, buf.mem.bytes().first(bufs.blob_bytes(s)));
        }
        buf.sg = static_cast<std::ptrdiff_t>(s);
        buf.version = manifest.step;
        buf.dirty = true;
        bufs.start_write(b);
    }
    bufs.wait_all_writes(nullptr);
    bufs.rethrow_pending();
    bufs.set_tier_step(manifest.step);
    return manifest;
}

}  // namespace spillway::detail
