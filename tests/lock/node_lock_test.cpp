// SPDX-License-Identifier: Apache-2.0
// node_lock: exclusion across forked processes and threads, release on SIGKILL, no deadlock
// under a try_lock storm, and the lock file's safety rules.
//
// Forked children do only simple work (open the lock, pread/pwrite a shared file, sleep)
// and leave with _exit(); every assertion is made in the parent.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <spillway/lock/node_lock.hpp>

#include "support/temp_dir.hpp"

using namespace spillway;
namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

namespace {

// A lock directory of its own per test (on /dev/shm when present: node-local like the
// default), so concurrent test runs never share lock names.
test::temp_dir lock_dir() {
    std::error_code ec;
    if (fs::is_directory("/dev/shm", ec))
        return test::temp_dir::under("/dev/shm", "spillway-locktest");
    return test::temp_dir("spillway-locktest");
}

void nap_us(long us) {
    timespec ts{us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, nullptr);
}

// The shared file: [0] "inside" flag (int64), [8] counter (int64), [16 + 8 i] per-child value.
struct shared_file {
    explicit shared_file(const fs::path& p) {
        fd = ::open(p.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        REQUIRE(fd >= 0);
        std::int64_t zero[32] = {};
        REQUIRE(::pwrite(fd, zero, sizeof zero, 0) == static_cast<ssize_t>(sizeof zero));
    }
    ~shared_file() { ::close(fd); }
    std::int64_t get(int slot) const {
        std::int64_t v = 0;
        if (::pread(fd, &v, sizeof v, slot * 8) != static_cast<ssize_t>(sizeof v)) return -1;
        return v;
    }
    void set(int slot, std::int64_t v) const { (void)!::pwrite(fd, &v, sizeof v, slot * 8); }
    int fd = -1;
};

// One pass through the critical section: flags an overlap if someone else is inside, and
// increments the counter with a read, a pause and a write (an overlap loses increments).
// Returns 1 on overlap.
int critical_section(const shared_file& f, long pause_us) {
    int overlap = f.get(0) != 0 ? 1 : 0;
    f.set(0, 1);
    std::int64_t c = f.get(1);
    if (pause_us > 0) nap_us(pause_us);
    f.set(1, c + 1);
    f.set(0, 0);
    return overlap;
}

// Forks `count` children running fn(i) (its int result is the exit status) and waits for
// them for at most `limit`; children still running then are killed and reported.
struct fork_result {
    std::vector<int> status;  // exit status, or -1 when killed at the deadline
    bool timed_out = false;
};
fork_result fork_children(int count, const std::function<int(int)>& fn,
                          std::chrono::seconds limit) {
    std::vector<pid_t> pids;
    for (int i = 0; i < count; ++i) {
        pid_t pid = ::fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            int rc = 100;
            try {
                rc = fn(i);
            } catch (...) {
                rc = 101;
            }
            ::_exit(rc);
        }
        pids.push_back(pid);
    }
    fork_result r;
    r.status.assign(count, -1);
    auto deadline = clock_type::now() + limit;
    int left = count;
    while (left > 0) {
        for (int i = 0; i < count; ++i) {
            if (pids[i] == 0) continue;
            int st = 0;
            if (::waitpid(pids[i], &st, WNOHANG) == pids[i]) {
                r.status[i] =
                    WIFEXITED(st) ? WEXITSTATUS(st) : 200 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
                pids[i] = 0;
                --left;
            }
        }
        if (left > 0 && clock_type::now() > deadline) {
            r.timed_out = true;
            for (int i = 0; i < count; ++i)
                if (pids[i] != 0) {
                    ::kill(pids[i], SIGKILL);
                    ::waitpid(pids[i], nullptr, 0);
                }
            break;
        }
        if (left > 0) nap_us(2000);
    }
    return r;
}

// Waits up to `ms` for one byte on fd; true when it came.
bool wait_byte(int fd, int ms) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, ms) != 1) return false;
    char c;
    return ::read(fd, &c, 1) == 1;
}

/// Forks a process that takes node_lock `name`, writes one byte to `notify_fd` once it holds
/// it, and waits to be killed; returns its pid.
pid_t fork_holder(const char* name, const lock_options& opts, int notify_fd) {
    const pid_t holder = ::fork();
    REQUIRE(holder >= 0);
    if (holder == 0) {
        try {
            node_lock l(name, opts);
            l.lock();
            (void)!::write(notify_fd, "h", 1);
            for (;;) ::pause();
        } catch (...) {
        }
        ::_exit(1);
    }
    return holder;
}

#ifdef SPILLWAY_SANITIZED
constexpr int kIterations = 60;
#else
constexpr int kIterations = 150;
#endif

}  // namespace

TEST_CASE("node_lock: four processes never overlap inside the critical section") {
    auto dir = lock_dir();
    for (auto mech : {lock_mechanism::ofd, lock_mechanism::flock}) {
        CAPTURE(static_cast<int>(mech));
        shared_file f(dir.path() / "shared");
        lock_options opts{dir.path()};
        auto r = fork_children(
            4,
            [&](int) {
                node_lock l("mutex", opts, mech);
                int overlaps = 0;
                for (int k = 0; k < kIterations; ++k) {
                    std::scoped_lock g(l);
                    overlaps += critical_section(f, 20);
                }
                return overlaps == 0 ? 0 : 1;
            },
            std::chrono::seconds(60));
        CHECK_FALSE(r.timed_out);
        for (int s : r.status) CHECK(s == 0);
        CHECK(f.get(1) == 4 * kIterations);  // no increment lost
    }
}

TEST_CASE("the shared-file detector sees overlaps without a lock") {
    // Proves that the check above can fail: the same processes without the lock overlap.
    auto dir = lock_dir();
    shared_file f(dir.path() / "shared");
    auto r = fork_children(
        4,
        [&](int) {
            int overlaps = 0;
            for (int k = 0; k < kIterations; ++k) overlaps += critical_section(f, 20);
            return overlaps == 0 ? 0 : 1;
        },
        std::chrono::seconds(60));
    REQUIRE_FALSE(r.timed_out);
    int overlapped = 0;
    for (int s : r.status) overlapped += s == 1;
    CHECK((overlapped > 0 || f.get(1) < 4 * kIterations));
}

TEST_CASE("node_lock: SIGKILL of the holder releases the lock, and the waiter gets it") {
    auto dir = lock_dir();
    lock_options opts{dir.path()};
    int held[2], got[2];
    REQUIRE(::pipe(held) == 0);
    REQUIRE(::pipe(got) == 0);
    // Holder: takes the lock, says so, and waits to be killed.
    const pid_t holder = fork_holder("crash", opts, held[1]);
    REQUIRE(wait_byte(held[0], 10000));
    // Waiter: blocks in lock() and reports when it gets through.
    pid_t waiter = ::fork();
    REQUIRE(waiter >= 0);
    if (waiter == 0) {
        try {
            node_lock l("crash", opts);
            l.lock();
            (void)!::write(got[1], "g", 1);
            l.unlock();
            ::_exit(0);
        } catch (...) {
        }
        ::_exit(1);
    }
    node_lock mine("crash", opts);
    CHECK_FALSE(mine.try_lock());         // the holder has it
    CHECK_FALSE(wait_byte(got[0], 200));  // and the waiter is stuck behind it (a slow machine
                                          // only makes this surer)
    // The kernel drops the lock with the holder's last descriptor, typically within a
    // millisecond; the bound is only there to turn a hang (a lock that outlives its holder)
    // into a failure, so a loaded machine never trips it.
    ::kill(holder, SIGKILL);
    bool waiter_through = wait_byte(got[0], 60'000);
    CHECK(waiter_through);
    int st = 0;
    ::waitpid(holder, &st, 0);
    CHECK(WIFSIGNALED(st));
    if (!waiter_through) ::kill(waiter, SIGKILL);
    ::waitpid(waiter, &st, 0);
    CHECK((WIFEXITED(st) && WEXITSTATUS(st) == 0));
    // The lock is free again for everyone.
    CHECK(mine.try_lock());
    mine.unlock();
    for (int fd : {held[0], held[1], got[0], got[1]}) ::close(fd);
}

TEST_CASE("node_lock: no deadlock and no overlap under a try_lock storm") {
    auto dir = lock_dir();
    shared_file f(dir.path() / "shared");
    lock_options opts{dir.path()};
    constexpr int kProcs = 4;
    constexpr int kTries = 20 * kIterations;
    auto r = fork_children(
        kProcs,
        [&](int i) {
            node_lock l("storm", opts);
            int overlaps = 0;
            std::int64_t acquired = 0;
            for (int k = 0; k < kTries; ++k) {
                bool have =
                    (k % 64 == 63) ? (l.lock(), true) : l.try_lock();  // now and then, block
                if (!have) continue;
                overlaps += critical_section(f, 0);
                ++acquired;
                l.unlock();
            }
            f.set(2 + i, acquired);
            return overlaps == 0 ? 0 : 1;
        },
        std::chrono::seconds(60));
    CHECK_FALSE(r.timed_out);
    std::int64_t total = 0;
    for (int i = 0; i < kProcs; ++i) {
        CHECK(r.status[i] == 0);
        CHECK(f.get(2 + i) >= kTries / 64);  // at least the blocking attempts got through
        total += f.get(2 + i);
    }
    CHECK(f.get(1) == total);
}

TEST_CASE("node_lock: objects of one name exclude each other inside one process") {
    auto dir = lock_dir();
    lock_options opts{dir.path()};
    node_lock a("same", opts), b("same", opts), other("other", opts);
    CHECK(a.try_lock());
    CHECK_FALSE(b.try_lock());
    CHECK(other.try_lock());  // a different name is a different lock
    other.unlock();
    a.unlock();
    CHECK(b.try_lock());
    b.unlock();

    SUBCASE("threads with an object each") {
        std::atomic<int> inside{0}, overlaps{0};
        std::atomic<long> counter{0};
        std::vector<std::thread> ts;
        for (int t = 0; t < 4; ++t)
            ts.emplace_back([&] {
                node_lock mine("threads", opts);
                for (int k = 0; k < kIterations; ++k) {
                    std::scoped_lock g(mine);
                    if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
                    long c = counter.load(std::memory_order_relaxed);
                    std::this_thread::yield();
                    counter.store(c + 1, std::memory_order_relaxed);
                    inside.fetch_sub(1);
                }
            });
        for (auto& t : ts) t.join();
        CHECK(overlaps.load() == 0);
        CHECK(counter.load() == 4L * kIterations);
    }
    SUBCASE("threads sharing one object") {
        node_lock shared("shared-object", opts);
        long counter = 0;  // plain: the internal mutex orders the threads
        std::vector<std::thread> ts;
        for (int t = 0; t < 4; ++t)
            ts.emplace_back([&] {
                for (int k = 0; k < kIterations; ++k) {
                    std::scoped_lock g(shared);
                    long c = counter;
                    std::this_thread::yield();
                    counter = c + 1;
                }
            });
        for (auto& t : ts) t.join();
        CHECK(counter == 4L * kIterations);
    }
}

TEST_CASE("node_lock: lock files are 0600 regular files, never followed through a link") {
    auto dir = lock_dir();
    lock_options opts{dir.path()};
    {
        ::umask(0077);
        node_lock l("mode", opts);
        struct stat st {};
        REQUIRE(::stat(l.path().c_str(), &st) == 0);
        CHECK(S_ISREG(st.st_mode));
        CHECK((st.st_mode & 07777) == 0600);
        CHECK(l.path() == dir.path() / "spillway-mode.lock");
        CHECK(l.mechanism() != lock_mechanism::automatic);
        ::umask(0022);
    }
    // A planted symbolic link is refused, and its target is left alone.
    auto target = dir.path() / "victim";
    { std::ofstream(target) << "keep"; }
    fs::create_symlink(target, dir.path() / "spillway-link.lock");
    try {
        node_lock l("link", opts);
        FAIL("a symbolic link was followed");
    } catch (const std::system_error& e) {
        CHECK(e.code().value() == ELOOP);
        CHECK(std::string(e.what()).find("spillway-link.lock") != std::string::npos);
    }
    CHECK(fs::file_size(target) == 4);
    // A FIFO (or anything not a regular file) is refused without hanging.
    REQUIRE(::mkfifo((dir.path() / "spillway-fifo.lock").c_str(), 0600) == 0);
    try {
        node_lock l("fifo", opts);
        FAIL("a FIFO was taken for a lock file");
    } catch (const std::system_error& e) {
        CHECK(e.code().value() == EINVAL);
        const std::string fifo = "in " + dir.path().string() + ": spillway-fifo.lock is a FIFO";
        CHECK(std::string(e.what()).find(fifo) != std::string::npos);
    }
    // Names never leave the directory; the message quotes the name and says why.
    CHECK_THROWS_WITH_AS(node_lock("../escape", opts),
                         doctest::Contains("lock name '../escape' contains '/'"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(node_lock("..", opts),
                         doctest::Contains("lock name '..' is a relative directory name"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(node_lock("", opts), doctest::Contains("lock name '' is empty"),
                         std::invalid_argument);
    // A name that is a valid key but makes "spillway-<name>.lock" too long: the limit is named.
    const std::string long_name(250, 'x');
    const std::string too_long = "lock name '" + long_name + "' is too long";
    CHECK_THROWS_WITH_AS(node_lock(long_name, opts), doctest::Contains(too_long.c_str()),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(node_lock(long_name, opts), doctest::Contains("would exceed 255 bytes"),
                         std::invalid_argument);
    // A missing directory is named in the error.
    try {
        node_lock l("x", lock_options{dir.path() / "missing"});
        FAIL("opened a lock in a missing directory");
    } catch (const std::system_error& e) {
        CHECK(e.code().value() == ENOENT);
        CHECK(std::string(e.what()).find("missing") != std::string::npos);
    }
}

TEST_CASE("node_lock: the default directory is node-local and path_locks names two files") {
    auto def = default_lock_directory();
    CHECK(fs::is_directory(def));
    std::string unique = std::string("test-") + std::to_string(::getpid()) + "-" +
                         std::to_string(clock_type::now().time_since_epoch().count());
    {
        node_lock l(unique);
        CHECK(l.path().parent_path() == def);
        CHECK(l.try_lock());
        l.unlock();
    }
    fs::remove(def / ("spillway-" + unique + ".lock"));

    auto dir = lock_dir();
    path_locks<node_lock> a("path0", lock_options{dir.path()}),
        b("path0", lock_options{dir.path()});
    CHECK(fs::exists(dir.path() / "spillway-path0.read.lock"));
    CHECK(fs::exists(dir.path() / "spillway-path0.write.lock"));
    std::scoped_lock reading(a.read_lock);
    CHECK_FALSE(b.read_lock.try_lock());  // one reader per path
    CHECK(b.write_lock.try_lock());       // while one writer goes ahead
    b.write_lock.unlock();
}

TEST_CASE(
    "node_lock: a lock file deleted or replaced behind its back is opened again, so holders "
    "converge") {
    // A holder of the old file and one of a new file under the name would not exclude each
    // other. Each acquisition checks the name still names the file it locked: after the
    // file went, the next acquisition by the old object moves to the new file.
    auto dir = lock_dir();
    lock_options opts{dir.path()};
    node_lock a("replaced", opts);
    REQUIRE(a.try_lock());
    a.unlock();
    SUBCASE("deleted") {
        std::filesystem::remove(a.path());
    }
    SUBCASE("replaced by another file") {
        std::filesystem::remove(a.path());
        std::ofstream(a.path()) << "";
        std::filesystem::permissions(
            a.path(), std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
    }
    node_lock b("replaced", opts);  // opens (or creates) the file now under the name
    REQUIRE(b.try_lock());
    CHECK_FALSE(a.try_lock());  // a moves to b's file, which b holds
    b.unlock();
    CHECK(a.try_lock());
    CHECK_FALSE(b.try_lock());
    a.unlock();
    // lock() converges the same way (it would block on the old file otherwise: never).
    std::filesystem::remove(a.path());
    node_lock c("replaced", opts);
    c.lock();
    std::atomic<bool> got{false};
    std::thread t([&] {
        a.lock();
        got = true;
        a.unlock();
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK_FALSE(got.load());  // a waits for c on the new file
    c.unlock();
    t.join();
    CHECK(got.load());
}

TEST_CASE(
    "node_lock: lock files stay after use; remove_file removes one only when nobody holds it") {
    auto dir = lock_dir();
    lock_options opts{dir.path()};
    {
        path_locks<node_lock> p("gone", opts);
        p.read_lock.lock();
        p.read_lock.unlock();
    }
    // Nobody uses the name any more, and the two files of the path are still there.
    CHECK(fs::exists(dir.path() / "spillway-gone.read.lock"));
    CHECK(fs::exists(dir.path() / "spillway-gone.write.lock"));
    CHECK(remove_path_lock_files("gone", opts));
    CHECK(fs::is_empty(dir.path()));
    CHECK(remove_path_lock_files("gone", opts));  // none: nothing to do
    CHECK(node_lock::remove_file("never-made", opts));

    // Held by an object of this process: left alone; an idle object does not prevent it.
    node_lock held("held", opts), idle("idle", opts);
    held.lock();
    CHECK_FALSE(node_lock::remove_file("held", opts));
    CHECK(fs::exists(held.path()));
    CHECK(node_lock::remove_file("idle", opts));
    CHECK_FALSE(fs::exists(idle.path()));
    held.unlock();
    CHECK(node_lock::remove_file("held", opts));
    // The idle object locks again on a new file under the name (protocol step 3).
    idle.lock();
    CHECK(fs::exists(idle.path()));
    CHECK_FALSE(node_lock::remove_file("idle", opts));
    idle.unlock();

    // Held by another process: left alone until that process is killed.
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    const pid_t holder = fork_holder("other", opts, ready[1]);
    REQUIRE(wait_byte(ready[0], 60'000));
    CHECK_FALSE(node_lock::remove_file("other", opts));
    CHECK(fs::exists(dir.path() / "spillway-other.lock"));
    ::kill(holder, SIGKILL);
    ::waitpid(holder, nullptr, 0);
    CHECK(node_lock::remove_file("other", opts));
    CHECK_FALSE(fs::exists(dir.path() / "spillway-other.lock"));
    ::close(ready[0]);
    ::close(ready[1]);
    // A FIFO under the name is refused, not blocked on, and left where it is.
    REQUIRE(::mkfifo((dir.path() / "spillway-fifo.lock").c_str(), 0600) == 0);
    CHECK_THROWS_WITH_AS(node_lock::remove_file("fifo", opts), doctest::Contains("is a FIFO"),
                         std::system_error);
}

TEST_CASE("node_lock: removing lock files while four processes lock them never lets two overlap") {
    // Four children take the lock over and over (building a new object now and then, as a
    // process that starts would) while a fifth removes the file as often as it can. Each
    // removal races the others' open and lock; the protocol must keep the critical section
    // exclusive, and no increment may be lost.
    auto dir = lock_dir();
    for (auto mech : {lock_mechanism::ofd, lock_mechanism::flock}) {
        CAPTURE(static_cast<int>(mech));
        shared_file f(dir.path() / "shared");
        lock_options opts{dir.path()};
        auto r = fork_children(
            5,
            [&](int i) {
                if (i == 4) {  // the remover: until the others are done (slot 2 counts them)
                    std::int64_t removed = 0;
                    while (f.get(2) < 4)
                        removed += node_lock::remove_file("churn", opts, mech) ? 1 : 0;
                    f.set(3, removed);
                    return 0;
                }
                int overlaps = 0;
                for (int round = 0; round < kIterations / 10; ++round) {
                    node_lock l("churn", opts, mech);
                    for (int k = 0; k < 10; ++k) {
                        std::scoped_lock g(l);
                        overlaps += critical_section(f, 20);
                    }
                }
                {
                    node_lock l("done", opts, mech);
                    std::scoped_lock g(l);
                    f.set(2, f.get(2) + 1);
                }
                return overlaps == 0 ? 0 : 1;
            },
            std::chrono::seconds(300));
        CHECK_FALSE(r.timed_out);
        for (int s : r.status) CHECK(s == 0);
        CHECK(f.get(1) == 4 * (kIterations / 10) * 10);  // no increment lost
        MESSAGE("lock file removed " << f.get(3) << " times while in use");
        fs::remove(dir.path() / "shared");
    }
}
