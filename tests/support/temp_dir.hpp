// SPDX-License-Identifier: Apache-2.0
// tests/support/temp_dir.hpp: a scratch directory removed at scope exit.
//
// Created under $SPILLWAY_TEST_TMPDIR (set by CTest to a folder in the build tree, which is
// on the disk, not tmpfs) or else the system temporary directory.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <system_error>

namespace spillway::test {

class temp_dir {
public:
    /// Where the tests' directories go: $SPILLWAY_TEST_TMPDIR, else the system's temporary
    /// directory.
    static std::filesystem::path root() {
        const char* base = std::getenv("SPILLWAY_TEST_TMPDIR");
        return base && *base ? std::filesystem::path(base) : std::filesystem::temp_directory_path();
    }

    explicit temp_dir(const std::string& prefix = "spillway") {
        namespace fs = std::filesystem;
        const fs::path root = temp_dir::root();
        fs::create_directories(root);
        std::random_device rd;
        for (int attempt = 0;; ++attempt) {
            path_ = root / (prefix + "-" + std::to_string(rd()));
            if (fs::create_directory(path_)) break;
            if (attempt > 100)
                throw std::runtime_error("temp_dir: cannot create under " + root.string());
        }
    }
    /// A temporary directory on an explicit file system root (e.g. /dev/shm).
    static temp_dir under(const std::filesystem::path& root,
                          const std::string& prefix = "spillway") {
        temp_dir d(no_create{});
        std::random_device rd;
        d.path_ = root / (prefix + "-" + std::to_string(rd()));
        std::filesystem::create_directories(d.path_);
        return d;
    }
    temp_dir(temp_dir&& o) noexcept : path_(std::move(o.path_)) { o.path_.clear(); }
    temp_dir(const temp_dir&) = delete;
    temp_dir& operator=(const temp_dir&) = delete;
    ~temp_dir() {
        if (!path_.empty()) {
            std::error_code ec;
            std::filesystem::permissions(path_, std::filesystem::perms::owner_all,
                                         std::filesystem::perm_options::add, ec);
            std::filesystem::remove_all(path_, ec);
        }
    }
    [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

private:
    struct no_create {};
    explicit temp_dir(no_create) {}
    std::filesystem::path path_;
};

}  // namespace spillway::test
