// SPDX-License-Identifier: Apache-2.0
// path_lock_name: a documented hash of the canonical path, the same in every process and
// build (fixed known values), and one name for every spelling of a directory.
#include <doctest/doctest.h>

#include <spillway/lock/lock_name.hpp>

#include <cstddef>
#include <filesystem>
#include <span>
#include <string>

#include "support/temp_dir.hpp"

TEST_CASE("fnv1a_64 gives the published FNV-1a test values") {
    static_assert(spillway::fnv1a_64("") == 0xcbf29ce484222325ull);
    CHECK(spillway::fnv1a_64("a") == 0xaf63dc4c8601ec8cull);
    CHECK(spillway::fnv1a_64("foobar") == 0x85944171f73967e8ull);
    const std::byte foobar[] = {std::byte{'f'}, std::byte{'o'}, std::byte{'o'},
                                std::byte{'b'}, std::byte{'a'}, std::byte{'r'}};
    CHECK(spillway::fnv1a_64(std::span<const std::byte>(foobar)) == 0x85944171f73967e8ull);
}

TEST_CASE("path_lock_name is the prefix and 16 hex digits of the canonical path's hash") {
    // Fixed values: any process of any build computes these names.
    CHECK(spillway::path_lock_name("/") == "af63a24c860189fe");
    CHECK(spillway::path_lock_name("/tmp/spillway-lock", "trainer-") == "trainer-c93f44c32194f47b");
    // Leading zeros are written: the name always has 16 digits after the prefix.
    CHECK(spillway::path_lock_name("/", "p-").size() == 18);
}

TEST_CASE("every spelling of one directory gives one name; another directory another") {
    spillway::test::temp_dir dir("lock-name");
    namespace fs = std::filesystem;
    fs::create_directories(dir.path() / "a" / "b");
    const std::string name = spillway::path_lock_name(dir.path() / "a");
    CHECK(spillway::path_lock_name(dir.path() / "a" / "b" / "..") == name);
    CHECK(spillway::path_lock_name(dir.path() / "a" / ".") == name);
    fs::create_directory_symlink(dir.path() / "a", dir.path() / "link");
    CHECK(spillway::path_lock_name(dir.path() / "link") == name);
    const fs::path cwd = fs::current_path();
    fs::current_path(dir.path());
    CHECK(spillway::path_lock_name("a") == name);
    fs::current_path(cwd);
    CHECK(spillway::path_lock_name(dir.path() / "a" / "b") != name);
    // A path that does not exist yet is normalised lexically.
    CHECK(spillway::path_lock_name(dir.path() / "a" / "new" / ".." / "b") ==
          spillway::path_lock_name(dir.path() / "a" / "b"));
}
