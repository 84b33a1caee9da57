// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/tier/path_folders.hpp: this process's private folder on each storage path, with
/// the path's stable lock name: what a trainer needs to put one file tier per path under a
/// virtual_tier.
///
/// Guarantees:
/// - create(paths, subdir, lock_prefix) makes, for each path in order:
///   1. `<path>/<subdir>` (the root the processes using that path share), creating what is
///      missing with mode 0700;
///   2. removes the folders there whose owner died (owned_directory::reclaim_abandoned: a
///      killed run's blobs), never a living process's;
///   3. this process's folder `<root>/<folder_prefix>XXXXXX` (owned_directory::create: mode
///      0700, removed with everything in it when the path_folders is destroyed);
///   4. the lock name path_lock_name(root, lock_prefix): the same in every process and build
///      that uses the path, so a node's processes take turns on it (node_lock).
/// - The destructor removes this process's folders, then each root left empty (other
///   processes may still use a root: a non-empty one stays).
/// - Errors are std::system_error naming the path and what failed; what was created before
///   the error is removed again.
#pragma once

#include <cerrno>
#include <cstddef>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include <sys/stat.h>

#include "spillway/lock/lock_name.hpp"
#include "spillway/lock/owned_directory.hpp"
#include "spillway/tier/file_tier_options.hpp"

namespace spillway {

/// This process's private folder on each storage path (see the file comment). Movable, not
/// copyable.
class path_folders {
public:
    /// See the file comment, steps 1-4.
    /// @param paths         the storage paths, in order (at least one)
    /// @param subdir        the shared root's name under each path (a plain name)
    /// @param lock_prefix   the prefix of each path's lock name
    /// @param folder_prefix the prefix of this process's folder in each root
    /// @throws std::invalid_argument for no path; std::system_error naming the path
    [[nodiscard]] static path_folders create(std::span<const std::filesystem::path> paths,
                                             std::string_view subdir, std::string_view lock_prefix,
                                             std::string_view folder_prefix = "proc-") {
        if (paths.empty()) throw std::invalid_argument("path_folders: no path");
        path_folders f;
        for (const auto& path : paths) {
            auto root = path / subdir;
            make_private_dirs(root);
            f.roots_.push_back(root);  // (removed if empty on an error below)
            owned_directory::reclaim_abandoned(root, folder_prefix);
            f.folders_.push_back(owned_directory::create(root, folder_prefix));
            f.paths_.push_back(path);
            f.lock_names_.push_back(path_lock_name(root, lock_prefix));
        }
        return f;
    }

    /// Takes o's folders; o then holds none.
    path_folders(path_folders&&) noexcept = default;
    /// Removes this one's folders, then takes o's.
    path_folders& operator=(path_folders&& o) noexcept {
        if (this != &o) {
            clear();
            paths_ = std::move(o.paths_);
            roots_ = std::move(o.roots_);
            folders_ = std::move(o.folders_);
            lock_names_ = std::move(o.lock_names_);
        }
        return *this;
    }
    path_folders(const path_folders&) = delete;
    path_folders& operator=(const path_folders&) = delete;
    ~path_folders() { clear(); }

    /// The number of paths.
    [[nodiscard]] std::size_t size() const noexcept { return folders_.size(); }
    /// Storage path i, as given.
    [[nodiscard]] const std::filesystem::path& path(std::size_t i) const { return paths_.at(i); }
    /// `<path i>/<subdir>`, shared with the other processes on that path.
    [[nodiscard]] const std::filesystem::path& root(std::size_t i) const { return roots_.at(i); }
    /// This process's folder on path i.
    [[nodiscard]] const std::filesystem::path& folder(std::size_t i) const {
        return folders_.at(i).path();
    }
    /// Path i's lock name (for virtual_tier_options::lock_names).
    [[nodiscard]] const std::vector<std::string>& lock_names() const noexcept {
        return lock_names_;
    }

    /// The arguments of one file tier per path, in order: this process's folder (or the
    /// subfolder `sub` of it, created mode 0700), and `options` named after the path
    /// (file_tier_options::name = the path as given), for a
    /// virtual_tier<Lock, std::vector<file_tier<>>> or a list of file tiers.
    /// @throws std::system_error naming the subfolder it cannot create
    [[nodiscard]] std::vector<std::tuple<std::filesystem::path, file_tier_options>> file_tier_args(
        file_tier_options options = {}, std::string_view sub = {}) const {
        std::vector<std::tuple<std::filesystem::path, file_tier_options>> out;
        for (std::size_t i = 0; i < size(); ++i) {
            auto dir = folder(i);
            if (!sub.empty()) {
                dir /= sub;
                if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
                    throw std::system_error(errno, std::generic_category(),
                                            dir.string() + ": mkdir failed");
            }
            options.name = path(i).string();
            out.emplace_back(std::move(dir), options);
        }
        return out;
    }

private:
    path_folders() = default;

    static void make_private_dirs(const std::filesystem::path& dir) {
        std::vector<std::filesystem::path> missing;  // leaf first
        std::error_code ec;
        for (auto p = dir; !p.empty() && !std::filesystem::exists(p, ec); p = p.parent_path()) {
            if (ec) break;
            missing.push_back(p);
            if (p == p.parent_path()) break;
        }
        if (ec) throw std::system_error(ec, dir.string() + ": cannot inspect it");
        for (auto it = missing.rbegin(); it != missing.rend(); ++it)
            if (::mkdir(it->c_str(), 0700) != 0 && errno != EEXIST)
                throw std::system_error(errno, std::generic_category(),
                                        it->string() + ": cannot create directory");
    }

    void clear() noexcept {
        folders_.clear();  // (removes this process's folders)
        for (const auto& root : roots_) {
            std::error_code ec;
            if (std::filesystem::is_empty(root, ec) && !ec) std::filesystem::remove(root, ec);
        }
        roots_.clear();
        paths_.clear();
        lock_names_.clear();
    }

    std::vector<std::filesystem::path> paths_, roots_;
    std::vector<owned_directory> folders_;
    std::vector<std::string> lock_names_;
};

}  // namespace spillway
