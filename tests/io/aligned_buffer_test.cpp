// aligned_buffer: alignment, zeroing, padding, moves, bad alignment, and the huge-page advice
// for large buffers (page_size::automatic) against page_size::base.
#include <doctest/doctest.h>

#include <spillway/io/aligned_buffer.hpp>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>

using namespace spillway;

namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;

bool all_zero(std::span<const std::byte> bytes) {
    return std::all_of(bytes.begin(), bytes.end(), [](std::byte b) { return b == std::byte{0}; });
}

/// True when this kernel takes MADV_HUGEPAGE ("always" or "madvise" mode, not "never").
bool thp_advisable() {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string line;
    return std::getline(f, line) && line.find("[never]") == std::string::npos;
}

}  // namespace

TEST_CASE("aligned_buffer: sizes round up to the alignment, the data is aligned and zeroed") {
    std::mt19937_64 rng(7);
    for (int i = 0; i < 40; ++i) {
        const std::size_t n = rng() % (5 * MiB);
        const std::size_t alignment = std::size_t{512} << (rng() % 5);  // 512 B .. 8 KiB
        aligned_buffer b(n, memory_lock::unlocked, alignment);
        CAPTURE(n);
        CAPTURE(alignment);
        CHECK(b.size() == n);
        CHECK(b.capacity() >= std::max<std::size_t>(n, 1));
        CHECK(b.capacity() < std::max<std::size_t>(n, 1) + alignment);
        CHECK(is_aligned(b.capacity(), alignment));
        CHECK(is_aligned(b.data(), alignment));
        CHECK(all_zero(b.padded_bytes()));
    }
}

TEST_CASE("aligned_buffer: uninitialized fill still zeroes the padding") {
    const std::size_t n = 3 * MiB + 123;
    aligned_buffer b(n, memory_lock::unlocked, default_alignment, buffer_fill::uninitialized);
    CHECK(all_zero(b.padded_bytes().subspan(n)));
    std::fill(b.bytes().begin(), b.bytes().end(), std::byte{0x5a});
    CHECK(all_zero(b.padded_bytes().subspan(n)));  // writing the requested bytes leaves it
}

TEST_CASE("aligned_buffer: a bad alignment is refused with its value") {
    CHECK_THROWS_WITH_AS(aligned_buffer(4096, memory_lock::unlocked, 3000),
                         doctest::Contains("3000 is not a power of two"), std::invalid_argument);
    CHECK_THROWS_AS(aligned_buffer(4096, memory_lock::unlocked, 0), std::invalid_argument);
}

TEST_CASE("aligned_buffer: moves hand over memory, size and the page advice") {
    aligned_buffer a(4 * MiB);
    a.bytes()[17] = std::byte{9};
    const auto* data = a.data();
    const bool advice = a.huge_page_advice();
    aligned_buffer b(std::move(a));
    CHECK(b.data() == data);
    CHECK(b.size() == 4 * MiB);
    CHECK(b.huge_page_advice() == advice);
    CHECK(b.bytes()[17] == std::byte{9});
    CHECK(a.data() == nullptr);  // NOLINT(bugprone-use-after-move): the moved-from state is specified
    CHECK(a.size() == 0);
    CHECK_FALSE(a.huge_page_advice());
    aligned_buffer c(8 * KiB);
    c = std::move(b);
    CHECK(c.data() == data);
    CHECK(c.huge_page_advice() == advice);
    CHECK_FALSE(b.huge_page_advice());
}

TEST_CASE("aligned_buffer: large buffers get the huge-page advice unless page_size::base") {
    aligned_buffer small(huge_page_bytes - 4096);
    CHECK_FALSE(small.huge_page_advice());

    aligned_buffer base(8 * MiB, memory_lock::unlocked, default_alignment, buffer_fill::zeroed, page_size::base);
    CHECK_FALSE(base.huge_page_advice());
    CHECK(all_zero(base.padded_bytes()));

    const std::size_t n = 8 * MiB + 4096 + 5;  // not a whole number of huge pages
    aligned_buffer large(n);
    CHECK(large.size() == n);
    CHECK(large.capacity() == align_up(n));  // the advice does not change what O_DIRECT may use
    CHECK(all_zero(large.padded_bytes()));
    CHECK(large.huge_page_advice() == thp_advisable());
    if (large.huge_page_advice()) CHECK(is_aligned(large.data(), huge_page_bytes));
}
