// SPDX-License-Identifier: Apache-2.0
// The library names its threads, so that top -H, perf and gdb tell them apart: every
// component that starts threads is checked through /proc/self/task/*/comm.
#include <doctest/doctest.h>

#include <spillway/detail/thread_name.hpp>
#include <spillway/thread_pool.hpp>
#include <spillway/lock/lock_policy.hpp>
#include <spillway/tier/file_tier.hpp>
#include <spillway/tier/host_tier.hpp>
#include <spillway/tier/throttled_tier.hpp>
#include <spillway/tier/virtual_tier.hpp>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "support/temp_dir.hpp"

using namespace spillway;

namespace {

/// The names of this process's threads now.
std::multiset<std::string> thread_names() {
    std::multiset<std::string> names;
    for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
        std::ifstream in(task.path() / "comm");
        std::string name;
        if (std::getline(in, name)) names.insert(name);
    }
    return names;
}

}  // namespace

TEST_CASE("name_this_thread names the calling thread and cuts long names to 15 characters") {
    std::multiset<std::string> seen;
    std::thread t([&] {
        detail::name_this_thread("spw-a-very-long-thread-name");
        seen = thread_names();
    });
    t.join();
    CHECK(seen.count("spw-a-very-long") == 1);  // the first 15 characters
    CHECK(seen.count("spw-a-very-long-thread-name") == 0);
}

TEST_CASE("the library's threads carry their component's name") {
    const auto before = thread_names();
    SUBCASE("thread pool") {
        thread_pool pool(2, "spw-test-pool");
        CHECK(thread_names().count("spw-test-pool") == 2);
        thread_pool plain(1);
        CHECK(thread_names().count("spw-pool") == before.count("spw-pool") + 1);
    }
    SUBCASE("file tier engine") {
        test::temp_dir dir("thread-names");
        file_tier<> tier(dir.path());
        const auto now = thread_names();
        CHECK(now.count("spw-uring") + now.count("spw-posix") > before.count("spw-uring") + before.count("spw-posix"));
    }
    SUBCASE("throttled tier") {
        throttled_tier<host_tier> tier(throttle_config::joint(bandwidth_limit{1e9, 4096}));
        CHECK(thread_names().count("spw-throttle") == before.count("spw-throttle") + 1);
    }
    SUBCASE("virtual tier") {
        host_tier a, b;
        virtual_tier_options o;
        o.bandwidths = {1.0, 1.0};
        o.workers = 3;
        virtual_tier<thread_lock, host_tier&, host_tier&> vt(o, a, b);
        CHECK(thread_names().count("spw-vtier") == before.count("spw-vtier") + 3);
    }
}
