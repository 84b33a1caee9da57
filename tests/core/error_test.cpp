// SPDX-License-Identifier: Apache-2.0
// tests/core/error_test.cpp: the error helpers every layer uses.
#include <doctest/doctest.h>

#include <cerrno>
#include <exception>
#include <iomanip>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

#include "spillway/error.hpp"

namespace {

std::system_error caught_system_error(int err) {
    try {
        spillway::throw_system_error(err, "pwrite", "'/data/sg-3': 4096 bytes");
    } catch (const std::system_error& e) {
        return e;
    }
    FAIL("throw_system_error did not throw");
    return std::system_error(0, std::generic_category());
}

std::size_t occurrences(const std::string& text, const std::string& part) {
    std::size_t n = 0;
    for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
    return n;
}

}  // namespace

TEST_CASE("with_context puts the context first and the errno text once, at the end") {
    const std::system_error inner = caught_system_error(ENOSPC);
    const std::system_error outer =
        spillway::with_context(inner, "update_pipeline: write subgroup 3 failed");
    const std::string what = outer.what();
    CHECK(outer.code().value() == ENOSPC);
    CHECK(outer.code().category() == std::generic_category());
    CHECK(what.rfind(
              "update_pipeline: write subgroup 3 failed: '/data/sg-3': 4096 bytes: pwrite failed",
              0) == 0);
    const std::string errno_text = std::generic_category().message(ENOSPC);
    CHECK(occurrences(what, errno_text) == 1);
    CHECK(what.size() >= errno_text.size());
    CHECK(what.compare(what.size() - errno_text.size(), errno_text.size(), errno_text) == 0);

    // Wrapped twice (two layers add context), the errno text still appears once.
    const std::string twice = spillway::with_context(outer, "virtual_tier").what();
    CHECK(twice.rfind("virtual_tier: update_pipeline: write subgroup 3", 0) == 0);
    CHECK(occurrences(twice, errno_text) == 1);
}

TEST_CASE("with_context keeps an inner message that does not end with the errno text") {
    const std::system_error inner(std::make_error_code(std::errc::io_error));
    const std::string what = spillway::with_context(inner, "read 'k'").what();
    CHECK(what.rfind("read 'k'", 0) == 0);
    CHECK(occurrences(what, std::generic_category().message(EIO)) == 1);
}

TEST_CASE("with_context on an exception_ptr keeps the kind of error and the errno") {
    auto rethrown = [](std::exception_ptr e) { std::rethrow_exception(e); };
    const auto sys = spillway::with_context(
        std::make_exception_ptr(std::system_error(EIO, std::generic_category(), "pread")),
        "read 'k'");
    CHECK_THROWS_WITH_AS(rethrown(sys), doctest::Contains("read 'k': pread"), std::system_error);
    try {
        rethrown(sys);
    } catch (const std::system_error& e) {
        CHECK(e.code().value() == EIO);
    }
    const auto arg = spillway::with_context(
        std::make_exception_ptr(std::invalid_argument("bad size")), "tier 'x'");
    CHECK_THROWS_WITH_AS(rethrown(arg), "tier 'x': bad size", std::invalid_argument);
    const auto other =
        spillway::with_context(std::make_exception_ptr(std::out_of_range("gone")), "stash");
    CHECK_THROWS_WITH_AS(rethrown(other), "stash: gone", std::runtime_error);
    const auto unknown = spillway::with_context(std::make_exception_ptr(42), "stash");
    CHECK_THROWS_WITH_AS(rethrown(unknown), "stash: unknown error", std::runtime_error);
    CHECK_THROWS_WITH_AS(
        spillway::rethrow_with_context(std::make_exception_ptr(std::runtime_error("x")), "y"),
        "y: x", std::runtime_error);
}

TEST_CASE("validate_key refuses names that could escape their directory, naming the key") {
    CHECK_NOTHROW(spillway::validate_key("subgroup-0"));
    for (const char* bad : {"", ".", "..", "a/b", "../x"}) {
        try {
            spillway::validate_key(bad);
            FAIL("accepted " << bad);
        } catch (const std::invalid_argument& e) {
            CHECK(std::string(e.what()).find(spillway::quoted(bad)) != std::string::npos);
        }
    }
}

namespace spillway {
// Library code calls quoted() unqualified; with <iomanip> included, std::quoted is found too.
std::string quote_unqualified(std::string& mutable_text) {
    return quoted(mutable_text);
}
std::string quote_unqualified(const std::string& text) {
    return quoted(text);
}
}  // namespace spillway

TEST_CASE("an unqualified quoted() of a const or non-const string is spillway's, not std::quoted") {
    std::string text = "a\nb";
    CHECK(spillway::quote_unqualified(text) == "'a\\x0ab'");
    CHECK(spillway::quote_unqualified(std::as_const(text)) == "'a\\x0ab'");
}

TEST_CASE("quoted keeps a message one whole line: control bytes are written as \\xNN") {
    CHECK(spillway::quoted("a b") == "'a b'");
    CHECK(spillway::quoted("") == "''");
    CHECK(spillway::quoted(std::string_view("nul\0byte", 8)) == "'nul\\x00byte'");
    CHECK(spillway::quoted("line\nbreak\x7f") == "'line\\x0abreak\\x7f'");
    CHECK(spillway::quoted("caf\xc3\xa9") == "'caf\xc3\xa9'");  // UTF-8 stays as it is
    // The reason for refusing a key with a NUL is not cut off at the NUL.
    CHECK_THROWS_WITH_AS(spillway::validate_key(std::string_view("nul\0byte", 8)),
                         "key 'nul\\x00byte' contains a NUL byte", std::invalid_argument);
}

TEST_CASE("escaped writes control bytes as \\xNN and keeps every other byte, without quotes") {
    CHECK(spillway::escaped("step-\033[2J") == "step-\\x1b[2J");  // a terminal escape sequence
    CHECK(spillway::escaped(std::string_view("a\0b\n\r\t\x7f", 7)) ==
          "a\\x00b\\x0a\\x0d\\x09\\x7f");
    CHECK(spillway::escaped("caf\xc3\xa9 ~") == "caf\xc3\xa9 ~");
    CHECK(spillway::escaped("") == "");
    const std::string longer(1000, 'k');
    CHECK(spillway::escaped(longer) == longer);  // never cut, unlike quoted
}

TEST_CASE("quoted cuts a string longer than a file name to its first 100 bytes and its size") {
    const std::string longest(255, 'k');  // the longest valid key stays whole
    CHECK(spillway::quoted(longest) == "'" + longest + "'");
    const std::string huge(5000, 'k');
    CHECK(spillway::quoted(huge) == "'" + std::string(100, 'k') + "...' (5000 bytes)");
    // The cut counts bytes before escaping: control bytes in the first 100 are still escaped.
    std::string nul(300, 'x');
    nul[0] = '\n';
    CHECK(spillway::quoted(nul) == "'\\x0a" + std::string(99, 'x') + "...' (300 bytes)");
    try {
        spillway::validate_key(huge);
        FAIL("a 5000-byte key was accepted");
    } catch (const std::invalid_argument& e) {
        const std::string what = e.what();
        CHECK(what ==
              "key '" + std::string(100, 'k') + "...' (5000 bytes) is longer than 255 bytes");
    }
}
