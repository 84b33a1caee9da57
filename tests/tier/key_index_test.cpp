// SPDX-License-Identifier: Apache-2.0
// The virtual tier's key index and fail-over record as plain bookkeeping: where a key is
// counted, and for how many bytes, through writes, fail-over, failures, erasure and stale
// copies; no tier, no I/O.
#include <doctest/doctest.h>

#include <cerrno>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include <spillway/tier/detail/fail_over.hpp>
#include <spillway/tier/detail/key_index.hpp>

using spillway::detail::key_index;

namespace {
std::vector<std::size_t> counts(const key_index& index, std::size_t children) {
    std::vector<std::size_t> out;
    for (std::size_t i = 0; i < children; ++i) out.push_back(index.keys_on(i));
    return out;
}
std::vector<std::size_t> bytes(const key_index& index, std::size_t children) {
    std::vector<std::size_t> out;
    for (std::size_t i = 0; i < children; ++i) out.push_back(index.bytes_on(i));
    return out;
}
}  // namespace

TEST_CASE("key_index: a key is counted on its write's target, then on its home") {
    key_index index(3);
    index.start_write("a", 1, 4096);
    CHECK(counts(index, 3) == std::vector<std::size_t>{0, 1, 0});
    CHECK(bytes(index, 3) == std::vector<std::size_t>{0, 4096, 0});
    auto it = index.find("a");
    REQUIRE(it != index.end());
    CHECK_FALSE(it->second.home.has_value());
    CHECK(it->second.placed() == 1u);

    CHECK(index.commit_write("a", 1, 4096) == std::nullopt);  // no previous home
    it = index.find("a");
    CHECK(it->second.home == 1u);
    CHECK(it->second.size == 4096u);
    CHECK_FALSE(it->second.target.has_value());

    // A rewrite of another size placed on child 2, failed over to child 0, committed there:
    // counted at its new size from the start.
    index.start_write("a", 2, 100);
    CHECK(counts(index, 3) == std::vector<std::size_t>{0, 0, 1});
    CHECK(bytes(index, 3) == std::vector<std::size_t>{0, 0, 100});
    CHECK(index.find("a")->second.counted_size() == 100u);
    CHECK(index.find("a")->second.size == 4096u);  // the committed copy's, until the commit
    index.retarget("a", 0);
    CHECK(counts(index, 3) == std::vector<std::size_t>{1, 0, 0});
    CHECK(bytes(index, 3) == std::vector<std::size_t>{100, 0, 0});
    CHECK(index.commit_write("a", 0, 100) == 1u);  // the old home, whose copy is erased next
    CHECK(counts(index, 3) == std::vector<std::size_t>{1, 0, 0});
    CHECK(bytes(index, 3) == std::vector<std::size_t>{100, 0, 0});
    CHECK(index.size() == 1u);
}

TEST_CASE("key_index: a failed write is counted where its committed copy is") {
    key_index index(2);
    index.start_write("new", 0, 50);
    index.revert_write("new");  // no committed copy: the key is gone
    CHECK(index.find("new") == index.end());
    CHECK(counts(index, 2) == std::vector<std::size_t>{0, 0});
    CHECK(bytes(index, 2) == std::vector<std::size_t>{0, 0});

    index.start_write("old", 0, 8);
    (void)index.commit_write("old", 0, 8);
    index.start_write("old", 1, 1000);
    CHECK(bytes(index, 2) == std::vector<std::size_t>{0, 1000});
    index.revert_write("old");  // back at the committed copy's size
    CHECK(index.find("old")->second.placed() == 0u);
    CHECK(counts(index, 2) == std::vector<std::size_t>{1, 0});
    CHECK(bytes(index, 2) == std::vector<std::size_t>{8, 0});
}

TEST_CASE("key_index: erase, adoption, vanished keys") {
    key_index index(2);
    auto it = index.adopt("found", 77, 1);
    CHECK(it->second.home == 1u);
    CHECK(it->second.size == 77u);
    CHECK(counts(index, 2) == std::vector<std::size_t>{0, 1});
    CHECK(bytes(index, 2) == std::vector<std::size_t>{0, 77});
    CHECK(index.erase(index.find("found")) == 1u);
    CHECK(counts(index, 2) == std::vector<std::size_t>{0, 0});
    CHECK(bytes(index, 2) == std::vector<std::size_t>{0, 0});

    // A write that lands after its key was erased wins: the key is back, counted.
    index.start_write("k", 0, 5);
    CHECK(index.erase(index.find("k")) == std::nullopt);
    CHECK(bytes(index, 2) == std::vector<std::size_t>{0, 0});
    CHECK(index.commit_write("k", 0, 5) == std::nullopt);
    CHECK(counts(index, 2) == std::vector<std::size_t>{1, 0});
    CHECK(bytes(index, 2) == std::vector<std::size_t>{5, 0});

    // A read found the file gone: forgotten, unless a write is in flight or it moved.
    index.forget_vanished("k", 1);  // not its home
    CHECK(index.find("k") != index.end());
    index.start_write("k", 1, 5);
    index.forget_vanished("k", 0);  // a write is in flight
    CHECK(index.find("k") != index.end());
    (void)index.commit_write("k", 1, 5);
    index.forget_vanished("k", 1);
    CHECK(index.find("k") == index.end());
    CHECK(counts(index, 2) == std::vector<std::size_t>{0, 0});
    CHECK(bytes(index, 2) == std::vector<std::size_t>{0, 0});
}

TEST_CASE("key_index: two writes of one key in flight leave the counts consistent") {
    // The caller should not overlap writes of one key, but if it does the index must not
    // lose track: each commit moves the key (and its bytes) to where it landed.
    key_index index(2);
    index.start_write("k", 0, 10);
    index.start_write("k", 1, 30);  // a second write, elsewhere, before the first lands
    CHECK(counts(index, 2) == std::vector<std::size_t>{0, 1});
    CHECK(bytes(index, 2) == std::vector<std::size_t>{0, 30});
    CHECK(index.commit_write("k", 0, 10) == std::nullopt);
    CHECK(counts(index, 2) == std::vector<std::size_t>{1, 0});
    CHECK(bytes(index, 2) == std::vector<std::size_t>{10, 0});
    CHECK(index.commit_write("k", 1, 30) == 0u);
    CHECK(counts(index, 2) == std::vector<std::size_t>{0, 1});
    CHECK(bytes(index, 2) == std::vector<std::size_t>{0, 30});
    CHECK(index.erase(index.find("k")) == 1u);
    CHECK(bytes(index, 2) == std::vector<std::size_t>{0, 0});
}

TEST_CASE("key_index: stale copies are remembered per key and child") {
    key_index index(3);
    index.add_stale("s", {0});
    index.add_stale("s", {2});
    CHECK(index.is_stale("s", 0));
    CHECK_FALSE(index.is_stale("s", 1));
    CHECK(index.is_stale("s", 2));
    CHECK_FALSE(index.is_stale("t", 0));
    // A write of the key committed on child 0 replaced the stale copy there.
    index.start_write("s", 0, 1);
    (void)index.commit_write("s", 0, 1);
    CHECK_FALSE(index.is_stale("s", 0));
    CHECK(index.stale().size() == 1u);
    CHECK(index.take_stale("s") == std::vector<std::size_t>{2});
    CHECK(index.stale().empty());
    CHECK(index.take_stale("s").empty());
}

TEST_CASE("write_failures: I/O errors are recorded in order; others end the write") {
    spillway::detail::write_failures f;
    auto eio = std::make_exception_ptr(std::system_error(EIO, std::generic_category(), "disk"));
    auto nospc = std::make_exception_ptr(std::system_error(ENOSPC, std::generic_category(), "pfs"));
    auto bad = std::make_exception_ptr(std::invalid_argument("bad key"));
    CHECK(f.record(1, "child 1 ('b')", bad) == std::nullopt);
    CHECK(f.tried().empty());
    CHECK(f.record(0, "child 0 ('a')", eio).value().rfind("disk", 0) == 0);
    CHECK(f.record(1, "child 1 ('b')", nospc).has_value());
    CHECK(f.tried() == std::vector<std::size_t>{0, 1});
    CHECK(spillway::detail::errno_of(eio) == EIO);
    CHECK(spillway::detail::errno_of(bad) == 0);
    try {
        std::rethrow_exception(f.exhausted("v: write of key 'k' (4 bytes)"));
    } catch (const std::system_error& e) {
        CHECK(e.code().value() == ENOSPC);  // the last failure's
        const std::string what = e.what();
        CHECK(what.rfind("v: write of key 'k' (4 bytes) failed on every usable child; child 0 "
                         "('a'): disk",
                         0) == 0);
        CHECK(what.find("; child 1 ('b'): pfs") != std::string::npos);
    }
}
