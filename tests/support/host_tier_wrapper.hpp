// SPDX-License-Identifier: Apache-2.0
// tests/support/host_tier_wrapper.hpp: the bookkeeping half of a storage tier for tests that
// change only how a host tier's reads or writes complete (slowly, failing, read-only): derive
// from host_tier_wrapper and define read() and write() (and erase() or name() if they change).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <spillway/tier/host_tier.hpp>
#include <spillway/tier/storage_tier.hpp>

namespace spillway::test {

struct host_tier_wrapper {
    static constexpr tier_properties properties = host_tier::properties;
    host_tier inner;

    bool erase(std::string_view k) { return inner.erase(k); }
    [[nodiscard]] bool contains(std::string_view k) const { return inner.contains(k); }
    [[nodiscard]] std::optional<std::size_t> size_of(std::string_view k) const { return inner.size_of(k); }
    [[nodiscard]] std::size_t capacity() const { return inner.capacity(); }
    [[nodiscard]] std::size_t used() const { return inner.used(); }
    [[nodiscard]] tier_stats stats() const { return inner.stats(); }
    [[nodiscard]] std::string name() const { return inner.name(); }
};

}  // namespace spillway::test
