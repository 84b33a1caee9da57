// SPDX-License-Identifier: Apache-2.0
// durable_file: CRC-32C (known value, hardware and table paths agree, incremental), new files
// created 0600 and never over an existing one or through a link, exact reads reporting a
// size mismatch without reading, and the directory swap leaving the new contents in place
// and the old ones gone.
#include <doctest/doctest.h>

#include <spillway/io/durable_file.hpp>

#include "support/temp_dir.hpp"

#include <cstddef>
#include <chrono>
#include <filesystem>
#include <future>
#include <fstream>
#include <random>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace spillway;
namespace fs = std::filesystem;

namespace {
std::span<const std::byte> bytes_of(const std::string& s) {
    return std::as_bytes(std::span(s.data(), s.size()));
}
std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
}  // namespace

TEST_CASE("crc32c: known value, and the hardware and table paths agree") {
    const char* s = "123456789";
    CHECK(crc32c(std::as_bytes(std::span(s, 9))) == 0xe3069283u);
    CHECK(crc32c_portable(std::as_bytes(std::span(s, 9))) == 0xe3069283u);
    std::mt19937 rng(1);
    for (std::size_t n : {0u, 1u, 7u, 8u, 9u, 63u, 4096u, 10001u}) {
        std::vector<std::byte> b(n);
        for (auto& x : b) x = static_cast<std::byte>(rng());
        CHECK(crc32c(b) == crc32c_portable(b));
        // Incremental equals one-shot.
        auto half = n / 2;
        CHECK(crc32c(std::span(b).subspan(half), crc32c(std::span(b).first(half))) == crc32c(b));
    }
    if (!crc32c_hardware()) MESSAGE("no SSE4.2: only the table path was exercised");
}

TEST_CASE("write_file creates a 0600 file and refuses an existing name or a link") {
    test::temp_dir dir("durable");
    const auto p = dir.path() / "a.bin";
    write_file(p, bytes_of("hello"), "test file");
    CHECK(slurp(p) == "hello");
    struct stat st {};
    REQUIRE(::stat(p.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
    CHECK_THROWS_WITH_AS(write_file(p, bytes_of("again"), "test file"), doctest::Contains("a.bin"),
                         std::system_error);
    CHECK(slurp(p) == "hello");  // the existing file is untouched
    fs::create_symlink(p, dir.path() / "link");
    CHECK_THROWS_AS(write_file(dir.path() / "link", bytes_of("x"), "test file"), std::system_error);
    CHECK(slurp(p) == "hello");
}

TEST_CASE("read_file reads exact sizes and reports a mismatch without reading") {
    test::temp_dir dir("durable");
    const auto p = dir.path() / "b.bin";
    write_file(p, bytes_of("0123456789"), "test file");
    std::vector<std::byte> out(10);
    CHECK(read_file(p, out, "test file") == 10);
    CHECK(std::string(reinterpret_cast<const char*>(out.data()), out.size()) == "0123456789");
    std::vector<std::byte> small(4, std::byte{0x55});
    CHECK(read_file(p, small, "test file") == 10);
    CHECK(small[0] == std::byte{0x55});
    std::vector<std::byte> any(1);
    CHECK_THROWS_WITH_AS(read_file(dir.path() / "missing", any, "test file"),
                         doctest::Contains("missing"), std::system_error);
}

TEST_CASE("replace_directory puts the new directory in place and removes the old one") {
    test::temp_dir dir("durable");
    const auto target = dir.path() / "save";
    const auto first = dir.path() / "save.tmp1";
    fs::create_directory(first);
    write_file(first / "f", bytes_of("one"), "test file");
    replace_directory(first, target);  // no previous directory: a plain rename
    CHECK(slurp(target / "f") == "one");
    CHECK_FALSE(fs::exists(first));

    const auto second = dir.path() / "save.tmp2";
    fs::create_directory(second);
    write_file(second / "f", bytes_of("two"), "test file");
    replace_directory(second, target);  // over an existing one: exchanged, then removed
    CHECK(slurp(target / "f") == "two");
    CHECK_FALSE(fs::exists(second));
    std::size_t entries = 0;
    for ([[maybe_unused]] auto& e : fs::directory_iterator(dir.path())) ++entries;
    CHECK(entries == 1);  // nothing of the old save is left beside it
}

namespace {
/// Runs read_file on `p` in another thread; if it has not returned after 20 s (blocked in
/// open() on a FIFO), opens the FIFO for writing to free it and reports the hang.
std::string read_file_error(const fs::path& p, bool& hung) {
    hung = false;
    std::vector<std::byte> out(16);
    auto result = std::async(std::launch::async, [&]() -> std::string {
        try {
            read_file(p, out, "test file");
        } catch (const std::exception& e) {
            return e.what();
        }
        return "(no error)";
    });
    if (result.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
        hung = true;
        int w = ::open(p.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
        if (w >= 0) ::close(w);
    }
    return result.get();
}
}  // namespace

TEST_CASE("read_file refuses a FIFO, a directory and a device at once, saying what it is") {
    test::temp_dir dir("durable-special");
    const auto fifo = dir.path() / "fifo.bin";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    bool hung = false;
    std::string what = read_file_error(fifo, hung);
    CHECK_FALSE(hung);
    CHECK(what.find(fifo.string() + " is a FIFO") != std::string::npos);

    const auto sub = dir.path() / "sub.bin";
    fs::create_directory(sub);
    what = read_file_error(sub, hung);
    CHECK_FALSE(hung);
    CHECK(what.find(sub.string() + " is a directory") != std::string::npos);
    CHECK(what.find("4096") == std::string::npos);  // not "truncated, has 4096 bytes"

    what = read_file_error("/dev/null", hung);
    CHECK(what.find("/dev/null is a character device") != std::string::npos);

    fs::create_symlink(dir.path() / "target", dir.path() / "link");
    write_file(dir.path() / "target", bytes_of("x"), "test file");
    what = read_file_error(dir.path() / "link", hung);
    CHECK(what.find("is a symbolic link") != std::string::npos);
}

TEST_CASE("open_regular_file returns a blocking descriptor of a regular file, checked by fstat") {
    test::temp_dir dir("durable-open");
    const auto p = dir.path() / "f";
    write_file(p, bytes_of("abc"), "test file");
    unique_fd fd = open_regular_file(p, "test file");
    REQUIRE(fd.get() >= 0);
    CHECK((::fcntl(fd.get(), F_GETFL) & O_NONBLOCK) == 0);
    CHECK((::fcntl(fd.get(), F_GETFD) & FD_CLOEXEC) != 0);
    char buf[4] = {};
    CHECK(::read(fd.get(), buf, 4) == 3);
    // The stricter rules: a second link is refused when a single link is required.
    fs::create_hard_link(p, dir.path() / "g");
    CHECK_NOTHROW(open_regular_file(p, "test file"));
    try {
        (void)open_regular_file_at(AT_FDCWD, p.c_str(), O_RDONLY, "test file",
                                   regular_file_rules{.single_link = true});
        FAIL("a file with two links was accepted");
    } catch (const std::system_error& e) {
        CHECK(e.code().value() == EMLINK);
        CHECK(std::string(e.what()).find("has 2 hard links") != std::string::npos);
    }
    // Missing: ENOENT naming the path.
    CHECK_THROWS_WITH_AS(open_regular_file(dir.path() / "missing", "test file"),
                         doctest::Contains("missing"), std::system_error);
    // A FIFO opened for writing has no reader: refused as a FIFO, not blocked, not ENXIO.
    REQUIRE(::mkfifo((dir.path() / "fifo").c_str(), 0600) == 0);
    CHECK_THROWS_WITH_AS(
        open_regular_file_at(AT_FDCWD, (dir.path() / "fifo").c_str(), O_WRONLY, "test file"),
        doctest::Contains("is a FIFO"), std::system_error);
}
