// SPDX-License-Identifier: Apache-2.0
// Tests of what is particular to file_tier (the shared storage_tier behaviour is checked by
// the conformance suite): both engines, O_DIRECT and the tmpfs fallback, unaligned sizes and
// buffers, the directory checks, a full file system (EFBIG through RLIMIT_FSIZE), files
// deleted or truncated behind the tier's back, file modes, key checks, capacity,
// persistence and destruction with operations in flight.
#include <spillway/tier/file_tier.hpp>

#include <doctest/doctest.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <sys/stat.h>

#include "support/random_bytes.hpp"
#include "support/skip.hpp"
#include "support/temp_dir.hpp"

using namespace spillway;
namespace fs = std::filesystem;

namespace {

#ifdef SPILLWAY_SANITIZED
constexpr std::size_t largest = std::size_t{8} << 20;
#else
constexpr std::size_t largest = std::size_t{64} << 20;
#endif

template <class Tier>
void round_trip(Tier& tier, const std::string& key, std::size_t n, std::size_t misalign,
                std::uint64_t seed) {
    CAPTURE(key);
    CAPTURE(n);
    CAPTURE(misalign);
    auto data = test::random_bytes(n, seed);
    // A buffer whose start is `misalign` bytes past a 4 KiB boundary.
    aligned_buffer out_storage(n + misalign), in_storage(n + misalign);
    std::span<std::byte> out(out_storage.data() + misalign, n), in(in_storage.data() + misalign, n);
    if (n) std::memcpy(out.data(), data.data(), n);
    CHECK(tier.write(key, out).wait() == n);
    CHECK(tier.size_of(key) == n);
    CHECK(fs::file_size(tier.path_of(key)) == n);
    CHECK(tier.read(key, in).wait() == n);
    CHECK((n == 0 || std::memcmp(in.data(), data.data(), n) == 0));
}

std::string message_of(io_completion c) {
    try {
        c.wait();
    } catch (const std::exception& e) {
        return e.what();
    }
    return "(no error)";
}

/// prefix + number (spelled out to dodge a false -Wrestrict of GCC 12 on `"k" + to_string(i)`).
std::string key(std::string_view prefix, std::size_t i) {
    std::string s(prefix);
    s.append(std::to_string(i));
    return s;
}

/// Files with the tier's reserved prefix in `dir` (temporary and spare files).
std::size_t reserved_files(const fs::path& dir) {
    std::size_t count = 0;
    for (auto& e : fs::directory_iterator(dir))
        if (e.path().filename().string().rfind(".spillway.", 0) == 0) ++count;
    return count;
}

/// True when the only reserved files left are the spares the tier says it holds.
template <class Tier>
bool no_temporary_files(const Tier& tier) {
    return reserved_files(tier.directory()) == tier.spare_files_held();
}

}  // namespace

#if SPILLWAY_HAS_LIBURING
#define SPILLWAY_FILE_ENGINES posix_engine, uring_engine, io_engine
#else
#define SPILLWAY_FILE_ENGINES posix_engine, io_engine
#endif

TEST_CASE_TEMPLATE(
    "file_tier round-trips sizes from 1 byte to 64 MiB from aligned and unaligned buffers", Engine,
    SPILLWAY_FILE_ENGINES) {
#if SPILLWAY_HAS_LIBURING
    if (std::is_same_v<Engine, uring_engine> && !uring_probe().available) {
        MESSAGE("io_uring unavailable (" << uring_probe().reason
                                         << "): uring_engine file tier skipped");
        return;
    }
#endif
    test::temp_dir dir("file-tier");
    file_tier_options opt;
    opt.engine.block_size = 256 * 1024;
    opt.engine.queue_depth = 8;
    file_tier<Engine> tier(dir.path(), opt);
    MESSAGE("engine " << std::string(tier.engine().backend_name()) << ", O_DIRECT "
                      << std::string(tier.direct_io() ? "on" : "off: " + tier.direct_io_note()));
    std::uint64_t seed = 1;
    for (std::size_t n :
         {std::size_t{0}, std::size_t{1}, std::size_t{511}, std::size_t{4095}, std::size_t{4096},
          std::size_t{4097}, std::size_t{12288}, (std::size_t{1} << 20) + 1})
        for (std::size_t misalign : {std::size_t{0}, std::size_t{1}, std::size_t{512}})
            round_trip(tier, "blob-" + std::to_string(n) + "-" + std::to_string(misalign), n,
                       misalign, ++seed);
    round_trip(tier, "largest-unaligned", largest - 3, 1, ++seed);  // bounce buffer and a tail
    round_trip(tier, "largest", largest, 0, ++seed);  // straight from the caller's buffer
    // Rewriting a key with another size replaces it.
    round_trip(tier, "blob-1-0", 70'000, 3, 99);
    CHECK(no_temporary_files(tier));
    auto s = tier.stats();
    CHECK(s.writes == 27);
    CHECK(s.reads == 27);
    CHECK(s.failed_reads + s.failed_writes == 0);
}

namespace {
/// Whether a child of this process can mount a ramfs in a private mount namespace (it needs
/// CAP_SYS_ADMIN); asked once, before main, while the process has one thread.
bool can_mount_ramfs() {
    test::temp_dir mnt("file-tier-ramfs-probe");
    const pid_t pid = ::fork();
    if (pid < 0) return false;
    if (pid == 0) {
        if (::unshare(CLONE_NEWNS) != 0) ::_exit(1);
        if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) ::_exit(1);
        if (::mount("spillway-test", mnt.path().c_str(), "ramfs", 0, "mode=0700") != 0) ::_exit(1);
        ::umount(mnt.path().c_str());
        ::_exit(0);
    }
    int status = 0;
    return ::waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/// Whether the tests' file system (temp_dir::root()) takes hard links between two of its
/// directories; asked once, before main.
bool can_hard_link() {
    test::temp_dir a("ft-link-probe"), b("ft-link-probe");
    std::ofstream(a.path() / "f") << "x";
    std::error_code ec;
    fs::create_hard_link(a.path() / "f", b.path() / "f", ec);
    return !ec;
}
}  // namespace

TEST_CASE(
    "file_tier falls back to buffered I/O, saying why, on a file system without O_DIRECT (ramfs)" *
    doctest::skip(!can_mount_ramfs())) {
    // ramfs has no O_DIRECT at all: a child mounts one in a private mount namespace. No
    // tier (so no engine thread) is alive here: the child forks from a process with one
    // thread, as ThreadSanitizer requires.
    {
        test::temp_dir mnt("file-tier-ramfs");
        pid_t pid = ::fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            if (::unshare(CLONE_NEWNS) != 0) ::_exit(100);
            if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) ::_exit(100);
            if (::mount("spillway-test", mnt.path().c_str(), "ramfs", 0, "mode=0700") != 0)
                ::_exit(100);
            int code = 0;
            try {
                file_tier<> t(mnt.path());
                if (t.direct_io())
                    code = 1;
                else if (t.direct_io_note().find("O_DIRECT") == std::string::npos)
                    code = 2;
                auto data = test::random_bytes(10'001, 3);
                std::vector<std::byte> back(data.size());
                t.write("k", data).wait();
                t.read("k", back).wait();
                if (back != data) code = 3;
                file_tier_options required;
                required.direct_io = direct_io_mode::required;
                try {
                    file_tier<> r(mnt.path(), required);
                    code = 4;
                } catch (const std::system_error& e) {
                    if (std::string(e.what()).find(mnt.path().string()) == std::string::npos)
                        code = 5;
                }
            } catch (...) {
                code = 6;
            }
            ::umount(mnt.path().c_str());
            ::_exit(code);
        }
        int status = 0;
        REQUIRE(::waitpid(pid, &status, 0) == pid);
        REQUIRE(WIFEXITED(status));
        CHECK(WEXITSTATUS(status) == 0);  // 100: no ramfs, although can_mount_ramfs() said yes
    }
}

TEST_CASE("file_tier uses O_DIRECT on a disk, and on tmpfs where the kernel allows it") {
    test::temp_dir disk("file-tier-direct");
    file_tier<> on_disk(disk.path());
    if (on_disk.direct_io()) {
        CHECK(on_disk.direct_io_note().empty());
    } else {
        MESSAGE("the test directory's file system refuses O_DIRECT: " << on_disk.direct_io_note());
    }
    file_tier_options off;
    off.direct_io = direct_io_mode::off;
    file_tier<> buffered(disk.path(), off);
    CHECK_FALSE(buffered.direct_io());
    CHECK(buffered.direct_io_note().find("off") != std::string::npos);
}

TEST_CASE(
    "file_tier on tmpfs (/dev/shm): O_DIRECT where the kernel allows it, else buffered, saying "
    "why" *
    test::skip_without_directory("/dev/shm")) {
    auto shm = test::temp_dir::under("/dev/shm", "spillway-file-tier");
    file_tier<> tmpfs_tier(shm.path());
    if (tmpfs_tier.direct_io()) {
        MESSAGE(
            "/dev/shm accepts O_DIRECT on this kernel: the fallback path is not exercised here");
    } else {
        CHECK(tmpfs_tier.direct_io_note().find("O_DIRECT") != std::string::npos);
        CHECK(tmpfs_tier.direct_io_note().find(shm.path().string()) != std::string::npos);
        file_tier_options required;
        required.direct_io = direct_io_mode::required;
        const std::string shm_path = shm.path().string();
        CHECK_THROWS_WITH_AS(file_tier<>(shm.path(), required), doctest::Contains(shm_path.c_str()),
                             std::system_error);
    }
    for (std::size_t n : {std::size_t{1}, std::size_t{4097}, (std::size_t{3} << 20) + 5})
        round_trip(tmpfs_tier, "shm-" + std::to_string(n), n, 1, n);
}

TEST_CASE(
    "file_tier refuses a missing directory and a path under a regular file, naming the path") {
    test::temp_dir dir("file-tier-dirs");
    auto missing = dir.path() / "does-not-exist";
    try {
        file_tier<> t(missing);
        FAIL("a missing directory was accepted");
    } catch (const std::system_error& e) {
        CHECK(e.code() == std::errc::no_such_file_or_directory);
        CHECK(std::string(e.what()).find(missing.string()) != std::string::npos);
    }
    auto file = dir.path() / "regular";
    std::ofstream(file) << "x";
    auto under = file / "sub";
    try {
        file_tier<> t(under);
        FAIL("a path under a regular file was accepted");
    } catch (const std::system_error& e) {
        CHECK(e.code() == std::errc::not_a_directory);
        CHECK(std::string(e.what()).find(under.string()) != std::string::npos);
    }
    io_engine_config bad;
    bad.queue_depth = 0;
    file_tier_options bad_options;
    bad_options.engine = bad;
    CHECK_THROWS_AS(file_tier<>(dir.path(), bad_options), std::invalid_argument);
}

TEST_CASE(
    "a full file system (EFBIG via RLIMIT_FSIZE) fails the write and keeps the previous blob") {
    test::temp_dir dir("file-tier-full");
    file_tier<> tier(dir.path());
    auto old = test::random_bytes(100'000, 1);
    tier.write("k", old).wait();
    tier.write("other", test::random_bytes(10, 2)).wait();
    const std::size_t used = tier.used();

    auto previous_handler = std::signal(SIGXFSZ, SIG_IGN);
    rlimit saved{};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
    rlimit small = saved;
    small.rlim_cur = 1 << 20;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    auto too_big = test::random_bytes(3 << 20, 3);
    std::string what = message_of(tier.write("k", too_big));
    auto fresh = test::random_bytes((1 << 20) + 4096, 4);
    std::string what_fresh = message_of(tier.write("fresh", fresh));
    ::setrlimit(RLIMIT_FSIZE, &saved);
    std::signal(SIGXFSZ, previous_handler);

    CHECK(what.find("'k'") != std::string::npos);
    CHECK(what.find(std::to_string(too_big.size())) != std::string::npos);
    CHECK(what.find(std::strerror(EFBIG)) != std::string::npos);
    CHECK(what_fresh.find("'fresh'") != std::string::npos);
    CHECK_FALSE(tier.contains("fresh"));
    CHECK(tier.used() == used);
    CHECK(no_temporary_files(tier));
    std::vector<std::byte> back(old.size());
    tier.read("k", back).wait();
    CHECK(back == old);
    CHECK(tier.stats().failed_writes == 2);
    // Usable again once there is room.
    tier.write("fresh", fresh).wait();
    CHECK(tier.size_of("fresh") == fresh.size());
}

TEST_CASE("file_tier reports files deleted or truncated behind its back and stays usable") {
    test::temp_dir dir("file-tier-behind");
    file_tier<> tier(dir.path());
    auto a = test::random_bytes(50'000, 1), b = test::random_bytes(9'000, 2);
    tier.write("a", a).wait();
    tier.write("b", b).wait();
    std::vector<std::byte> buf(a.size());

    SUBCASE("deleted") {
        fs::remove(dir.path() / "a");
        try {
            tier.read("a", buf).wait();
            FAIL("reading a deleted file succeeded");
        } catch (const std::system_error& e) {
            std::string what = e.what();
            CHECK(e.code() == std::errc::no_such_file_or_directory);
            CHECK(what.find("'a'") != std::string::npos);
            CHECK(what.find((dir.path() / "a").string()) != std::string::npos);
            CHECK(what.find("deleted") != std::string::npos);
        }
        CHECK_FALSE(tier.contains("a"));
        CHECK(tier.used() == b.size());
    }
    SUBCASE("truncated") {
        fs::resize_file(dir.path() / "a", 40'000);
        try {
            tier.read("a", buf).wait();
            FAIL("reading a truncated file succeeded");
        } catch (const std::system_error& e) {
            std::string what = e.what();
            CHECK(e.code() == std::errc::io_error);
            CHECK(what.find("'a'") != std::string::npos);
            CHECK(what.find("40000 bytes") != std::string::npos);
            CHECK(what.find("50000 bytes") != std::string::npos);
        }
    }
    std::vector<std::byte> back(b.size());
    tier.read("b", back).wait();
    CHECK(back == b);
    CHECK(tier.stats().failed_reads == 1);
}

TEST_CASE("file_tier errors for a missing key and a buffer of the wrong size name key and sizes") {
    test::temp_dir dir("file-tier-errors");
    file_tier<> tier(dir.path());
    std::vector<std::byte> buf(100);
    std::string what = message_of(tier.read("nope", buf));
    CHECK(what.find("'nope'") != std::string::npos);
    CHECK(what.find("no such key") != std::string::npos);
    tier.write("k", test::random_bytes(300, 1)).wait();
    try {
        tier.read("k", buf).wait();
        FAIL("a wrong-size read succeeded");
    } catch (const std::invalid_argument& e) {
        std::string w = e.what();
        CHECK(w.find("'k'") != std::string::npos);
        CHECK(w.find("100 bytes") != std::string::npos);
        CHECK(w.find("300 bytes") != std::string::npos);
    }
}

TEST_CASE("file_tier keys never leave the directory; files are 0600 and links are not followed") {
    test::temp_dir dir("file-tier-keys");
    file_tier<> tier(dir.path());
    std::vector<std::byte> one(1);
    for (std::string bad : std::vector<std::string>{"", "a/b", "..", ".", "../escape",
                                                    ".spillway.tmp.1.2", std::string(256, 'x')}) {
        CAPTURE(bad);
        // The message names the tier and the key, quoted (a key too long cut to 100 bytes).
        const std::string key = "file: key " + spillway::quoted(bad) + " ";
        CHECK_THROWS_WITH_AS(tier.write(bad, one), doctest::Contains(key.c_str()),
                             std::invalid_argument);
        CHECK_THROWS_WITH_AS(tier.read(bad, one), doctest::Contains(key.c_str()),
                             std::invalid_argument);
        CHECK_THROWS_WITH_AS(tier.erase(bad), doctest::Contains(key.c_str()),
                             std::invalid_argument);
    }
    CHECK_THROWS_WITH_AS(tier.erase(".spillway.tmp.1.2"),
                         doctest::Contains("reserved prefix '.spillway.'"), std::invalid_argument);
    tier.write("..a", one).wait();  // merely starts with dots: a plain name
    CHECK(fs::exists(dir.path() / "..a"));
    struct stat st {};
    REQUIRE(::stat((dir.path() / "..a").c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);

    // A symbolic link planted under a key's name is replaced, never written through.
    test::temp_dir outside("file-tier-outside");
    auto target = outside.path() / "target";
    std::ofstream(target) << "untouched";
    fs::create_symlink(target, dir.path() / "link");
    auto data = test::random_bytes(5000, 5);
    tier.write("link", data).wait();
    CHECK(fs::is_regular_file(fs::symlink_status(dir.path() / "link")));
    std::ifstream in(target);
    std::string content;
    in >> content;
    CHECK(content == "untouched");
}

TEST_CASE("file_tier capacity counts stored blobs; a rewrite counts only the difference") {
    test::temp_dir dir("file-tier-capacity");
    file_tier_options bounded;
    bounded.capacity = 10'000;
    file_tier<> tier(dir.path(), bounded);
    CHECK(tier.capacity() == 10'000);
    tier.write("a", test::random_bytes(6'000, 1)).wait();
    std::string what = message_of(tier.write("b", test::random_bytes(6'000, 2)));
    CHECK(what.find("'b'") != std::string::npos);
    CHECK(what.find("capacity of 10000 bytes") != std::string::npos);
    CHECK_FALSE(tier.contains("b"));
    tier.write("a", test::random_bytes(9'000, 3)).wait();
    CHECK(tier.used() == 9'000);
    CHECK(tier.erase("a"));
    CHECK_FALSE(tier.erase("a"));
    CHECK(tier.used() == 0);
    tier.write("b", test::random_bytes(6'000, 2)).wait();
    CHECK(tier.used() == 6'000);
}

TEST_CASE(
    "file_tier is persistent, serves several threads, and its destructor waits for operations in "
    "flight") {
    test::temp_dir dir("file-tier-persist");
    constexpr int blobs = 24;
    std::vector<std::vector<std::byte>> data;
    for (int i = 0; i < blobs; ++i) data.push_back(test::random_bytes(100'000 + 4099 * i, i));
    std::vector<io_completion> pending;
    {
        file_tier_options opt;
        opt.engine.queue_depth = 4;
        opt.engine.block_size = 16 * 1024;
        file_tier<> tier(dir.path(), opt);
        for (int i = 0; i < blobs; ++i) pending.push_back(tier.write(key("k", i), data[i]));
    }  // destroyed with writes in flight: it waits for them
    for (auto& p : pending) CHECK(p.ready());
    for (auto& p : pending) p.wait();

    // A temporary file of a process of this host that is gone (pid 2^22 + 1 is above the
    // kernel's pid_max limit, so no process has it) is cleaned up, as is one whose name has
    // no host part; another host's is left alone (on a shared file system
    // its process may be running); regular files become keys.
    const std::string ours = ".spillway.tmp.4194305.7." + detail::host_name();
    const std::string legacy = ".spillway.tmp.4194305.8";
    const std::string theirs = ".spillway.tmp.4194305.9.another-host.example";
    for (const auto& n : {ours, legacy, theirs}) std::ofstream(dir.path() / n) << "stale";
    file_tier<> again(dir.path());
    CHECK_FALSE(fs::exists(dir.path() / ours));
    CHECK_FALSE(fs::exists(dir.path() / legacy));
    CHECK(fs::exists(dir.path() / theirs));
    fs::remove(dir.path() / theirs);
    CHECK(again.used() == [&] {
        std::size_t s = 0;
        for (auto& d : data) s += d.size();
        return s;
    }());
    std::vector<std::thread> threads;
    std::atomic<int> bad{0};
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&, t] {
            for (int i = t; i < blobs; i += 4) {
                std::vector<std::byte> back(data[i].size());
                try {
                    again.read(key("k", i), back).wait();
                    if (back != data[i]) ++bad;
                    again.write(key("t", i), back).wait();
                } catch (...) {
                    ++bad;
                }
            }
        });
    for (auto& th : threads) th.join();
    CHECK(bad.load() == 0);
    CHECK(again.stats().reads == blobs);
    CHECK(again.stats().writes == blobs);
}

TEST_CASE(
    "file_tier recycles the files that rewrites replace, up to spare_files, and removes them at "
    "the end") {
    test::temp_dir dir("file-tier-spares");
    {
        file_tier_options opt;
        opt.spare_files = 2;
        file_tier<> tier(dir.path(), opt);
        std::uint64_t seed = 0;
        // Rewrites of growing and shrinking sizes reuse spares: every version reads back exactly.
        for (std::size_t n :
             {std::size_t{100'000}, std::size_t{100'000}, std::size_t{300'001}, std::size_t{4096},
              std::size_t{1}, std::size_t{250'000}, std::size_t{0}, std::size_t{77'777}}) {
            CAPTURE(n);
            for (const char* k : {"a", "b", "c"}) {
                auto data = test::random_bytes(n, ++seed);
                tier.write(k, data).wait();
                std::vector<std::byte> back(n);
                tier.read(k, back).wait();
                CHECK(back == data);
                CHECK(fs::file_size(dir.path() / k) == n);
            }
            CHECK(tier.spare_files_held() <= 2);
            CHECK(no_temporary_files(tier));
        }
        CHECK(tier.spare_files_held() >= 1);  // sequential rewrites: one spare circulates
        CHECK(tier.used() == 3 * 77'777);
    }
    CHECK(reserved_files(dir.path()) == 0);
    file_tier_options none;
    none.spare_files = 0;
    file_tier<> tier(dir.path(), none);
    auto data = test::random_bytes(5000, 1);
    tier.write("a", data).wait();
    tier.write("a", data).wait();
    CHECK(tier.spare_files_held() == 0);
    CHECK(reserved_files(dir.path()) == 0);
}

namespace {
/// The POSIX engine, except that reads wait in a queue while `hold_reads` is set, until
/// release(): a read can then stay in flight across other operations.
struct held_read_engine {
    posix_engine inner;
    std::mutex mutex;
    bool hold_reads = false;
    std::vector<std::pair<io_request, io_callback>> held;
    explicit held_read_engine(io_engine_config c) : inner(c) {}
    io_completion read(int fd, std::span<std::byte> b, std::uint64_t off, std::string_view l = {}) {
        return inner.read(fd, b, off, l);
    }
    io_completion write(int fd, std::span<const std::byte> b, std::uint64_t off,
                        std::string_view l = {}) {
        return inner.write(fd, b, off, l);
    }
    void submit(const io_request& r, io_callback cb) {
        std::lock_guard lock(mutex);
        if (r.op == io_op::read && hold_reads)
            held.emplace_back(r, std::move(cb));
        else
            inner.submit(r, std::move(cb));
    }
    void release() {
        std::lock_guard lock(mutex);
        hold_reads = false;
        for (auto& [r, cb] : held) inner.submit(r, std::move(cb));
        held.clear();
    }
    io_backend backend() const { return inner.backend(); }
    std::string_view backend_name() const { return inner.backend_name(); }
    const io_engine_config& config() const { return inner.config(); }
    io_engine_counters counters() const { return inner.counters(); }
};
}  // namespace

TEST_CASE("file_tier: a read that overlaps a rewrite of its key returns the old blob, whole") {
    // The rewrite replaces K's file while the read holds it; the replaced file must not be
    // recycled (as a spare) for the next write, of L, while the read still reads it. An
    // unaligned size also gives the read its second descriptor (the tail, with O_DIRECT).
    test::temp_dir dir("ft-read-rewrite");
    file_tier<held_read_engine> tier(dir.path());
    const std::size_t n = 3 * 4096 + 100;
    const std::vector<std::byte> old_k(n, std::byte{'A'}), new_k(n, std::byte{'B'}),
        l(n, std::byte{'L'});
    tier.write("K", old_k).wait();
    auto& engine = const_cast<held_read_engine&>(tier.engine());
    engine.hold_reads = true;
    std::vector<std::byte> out(n, std::byte{0});
    auto read = tier.read("K", out);  // descriptors open, transfer held
    tier.write("K", new_k).wait();
    tier.write("L", l).wait();
    engine.release();
    CHECK(read.wait() == n);
    CHECK(out == old_k);
    CHECK(tier.spare_files_held() == 0);  // K's old file was unlinked, not kept
    // Once no read holds it, a replaced file is recycled again.
    tier.write("K", old_k).wait();
    CHECK(tier.spare_files_held() == 1);
    std::vector<std::byte> back(n);
    tier.read("K", back).wait();
    CHECK(back == old_k);
    tier.read("L", back).wait();
    CHECK(back == l);
}

TEST_CASE(
    "file_tier: of two overlapping writes of one key, the file and the size are the same write's") {
    test::temp_dir dir("ft-same-key");
    file_tier_options o;
    o.direct_io = direct_io_mode::off;
    posix_file_tier tier(dir.path(), o);
    const std::vector<std::byte> small(4096, std::byte{'s'}), large(8192, std::byte{'l'});
    for (int i = 0; i < 500; ++i) {
        auto a = tier.write("K", small);
        auto b = tier.write("K", large);
        a.wait();
        b.wait();
        const auto size = tier.size_of("K");
        REQUIRE(size);
        REQUIRE(std::filesystem::file_size(dir.path() / "K") == *size);
        std::vector<std::byte> back(*size);
        tier.read("K", back).wait();
        REQUIRE(back == (*size == small.size() ? small : large));
        REQUIRE(tier.used() == *size);
    }
}

namespace {
/// The whole content of `p` as a string.
std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
}  // namespace

TEST_CASE("file_tier never writes through a hard link: a cp -al snapshot keeps its contents") {
    // A rewritten key's old file becomes a spare; writing into a spare that has another link
    // (here the snapshot's) would overwrite the snapshot, so the tier never reuses such a file.
    test::temp_dir root("ft-hardlink");
    const auto dir = root.path() / "tier", snap = root.path() / "snap";
    fs::create_directory(dir);
    const std::string upper(16, 'A'), lower(16, 'a'), other(16, 'B');
    auto bytes = [](const std::string& s) {
        return std::span<const std::byte>(reinterpret_cast<const std::byte*>(s.data()), s.size());
    };
    {
        file_tier<> tier(dir);
        tier.write("a", bytes(upper)).wait();
        fs::create_directory(snap);  // cp -al tier snap
        for (auto& e : fs::directory_iterator(dir))
            fs::create_hard_link(e.path(), snap / e.path().filename());
        tier.write("a", bytes(lower)).wait();  // a's old file (linked from snap) is replaced
        tier.write("b", bytes(other)).wait();  // may take a spare
        CHECK(slurp(snap / "a") == upper);
        CHECK(slurp(dir / "a") == lower);
        CHECK(slurp(dir / "b") == other);
        CHECK(no_temporary_files(tier));
    }
    // A spare that gains a link after the tier kept it (the snapshot is taken later) is
    // checked on its descriptor when it is reused, and dropped, never written.
    fs::remove_all(snap);
    fs::create_directory(snap);
    {
        file_tier<> tier(dir);
        tier.write("c", bytes(upper)).wait();
        tier.write("c", bytes(lower)).wait();  // c's first file is now a spare, one link
        REQUIRE(tier.spare_files_held() == 1);
        for (auto& e : fs::directory_iterator(dir))
            fs::create_hard_link(e.path(), snap / e.path().filename());
        tier.write("d", bytes(other)).wait();
        for (auto& e : fs::directory_iterator(snap)) {
            CAPTURE(e.path());
            const std::string name = e.path().filename().string();
            if (name.rfind(".spillway.", 0) == 0) CHECK(slurp(e.path()) == upper);
        }
        CHECK(slurp(snap / "c") == lower);
        CHECK(slurp(dir / "d") == other);
        std::vector<std::byte> back(16);
        tier.read("d", back).wait();
        CHECK(std::memcmp(back.data(), other.data(), 16) == 0);
        CHECK(no_temporary_files(tier));
    }
}

TEST_CASE("file_tier: a hard link planted under a key's name is replaced, never written through" *
          doctest::skip(!can_hard_link())) {
    test::temp_dir dir("ft-planted-link");
    test::temp_dir outside("ft-planted-outside");
    const auto victim = outside.path() / "victim";
    std::ofstream(victim) << "untouched";
    file_tier<> tier(dir.path());
    std::error_code ec;
    fs::create_hard_link(victim, dir.path() / "k", ec);
    INFO("create_hard_link: " << ec.message());
    REQUIRE_FALSE(ec);  // can_hard_link() said this file system takes them
    // The planted file is not yet a key (the tier indexed the directory before it came);
    // a new tier finds it, and every rewrite and later write leave the victim alone.
    file_tier<> again(dir.path());
    REQUIRE(again.contains("k"));
    for (int i = 0; i < 4; ++i) {
        const std::string key = i % 2 ? "k" : "other";
        again.write(key, test::random_bytes(9, i)).wait();
    }
    CHECK(slurp(victim) == "untouched");
    CHECK(fs::hard_link_count(victim) == 1);  // the tier dropped its link, never wrote it
}

TEST_CASE("file_tier: a FIFO or a directory under a key's name fails the read, never blocks") {
    test::temp_dir dir("ft-fifo");
    file_tier<> tier(dir.path());
    const std::vector<std::byte> data(10, std::byte{'x'});
    tier.write("f", data).wait();
    tier.write("d", data).wait();
    fs::remove(dir.path() / "f");
    REQUIRE(::mkfifo((dir.path() / "f").c_str(), 0600) == 0);
    fs::remove(dir.path() / "d");
    fs::create_directory(dir.path() / "d");
    std::vector<std::byte> back(10);
    // (A blocking open would hang here, inside the tier's lock.)
    CHECK(message_of(tier.read("f", back)).find("is a FIFO") != std::string::npos);
    CHECK(message_of(tier.read("d", back)).find("is a directory") != std::string::npos);
    tier.write("f", data).wait();  // a rewrite replaces the FIFO
    tier.read("f", back).wait();
    CHECK(back == data);
}

TEST_CASE("file_tier key errors name the tier and cut a long key") {
    test::temp_dir dir("ft-key-errors");
    file_tier_options o;
    o.name = "scratch";
    file_tier<> tier(dir.path(), o);
    std::vector<std::byte> one(1);
    CHECK_THROWS_WITH_AS(tier.write("a/b", one), doctest::Contains("scratch: key 'a/b'"),
                         std::invalid_argument);
    const std::string huge(5000, 'k');
    try {
        tier.write(huge, one).wait();
        FAIL("a 5000-byte key was accepted");
    } catch (const std::invalid_argument& e) {
        const std::string what = e.what();
        CHECK(what.size() < 400);
        CHECK(what.find("'" + std::string(100, 'k') + "...' (5000 bytes)") != std::string::npos);
        CHECK(what.rfind("scratch: ", 0) == 0);
    }
}
