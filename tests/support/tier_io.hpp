// SPDX-License-Identifier: Apache-2.0
// tests/support/tier_io.hpp: one-line tier transfers that fail the test case on a short count,
// the message an operation ends with, a virtual tier's options with fixed placement, and
// where its keys went (keys and bytes per child).
#pragma once

#include <doctest/doctest.h>

#include <cstddef>
#include <exception>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <spillway/io/completion.hpp>
#include <spillway/tier/virtual_tier_options.hpp>

namespace spillway::test {

/// Writes `data` under `key` and requires the whole blob to be written.
template <class Tier>
void put(Tier& t, const std::string& key, const std::vector<std::byte>& data) {
    REQUIRE(t.write(key, data).wait() == data.size());
}

/// Reads `n` bytes of `key` and requires all of them.
template <class Tier>
std::vector<std::byte> get(Tier& t, const std::string& key, std::size_t n) {
    std::vector<std::byte> back(n);
    REQUIRE(t.read(key, back).wait() == n);
    return back;
}

/// What the operation failed with, or "no error".
inline std::string message_of(io_completion c) {
    try {
        c.wait();
    } catch (const std::exception& e) {
        return e.what();
    }
    return "no error";
}

inline bool has(const std::string& s, std::string_view part) {
    return s.find(part) != std::string::npos;
}

/// The test keys "k0", "k1", ...
inline std::string key_of(std::size_t i) {
    return std::string("k") + std::to_string(i);
}

/// The keys a virtual tier counts on each child (its report()).
template <class Tier>
std::vector<std::size_t> keys_per_child(const Tier& t) {
    std::vector<std::size_t> out;
    for (auto& r : t.report()) out.push_back(r.keys);
    return out;
}
/// The bytes a virtual tier counts on each child (its report()).
template <class Tier>
std::vector<std::size_t> bytes_per_child(const Tier& t) {
    std::vector<std::size_t> out;
    for (auto& r : t.report()) out.push_back(r.bytes);
    return out;
}

/// A virtual tier's options with the given bandwidths and placement fixed by them.
inline virtual_tier_options fixed(std::vector<double> bw, std::string name = "vt") {
    virtual_tier_options o;
    o.name = std::move(name);
    o.bandwidths = std::move(bw);
    o.placement = placement_mode::fixed;
    return o;
}

}  // namespace spillway::test
