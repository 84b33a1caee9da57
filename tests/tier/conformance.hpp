// SPDX-License-Identifier: Apache-2.0
// tests/tier/conformance.hpp: the tier factories and helpers behind the storage_tier
// conformance suite (conformance_test.cpp).
//
// A factory is a struct with
//   using tier_type = ...;                                   // a storage_tier
//   static std::string name();                               // for messages
//   static auto args(tier_env&);                             // constructor arguments, a tuple
//   static auto bounded_args(tier_env&, std::size_t cap);    // optional: same, with a capacity
//   using buffer_type = ...;                                 // optional: the caller buffers,
//                                                            // std::vector<std::byte> if absent
// or, for a tier that cannot be built from a tuple of arguments,
//   static std::unique_ptr<tier_type> make(tier_env&);       // (and optionally make_bounded)
// Building from argument tuples lets the decorator factories (throttled_of<F>, faulty_of<F>)
// wrap any base factory: the decorators construct their inner tier in place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include <spillway/tier/faulty_tier.hpp>
#include <spillway/tier/file_tier.hpp>
#include <spillway/tier/host_tier.hpp>
#include <spillway/tier/throttled_tier.hpp>

#include "support/random_bytes.hpp"
#include "support/temp_dir.hpp"

namespace spillway::test::conformance {

inline constexpr std::size_t KiB = 1024, MiB = 1024 * 1024;

#if defined(SPILLWAY_SANITIZED)
inline constexpr std::size_t largest_blob = 8 * MiB;  // sanitizers run many times slower
inline constexpr bool sanitized = true;
#else
inline constexpr std::size_t largest_blob = 64 * MiB;
inline constexpr bool sanitized = false;
#endif

/// The buffers the suite hands factory F's tier: F::buffer_type where F names one (a
/// contiguous container of std::byte, e.g. std::vector with a pinned-memory allocator, so a
/// device tier is tested with the caller buffers it is fast with), else std::vector<std::byte>.
template <class F>
struct buffer_of_t {
    using type = std::vector<std::byte>;
};
template <class F>
requires requires { typename F::buffer_type; }
struct buffer_of_t<F> {
    using type = typename F::buffer_type;
};
template <class F>
using buffer_of = typename buffer_of_t<F>::type;

/// Test data: `nbytes` pseudo-random bytes, a different window of one shared random pool for
/// each seed (cheap enough for 64 MiB blobs, even under sanitizers), in a Buffer.
/// Deterministic.
template <class Buffer = std::vector<std::byte>>
Buffer blob(std::size_t nbytes, std::uint64_t seed) {
    constexpr std::size_t window = MiB;  // seeds start anywhere in the first MiB
    static const std::vector<std::uint64_t> pool = [] {
        std::vector<std::uint64_t> words((largest_blob + window) / 8 + 1);
        std::uint64_t x = 0x9e3779b97f4a7c15ull;
        for (auto& w : words) {  // xorshift64*
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            w = x * 0x2545f4914f6cdd1dull;
        }
        return words;
    }();
    if (nbytes > largest_blob) {
        auto bytes = random_bytes(nbytes, seed);
        return Buffer(bytes.begin(), bytes.end());
    }
    const auto* base = reinterpret_cast<const std::byte*>(pool.data()) + (seed * 4099) % window;
    return Buffer(base, base + nbytes);
}

/// Scratch space that outlives the tiers of one test case (declare it before the tier).
class tier_env {
public:
    /// A fresh, empty directory on the disk ($SPILLWAY_TEST_TMPDIR, see temp_dir.hpp).
    std::filesystem::path disk_dir() {
        return fresh(disk_, [] { return temp_dir("conformance"); });
    }
    /// A fresh, empty directory on /dev/shm (tmpfs).
    std::filesystem::path shm_dir() {
        std::error_code ec;
        if (!std::filesystem::is_directory("/dev/shm", ec))
            throw std::runtime_error("tier_env: /dev/shm is not a directory on this machine");
        return fresh(shm_, [] { return temp_dir::under("/dev/shm", "spillway-conformance"); });
    }

private:
    template <class Make>
    std::filesystem::path fresh(std::optional<temp_dir>& root, Make&& make) {
        if (!root) root.emplace(make());
        auto p = root->path() / (std::string("t") + std::to_string(next_++));
        std::filesystem::create_directory(p);
        return p;
    }
    std::optional<temp_dir> disk_, shm_;
    int next_ = 0;
};

template <class F>
concept buildable_from_args = requires(tier_env& env) {
    F::args(env);
};
template <class F>
concept has_capacity_bound = requires(tier_env& env) {
    F::bounded_args(env, std::size_t{1});
}
|| requires(tier_env& env) {
    F::make_bounded(env, std::size_t{1});
};

template <class T, class Tuple>
std::unique_ptr<T> make_from(Tuple&& args) {
    return std::apply(
        [](auto&&... a) { return std::make_unique<T>(std::forward<decltype(a)>(a)...); },
        std::forward<Tuple>(args));
}

/// A fresh, empty tier from factory F.
template <class F>
std::unique_ptr<typename F::tier_type> make(tier_env& env) {
    if constexpr (requires { F::make(env); })
        return F::make(env);
    else
        return make_from<typename F::tier_type>(F::args(env));
}
/// A fresh, empty tier from factory F holding at most `capacity` bytes.
template <class F>
requires has_capacity_bound<F> std::unique_ptr<typename F::tier_type> make_bounded(
    tier_env& env, std::size_t capacity) {
    if constexpr (requires { F::make_bounded(env, capacity); })
        return F::make_bounded(env, capacity);
    else
        return make_from<typename F::tier_type>(F::bounded_args(env, capacity));
}

// ---- Base factories --------------------------------------------------------------------

struct host_factory {
    using tier_type = host_tier;
    static std::string name() { return "host"; }
    static auto args(tier_env&) { return std::tuple<>(); }
    static auto bounded_args(tier_env&, std::size_t capacity) { return std::tuple(capacity); }
};

/// file_tier<> (automatic engine, O_DIRECT where allowed) in a directory on the disk.
struct file_disk_factory {
    using tier_type = file_tier<>;
    static std::string name() { return "file(disk)"; }
    static auto bounded_args(tier_env& env, std::size_t capacity) {
        file_tier_options o;
        o.capacity = capacity;
        return std::tuple(env.disk_dir(), std::move(o));
    }
    static auto args(tier_env& env) {
        return bounded_args(env, std::numeric_limits<std::size_t>::max());
    }
};

/// file_tier<> on tmpfs (/dev/shm): kernels before 6.6 refuse O_DIRECT there, so on those
/// this is the buffered path (the round-trip case says which path ran).
struct file_shm_factory {
    using tier_type = file_tier<>;
    static std::string name() { return "file(shm)"; }
    static auto bounded_args(tier_env& env, std::size_t capacity) {
        file_tier_options o;
        o.capacity = capacity;
        return std::tuple(env.shm_dir(), std::move(o));
    }
    static auto args(tier_env& env) {
        return bounded_args(env, std::numeric_limits<std::size_t>::max());
    }
};

// ---- Decorator factories ---------------------------------------------------------------

/// The throttle used in the suite: real (a bucket smaller than the largest blob, so large
/// operations queue) but fast enough to keep the suite quick.
inline throttle_config conformance_throttle() {
    return throttle_config::joint({4e9, 4 * MiB});
}

template <class F>
requires buildable_from_args<F>
struct throttled_of {
    using tier_type = throttled_tier<typename F::tier_type>;
    using buffer_type = buffer_of<F>;
    static std::string name() { return std::string("throttled(") + F::name() + ")"; }
    static auto args(tier_env& env) {
        return std::tuple_cat(std::tuple(conformance_throttle(), std::in_place), F::args(env));
    }
    static auto bounded_args(tier_env& env, std::size_t capacity) requires has_capacity_bound<F> {
        return std::tuple_cat(std::tuple(conformance_throttle(), std::in_place),
                              F::bounded_args(env, capacity));
    }
};

/// A faulty_tier with no fault armed behaves exactly like its inner tier.
template <class F>
requires buildable_from_args<F>
struct faulty_of {
    using tier_type = faulty_tier<typename F::tier_type>;
    using buffer_type = buffer_of<F>;
    static std::string name() { return std::string("faulty(") + F::name() + ")"; }
    static auto args(tier_env& env) {
        return std::tuple_cat(std::tuple(std::in_place), F::args(env));
    }
    static auto bounded_args(tier_env& env, std::size_t capacity) requires has_capacity_bound<F> {
        return std::tuple_cat(std::tuple(std::in_place), F::bounded_args(env, capacity));
    }
};

// ---- Helpers ---------------------------------------------------------------------------

/// Runs fn() (which issues one operation) and waits for its completion. An operation may
/// report an error either by throwing from the call or from wait(); both are captured.
struct outcome {
    std::exception_ptr error;
    std::size_t nbytes = 0;
};
template <class Fn>
outcome run(Fn&& fn) {
    try {
        return {nullptr, fn().wait()};
    } catch (...) {
        return {std::current_exception(), 0};
    }
}

inline bool contains_text(std::string_view haystack, std::string_view needle) {
    return haystack.find(needle) != std::string_view::npos;
}

/// Checks that `o` failed with std::system_error(err) whose message holds every `part`.
inline void check_system_error(const outcome& o, int err,
                               std::initializer_list<std::string_view> parts) {
    REQUIRE_MESSAGE(o.error, "the operation succeeded; expected errno " << err);
    try {
        std::rethrow_exception(o.error);
    } catch (const std::system_error& e) {
        INFO("message: " << e.what());
        CHECK(e.code().value() == err);
        for (auto p : parts)
            CHECK_MESSAGE(contains_text(e.what(), p), "missing '" << std::string(p) << "'");
    } catch (const std::exception& e) {
        FAIL("expected std::system_error(" << err << "), got another exception: " << e.what());
    }
}

/// Checks that `o` failed with std::invalid_argument whose message holds every `part`.
inline void check_invalid_argument(const outcome& o,
                                   std::initializer_list<std::string_view> parts) {
    REQUIRE_MESSAGE(o.error, "the operation succeeded; expected std::invalid_argument");
    try {
        std::rethrow_exception(o.error);
    } catch (const std::invalid_argument& e) {
        INFO("message: " << e.what());
        for (auto p : parts)
            CHECK_MESSAGE(contains_text(e.what(), p), "missing '" << std::string(p) << "'");
    } catch (const std::exception& e) {
        FAIL("expected std::invalid_argument, got another exception: " << e.what());
    }
}

/// Writes `data` (a contiguous container of std::byte) under `key` and waits; fails the
/// test on error.
template <class Tier, class Buffer>
void put(Tier& tier, std::string_view key, const Buffer& data) {
    auto o = run([&] { return tier.write(key, data); });
    if (o.error) {
        try {
            std::rethrow_exception(o.error);
        } catch (const std::exception& e) {
            FAIL("write of " << std::string(key) << " failed: " << e.what());
        }
    }
    CHECK(o.nbytes == data.size());
}

/// Reads `key` (of size_of(key) bytes) into a Buffer and returns it; fails the test on error.
template <class Buffer = std::vector<std::byte>, class Tier>
Buffer get(Tier& tier, std::string_view key, std::size_t nbytes) {
    Buffer back(nbytes);
    auto o = run([&] { return tier.read(key, back); });
    if (o.error) {
        try {
            std::rethrow_exception(o.error);
        } catch (const std::exception& e) {
            FAIL("read of " << std::string(key) << " failed: " << e.what());
        }
    }
    CHECK(o.nbytes == nbytes);
    return back;
}

}  // namespace spillway::test::conformance
