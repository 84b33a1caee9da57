// SPDX-License-Identifier: Apache-2.0
// The stash's key recycler on its own: new keys, reuse of retired keys by size, draining.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <spillway/stash/detail/key_recycler.hpp>

using spillway::detail::key_recycler;

TEST_CASE("new keys are numbered from 1 under the prefix and the stash's serial") {
    key_recycler k("act", 7);
    CHECK(k.take(100) == "act-7-1");
    CHECK(k.take(100) == "act-7-2");
    CHECK(k.probe_key() == "act-7-probe");
    CHECK(k.retired() == 0);
}

TEST_CASE("a retired key is taken before a new one: of the same size first, else the smallest") {
    key_recycler k("act", 1);
    const std::string a = k.take(4096), b = k.take(8192), c = k.take(16384);
    k.retire(4096, a);
    k.retire(8192, b);
    k.retire(16384, c);
    CHECK(k.retired() == 3);
    CHECK(k.take(8192) == b);
    CHECK(k.take(100) == a);
    CHECK(k.take(100) == c);
    CHECK(k.take(100) == "act-1-4");  // none retired: a new key, never an earlier one
}

TEST_CASE("drain hands over every retired key, smallest blob first, and retires none after") {
    key_recycler k("x", 2);
    const std::string a = k.take(1), b = k.take(2), c = k.take(3);
    k.retire(3, c);
    k.retire(1, a);
    k.retire(2, b);
    CHECK(k.drain() == std::vector<std::string>{a, b, c});
    CHECK(k.retired() == 0);
    CHECK(k.drain().empty());
    CHECK(k.take(1) == "x-2-4");
}
