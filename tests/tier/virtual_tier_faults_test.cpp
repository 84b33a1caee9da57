// SPDX-License-Identifier: Apache-2.0
// virtual_tier against the faults of the fault matrix (docs/design.md, "Fault matrix"): a
// full child, short transfers, a FIFO, a directory, a hard link or a symbolic link under a
// key's name in a file-tier child, a truncated or torn blob, a killed writer process, a
// killed lock holder and a read-only file system. Each test proves what the virtual tier
// does with the fault: the child's own checks refuse it, the tier names the key and the
// child, fails over where a write can go elsewhere, and never returns wrong data.
#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <csignal>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <spillway/lock/lock_policy.hpp>
#include <spillway/lock/node_lock.hpp>
#include <spillway/tier/faulty_tier.hpp>
#include <spillway/tier/file_tier.hpp>
#include <spillway/tier/host_tier.hpp>
#include <spillway/tier/virtual_tier.hpp>

#include "support/random_bytes.hpp"
#include "support/tier_io.hpp"
#include "support/temp_dir.hpp"

using namespace spillway;
using spillway::test::random_bytes;
using namespace spillway::test;
namespace fs = std::filesystem;

namespace {
constexpr std::size_t KiB = 1024;

std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
std::vector<std::byte> bytes_of(const std::string& s) {
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    return std::vector<std::byte>(p, p + s.size());
}

/// Two file-tier children in directories a/ and b/ under a scratch directory.
struct two_dirs {
    explicit two_dirs(const std::string& prefix) : root(prefix) {
        fs::create_directory(a());
        fs::create_directory(b());
    }
    fs::path a() const { return root.path() / "a"; }
    fs::path b() const { return root.path() / "b"; }
    test::temp_dir root;
};
using file_vt = virtual_tier<thread_lock, file_tier<>, file_tier<>>;
}  // namespace

TEST_CASE("virtual_tier faults: ENOSPC from a full host-tier child fails over to another child") {
    // The child fills up after the write was placed (another user of the path), so the
    // child itself refuses the write with ENOSPC.
    host_tier a(64 * KiB, "small"), b(SIZE_MAX, "big");
    virtual_tier<thread_lock, host_tier&, host_tier&> vt(fixed({1, 0}, "enospc"), a, b);
    const auto blob = random_bytes(16 * KiB, 1), filler = random_bytes(60 * KiB, 2);
    vt.locks(0).write_lock.lock();  // hold child 0 so the write waits, placed there
    auto pending = vt.write("k", blob);
    CHECK(vt.child_of("k") == std::size_t{0});
    REQUIRE(a.write("filler", filler).wait() == filler.size());  // the path fills up
    vt.locks(0).write_lock.unlock();
    CHECK(pending.wait() == blob.size());
    CHECK(vt.child_of("k") == std::size_t{1});
    CHECK(b.contains("k"));
    CHECK_FALSE(a.contains("k"));
    auto r = vt.report();
    CHECK(r[0].health == child_health::degraded);
    CHECK(has(r[0].fault, "small: write of key 'k'"));
    CHECK(has(r[0].fault, "exceeds the capacity"));
    CHECK(r[1].health == child_health::healthy);
    CHECK(get(vt, "k", blob.size()) == blob);
    std::vector<std::byte> back(filler.size());
    CHECK(a.read("filler", back).wait() == filler.size());  // the other user's blob is intact
    CHECK(back == filler);
}

TEST_CASE("virtual_tier faults: short transfers are retried inside the child, then fail over") {
    using faulty_host = faulty_tier<host_tier>;
    virtual_tier<thread_lock, faulty_host, host_tier> vt(
        fixed({1, 0}, "short"), child_args(std::in_place, SIZE_MAX, "flaky"), child_args());
    const auto v1 = random_bytes(8 * KiB, 3), v2 = random_bytes(8 * KiB, 4);
    // Within the child's retry limit: the write succeeds where it was placed.
    vt.child<0>().inject_transient(fault_op::write, transient_fault::short_transfer, 3);
    put(vt, "k", v1);
    CHECK(vt.child_of("k") == std::size_t{0});
    CHECK(vt.child<0>().counters().retries == 3);
    CHECK(vt.report()[0].health == child_health::healthy);
    // Past it: the child gives up with EIO and the rewrite goes to the other child; the old
    // copy is erased after the new one landed.
    vt.child<0>().set_max_retries(2);
    vt.child<0>().inject_transient(fault_op::write, transient_fault::short_transfer, 3);
    put(vt, "k", v2);
    CHECK(vt.child_of("k") == std::size_t{1});
    CHECK(vt.report()[0].health == child_health::degraded);
    CHECK(has(vt.report()[0].fault, "short transfer persisted after 2 retries"));
    CHECK_FALSE(vt.child<0>().contains("k"));
    CHECK(get(vt, "k", v2.size()) == v2);
    // Short reads too: retried inside, the read returns the whole blob.
    vt.child<0>().clear_faults();
    vt.restore(0);
    put(vt, "j", v1);
    REQUIRE(vt.child_of("j") == std::size_t{0});
    vt.child<0>().set_max_retries(4);
    vt.child<0>().inject_transient(fault_op::read, transient_fault::short_transfer, 2);
    CHECK(get(vt, "j", v1.size()) == v1);
}

TEST_CASE("virtual_tier faults: a FIFO or a directory under a key's name in a file-tier child") {
    // The file tier's checks refuse it at once (a blocking open would hang a worker here);
    // the read fails naming the key, the child and what the file is; the rewrite goes to the
    // other child and the old name is cleared.
    two_dirs dirs("vt-fifo");
    file_vt vt(fixed({1, 0}, "fifo"), child_args(dirs.a()), child_args(dirs.b()));
    const auto blob = random_bytes(4 * KiB, 5);
    put(vt, "f", blob);
    put(vt, "d", blob);
    REQUIRE(vt.child_of("f") == std::size_t{0});
    fs::remove(dirs.a() / "f");
    REQUIRE(::mkfifo((dirs.a() / "f").c_str(), 0600) == 0);
    fs::remove(dirs.a() / "d");
    fs::create_directory(dirs.a() / "d");
    std::vector<std::byte> back(blob.size());
    const auto fifo = message_of(vt.read("f", back));
    INFO(fifo);
    CHECK(has(fifo, "fifo: read of key 'f'"));
    CHECK(has(fifo, "child 0"));
    CHECK(has(fifo, "is a FIFO"));
    const auto dir = message_of(vt.read("d", back));
    INFO(dir);
    CHECK(has(dir, "'d'"));
    CHECK(has(dir, "child 0"));
    CHECK(has(dir, "is a directory"));
    CHECK(vt.report()[0].health == child_health::degraded);  // the path misbehaves
    // Rewrites go to the healthy child.
    put(vt, "f", blob);
    put(vt, "d", blob);
    CHECK(vt.child_of("f") == std::size_t{1});
    CHECK(vt.child_of("d") == std::size_t{1});
    CHECK(get(vt, "f", blob.size()) == blob);
    CHECK(get(vt, "d", blob.size()) == blob);
    CHECK_FALSE(fs::exists(fs::symlink_status(dirs.a() / "f")));  // the FIFO was erased
}

TEST_CASE("virtual_tier faults: a cp -al snapshot of file-tier children keeps its contents") {
    // Rewrites through the virtual tier never write into a file with a second link.
    two_dirs dirs("vt-hardlink");
    const fs::path snap = dirs.root.path() / "snap";
    file_vt vt(fixed({1, 1}, "links"), child_args(dirs.a()), child_args(dirs.b()));
    const std::string upper(64, 'A'), lower(64, 'a'), other(64, 'B');
    for (int i = 0; i < 4; ++i) put(vt, "k" + std::to_string(i), bytes_of(upper));
    for (const char* child : {"a", "b"}) {  // cp -al
        fs::create_directories(snap / child);
        for (auto& e : fs::directory_iterator(dirs.root.path() / child))
            fs::create_hard_link(e.path(), snap / child / e.path().filename());
    }
    for (int i = 0; i < 4; ++i) put(vt, "k" + std::to_string(i), bytes_of(lower));
    for (int i = 0; i < 8; ++i) put(vt, "n" + std::to_string(i), bytes_of(other));
    std::size_t snapshotted = 0;
    for (const char* child : {"a", "b"})
        for (auto& e : fs::directory_iterator(snap / child)) {
            CAPTURE(e.path());
            CHECK(slurp(e.path()) == upper);
            ++snapshotted;
        }
    CHECK(snapshotted >= 4);
    for (int i = 0; i < 4; ++i)
        CHECK(get(vt, "k" + std::to_string(i), lower.size()) == bytes_of(lower));
    for (int i = 0; i < 8; ++i)
        CHECK(get(vt, "n" + std::to_string(i), other.size()) == bytes_of(other));
}

TEST_CASE("virtual_tier faults: a symbolic link under a key's name is never followed") {
    two_dirs dirs("vt-symlink");
    test::temp_dir outside("vt-symlink-outside");
    const fs::path target = outside.path() / "target";
    std::ofstream(target) << "untouched";
    fs::create_symlink(target, dirs.a() / "planted");
    file_vt vt(fixed({1, 0}, "symlink"), child_args(dirs.a()), child_args(dirs.b()));
    CHECK_FALSE(vt.contains("planted"));  // not adopted as a key
    const auto blob = random_bytes(4 * KiB, 6);
    put(vt, "planted", blob);  // replaces the link
    CHECK(vt.child_of("planted") == std::size_t{0});
    CHECK(fs::is_regular_file(fs::symlink_status(dirs.a() / "planted")));
    CHECK(get(vt, "planted", blob.size()) == blob);
    // A key's file swapped for a link behind the tier's back: the read fails, never reads
    // the target.
    put(vt, "k", blob);
    fs::remove(dirs.a() / "k");
    fs::create_symlink(target, dirs.a() / "k");
    std::vector<std::byte> back(blob.size());
    const auto msg = message_of(vt.read("k", back));
    INFO(msg);
    CHECK(has(msg, "symlink: read of key 'k'"));
    CHECK(has(msg, "child 0"));
    CHECK(slurp(target) == "untouched");
    put(vt, "k", blob);  // a rewrite (to the healthy child) works
    CHECK(get(vt, "k", blob.size()) == blob);
    CHECK(slurp(target) == "untouched");
}

TEST_CASE("virtual_tier faults: a truncated file or a torn write is refused, never returned") {
    SUBCASE("a file truncated behind the tier's back") {
        two_dirs dirs("vt-truncated");
        file_vt vt(fixed({1, 0}, "trunc"), child_args(dirs.a()), child_args(dirs.b()));
        const auto blob = random_bytes(8 * KiB, 7);
        put(vt, "k", blob);
        fs::resize_file(dirs.a() / "k", blob.size() / 2);
        std::vector<std::byte> back(blob.size(), std::byte{0x5a});
        const auto msg = message_of(vt.read("k", back));
        INFO(msg);
        CHECK(has(msg, "trunc: read of key 'k'"));
        CHECK(has(msg, "child 0"));
        put(vt, "k", blob);  // a rewrite repairs it
        CHECK(get(vt, "k", blob.size()) == blob);
    }
    SUBCASE("a child that stores half a blob and reports success") {
        using faulty_host = faulty_tier<host_tier>;
        virtual_tier<thread_lock, faulty_host, host_tier> vt(
            fixed({1, 0}, "torn"), child_args(std::in_place, SIZE_MAX, "liar"), child_args());
        const auto blob = random_bytes(8 * KiB, 8);
        vt.child<0>().inject_torn_write();
        put(vt, "k", blob);  // the device lied
        std::vector<std::byte> back(blob.size(), std::byte{0x5a});
        const auto msg = message_of(vt.read("k", back));
        INFO(msg);
        CHECK(has(msg, "torn: read of key 'k'"));
        CHECK(has(msg, "child 0"));
        CHECK(has(msg, std::to_string(blob.size() / 2)));
        put(vt, "k", blob);
        CHECK(get(vt, "k", blob.size()) == blob);
    }
}

TEST_CASE("virtual_tier faults: a writer process killed mid-write leaves whole blobs only") {
    // A forked process writes through a virtual tier over two file tiers and is killed with
    // SIGKILL while a large write is in flight. A new virtual tier over the same directories
    // adopts each committed key with its exact contents, and the large key is whole or absent.
    two_dirs dirs("vt-killed");
    constexpr int committed = 6;
    const std::size_t big = 4 * 1024 * KiB;
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::close(ready[0]);
        {
            file_vt vt(fixed({1, 1}, "writer"), child_args(dirs.a()), child_args(dirs.b()));
            for (int i = 0; i < committed; ++i)
                vt.write("k" + std::to_string(i), random_bytes(32 * KiB, 100 + i)).wait();
            const auto large = random_bytes(big, 9);
            (void)!::write(ready[1], "r", 1);
            for (;;) vt.write("big", large).wait();  // until killed
        }
    }
    ::close(ready[1]);
    char c = 0;
    REQUIRE(::read(ready[0], &c, 1) == 1);
    ::close(ready[0]);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    REQUIRE(::kill(pid, SIGKILL) == 0);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFSIGNALED(status));

    file_vt vt(fixed({1, 1}, "reader"), child_args(dirs.a()), child_args(dirs.b()));
    for (int i = 0; i < committed; ++i) {
        const std::string key = "k" + std::to_string(i);
        CAPTURE(key);
        REQUIRE(vt.size_of(key) == 32 * KiB);
        CHECK(get(vt, key, 32 * KiB) == random_bytes(32 * KiB, 100 + i));
    }
    if (auto n = vt.size_of("big")) {
        REQUIRE(*n == big);
        CHECK(get(vt, "big", big) == random_bytes(big, 9));
    } else {
        MESSAGE("the first large write was killed before it committed");
    }
    // The dead writer's temporary files are gone (the new file tiers removed them).
    for (const fs::path& d : {dirs.a(), dirs.b()})
        for (auto& e : fs::directory_iterator(d)) {
            CAPTURE(e.path());
            CHECK(e.path().filename().string().rfind(".spillway.", 0) != 0);
        }
    put(vt, "after", random_bytes(KiB, 10));  // and the tier is usable
}

TEST_CASE("virtual_tier faults: a lock holder killed with SIGKILL frees the child for the tier") {
    // Another process holds child 0's write lock and dies; the write waiting for it goes on.
    test::temp_dir locks("vt-killed-holder");
    virtual_tier_options o = fixed({1, 0}, "held");
    o.locks.directory = locks.path();
    o.workers = 2;
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    const pid_t pid = ::fork();  // before the tier exists: the child process has one thread
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::close(ready[0]);
        node_lock holder("held.0.write", o.locks);
        holder.lock();
        (void)!::write(ready[1], "r", 1);
        for (;;) ::pause();
    }
    ::close(ready[1]);
    char c = 0;
    REQUIRE(::read(ready[0], &c, 1) == 1);
    ::close(ready[0]);
    virtual_tier<node_lock, host_tier, host_tier> vt(o);
    const auto blob = random_bytes(4 * KiB, 11);
    auto waiting = vt.write("k", blob);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK_FALSE(waiting.ready());  // the holder is alive
    REQUIRE(::kill(pid, SIGKILL) == 0);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(waiting.wait() == blob.size());  // (a lock left held would hang here)
    CHECK(vt.child_of("k") == std::size_t{0});
    CHECK(get(vt, "k", blob.size()) == blob);
}

TEST_CASE("virtual_tier faults: a child gone read-only (EROFS) fails writes over, still reads") {
    // A stand-in for a file system remounted read-only: a faulty child failing every write
    // with EROFS (the real one, chmod 0500, is the next test and needs a non-root user).
    using faulty_host = faulty_tier<host_tier>;
    virtual_tier<thread_lock, faulty_host, host_tier> vt(
        fixed({1, 1}, "rofs"), child_args(std::in_place, SIZE_MAX, "ro"), child_args());
    std::vector<std::vector<std::byte>> blobs;
    for (int i = 0; i < 6; ++i) {
        blobs.push_back(random_bytes(4 * KiB, 20 + i));
        put(vt, "k" + std::to_string(i), blobs.back());
    }
    vt.child<0>().fail_always(fault_op::write, EROFS);
    for (int i = 0; i < 6; ++i)  // the keys on child 0 stay readable
        CHECK(get(vt, "k" + std::to_string(i), blobs[i].size()) == blobs[i]);
    put(vt, "new", blobs[0]);  // new keys and rewrites go to child 1
    for (int i = 0; i < 6; ++i) put(vt, "k" + std::to_string(i), blobs[i]);
    auto r = vt.report();
    CHECK(r[0].health == child_health::degraded);
    CHECK(has(r[0].fault, "EROFS"));
    CHECK(r[0].keys == 0);
    CHECK(r[1].keys == 7);
    for (int i = 0; i < 6; ++i)
        CHECK(get(vt, "k" + std::to_string(i), blobs[i].size()) == blobs[i]);
}

TEST_CASE("virtual_tier faults: a file-tier child over a read-only directory (chmod 0500)") {
    if (::geteuid() == 0) {
        MESSAGE(
            "running as root, which writes into a 0500 directory anyway, and no read-only "
            "mount is available here: skipped (the EROFS test above stands in)");
        return;
    }
    two_dirs dirs("vt-readonly");
    const auto blob = random_bytes(4 * KiB, 30);
    struct restore_mode {  // so the scratch directory can be removed
        fs::path p;
        ~restore_mode() { fs::permissions(p, fs::perms::owner_all); }
    } restore{dirs.a()};
    const auto read_only = fs::perms::owner_read | fs::perms::owner_exec;
    SUBCASE("read-only before the tier opens it: refused at construction, naming it") {
        fs::permissions(dirs.a(), read_only);
        auto refused = [&](auto&& make) {
            try {
                make();
            } catch (const std::system_error& e) {
                return std::string(e.what());
            }
            return std::string("no error");
        };
        const auto alone = refused([&] { file_tier<> a(dirs.a()); });
        INFO(alone);
        CHECK(has(alone, dirs.a().string()));
        CHECK(has(alone, "not writable"));
        const auto through = refused([&] {
            file_vt vt(fixed({1, 0}, "ro"), child_args(dirs.a()), child_args(dirs.b()));
        });
        INFO(through);
        CHECK(has(through, dirs.a().string()));
    }
    SUBCASE("read-only while the tier runs: writes fail over, old keys stay readable") {
        file_vt vt(fixed({1, 0}, "ro"), child_args(dirs.a()), child_args(dirs.b()));
        put(vt, "old", blob);
        put(vt, "old", blob);  // (the first file is now a spare the tier could reuse)
        REQUIRE(vt.child_of("old") == std::size_t{0});
        fs::permissions(dirs.a(), read_only);
        put(vt, "new", blob);
        CHECK(vt.child_of("new") == std::size_t{1});
        auto r = vt.report();
        CHECK(r[0].health == child_health::degraded);
        MESSAGE("child 0 degraded by: " << r[0].fault);
        CHECK(has(r[0].fault, "'new'"));
        CHECK(get(vt, "old", blob.size()) == blob);
        put(vt, "old", blob);  // a rewrite moves it; erasing the copy on child 0 is refused
        CHECK(vt.child_of("old") == std::size_t{1});
        CHECK(get(vt, "old", blob.size()) == blob);
    }
}
