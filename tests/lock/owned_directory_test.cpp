// SPDX-License-Identifier: Apache-2.0
// owned_directory: a dead owner's directory is reclaimed, a living one's never; entries that
// are not owned directories (no owner file, a symbolic link, a file, another prefix, another
// user's) are left alone; disown() keeps the directory; bad input is refused by name.
//
// Forked children only create directories and leave (by _exit or SIGKILL); every assertion
// is made in the parent.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <system_error>

#include <spillway/lock/owned_directory.hpp>

#include "support/abandoned_directory.hpp"
#include "support/temp_dir.hpp"

using namespace spillway;
namespace fs = std::filesystem;


TEST_CASE("owned_directory: created private, holds its owner file, removed with the object") {
    test::temp_dir parent;
    fs::path where;
    {
        auto d = owned_directory::create(parent.path(), "run-");
        where = d.path();
        CHECK(where.parent_path() == parent.path());
        CHECK(where.filename().string().rfind("run-", 0) == 0);
        CHECK(where.filename().string().size() == 4 + 6);
        struct stat st {};
        REQUIRE(::stat(where.c_str(), &st) == 0);
        CHECK((st.st_mode & 07777) == 0700);
        REQUIRE(::lstat((where / ".spillway.owner").c_str(), &st) == 0);
        CHECK(S_ISREG(st.st_mode));
        CHECK((st.st_mode & 07777) == 0600);
        CHECK_FALSE(fs::exists(where / ".spillway.owner.new"));
        std::ofstream(where / "data") << "x";
        // Its own reclaim (same process, another open file description) sees it alive.
        CHECK(owned_directory::reclaim_abandoned(parent.path(), "run-") == 0);
        CHECK(fs::exists(where / "data"));
    }
    CHECK_FALSE(fs::exists(where));
}

TEST_CASE("owned_directory: the directory of an owner that died is reclaimed, a living one is not") {
    test::temp_dir parent;
    auto living = owned_directory::create(parent.path(), "ckpt.tmp-");
    fs::path exited = test::abandoned_by_child(parent.path(), "ckpt.tmp-", 0);
    fs::path killed = test::abandoned_by_child(parent.path(), "ckpt.tmp-", SIGKILL);
    REQUIRE(fs::exists(exited / "state.bin"));
    REQUIRE(fs::exists(killed / "state.bin"));

    CHECK(owned_directory::reclaim_abandoned(parent.path(), "ckpt.tmp-") == 2);
    CHECK_FALSE(fs::exists(exited));
    CHECK_FALSE(fs::exists(killed));
    CHECK(fs::exists(living.path() / ".spillway.owner"));
    CHECK(owned_directory::reclaim_abandoned(parent.path(), "ckpt.tmp-") == 0);
}

TEST_CASE("owned_directory: what is not an abandoned owned directory of the prefix is left alone") {
    test::temp_dir parent;
    fs::path dead = test::abandoned_by_child(parent.path(), "job-", SIGKILL);
    fs::path other_prefix = test::abandoned_by_child(parent.path(), "other-", SIGKILL);

    // A directory of the prefix without an owner file (the user's own, or one being made).
    fs::create_directory(parent.path() / "job-mine");
    std::ofstream(parent.path() / "job-mine" / "keep") << "k";
    // A symbolic link of the prefix to the dead owner's directory, and a plain file.
    fs::create_directory_symlink(dead, parent.path() / "job-link");
    std::ofstream(parent.path() / "job-file") << "f";
    // An owner file that is a symbolic link to a lockable file is not an owner file.
    fs::create_directory(parent.path() / "job-linked-owner");
    std::ofstream(parent.path() / "lockable") << "";
    fs::create_symlink(parent.path() / "lockable", parent.path() / "job-linked-owner" / ".spillway.owner");
    // The bare prefix itself is not a directory the prefix made (mkdtemp adds six characters).
    fs::create_directory(parent.path() / "job-");

    CHECK(owned_directory::reclaim_abandoned(parent.path(), "job-") == 1);
    CHECK_FALSE(fs::exists(dead));
    CHECK(fs::exists(parent.path() / "job-mine" / "keep"));
    CHECK(fs::is_symlink(parent.path() / "job-link"));
    CHECK(fs::exists(parent.path() / "job-file"));
    CHECK(fs::exists(parent.path() / "job-linked-owner"));
    CHECK(fs::exists(parent.path() / "lockable"));
    CHECK(fs::exists(parent.path() / "job-"));
    CHECK(fs::exists(other_prefix / "state.bin"));
}

TEST_CASE("owned_directory: disown keeps the directory and gives up the owner file") {
    test::temp_dir parent;
    fs::path kept;
    {
        auto d = owned_directory::create(parent.path(), "save-");
        std::ofstream(d.path() / "manifest.txt") << "m";
        kept = d.disown();
        CHECK(d.path().empty());
        CHECK_FALSE(fs::exists(kept / ".spillway.owner"));
    }
    CHECK(fs::exists(kept / "manifest.txt"));
    CHECK(owned_directory::reclaim_abandoned(parent.path(), "save-") == 0);
    CHECK(fs::exists(kept / "manifest.txt"));
}

TEST_CASE("owned_directory: a moved-from object owns nothing; assignment removes the old directory") {
    test::temp_dir parent;
    auto a = owned_directory::create(parent.path(), "m-");
    fs::path first = a.path();
    owned_directory b = std::move(a);
    CHECK(a.path().empty());  // NOLINT(bugprone-use-after-move): moved-from state is specified
    CHECK(b.path() == first);
    b = owned_directory::create(parent.path(), "m-");
    CHECK_FALSE(fs::exists(first));
    CHECK(fs::exists(b.path() / ".spillway.owner"));
}

TEST_CASE("owned_directory: bad prefixes and missing parents are refused by name") {
    test::temp_dir parent;
    CHECK_THROWS_WITH_AS((void)owned_directory::create(parent.path(), "../x"),
                         doctest::Contains("contains '/'"), std::invalid_argument);
    CHECK_THROWS_WITH_AS((void)owned_directory::create(parent.path(), ""), doctest::Contains("is empty"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(owned_directory::reclaim_abandoned(parent.path(), ".."),
                         doctest::Contains("directory prefix"), std::invalid_argument);
    const auto missing = parent.path() / "no-such-dir";
    CHECK_THROWS_WITH_AS((void)owned_directory::create(missing, "x-"), doctest::Contains(missing.c_str()),
                         std::system_error);
    CHECK_THROWS_WITH_AS(owned_directory::reclaim_abandoned(missing, "x-"), doctest::Contains(missing.c_str()),
                         std::system_error);
}

TEST_CASE("owned_directory: a parent that is a file is refused and left as it was") {
    test::temp_dir parent;
    const auto file = parent.path() / "plain";
    std::ofstream(file) << "contents";
    CHECK_THROWS_WITH_AS((void)owned_directory::create(file, "x-"), doctest::Contains(file.c_str()), std::system_error);
    CHECK_THROWS_WITH_AS(owned_directory::reclaim_abandoned(file, "x-"), doctest::Contains(file.c_str()),
                         std::system_error);
    CHECK(fs::file_size(file) == 8);
}
