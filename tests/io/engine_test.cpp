// SPDX-License-Identifier: Apache-2.0
// Tests of the I/O engines: uring_engine, posix_engine and io_engine (automatic backend).
// Every engine runs the same cases: round trips of many sizes, splitting into pieces, the
// queue depth bound, concurrent submitters, retried short transfers and EAGAIN, error
// messages, destruction with requests in flight.
#include <spillway/io/aligned_buffer.hpp>
#include <spillway/io/io_engine.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cstddef>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/random_bytes.hpp"
#include "support/skip.hpp"
#include "support/temp_dir.hpp"

using namespace spillway;

namespace {

#ifdef SPILLWAY_SANITIZED
constexpr std::size_t big = std::size_t{8} << 20;
#else
constexpr std::size_t big = std::size_t{48} << 20;
#endif

/// A scratch file opened read-write, closed at scope exit.
struct scratch_file {
    test::temp_dir dir{"engine"};
    std::string path = (dir.path() / "data").string();
    int fd = -1;
    explicit scratch_file(int extra_flags = 0) {
        fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | extra_flags, 0600);
        if (fd < 0 && extra_flags != 0) fd = -2;  // the caller checks for "no O_DIRECT here"
        REQUIRE(fd != -1);
    }
    ~scratch_file() {
        if (fd >= 0) ::close(fd);
    }
};

template <class Engine>
std::unique_ptr<Engine> make_engine(io_engine_config config) {
#if SPILLWAY_HAS_LIBURING
    if constexpr (std::is_same_v<Engine, uring_engine>) {
        if (!uring_probe().available) {
            MESSAGE("io_uring unavailable here (" << uring_probe().reason
                                                  << "): uring_engine cases skipped");
            return nullptr;
        }
    }
#endif
    return std::make_unique<Engine>(std::move(config));
}

std::size_t pieces_of(std::size_t n, std::size_t block) {
    return (n + block - 1) / block;
}

/// Polls `done` for up to a minute: a bound only a hang reaches, however loaded the machine.
template <class Pred>
bool within_a_minute(Pred done) {
    for (auto end = std::chrono::steady_clock::now() + std::chrono::minutes(1);
         std::chrono::steady_clock::now() < end;) {
        if (done()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return done();
}

}  // namespace

#if SPILLWAY_HAS_LIBURING
#define SPILLWAY_ENGINES posix_engine, uring_engine, io_engine
#else
#define SPILLWAY_ENGINES posix_engine, io_engine
#endif

TEST_CASE_TEMPLATE("engine round trips of many sizes, split into block-size pieces", Engine,
                   SPILLWAY_ENGINES) {
    io_engine_config cfg;
    cfg.queue_depth = 8;
    cfg.block_size = 64 * 1024;
    auto engine = make_engine<Engine>(cfg);
    if (!engine) return;
    scratch_file f;
    std::uint64_t offset = 0;
    std::size_t expected_pieces = 0;
    for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{4095}, std::size_t{4096},
                          std::size_t{65535}, std::size_t{65536}, std::size_t{65537},
                          std::size_t{1} << 20, (std::size_t{5} << 20) + 3}) {
        CAPTURE(n);
        auto data = test::random_bytes(n, n);
        CHECK(engine->write(f.fd, data, offset, f.path).wait() == n);
        std::vector<std::byte> back(n);
        CHECK(engine->read(f.fd, back, offset, f.path).wait() == n);
        CHECK(back == data);
        expected_pieces += 2 * pieces_of(n, cfg.block_size);
        offset += n + 13;  // unaligned offsets too
    }
    auto c = engine->counters();
    CHECK(c.pieces == expected_pieces);
    CHECK(c.requests == 18);
    CHECK(c.failures == 0);
    CHECK(c.max_in_flight <= cfg.queue_depth);
    std::vector<std::byte> empty;
    CHECK(engine->read(f.fd, empty, 0, f.path).wait() == 0);
}

TEST_CASE_TEMPLATE("engine with O_DIRECT moves aligned requests of many sizes", Engine,
                   SPILLWAY_ENGINES) {
    io_engine_config cfg;
    cfg.queue_depth = 16;
    cfg.block_size = 128 * 1024;
    auto engine = make_engine<Engine>(cfg);
    if (!engine) return;
    scratch_file f(O_DIRECT);
    if (f.fd < 0) {
        MESSAGE(
            "the file system of the test directory refuses O_DIRECT: O_DIRECT engine case skipped");
        return;
    }
    for (std::size_t n : {std::size_t{4096}, std::size_t{128} * 1024, std::size_t{3} << 20, big}) {
        CAPTURE(n);
        aligned_buffer out(n), in(n);
        auto data = test::random_bytes(n, n + 1);
        std::memcpy(out.data(), data.data(), n);
        engine->write(f.fd, out.bytes(), 4096, f.path).wait();
        engine->read(f.fd, in.bytes(), 4096, f.path).wait();
        CHECK(std::memcmp(in.data(), data.data(), n) == 0);
    }
}

TEST_CASE_TEMPLATE("engine keeps at most queue_depth pieces in flight", Engine, SPILLWAY_ENGINES) {
    io_engine_config cfg;
    cfg.queue_depth = 4;
    cfg.block_size = 4096;
    // Slow every piece down so that pieces overlap whatever the scheduler does.
    cfg.result_filter = [](io_op, long res, std::size_t) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        return res;
    };
    auto engine = make_engine<Engine>(cfg);
    if (!engine) return;
    scratch_file f;
    auto data = test::random_bytes(64 * 4096, 3);
    engine->write(f.fd, data, 0, f.path).wait();
    auto c = engine->counters();
    CHECK(c.pieces == 64);
    CHECK(c.max_in_flight == cfg.queue_depth);
}

TEST_CASE_TEMPLATE("engine serves several submitting threads at once", Engine, SPILLWAY_ENGINES) {
    io_engine_config cfg;
    cfg.queue_depth = 8;
    cfg.block_size = 16 * 1024;
    auto engine = make_engine<Engine>(cfg);
    if (!engine) return;
    scratch_file f;
    constexpr int threads = 4, per_thread = 12;
    const std::size_t n = 100'003;  // not a multiple of the block size
    std::atomic<int> bad{0};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
            for (int i = 0; i < per_thread; ++i) {
                std::uint64_t off = static_cast<std::uint64_t>(t * per_thread + i) * n;
                auto data = test::random_bytes(n, off + 1);
                std::vector<std::byte> back(n);
                try {
                    auto w = engine->write(f.fd, data, off, f.path);
                    w.wait();
                    engine->read(f.fd, back, off, f.path).wait();
                    if (back != data) ++bad;
                } catch (...) {
                    ++bad;
                }
            }
        });
    for (auto& th : pool) th.join();
    CHECK(bad.load() == 0);
    CHECK(engine->counters().requests == 2 * threads * per_thread);
}

TEST_CASE_TEMPLATE("engine retries short transfers and EAGAIN", Engine, SPILLWAY_ENGINES) {
    io_engine_config cfg;
    cfg.queue_depth = 4;
    cfg.block_size = 64 * 1024;
    std::atomic<int> calls{0}, shortened{0}, again{0};
    // Every third raw result becomes -EAGAIN, every other full one is cut in half: the
    // engine has to redo those parts, and the data must still round-trip exactly.
    cfg.result_filter = [&](io_op, long res, std::size_t requested) -> long {
        int k = calls.fetch_add(1);
        if (k % 3 == 0) {
            ++again;
            return -EAGAIN;
        }
        if (k % 2 == 0 && res > 1 && static_cast<std::size_t>(res) == requested) {
            ++shortened;
            return res / 2;
        }
        return res;
    };
    auto engine = make_engine<Engine>(cfg);
    if (!engine) return;
    scratch_file f;
    for (std::size_t n :
         {std::size_t{1}, std::size_t{3000}, std::size_t{1} << 20, (std::size_t{2} << 20) + 17}) {
        CAPTURE(n);
        auto data = test::random_bytes(n, 7 * n);
        engine->write(f.fd, data, 5, f.path).wait();
        std::vector<std::byte> back(n);
        engine->read(f.fd, back, 5, f.path).wait();
        CHECK(back == data);
    }
    auto c = engine->counters();
    CHECK(c.failures == 0);
    CHECK(c.again_retries == static_cast<std::uint64_t>(again.load()));
    CHECK(c.short_retries == static_cast<std::uint64_t>(shortened.load()));
    CHECK(c.again_retries > 0);
    CHECK(c.short_retries > 0);
}

TEST_CASE_TEMPLATE("engine errors name the call, the label, the size, the offset and the errno",
                   Engine, SPILLWAY_ENGINES) {
    io_engine_config cfg;
    cfg.queue_depth = 4;
    cfg.block_size = 4096;
    std::atomic<bool> inject{false};
    std::atomic<int> seen{0};
    cfg.result_filter = [&](io_op, long res, std::size_t) -> long {
        if (inject && seen.fetch_add(1) == 2) return -EIO;  // the third piece fails
        return res;
    };
    auto engine = make_engine<Engine>(cfg);
    if (!engine) return;
    scratch_file f;
    auto data = test::random_bytes(10'000, 1);
    engine->write(f.fd, data, 0, f.path).wait();

    SUBCASE("end of file during a read") {
        std::vector<std::byte> back(20'000);
        try {
            engine->read(f.fd, back, 0, f.path).wait();
            FAIL("a read past the end of the file succeeded");
        } catch (const std::system_error& e) {
            std::string what = e.what();
            CHECK(e.code() == std::errc::no_message_available);
            CHECK(what.find(f.path) != std::string::npos);
            CHECK(what.find("read of 20000 bytes at offset 0") != std::string::npos);
            CHECK(what.find("end of file") != std::string::npos);
        }
    }
    SUBCASE("a descriptor opened read-only refuses a write") {
        int ro = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
        REQUIRE(ro >= 0);
        try {
            engine->write(ro, data, 123, "label-for-ro").wait();
            FAIL("a write to a read-only descriptor succeeded");
        } catch (const std::system_error& e) {
            std::string what = e.what();
            CHECK(e.code() == std::errc::bad_file_descriptor);
            CHECK(what.find("label-for-ro") != std::string::npos);
            CHECK(what.find("write of 10000 bytes at offset 123") != std::string::npos);
        }
        ::close(ro);
    }
    SUBCASE("an EIO in the third piece fails the request and names the piece") {
        inject = true;
        std::vector<std::byte> back(10'000);
        try {
            engine->read(f.fd, back, 0, f.path).wait();
            FAIL("the injected EIO was lost");
        } catch (const std::system_error& e) {
            std::string what = e.what();
            CHECK(e.code() == std::errc::io_error);
            CHECK(what.find("piece of") != std::string::npos);
            CHECK(what.find(f.path) != std::string::npos);
        }
        inject = false;
        CHECK(engine->counters().failures == 1);
    }
    SUBCASE("a request past the largest file offset is refused at once, and does not hang") {
        // read() and write() throw from submit(); the handle they made must not wait, as
        // the exception unwinds, for a completion that will never come.
        std::vector<std::byte> back(4096);
        CHECK_THROWS_WITH_AS(
            engine->read(f.fd, back, UINT64_MAX - 100, "far-away"),
            doctest::Contains(
                "far-away: read of 4096 bytes at offset 18446744073709551515 runs past "
                "the largest file offset"),
            std::invalid_argument);
        CHECK_THROWS_AS(engine->write(f.fd, data, std::uint64_t{1} << 63, "far-away"),
                        std::invalid_argument);
    }
    // The engine stays usable after a failed request.
    std::vector<std::byte> back(data.size());
    engine->read(f.fd, back, 0, f.path).wait();
    CHECK(back == data);
}

TEST_CASE_TEMPLATE("destroying an engine waits for every request in flight", Engine,
                   SPILLWAY_ENGINES) {
    io_engine_config cfg;
    cfg.queue_depth = 2;
    cfg.block_size = 4096;
    cfg.result_filter = [](io_op, long res, std::size_t) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        return res;
    };
    scratch_file f;
    auto data = test::random_bytes(64 * 1024, 9);
    std::atomic<int> done{0};
    {
        auto engine = make_engine<Engine>(cfg);
        if (!engine) return;
        for (int i = 0; i < 20; ++i)
            engine->submit({io_op::write, f.fd, data.data(), data.size(),
                            static_cast<std::uint64_t>(i) * data.size(), f.path},
                           [&](std::size_t n, std::exception_ptr err) {
                               if (!err && n == data.size()) ++done;
                           });
    }  // the destructor waits here
    CHECK(done.load() == 20);
}

TEST_CASE("engine configuration is validated eagerly") {
    io_engine_config cfg;
    cfg.queue_depth = 0;
    CHECK_THROWS_WITH_AS(posix_engine{cfg}, doctest::Contains("queue_depth 0"),
                         std::invalid_argument);
    cfg.queue_depth = 8;
    cfg.block_size = 1000;
    CHECK_THROWS_WITH_AS(io_engine{cfg}, doctest::Contains("block_size 1000"),
                         std::invalid_argument);
#if SPILLWAY_HAS_LIBURING
    CHECK_THROWS_WITH_AS(uring_engine{cfg}, doctest::Contains("block_size 1000"),
                         std::invalid_argument);
#endif
}

TEST_CASE("automatic backend picks io_uring when the probe passes and says why not otherwise") {
    const auto& probe = uring_probe();
    io_engine automatic;
    if (probe.available) {
        CHECK(automatic.backend() == io_backend::io_uring);
        CHECK(automatic.backend_name() == "io_uring");
        CHECK(automatic.fallback_reason().empty());
    } else {
        MESSAGE("io_uring unavailable: " << probe.reason);
        CHECK(automatic.backend() == io_backend::posix);
        CHECK(automatic.fallback_reason() == probe.reason);
        CHECK_THROWS_AS(io_engine({}, io_backend::io_uring), std::system_error);
    }
    io_engine forced_posix({}, io_backend::posix);
    CHECK(forced_posix.backend() == io_backend::posix);
    CHECK(forced_posix.backend_name() == "posix");
    CHECK(forced_posix.fallback_reason().empty());

    // The environment switch turns the probe off (for machines where io_uring misbehaves).
    ::setenv("SPILLWAY_DISABLE_IO_URING", "1", 1);
    auto off = detail::probe_uring_uncached();
    ::unsetenv("SPILLWAY_DISABLE_IO_URING");
    CHECK_FALSE(off.available);
#if SPILLWAY_HAS_LIBURING
    CHECK(off.reason.find("SPILLWAY_DISABLE_IO_URING") != std::string::npos);
#else
    // The probe's first question is whether liburing was built in at all.
    CHECK(off.reason.find("built without liburing") != std::string::npos);
#endif
}

#if SPILLWAY_HAS_LIBURING
TEST_CASE("uring_engine retries real short reads from a pipe" *
          spillway::test::skip_without_uring()) {
    int p[2];
    REQUIRE(::pipe2(p, O_NONBLOCK | O_CLOEXEC) == 0);
    io_engine_config cfg;
    cfg.queue_depth = 2;
    cfg.block_size = 4096;
    auto data = test::random_bytes(3000, 11);
    std::vector<std::byte> back(data.size());
    {
        uring_engine engine(cfg);
        // Nothing is in the pipe yet; then 1000 bytes arrive (a short read: the kernel
        // completes the read with what there is), then the other 2000. (Recent kernels wait
        // for data inside io_uring even on O_NONBLOCK pipes, so -EAGAIN is proven with the
        // result filter above, not here.)
        // Each step waits for the engine's own counters (not a nap that a loaded machine may
        // outlast): the read is in the kernel before the first bytes come, and the short
        // read was seen and resubmitted before the rest come.
        auto c = engine.read(p[0], back, 0, "pipe");
        REQUIRE(within_a_minute([&] { return engine.counters().pieces == 1; }));
        REQUIRE(::write(p[1], data.data(), 1000) == 1000);
        REQUIRE(within_a_minute([&] { return engine.counters().short_retries >= 1; }));
        REQUIRE(::write(p[1], data.data() + 1000, 2000) == 2000);
        CHECK(c.wait() == data.size());
        CHECK(back == data);
        auto counters = engine.counters();
        CHECK(counters.short_retries >= 1);
        MESSAGE("pipe read: " << counters.short_retries << " short and " << counters.again_retries
                              << " EAGAIN retries");
    }
    ::close(p[0]);
    ::close(p[1]);
}

TEST_CASE("uring_engine with registered files and buffers round-trips, and refuses misuse") {
    if (!uring_probe().available) {
        MESSAGE("io_uring unavailable here (" << uring_probe().reason
                                              << "): registration case skipped");
        return;
    }
    for (auto reg :
         {io_registration::files, io_registration::buffers, io_registration::files_and_buffers}) {
        CAPTURE(static_cast<int>(reg));
        io_engine_config cfg;
        cfg.queue_depth = 8;
        cfg.block_size = 64 * 1024;
        cfg.registration = reg;
        uring_engine engine(cfg);
        aligned_buffer pinned(1 << 20);
        if (registers_buffers(reg)) {
            std::span<std::byte> bufs[] = {pinned.bytes()};
            engine.register_buffers(bufs);
            CHECK_THROWS_AS(engine.register_buffers(bufs), std::logic_error);
        } else {
            std::span<std::byte> bufs[] = {pinned.bytes()};
            CHECK_THROWS_AS(engine.register_buffers(bufs), std::logic_error);
        }
        scratch_file f;
        auto data = test::random_bytes(pinned.size(), 21);
        std::memcpy(pinned.data(), data.data(), data.size());
        engine.write(f.fd, pinned.bytes(), 0, f.path).wait();
        std::memset(pinned.data(), 0, pinned.size());
        engine.read(f.fd, pinned.bytes(), 0, f.path).wait();
        CHECK(std::memcmp(pinned.data(), data.data(), data.size()) == 0);
        // A buffer outside the registered one uses the plain opcodes.
        std::vector<std::byte> other(5000);
        engine.read(f.fd, other, 100, f.path).wait();
        CHECK(std::memcmp(other.data(), data.data() + 100, other.size()) == 0);
    }
}

TEST_CASE("automatic backend falls back to POSIX when seccomp forbids io_uring_setup") {
    // A forked child installs a seccomp filter that answers io_uring_setup with ENOSYS (what
    // a container runtime's default profile does), then asks for an automatic engine.
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        sock_filter filter[] = {
            {BPF_LD | BPF_W | BPF_ABS, 0, 0,
             static_cast<std::uint32_t>(offsetof(seccomp_data, nr))},
            {BPF_JMP | BPF_JEQ | BPF_K, 0, 1, static_cast<std::uint32_t>(__NR_io_uring_setup)},
            {BPF_RET | BPF_K, 0, 0, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA)},
            {BPF_RET | BPF_K, 0, 0, SECCOMP_RET_ALLOW},
        };
        sock_fprog prog{static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
        if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) ::_exit(10);
        if (::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) ::_exit(11);
        auto probe = detail::probe_uring_uncached();
        if (probe.available) ::_exit(12);
        if (probe.reason.find("io_uring_queue_init") == std::string::npos) ::_exit(13);
        io_engine engine;  // uring_probe() may be cached from before the filter: still falls back
        if (engine.backend() != io_backend::posix) ::_exit(14);
        if (engine.fallback_reason().empty()) ::_exit(15);
        scratch_file f;
        auto data = test::random_bytes(10'000, 5);
        std::vector<std::byte> back(data.size());
        engine.write(f.fd, data, 0, f.path).wait();
        engine.read(f.fd, back, 0, f.path).wait();
        ::_exit(back == data ? 0 : 16);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
}
#endif

TEST_CASE(
    "a completion whose every producer copy is gone unfinished fails with ECANCELED instead of "
    "hanging") {
    io_completion handle;
    {
        completion_source source;
        handle = source.handle();
        completion_source copy = source;  // (the engine keeps one, the caller's call another)
    }
    REQUIRE(handle.ready());
    try {
        handle.wait();
        FAIL("an abandoned operation succeeded");
    } catch (const std::system_error& e) {
        CHECK(e.code().value() == ECANCELED);
        CHECK(std::string(e.what()).find("abandoned") != std::string::npos);
    }
    // A completed source is not touched when it goes.
    io_completion done;
    {
        completion_source source;
        done = source.handle();
        source.succeed(7);
    }
    CHECK(done.wait() == 7);
}
