// Tests of file_tier specifics (the shared behaviour is in the conformance suite).
#include <spillway/tier/file_tier.hpp>

#include <doctest/doctest.h>

#include "support/random_bytes.hpp"
#include "support/temp_dir.hpp"

using namespace spillway;

TEST_CASE("file_tier round trip (smoke)") {
    test::temp_dir dir("file-tier");
    file_tier<> tier(dir.path());
    MESSAGE("backend " << tier.engine().backend_name() << ", direct " << tier.direct_io() << " " << tier.direct_io_note());
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{4095}, std::size_t{4096}, std::size_t{4097},
                          std::size_t{3} << 20 | 5}) {
        auto data = test::random_bytes(n, n);
        tier.write("k" + std::to_string(n), data).wait();
        std::vector<std::byte> back(n);
        tier.read("k" + std::to_string(n), back).wait();
        CHECK(back == data);
    }
}
