// SPDX-License-Identifier: Apache-2.0
// aligned_buffer: alignment, zeroing, padding, moves, bad alignment, the huge-page advice
// for large buffers (page_size::automatic) against page_size::base, and large buffers kept
// out of fork() children. buffer_arena: small buffers sharing huge-page slabs, pieces merged
// and reused, empty slabs unmapped, buffers outliving the arena, concurrent use.
#include <doctest/doctest.h>

#include <spillway/io/aligned_buffer.hpp>
#include <spillway/io/buffer_arena.hpp>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

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
    CHECK_THROWS_WITH_AS(aligned_buffer(4096, memory_lock::unlocked, 0),
                         doctest::Contains("alignment 0 is not a power of two"),
                         std::invalid_argument);
}

TEST_CASE(
    "aligned_buffer and buffer_arena: a size no memory holds is std::bad_alloc, not a wrapped "
    "capacity") {
    // Rounded up, these sizes would wrap around to a capacity of 0 or a few pages, and a later
    // write inside size() would run off the allocation.
    constexpr std::size_t huge = std::numeric_limits<std::size_t>::max();
    CHECK_THROWS_AS(aligned_buffer(huge - 100, memory_lock::unlocked, default_alignment,
                                   buffer_fill::uninitialized),
                    std::bad_alloc);
    CHECK_THROWS_AS(aligned_buffer(huge - (std::size_t{1} << 20)), std::bad_alloc);
    buffer_arena arena;
    CHECK_THROWS_AS((void)arena.allocate(huge - (std::size_t{1} << 20)), std::bad_alloc);
    CHECK(arena.allocate(4096).capacity() == 4096);  // still usable
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
    CHECK(a.data() ==
          nullptr);  // NOLINT(bugprone-use-after-move): the moved-from state is specified
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

    aligned_buffer base(8 * MiB, memory_lock::unlocked, default_alignment, buffer_fill::zeroed,
                        page_size::base);
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

namespace {

/// True when a mapping of this process covers `p` (from /proc/self/maps).
bool mapped_here(const void* p) {
    std::ifstream maps("/proc/self/maps");
    const auto addr = reinterpret_cast<std::uintptr_t>(p);
    std::string line;
    while (std::getline(maps, line)) {
        std::uintptr_t lo = 0, hi = 0;
        if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR, &lo, &hi) == 2 && lo <= addr &&
            addr < hi)
            return true;
    }
    return false;
}

/// The VmFlags of the mapping that covers `p` (from /proc/self/smaps), or "" when none does.
std::string vm_flags(const void* p) {
    std::ifstream smaps("/proc/self/smaps");
    const auto addr = reinterpret_cast<std::uintptr_t>(p);
    std::string line;
    bool inside = false;
    while (std::getline(smaps, line)) {
        std::uintptr_t lo = 0, hi = 0;
        if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " ", &lo, &hi) == 2)
            inside = lo <= addr && addr < hi;
        else if (inside && line.rfind("VmFlags:", 0) == 0)
            return line;
    }
    return "";
}

}  // namespace

TEST_CASE(
    "aligned_buffer: large buffers are not inherited over fork(), so the parent keeps its huge "
    "pages") {
    aligned_buffer large(8 * MiB + 5);
    aligned_buffer small(64 * KiB);
    aligned_buffer base(8 * MiB, memory_lock::unlocked, default_alignment, buffer_fill::zeroed,
                        page_size::base);
    CHECK_FALSE(large.fork_inherited());
    CHECK(small.fork_inherited());
    CHECK(base.fork_inherited());
    CHECK(is_aligned(large.data(), huge_page_bytes));
    CHECK(vm_flags(large.data()).find(" dc") != std::string::npos);  // "do not copy on fork"
    for (std::size_t i = 0; i < large.size(); i += 4096) large.bytes()[i] = std::byte{7};

    const pid_t pid = ::fork();  // no other thread runs here (ThreadSanitizer needs that)
    REQUIRE(pid >= 0);
    if (pid == 0) {
        int code = 0;
        if (mapped_here(large.data())) code = 1;   // not inherited
        if (!mapped_here(small.data())) code = 2;  // ordinary heap memory is
        if (small.bytes()[0] != std::byte{0}) code = 3;
        { aligned_buffer gone(std::move(large)); }  // destroying it in the child is harmless
        ::_exit(code);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    // The parent's buffer is intact and still its own.
    CHECK(mapped_here(large.data()));
    CHECK(large.bytes()[4096] == std::byte{7});
    large.bytes()[8192] = std::byte{9};
    CHECK(large.bytes()[8192] == std::byte{9});
}

TEST_CASE(
    "aligned_buffer: a large buffer's memory is returned to the system when it is destroyed") {
    const void* where = nullptr;
    {
        aligned_buffer large(4 * MiB);
        where = large.data();
        CHECK(mapped_here(where));
    }
    CHECK_FALSE(mapped_here(where));  // its own mapping, unmapped (not kept by the allocator)
}

// ---- buffer_arena: small buffers carved from shared huge-page slabs -------------------------

TEST_CASE(
    "buffer_arena: buffers behave like aligned_buffers: sizes, alignment, zeroing, padding, "
    "advice") {
    buffer_arena arena;
    aligned_buffer a = arena.allocate(5000);
    CHECK(a.size() == 5000);
    CHECK(a.capacity() == 8192);
    CHECK(is_aligned(a.data()));
    CHECK(all_zero(a.padded_bytes()));
    CHECK(a.huge_page_advice() == thp_advisable());
    CHECK_FALSE(a.fork_inherited());
    CHECK(vm_flags(a.data()).find(" dc") != std::string::npos);  // the slab is MADV_DONTFORK

    // An uninitialized buffer still has zero padding, also when its piece was used before
    // (`keeper` keeps the slab mapped, so the piece comes back with what was written to it).
    aligned_buffer keeper = arena.allocate(4096);
    std::fill(a.padded_bytes().begin(), a.padded_bytes().end(), std::byte{0xAB});
    std::byte* where = a.data();
    a = aligned_buffer();
    aligned_buffer b = arena.allocate(4100, buffer_fill::uninitialized);
    CHECK(b.data() == where);  // the freed piece is reused
    CHECK(b.bytes()[0] == std::byte{0xAB});
    CHECK(all_zero(b.padded_bytes().subspan(4100)));
}

TEST_CASE(
    "buffer_arena: small buffers share a slab; freed pieces merge and are reused; an empty slab is "
    "unmapped") {
    buffer_arena arena;
    std::vector<aligned_buffer> quarter;
    for (int i = 0; i < 4; ++i) quarter.push_back(arena.allocate(512 * KiB));
    CHECK(arena.slab_count() == 1);
    CHECK(arena.mapped_bytes() == 2 * MiB);
    CHECK(arena.used_bytes() == 2 * MiB);
    CHECK(arena.slack_bytes() == 0);
    const std::byte* base = quarter[0].data();
    CHECK(is_aligned(base, huge_page_bytes));
    for (int i = 0; i < 4; ++i) {  // four disjoint pieces; each keeps what is written to it
        CHECK(quarter[static_cast<std::size_t>(i)].data() ==
              base + static_cast<std::size_t>(i) * 512 * KiB);
        auto bytes = quarter[static_cast<std::size_t>(i)].bytes();
        std::fill(bytes.begin(), bytes.end(), std::byte(i + 1));
    }
    for (int i = 0; i < 4; ++i) {
        auto bytes = quarter[static_cast<std::size_t>(i)].bytes();
        CHECK(std::all_of(bytes.begin(), bytes.end(),
                          [&](std::byte v) { return v == std::byte(i + 1); }));
    }

    // Two neighbours freed make room for one buffer of twice the size, in place.
    quarter[1] = aligned_buffer();
    quarter[2] = aligned_buffer();
    CHECK(arena.slack_bytes() == 1 * MiB);
    aligned_buffer half = arena.allocate(1 * MiB);
    CHECK(half.data() == base + 512 * KiB);
    CHECK(arena.slab_count() == 1);
    CHECK(arena.slack_bytes() == 0);

    // Another request that does not fit maps a second slab; moves carry the piece along.
    aligned_buffer more = arena.allocate(100 * KiB);
    CHECK(arena.slab_count() == 2);
    aligned_buffer moved(std::move(more));
    CHECK(moved.size() == 100 * KiB);
    const void* second = moved.data();
    moved = aligned_buffer();
    CHECK(arena.slab_count() == 1);
    CHECK_FALSE(mapped_here(second));  // its slab had nothing else: unmapped at once

    quarter.clear();
    half = aligned_buffer();
    CHECK(arena.slab_count() == 0);
    CHECK(arena.mapped_bytes() == 0);
    CHECK_FALSE(mapped_here(base));
}

TEST_CASE("buffer_arena: a request of a slab or more gets a slab of its own") {
    buffer_arena arena;
    aligned_buffer big = arena.allocate(3 * MiB + 5);
    CHECK(big.capacity() == align_up(3 * MiB + 5));
    CHECK(arena.mapped_bytes() == 4 * MiB);  // rounded up to whole huge pages
    CHECK(is_aligned(big.data(), huge_page_bytes));
    aligned_buffer small = arena.allocate(64 * KiB);  // fits in the big slab's tail
    CHECK(arena.slab_count() == 1);
    CHECK(small.data() == big.data() + big.capacity());
}

TEST_CASE("buffer_arena: buffers outlive the arena object") {
    aligned_buffer kept;
    const void* where = nullptr;
    {
        buffer_arena arena;
        kept = arena.allocate(256 * KiB);
        where = kept.data();
        aligned_buffer gone = arena.allocate(256 * KiB);
    }
    auto bytes = kept.bytes();
    std::fill(bytes.begin(), bytes.end(), std::byte{3});
    CHECK(kept.bytes()[bytes.size() - 1] == std::byte{3});
    CHECK(mapped_here(where));
    kept = aligned_buffer();  // the last buffer unmaps the slab
    CHECK_FALSE(mapped_here(where));
}

TEST_CASE("buffer_arena: threads allocating and freeing at once never share a byte") {
    buffer_arena arena;
    constexpr int threads = 4, rounds = 300;
    std::vector<std::thread> pool;
    std::atomic<int> bad{0};
    for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
            std::mt19937 rng(static_cast<unsigned>(t) + 1);
            std::vector<aligned_buffer> held;
            for (int r = 0; r < rounds; ++r) {
                const std::size_t n = (1 + rng() % 96) * 4 * KiB + rng() % 4096;
                aligned_buffer b = arena.allocate(n, buffer_fill::uninitialized);
                std::fill(b.bytes().begin(), b.bytes().end(), std::byte(t + 1));
                held.push_back(std::move(b));
                if (held.size() > 6) {  // free a random one after checking nobody wrote into it
                    const std::size_t k = rng() % held.size();
                    auto bytes = held[k].bytes();
                    if (!std::all_of(bytes.begin(), bytes.end(),
                                     [&](std::byte v) { return v == std::byte(t + 1); }))
                        ++bad;
                    held.erase(held.begin() + static_cast<std::ptrdiff_t>(k));
                }
            }
        });
    }
    for (auto& th : pool) th.join();
    CHECK(bad.load() == 0);
    CHECK(arena.used_bytes() == 0);
    CHECK(arena.mapped_bytes() == 0);  // every slab emptied and unmapped
}
