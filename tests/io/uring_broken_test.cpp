// SPDX-License-Identifier: Apache-2.0
// Tests of uring_engine when its ring breaks under it (guarantee 6 of uring_engine.hpp).
//
// The ring is broken from the outside: the test finds the descriptors of the rings the
// engine's constructor opened (/proc/self/fd links that read "anon_inode:[io_uring]" and
// were not there before) and dup2()s /dev/null onto them, so the engine's next
// io_uring_enter fails with EOPNOTSUPP. A completion thread already asleep in
// io_uring_enter keeps the old ring alive until it returns. Each case covers one way the
// engine learns of the break:
// - idle engine, the next submit() fails: later requests fail at once;
// - requests queued beyond the queue depth, a piece in the kernel: the queue fails, the piece
//   completes;
// - a piece in the kernel: it completes when the kernel finishes it, however late, never earlier;
// - the descriptor's number closed and taken by another ring: requests fail, nothing spins;
// - io_uring_wait_cqe fails: pieces the kernel completes later still complete, nothing spins.
// A watchdog ends the process when a case hangs (an engine that aborts or spins for ever).
#include <spillway/io/uring_engine.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "support/random_bytes.hpp"
#include "support/skip.hpp"
#include "support/temp_dir.hpp"

#if SPILLWAY_HAS_LIBURING

using namespace spillway;
using namespace std::chrono_literals;

namespace {

/// Ends the process with a message when the case is still running after `limit` (doctest has
/// no timeout, and a hang would otherwise last until ctest's).
class watchdog {
public:
    explicit watchdog(const char* name, std::chrono::seconds limit = 60s)
        : thread_([this, name, limit] {
              std::unique_lock lock(mutex_);
              if (!cv_.wait_for(lock, limit, [&] { return done_; })) {
                  std::fprintf(stderr, "uring_broken_test: '%s' still running after %llds: hung\n",
                               name, static_cast<long long>(limit.count()));
                  std::_Exit(3);
              }
          }) {}
    ~watchdog() {
        {
            std::lock_guard lock(mutex_);
            done_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }

private:
    std::mutex mutex_;
    std::condition_variable cv_;
    bool done_ = false;
    std::thread thread_;
};

/// The descriptors of this process's io_uring rings.
std::vector<int> uring_fds() {
    std::vector<int> fds;
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
        std::error_code ec;
        auto target = std::filesystem::read_symlink(entry.path(), ec);
        if (!ec && target == "anon_inode:[io_uring]")
            fds.push_back(std::stoi(entry.path().filename().string()));
    }
    return fds;
}

/// Puts /dev/null on every ring descriptor opened since `before` was listed; returns them.
std::vector<int> break_rings(const std::vector<int>& before) {
    int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    REQUIRE(devnull >= 0);
    std::vector<int> broken;
    for (int fd : uring_fds()) {
        if (std::find(before.begin(), before.end(), fd) != before.end()) continue;
        REQUIRE(::dup2(devnull, fd) == fd);
        broken.push_back(fd);
    }
    ::close(devnull);
    REQUIRE(!broken.empty());
    return broken;
}

/// After the engine is gone: the numbers that now name /dev/null are not the engine's, and
/// its destructor must have left them open. The test closes them.
void close_broken(const std::vector<int>& fds) {
    for (int fd : fds) {
        CHECK(::fcntl(fd, F_GETFD) != -1);
        ::close(fd);
    }
}

/// Polls `done` for up to 60 s (a bound only a hang reaches, however loaded the machine).
template <class Pred>
bool eventually(Pred done) {
    for (auto end = std::chrono::steady_clock::now() + 60s;
         std::chrono::steady_clock::now() < end;) {
        if (done()) return true;
        std::this_thread::sleep_for(1ms);
    }
    return done();
}

/// Checks that `c` failed with the broken ring's error: EOPNOTSUPP, a message naming
/// io_uring, `call` (when given), the errno text and each of `parts`.
void check_broken(io_completion& c, std::initializer_list<std::string_view> parts,
                  std::string_view call = {}) {
    try {
        c.wait();
        FAIL("a request on a broken ring succeeded");
    } catch (const std::system_error& e) {
        std::string what = e.what();
        INFO(what);
        CHECK(e.code().value() == EOPNOTSUPP);
        CHECK(what.find("io_uring") != std::string::npos);
        if (!call.empty()) CHECK(what.find(call) != std::string::npos);
        CHECK(what.find(std::generic_category().message(EOPNOTSUPP)) != std::string::npos);
        for (auto p : parts) CHECK(what.find(p) != std::string::npos);
    }
}

/// What the scheduler counted for one thread: CPU seconds and context switches (voluntary and
/// not). A spinning thread shows as one or the other whatever the load: on an idle machine it
/// burns CPU, on a busy one each yield gives the core away and counts a switch.
struct thread_activity {
    double cpu_seconds = 0;
    long switches = 0;
};

/// The activity of this process's thread named `name` (the first one found).
thread_activity activity_of(const std::string& name) {
    for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
        std::ifstream comm(task.path() / "comm");
        std::string n;
        if (!std::getline(comm, n) || n != name) continue;
        thread_activity a;
        std::ifstream stat(task.path() / "stat");
        std::string line;
        std::getline(stat, line);
        // Fields after the command's closing parenthesis: state is field 3, utime 14, stime 15.
        std::istringstream rest(line.substr(line.rfind(')') + 2));
        std::vector<std::string> f{std::istream_iterator<std::string>(rest), {}};
        REQUIRE(f.size() > 12);
        a.cpu_seconds = static_cast<double>(std::stol(f[11]) + std::stol(f[12])) /
                        static_cast<double>(::sysconf(_SC_CLK_TCK));
        std::ifstream status(task.path() / "status");
        for (std::string l; std::getline(status, l);)
            if (l.rfind("voluntary_ctxt_switches:", 0) == 0 ||
                l.rfind("nonvoluntary_ctxt_switches:", 0) == 0)
                a.switches += std::stol(l.substr(l.find(':') + 1));
        return a;
    }
    FAIL("no thread named " << name);
    return {};
}

/// The scheduler state ('R' running, 'S' asleep, ...) of this process's threads named
/// `name`, as one string (one letter each, in /proc order).
std::string states_of(const std::string& name) {
    std::string states;
    for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
        std::ifstream comm(task.path() / "comm");
        std::string n;
        if (!std::getline(comm, n) || n != name) continue;
        std::ifstream stat(task.path() / "stat");
        std::string line;
        std::getline(stat, line);
        const auto close = line.rfind(')');
        if (close != std::string::npos && close + 2 < line.size()) states += line[close + 2];
    }
    return states;
}

/// Waits until every thread named `name` sleeps ('S': a completion thread in io_uring_enter)
/// instead of trusting a fixed nap to be long enough on a loaded machine. A thread that never
/// sleeps within 60 s is spinning: false.
bool asleep_soon(const std::string& name) {
    return eventually([&] {
        const auto st = states_of(name);
        return !st.empty() && st.find_first_not_of('S') == std::string::npos;
    });
}

/// A scratch file opened read-write, closed at scope exit.
struct scratch_file {
    test::temp_dir dir{"uring-broken"};
    std::string path = (dir.path() / "data").string();
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    scratch_file() { REQUIRE(fd >= 0); }
    ~scratch_file() { ::close(fd); }
};

/// A pipe, closed at scope exit.
struct pipe_pair {
    int fds[2] = {-1, -1};
    pipe_pair() { REQUIRE(::pipe2(fds, O_CLOEXEC) == 0); }
    ~pipe_pair() {
        ::close(fds[0]);
        ::close(fds[1]);
    }
    void put(const std::vector<std::byte>& bytes) const {
        REQUIRE(::write(fds[1], bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
    }
};

}  // namespace

TEST_CASE(
    "uring_engine whose ring breaks while idle fails later requests at once, and its destructor "
    "returns" *
    spillway::test::skip_without_uring()) {
    watchdog dog("idle ring breaks");
    scratch_file f;
    auto data = test::random_bytes(10'000, 3);
    for (auto reg : {io_registration::none, io_registration::files}) {
        CAPTURE(static_cast<int>(reg));
        io_engine_config cfg;
        cfg.queue_depth = 4;
        cfg.block_size = 4096;
        cfg.registration = reg;
        auto before = uring_fds();
        auto engine = std::make_unique<uring_engine>(cfg);
        CHECK(engine->write(f.fd, data, 0, f.path).wait() == data.size());
        REQUIRE(asleep_soon("spw-uring"));  // the completion thread is in io_uring_enter now
        auto broken = break_rings(before);

        auto w = engine->write(f.fd, data, 0, f.path);
        check_broken(w, {f.path, "write of 10000 bytes at offset 0"}, "io_uring_submit");
        std::vector<std::byte> back(data.size());
        auto r = engine->read(f.fd, back, 4096, "after-break");
        check_broken(r, {"after-break", "read of 10000 bytes at offset 4096"});

        std::atomic<int> calls{0};
        std::promise<std::exception_ptr> outcome;
        engine->submit({io_op::write, f.fd, data.data(), data.size(), 0, "callback-form"},
                       [&](std::size_t n, std::exception_ptr err) {
                           CHECK(n == 0);
                           if (calls.fetch_add(1) == 0) outcome.set_value(err);
                       });
        auto err = outcome.get_future().get();
        REQUIRE(err != nullptr);
        io_completion failed = io_completion::failed(err);
        check_broken(failed, {"callback-form"});

        auto c = engine->counters();
        CHECK(c.requests == 4);
        CHECK(c.failures == 3);
        engine.reset();  // returns, and frees the ring
        CHECK(calls.load() == 1);
        close_broken(broken);
    }
}

TEST_CASE(
    "uring_engine fails requests queued beyond the queue depth when its ring breaks; the piece in "
    "the kernel "
    "completes" *
    spillway::test::skip_without_uring()) {
    watchdog dog("queued requests");
    scratch_file f;
    pipe_pair p;
    io_engine_config cfg;
    cfg.queue_depth = 1;
    cfg.block_size = 4096;
    auto payload = test::random_bytes(100, 5);
    auto data = test::random_bytes(3 * 4096, 6);
    std::vector<std::byte> in(payload.size());
    auto before = uring_fds();
    auto engine = std::make_unique<uring_engine>(cfg);
    auto r = engine->read(p.fds[0], in, 0, "pipe");
    REQUIRE(eventually([&] { return engine->counters().pieces == 1; }));
    // Each submit() takes the engine's lock after the completion thread handed the read to the
    // kernel (it counted the piece under that lock): the read is in the kernel, and the writes
    // wait behind it in the queue (one slot).
    std::vector<io_completion> writes;
    for (int i = 0; i < 5; ++i)
        writes.push_back(engine->write(f.fd, data, std::uint64_t(i) * data.size(), f.path));
    CHECK(engine->counters().pieces == 1);
    auto broken = break_rings(before);
    p.put(payload);
    CHECK(r.wait() == payload.size());
    CHECK(in == payload);
    for (std::size_t i = 0; i < writes.size(); ++i) {
        CAPTURE(i);
        check_broken(writes[i],
                     {f.path, "write of 12288 bytes at offset " + std::to_string(i * data.size())});
    }
    auto c = engine->counters();
    CHECK(c.requests == 6);
    CHECK(c.failures == 5);
    engine.reset();
    close_broken(broken);
}

TEST_CASE(
    "uring_engine completes a piece the kernel held when its ring broke only when the kernel "
    "finishes it" *
    spillway::test::skip_without_uring()) {
    watchdog dog("late piece");
    scratch_file f;
    pipe_pair p;
    io_engine_config cfg;
    cfg.queue_depth = 2;
    cfg.block_size = 4096;
    auto data = test::random_bytes(5000, 8), payload = test::random_bytes(100, 9);
    std::vector<std::byte> in(payload.size());
    auto before = uring_fds();
    auto engine = std::make_unique<uring_engine>(cfg);
    auto r = engine->read(p.fds[0], in, 0, "late-pipe");
    REQUIRE(eventually([&] { return engine->counters().pieces == 1; }));
    // This write's submit() takes the lock after the read was handed to the kernel.
    CHECK(engine->write(f.fd, data, 0, f.path).wait() == data.size());
    REQUIRE(asleep_soon("spw-uring"));
    auto broken = break_rings(before);

    auto w = engine->write(f.fd, data, 0, f.path);
    check_broken(w, {f.path});
    // The kernel still owns the read's buffer: the engine must not call the read finished
    // however long the data takes (failing it after a grace period would let the kernel
    // write the buffer after its owner got it back).
    std::this_thread::sleep_for(1500ms);
    CHECK_FALSE(r.ready());
    p.put(payload);
    CHECK(r.wait() == payload.size());
    CHECK(in == payload);
    engine.reset();
    close_broken(broken);
}

TEST_CASE(
    "uring_engine whose ring descriptor was closed and now names another ring fails requests "
    "instead of "
    "spinning" *
    spillway::test::skip_without_uring()) {
    watchdog dog("descriptor reused");
    scratch_file f;
    auto data = test::random_bytes(5000, 13);
    auto before = uring_fds();
    auto a = std::make_unique<uring_engine>();
    CHECK(a->write(f.fd, data, 0, f.path).wait() == data.size());
    REQUIRE(asleep_soon("spw-uring"));  // A's completion thread is asleep in io_uring_enter
    std::vector<int> a_fds;
    for (int fd : uring_fds())
        if (std::find(before.begin(), before.end(), fd) == before.end()) a_fds.push_back(fd);
    REQUIRE(a_fds.size() == 1);
    ::close(a_fds[0]);
    auto b = std::make_unique<uring_engine>();  // takes the lowest free number: A's
    const auto now = uring_fds();
    REQUIRE(std::find(now.begin(), now.end(), a_fds[0]) != now.end());
    // A's io_uring_enter now reaches B's ring, which takes none of A's entries: an engine
    // that keeps resubmitting spins there for ever, holding its lock.
    auto w = a->write(f.fd, data, 0, "after-reuse");
    try {
        w.wait();
        FAIL("a write through a closed ring descriptor succeeded");
    } catch (const std::system_error& e) {
        INFO(e.what());
        CHECK(e.code().value() == EBADF);
        CHECK(std::string(e.what()).find("io_uring_submit") != std::string::npos);
        CHECK(std::string(e.what()).find("after-reuse") != std::string::npos);
    }
    a.reset();  // must not close B's ring, which holds the number now
    CHECK(b->write(f.fd, data, 0, f.path).wait() == data.size());
}

TEST_CASE(
    "uring_engine whose io_uring_wait_cqe fails still completes what the kernel finishes, and does "
    "not spin" *
    spillway::test::skip_without_uring()) {
    watchdog dog("wait fails");
    scratch_file f;
    pipe_pair a, b;
    io_engine_config cfg;
    cfg.queue_depth = 3;
    cfg.block_size = 4096;
    auto pa = test::random_bytes(100, 10), pb = test::random_bytes(200, 11),
         data = test::random_bytes(5000, 12);
    std::vector<std::byte> ina(pa.size()), inb(pb.size());
    auto before = uring_fds();
    auto engine = std::make_unique<uring_engine>(cfg);
    auto ra = engine->read(a.fds[0], ina, 0, "pipe-a");
    auto rb = engine->read(b.fds[0], inb, 0, "pipe-b");
    REQUIRE(eventually([&] { return engine->counters().pieces == 2; }));
    CHECK(engine->write(f.fd, data, 0, f.path).wait() ==
          data.size());  // both reads are in the kernel now
    REQUIRE(asleep_soon("spw-uring"));
    auto broken = break_rings(before);
    // Nothing submits: the completion thread learns of the break when, after the completion
    // of read A, its next io_uring_wait_cqe fails.
    a.put(pa);
    CHECK(ra.wait() == pa.size());
    CHECK(ina == pa);
    // An engine that retries the failing wait spins: a whole core when idle, a switch per
    // yield when the machine is busy. The completion thread (the only "spw-uring" here) must
    // sleep. The check reads that thread's own counters, not the clock: a sleeping thread
    // shows no CPU time and a switch per wake-up (its one-second wait timeout), however slow
    // or busy the machine; the bounds sit far above that and far below a spinner's (0.49 s
    // of CPU idle, 125 switches beside three busy loops). It first waits until the thread
    // is asleep, so the work of completing read A is never counted.
    REQUIRE(asleep_soon("spw-uring"));
    const auto before_nap = activity_of("spw-uring");
    std::this_thread::sleep_for(500ms);
    const auto after_nap = activity_of("spw-uring");
    CHECK(after_nap.cpu_seconds - before_nap.cpu_seconds < 0.1);
    CHECK(after_nap.switches - before_nap.switches < 50);
    // Read B completes through the ring's memory although the ring can no longer be waited on.
    b.put(pb);
    CHECK(rb.wait() == pb.size());
    CHECK(inb == pb);
    auto w = engine->write(f.fd, data, 0, "late-write");
    check_broken(w, {"late-write"}, "io_uring_wait_cqe");
    engine.reset();
    close_broken(broken);
}

#else
TEST_CASE("uring_engine broken-ring cases: built without liburing" * doctest::skip()) {}
#endif
