// SPDX-License-Identifier: Apache-2.0
// tests/tier/virtual_tier_conformance.hpp: the virtual tier's factory for the storage_tier
// conformance suite: a heterogeneous virtual tier (host memory + a file tier on /dev/shm)
// under node_lock, with its lock files in the test's own scratch directory and bandwidths
// probed at construction.
#pragma once

#include <spillway/lock/node_lock.hpp>
#include <spillway/tier/virtual_tier.hpp>

#include "tier/conformance.hpp"

namespace spillway::test::conformance {

struct virtual_factory {
    using tier_type = virtual_tier<node_lock, host_tier, file_tier<>>;
    static std::string name() { return "virtual(host, file(shm))"; }
    static virtual_tier_options options(tier_env& env, std::size_t capacity) {
        virtual_tier_options o;
        o.name = "vt";
        o.probe_nbytes = 64 * KiB;
        o.capacity = capacity;
        o.locks.directory = env.shm_dir();
        return o;
    }
    static auto bounded_args(tier_env& env, std::size_t capacity) {
        return std::tuple(options(env, capacity), std::tuple<>(),
                          std::tuple(env.shm_dir(), file_tier_options{}));
    }
    static auto args(tier_env& env) {
        return bounded_args(env, std::numeric_limits<std::size_t>::max());
    }
};

/// The striped virtual tier (placement_mode::striped) over two file tiers on /dev/shm, with
/// given bandwidths (no probe).
struct virtual_striped_factory {
    using tier_type = virtual_tier<node_lock, file_tier<>, file_tier<>>;
    static std::string name() { return "virtual striped(file(shm), file(shm))"; }
    static auto bounded_args(tier_env& env, std::size_t capacity) {
        virtual_tier_options o = virtual_factory::options(env, capacity);
        o.name = "vts";
        o.placement = placement_mode::striped;
        o.bandwidths = {1.0, 1.0};
        const auto a = env.shm_dir() / "striped-a", b = env.shm_dir() / "striped-b";
        std::filesystem::create_directories(a);
        std::filesystem::create_directories(b);
        return std::tuple(o, std::tuple(a, file_tier_options{}),
                          std::tuple(b, file_tier_options{}));
    }
    static auto args(tier_env& env) {
        return bounded_args(env, std::numeric_limits<std::size_t>::max());
    }
};

}  // namespace spillway::test::conformance
