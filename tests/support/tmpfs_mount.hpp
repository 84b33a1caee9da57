// SPDX-License-Identifier: Apache-2.0
// tests/support/tmpfs_mount.hpp: a tmpfs of a given size, for tests that put a run on a file
// system of exactly the free space a check asks for.
//
// Guarantees: mounted (mode 0700) on construction and detached at scope exit; a process that
// may not mount (not root, no CAP_SYS_ADMIN) prints why and exits 77, which the test's ctest
// entry reports as skipped (SKIP_RETURN_CODE 77).
#pragma once

#include <sys/mount.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

namespace spillway::test {

class tmpfs_mount {
public:
    tmpfs_mount(const std::filesystem::path& at, std::size_t bytes) : at_(at) {
        std::filesystem::create_directories(at_);
        const std::string opts = "size=" + std::to_string(bytes) + ",mode=0700";
        if (::mount("tmpfs", at_.c_str(), "tmpfs", 0, opts.c_str()) != 0) {
            std::printf("cannot mount a tmpfs on %s (%s): test skipped\n", at_.c_str(),
                        std::strerror(errno));
            std::fflush(stdout);
            std::_Exit(77);
        }
    }
    ~tmpfs_mount() { ::umount2(at_.c_str(), MNT_DETACH); }
    tmpfs_mount(const tmpfs_mount&) = delete;
    tmpfs_mount& operator=(const tmpfs_mount&) = delete;

private:
    std::filesystem::path at_;
};

}  // namespace spillway::test
