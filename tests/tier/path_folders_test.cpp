// SPDX-License-Identifier: Apache-2.0
// path_folders: this process's private folder on each storage path, the stable lock name of
// each path, a dead process's folder reclaimed and a living one's kept, the roots removed
// when left empty, file tiers built in the folders, and errors naming the path.
#include <doctest/doctest.h>

#include <spillway/lock/lock_name.hpp>
#include <spillway/tier/file_tier.hpp>
#include <spillway/tier/path_folders.hpp>
#include <spillway/tier/virtual_tier.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/random_bytes.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using spillway::path_folders;

TEST_CASE("path_folders: a private folder per path, stable lock names, roots removed when empty") {
    spillway::test::temp_dir dir;
    const std::vector<fs::path> paths = {dir.path() / "a", dir.path() / "deep" / "b"};
    {
        auto f = path_folders::create(paths, "run-state", "trainer-");
        REQUIRE(f.size() == 2);
        for (std::size_t i = 0; i < 2; ++i) {
            CHECK(f.path(i) == paths[i]);
            CHECK(f.root(i) == paths[i] / "run-state");
            CHECK(f.folder(i).parent_path() == f.root(i));
            CHECK(f.folder(i).filename().string().rfind("proc-", 0) == 0);
            struct stat st {};
            REQUIRE(::stat(f.folder(i).c_str(), &st) == 0);
            CHECK((st.st_mode & 0777) == 0700);
            REQUIRE(::stat(f.root(i).c_str(), &st) == 0);
            CHECK((st.st_mode & 0777) == 0700);
            CHECK(f.lock_names()[i] == spillway::path_lock_name(f.root(i), "trainer-"));
        }
        CHECK(f.lock_names()[0] != f.lock_names()[1]);
        // A second process's view of the same paths: other folders, the same lock names.
        auto g = path_folders::create(paths, "run-state", "trainer-");
        CHECK(g.folder(0) != f.folder(0));
        CHECK(g.lock_names() == f.lock_names());
        // One file tier per path in this process's folder, named by the path.
        spillway::virtual_tier_options vo;
        vo.bandwidths = {1.0, 1.0};
        vo.placement = spillway::placement_mode::striped;
        spillway::virtual_tier<spillway::null_lock, std::vector<spillway::file_tier<>>> vt(
            vo, f.file_tier_args({}, "params"));
        const auto blob = spillway::test::random_bytes(5000, 3);
        REQUIRE(vt.write("params-1", blob).wait() == blob.size());
        CHECK(fs::exists(f.folder(1) / "params" / "params-1"));
        CHECK(vt.report()[1].name == paths[1].string());
    }
    // Both gone: the folders, and the roots that no other process used.
    CHECK_FALSE(fs::exists(paths[0] / "run-state"));
    CHECK_FALSE(fs::exists(paths[1] / "run-state"));
    CHECK(fs::exists(paths[1]));
}

TEST_CASE("path_folders: a killed process's folder is reclaimed, a living one's is kept") {
    spillway::test::temp_dir dir;
    const std::vector<fs::path> paths = {dir.path()};
    auto living = path_folders::create(paths, "s", "x-");
    std::ofstream(living.folder(0) / "blob") << "kept";
    // A child process creates its folder and dies without its destructor.
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        auto dead = path_folders::create(paths, "s", "x-");
        std::ofstream(dead.folder(0) / "blob") << "left behind";
        ::_exit(0);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    std::size_t before = 0;
    for (const auto& e : fs::directory_iterator(paths[0] / "s")) before += e.is_directory();
    CHECK(before == 2);
    auto next = path_folders::create(paths, "s", "x-");
    std::size_t after = 0;
    for (const auto& e : fs::directory_iterator(paths[0] / "s")) after += e.is_directory();
    CHECK(after == 2);  // the living one and the new one
    CHECK(fs::exists(living.folder(0) / "blob"));
}

TEST_CASE("path_folders: a path under a regular file is refused, naming it") {
    spillway::test::temp_dir dir;
    std::ofstream(dir.path() / "file") << "x";
    const std::vector<fs::path> paths = {dir.path() / "ok", dir.path() / "file" / "sub"};
    CHECK_THROWS_WITH_AS((void)path_folders::create(paths, "s", "x-"),
                         doctest::Contains((dir.path() / "file").string().c_str()),
                         std::system_error);
    CHECK_THROWS_AS((void)path_folders::create(std::vector<fs::path>{}, "s", "x-"),
                    std::invalid_argument);
    // What the refused call made on the first path is gone again.
    CHECK_FALSE(fs::exists(dir.path() / "ok" / "s"));
}
