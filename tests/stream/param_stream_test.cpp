// SPDX-License-Identifier: Apache-2.0
// param_stream: parameters streamed layer by layer through a hard memory budget. The budget
// proven by instrumentation (a tier that samples the stream's resident bytes at every call
// and completion) over random budgets and layer sizes; exact read and write counts per step
// with room for k layers; bit-identity of a simulated training loop against in-memory
// arrays; refusals, misuse and tier errors naming the layer; blobs kept or erased; a file
// tier.
#include <doctest/doctest.h>

#include <spillway/stream/param_stream.hpp>
#include <spillway/tier/faulty_tier.hpp>
#include <spillway/tier/file_tier.hpp>
#include <spillway/tier/host_tier.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "support/host_tier_wrapper.hpp"
#include "support/random_bytes.hpp"
#include "support/temp_dir.hpp"

using spillway::blob_lifetime;
using spillway::host_tier;
using spillway::initial_contents;
using spillway::layer_change;
using spillway::page_size;
using spillway::param_stream;
using spillway::param_stream_options;

namespace {

/// A host tier that samples `probe()` (the stream's resident bytes) when each read or write
/// is issued and again when it completes, and counts reads and writes per key. With
/// `async`, operations complete on two worker threads after a random delay (0-200 us), so
/// the stream meets completions in any order, as on a real device.
class probed_tier : public spillway::test::host_tier_wrapper {
public:
    explicit probed_tier(bool async = false, std::uint64_t seed = 1) : async_(async), rng_(seed) {
        if (async_)
            for (int i = 0; i < 2; ++i) workers_.emplace_back([this] { work(); });
    }
    probed_tier(const probed_tier&) = delete;
    probed_tier& operator=(const probed_tier&) = delete;
    ~probed_tier() {
        {
            std::lock_guard lock(mutex_);
            stop_ = true;
        }
        cv_.notify_all();
        for (auto& t : workers_) t.join();
    }

    spillway::io_completion write(std::string_view key, std::span<const std::byte> bytes) {
        sample();
        ++writes;
        if (!async_) {
            auto c = inner.write(key, bytes);
            sample();
            return c;
        }
        return enqueue([this, k = std::string(key), bytes] { return inner.write(k, bytes); });
    }
    spillway::io_completion read(std::string_view key, std::span<std::byte> bytes) {
        sample();
        ++reads;
        if (!async_) {
            auto c = inner.read(key, bytes);
            sample();
            return c;
        }
        return enqueue([this, k = std::string(key), bytes] { return inner.read(k, bytes); });
    }
    [[nodiscard]] std::string name() const { return "probed"; }

    std::function<std::size_t()> probe;  ///< set before the first operation
    std::atomic<std::size_t> max_seen{0};
    std::atomic<std::uint64_t> samples{0};
    std::atomic<std::uint64_t> reads{0};
    std::atomic<std::uint64_t> writes{0};

private:
    void sample() {
        if (!probe) return;
        const std::size_t now = probe();
        std::size_t seen = max_seen.load();
        while (now > seen && !max_seen.compare_exchange_weak(seen, now)) {
        }
        ++samples;
    }
    struct op {
        std::function<spillway::io_completion()> run;
        spillway::completion_source source;
        std::chrono::microseconds delay;
    };
    spillway::io_completion enqueue(std::function<spillway::io_completion()> run) {
        spillway::completion_source source;
        auto handle = source.handle();
        {
            std::lock_guard lock(mutex_);
            queue_.push_back({std::move(run), source, std::chrono::microseconds(rng_() % 200)});
        }
        cv_.notify_one();
        return handle;
    }
    void work() {
        for (;;) {
            op o;
            {
                std::unique_lock lock(mutex_);
                cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
                if (queue_.empty()) return;
                o = std::move(queue_.front());
                queue_.pop_front();
            }
            std::this_thread::sleep_for(o.delay);
            try {
                const auto n = o.run().wait();
                sample();  // the stream has not seen the completion yet
                o.source.succeed(n);
            } catch (...) {
                sample();
                o.source.fail(std::current_exception());
            }
        }
    }
    bool async_;
    std::mt19937_64 rng_;
    std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<op> queue_;
    bool stop_ = false;
    std::vector<std::thread> workers_;
};
static_assert(spillway::storage_tier<probed_tier>);

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const std::exception& e) {
        return e.what();
    }
    return "";
}
bool contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

bool same(std::span<const std::byte> a, const std::vector<std::byte>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

/// The "update" of a byte layer in the fuzz: depends on the step, the layer and every byte.
void update_bytes(std::span<std::byte> bytes, std::size_t step, std::size_t layer) {
    auto x = static_cast<unsigned>(step * 131 + layer * 7 + 1);
    for (auto& b : bytes) {
        x = x * 1103515245u + 12345u + static_cast<unsigned>(b);
        b = static_cast<std::byte>(x >> 16);
    }
}

param_stream_options options_with(std::size_t budget, std::size_t held = 1) {
    param_stream_options o;
    o.memory_budget = budget;
    o.held_layers = held;
    return o;
}

}  // namespace

TEST_CASE("visit_order: distances follow forward then backward, and resynchronise") {
    spillway::detail::visit_order order(4);  // 0 1 2 3 | 3 2 1 0 | 0 1 ...
    CHECK(order.distance(0) == 1);
    CHECK(order.distance(3) == 4);
    order.visit(0);
    order.visit(1);
    order.visit(2);
    order.visit(3);
    CHECK(order.forward());
    CHECK(order.distance(3) == 1);  // backward starts with the last layer again
    CHECK(order.distance(2) == 2);
    CHECK(order.distance(0) == 4);
    order.visit(2);  // a loop that held layer 3 across the turn skips its second visit
    CHECK_FALSE(order.forward());
    CHECK(order.distance(1) == 1);
    CHECK(order.layer_at(1) == 1);
    CHECK(order.layer_at(2) == 0);
    CHECK(order.layer_at(3) == 0);
    order.visit(1);
    order.visit(0);
    CHECK(order.distance(0) == 1);  // the next forward starts at layer 0 again
    spillway::detail::visit_order one(1);
    CHECK(one.distance(0) == 1);
    one.visit(0);
    CHECK(one.distance(0) == 1);
}

TEST_CASE("visit_order: backward_only visits N-1..0 every step") {
    spillway::detail::visit_order order(4, spillway::visit_pattern::backward_only);  // 3 2 1 0 | 3
    CHECK(order.period() == 4);
    CHECK(order.distance(3) == 1);
    CHECK(order.distance(0) == 4);
    CHECK(order.layer_at(1) == 3);
    CHECK(order.layer_at(4) == 0);
    CHECK(order.layer_at(5) == 3);
    order.visit(3);
    order.visit(2);
    CHECK_FALSE(order.forward());
    CHECK(order.distance(1) == 1);
    CHECK(order.distance(3) == 3);  // the next step starts with the last layer
    CHECK(order.distance(2) == 4);  // just visited: needed latest
    order.visit(0);                 // a skipped visit resynchronises
    CHECK(order.distance(3) == 1);
    CHECK(order.layer_at(2) == 2);
}

TEST_CASE("construction refuses what cannot work, naming the smallest budget") {
    host_tier tier;
    const std::vector<std::size_t> sizes = {4096, 3 * 4096 + 5, 4096};
    const std::size_t least = spillway::smallest_budget(sizes, options_with(1));
    CHECK(least == 4 * 4096);
    SUBCASE("a budget under the largest layer") {
        auto msg = error_of([&] { param_stream s(tier, sizes, options_with(least - 1)); });
        CHECK(contains(msg, "smallest budget that works is " + std::to_string(least) + " bytes"));
        CHECK_THROWS_AS(param_stream(tier, sizes, options_with(least - 1)), std::invalid_argument);
        CHECK_THROWS_AS(param_stream(tier, sizes, options_with(0)), std::invalid_argument);
        param_stream ok(tier, sizes, options_with(least));  // exactly the smallest works
    }
    SUBCASE("held_layers = 2 needs the two largest layers") {
        const std::size_t two = spillway::smallest_budget(sizes, options_with(1, 2));
        CHECK(two == 5 * 4096);
        auto msg = error_of([&] { param_stream s(tier, sizes, options_with(two - 1, 2)); });
        CHECK(contains(msg, std::to_string(two) + " bytes"));
        CHECK(contains(msg, "held_layers = 2"));
    }
    SUBCASE("huge-page buffers are charged in whole 2 MiB pages") {
        const std::size_t big = (2u << 20) + 1;
        CHECK(spillway::charge_of(big) == (4u << 20));
        CHECK(spillway::charge_of(big, page_size::base) == (2u << 20) + 4096);
    }
    SUBCASE("bad layers, keys and held_layers") {
        CHECK_THROWS_AS(param_stream(tier, {}, options_with(least)), std::invalid_argument);
        CHECK(contains(error_of([&] {
                           param_stream s(tier, {4096, 0}, options_with(least));
                       }),
                       "layer 1 has 0 bytes"));
        auto o = options_with(least);
        o.key_prefix = "a/b";
        CHECK(contains(error_of([&] { param_stream s(tier, sizes, o); }), "key_prefix"));
        o.key_prefix = std::string(201, 'k');
        CHECK_THROWS_AS(param_stream(tier, sizes, o), std::invalid_argument);
        CHECK_THROWS_AS(param_stream(tier, sizes, options_with(least, 0)), std::invalid_argument);
    }
    SUBCASE("a bounded tier without room for every layer") {
        host_tier small(5 * 4096);
        auto msg = error_of([&] { param_stream s(small, sizes, options_with(least)); });
        CHECK(contains(msg, "need " + std::to_string(5 * 4096 + 5) + " bytes"));
    }
    SUBCASE("adopt_existing needs every blob at its size") {
        auto o = options_with(least);
        o.contents = initial_contents::adopt_existing;
        auto msg = error_of([&] { param_stream s(tier, sizes, o); });
        CHECK(contains(msg, "layer 0 (key 'params-0') has no blob"));
        std::vector<std::byte> b(4096);
        tier.write("params-0", b).wait();
        tier.write("params-1", b).wait();  // the wrong size
        tier.write("params-2", b).wait();
        msg = error_of([&] { param_stream s(tier, sizes, o); });
        CHECK(contains(msg, "layer 1 (key 'params-1')"));
        CHECK(contains(msg, "4096 bytes where the layer has 12293 bytes"));
    }
}

TEST_CASE("misuse throws, naming the layer") {
    host_tier tier;
    param_stream s(tier, spillway::uniform_layers(3, 4096), options_with(2 * 4096));
    CHECK(contains(error_of([&] { (void)s.acquire(0); }), "layer 0, which has no contents yet"));
    CHECK_THROWS_AS((void)s.acquire(0), std::logic_error);
    std::vector<std::byte> b(4096, std::byte{1});
    CHECK(contains(error_of([&] { s.store(1, std::span(b).first(100)); }),
                   "store of layer 1 with 100 bytes"));
    for (std::size_t l = 0; l < 3; ++l) s.store(l, b);
    CHECK_THROWS_AS((void)s.acquire(3), std::invalid_argument);
    CHECK(contains(error_of([&] { (void)s.acquire(7); }), "layer 7, but there are 3 layers"));
    CHECK(contains(error_of([&] { s.release(2); }), "release of layer 2, which is not acquired"));
    auto v = s.acquire(2);
    CHECK(v.layer() == 2);
    CHECK(contains(error_of([&] { (void)s.acquire(2); }), "layer 2, which is already acquired"));
    CHECK(contains(error_of([&] { (void)s.acquire(1); }),
                   "would hold 2 layers at once, but held_layers is 1"));
    CHECK(contains(error_of([&] { s.store(2, b); }), "store of layer 2, which is acquired"));
    CHECK(contains(error_of([&] { s.release(2, layer_change::updated); }), "acquired read-only"));
    CHECK_THROWS_AS(s.release(2, layer_change::updated), std::logic_error);
    s.release(2);  // the failed calls changed nothing
    auto u = s.acquire_for_update(2);
    CHECK(u.as<std::uint32_t>().size() == 1024);
    CHECK(contains(error_of([&] { (void)u.as<std::array<char, 3>>(); }), "layer 2 has 4096 bytes"));
    s.release(2, layer_change::updated);
}

TEST_CASE("reads and writes per step are exact with room for k layers; the turns keep them") {
    constexpr std::size_t n = 8;
    constexpr std::size_t layer = 4096;
    for (std::size_t k = 1; k <= n + 1; ++k) {
        CAPTURE(k);
        probed_tier tier;
        param_stream s(tier, spillway::uniform_layers(n, layer), options_with(k * layer));
        tier.probe = [&] { return s.resident_bytes(); };
        std::vector<std::vector<std::byte>> ref;
        for (std::size_t l = 0; l < n; ++l) {
            ref.push_back(spillway::test::random_bytes(layer, l));
            s.store(l, ref[l]);
        }
        s.flush();
        CHECK(s.progress().done());
        const std::size_t kept = std::min(k, n);
        for (std::size_t step = 0; step < 4; ++step) {
            const auto before = s.stats();
            for (std::size_t l = 0; l < n; ++l) {
                CHECK(same(s.acquire(l).bytes(), ref[l]));
                s.release(l);
            }
            // The last `kept` layers of forward are in memory when backward starts.
            for (std::size_t l = 0; l < n; ++l) CHECK(s.in_memory(l) == (l >= n - kept));
            const auto mid = s.stats();
            for (std::size_t l = n; l-- > 0;) {
                auto v = s.acquire_for_update(l);
                CHECK(same(v.bytes(), ref[l]));
                update_bytes(v.bytes(), step, l);
                update_bytes(ref[l], step, l);
                s.release(l, layer_change::updated);
            }
            for (std::size_t l = 0; l < n; ++l) CHECK(s.in_memory(l) == (l < kept));
            const auto after = s.stats();
            CHECK(mid.reads - before.reads >= n - kept);  // the first forward may read more
            if (step == 0) continue;
            CHECK(mid.reads - before.reads == n - kept);
            CHECK(after.reads - mid.reads ==
                  n - kept);  // backward: the turn's layers not read again
            CHECK(after.served_resident - before.served_resident == 2 * kept);
            // Each updated layer that leaves memory is written once; the layers kept across
            // both turns (the last k of forward that are also the last k of backward) never.
            CHECK(after.writes - before.writes == std::min(n, 2 * (n - kept)));
            CHECK(after.bytes_read - before.bytes_read == 2 * (n - kept) * layer);
            CHECK(after.waits - before.waits == 0);  // a synchronous tier: prefetch was in time
        }
        CHECK(s.stats().peak_resident_bytes <= k * layer);
        CHECK(tier.max_seen.load() <= k * layer);
        s.flush();
        for (std::size_t l = 0; l < n; ++l) {
            std::vector<std::byte> on_tier(layer);
            tier.inner.read(s.key_of(l), on_tier).wait();
            CHECK(on_tier == ref[l]);
        }
    }
}

TEST_CASE("the budget is never exceeded: random budgets, layer sizes, holds and delays") {
    std::mt19937_64 rng(20240633);
    // SPILLWAY_STREAM_TRIALS raises the count for a longer hunt.
    const char* env = std::getenv("SPILLWAY_STREAM_TRIALS");
    const int trials = env && *env ? std::atoi(env) : 120;
    for (int trial = 0; trial < trials; ++trial) {
        CAPTURE(trial);
        const bool async = trial % 2 == 1;
        probed_tier tier(async, static_cast<std::uint64_t>(trial));
        const std::size_t n = 1 + rng() % 10;
        std::vector<std::size_t> sizes;
        for (std::size_t l = 0; l < n; ++l) sizes.push_back(1 + rng() % (5 * 4096));
        if (trial % 10 == 0) sizes[rng() % n] = (2u << 20) + rng() % 4096;  // a huge-page buffer
        param_stream_options o;
        o.held_layers = 1 + rng() % 2;
        o.prefetch_depth = rng() % 3 == 0 ? rng() % 4 : std::numeric_limits<std::size_t>::max();
        if (trial % 3 == 0) o.pages = page_size::base;
        std::size_t all = 0;
        for (auto sz : sizes) all += spillway::charge_of(sz, o.pages);
        const std::size_t least = spillway::smallest_budget(sizes, o);
        o.memory_budget = least + rng() % (all + 4096 - least);
        CAPTURE(o.memory_budget);
        CAPTURE(n);
        param_stream s(tier, sizes, o);
        tier.probe = [&] { return s.resident_bytes(); };
        std::vector<std::vector<std::byte>> ref;
        for (std::size_t l = 0; l < n; ++l) {
            ref.push_back(spillway::test::random_bytes(sizes[l], 1000 * trial + l));
            if (l % 2 == 0)
                s.store(l, ref[l]);
            else
                s.fill(l, [&](spillway::layer_update_view v) {
                    std::memcpy(v.bytes().data(), ref[l].data(), v.size());
                });
            CHECK(s.resident_bytes() <= o.memory_budget);
        }
        for (std::size_t step = 0; step < 3; ++step) {
            for (std::size_t l = 0; l < n; ++l) {
                CHECK(same(s.acquire(l).bytes(), ref[l]));
                CHECK(s.resident_bytes() <= o.memory_budget);
                s.release(l);
            }
            // Backward; with held_layers 2 the update of layer l+1 is still held while layer
            // l is acquired (the hand-off to an update running under backward).
            std::size_t pending = n;
            for (std::size_t l = n; l-- > 0;) {
                auto v = s.acquire_for_update(l);
                CHECK(same(v.bytes(), ref[l]));
                const bool change = (l + step) % 3 != 0;
                if (change) {
                    update_bytes(v.bytes(), step, l);
                    update_bytes(ref[l], step, l);
                }
                CHECK(s.resident_bytes() <= o.memory_budget);
                if (pending != n) s.release(pending, layer_change::updated);
                pending = n;
                if (o.held_layers == 2 && change)
                    pending = l;
                else
                    s.release(l, change ? layer_change::updated : layer_change::unchanged);
            }
            if (pending != n) s.release(pending, layer_change::updated);
        }
        s.flush();
        for (std::size_t l = 0; l < n; ++l) {
            CHECK(same(s.acquire(l).bytes(), ref[l]));
            s.release(l);
        }
        CHECK(s.stats().peak_resident_bytes <= o.memory_budget);
        CHECK(tier.max_seen.load() <= o.memory_budget);
        CHECK(tier.samples.load() > 0);
    }
}

namespace {

/// A tiny training loop over float layers: forward sums each layer's params into the
/// activation; backward derives each param's gradient from the loss, the activation and
/// the param, and applies it. `Params` gives a layer's params: in memory or from a stream.
struct toy_model {
    std::vector<std::size_t> counts;  // floats per layer

    std::vector<float> init(std::size_t l) const {
        std::vector<float> p(counts[l]);
        std::mt19937 rng(static_cast<unsigned>(l + 17));
        std::normal_distribution<float> dist(0.0f, 0.02f);
        for (auto& x : p) x = dist(rng);
        return p;
    }
    // forward of one layer: a new activation from the old and the params
    static float forward(float act, std::span<const float> p) {
        float s = 0;
        for (float x : p) s += x * act + 0.001f;
        return std::tanh(s);
    }
    // backward and update of one layer, in place
    static void update(float loss, float act, std::span<float> p, std::size_t step) {
        const float lr = 0.01f / static_cast<float>(step + 1);
        for (std::size_t i = 0; i < p.size(); ++i) {
            const float g = loss * act + 0.1f * p[i] + 1e-4f * static_cast<float>(i % 7);
            p[i] -= lr * g;
        }
    }
};

/// Runs `steps` steps; `read(l)` and `update(l)` give layer l's params for forward and for
/// backward's update, `done(l, updated)` ends the use. Returns the losses.
template <class Read, class Update, class Done>
std::vector<float> train(const toy_model& m, std::size_t steps, Read read, Update update,
                         Done done) {
    std::vector<float> losses;
    const std::size_t n = m.counts.size();
    for (std::size_t step = 0; step < steps; ++step) {
        std::vector<float> acts(n + 1);
        acts[0] = 0.5f;
        for (std::size_t l = 0; l < n; ++l) {
            acts[l + 1] = toy_model::forward(acts[l], read(l));
            done(l, false);
        }
        const float loss = acts[n] * acts[n];
        losses.push_back(loss);
        for (std::size_t l = n; l-- > 0;) {
            toy_model::update(loss, acts[l], update(l), step);
            done(l, true);
        }
    }
    return losses;
}

template <class Tier>
void check_bit_identity(Tier& tier, std::size_t steps) {
    // Every layer is charged 16 KiB, so the smallest budget holds one: each pass reads
    // every layer but the one kept across the turn.
    toy_model m{{3100, 3500, 4096, 3073, 4000, 3900}};
    std::vector<std::size_t> sizes;
    for (auto c : m.counts) sizes.push_back(c * sizeof(float));
    // In memory: the reference.
    std::vector<std::vector<float>> mem;
    for (std::size_t l = 0; l < m.counts.size(); ++l) mem.push_back(m.init(l));
    auto ref_losses = train(
        m, steps, [&](std::size_t l) { return std::span<const float>(mem[l]); },
        [&](std::size_t l) { return std::span<float>(mem[l]); }, [](std::size_t, bool) {});
    // Streamed at the smallest budget: one layer at a time, every layer leaves memory.
    param_stream_options o;
    o.memory_budget = spillway::smallest_budget(sizes, o);
    param_stream s(tier, sizes, o);
    for (std::size_t l = 0; l < m.counts.size(); ++l)
        s.fill(l, [&](spillway::layer_update_view v) {
            auto p = m.init(l);
            std::copy(p.begin(), p.end(), v.template as<float>().begin());
        });
    std::uint64_t reads_before = s.stats().reads;
    auto losses = train(
        m, steps, [&](std::size_t l) { return s.acquire(l).template as<float>(); },
        [&](std::size_t l) { return s.acquire_for_update(l).template as<float>(); },
        [&](std::size_t l, bool updated) {
            s.release(l, updated ? layer_change::updated : layer_change::unchanged);
        });
    CHECK(s.stats().reads - reads_before == steps * (2 * m.counts.size() - 2) + 1);
    CHECK(s.stats().writes == m.counts.size() * (steps + 1) - 1);  // layer 0 is still dirty
    CHECK(s.stats().peak_resident_bytes <= o.memory_budget);
    REQUIRE(losses.size() == ref_losses.size());
    for (std::size_t i = 0; i < losses.size(); ++i)
        CHECK(std::memcmp(&losses[i], &ref_losses[i], sizeof(float)) == 0);
    for (std::size_t l = 0; l < m.counts.size(); ++l) {
        auto v = s.acquire(l).template as<float>();
        CHECK(std::memcmp(v.data(), mem[l].data(), v.size_bytes()) == 0);
        s.release(l);
    }
}

}  // namespace

TEST_CASE("offloading does not change the math: a training loop is bit-identical") {
    SUBCASE("host tier") {
        host_tier tier;
        check_bit_identity(tier, 5);
        CHECK(tier.used() == 0);  // the destructor erased the blobs
    }
    SUBCASE("asynchronous tier") {
        probed_tier tier(true, 7);
        check_bit_identity(tier, 3);
    }
}

TEST_CASE("a file tier in a scratch directory") {
    spillway::test::temp_dir dir("param-stream");
    spillway::file_tier<> tier(dir.path());
    check_bit_identity(tier, 3);
    CHECK(tier.used() == 0);
}

TEST_CASE("tier errors name the layer, its key and the tier; nothing is lost") {
    using faulty = spillway::faulty_tier<host_tier>;
    const std::size_t n = 4;
    const std::size_t layer = 4096;
    SUBCASE("a failed read is thrown by the acquire that needs it; the next acquire retries") {
        faulty tier;
        auto o = options_with(layer);
        o.prefetch_depth = 0;  // every read is the acquire's own
        param_stream s(tier, spillway::uniform_layers(n, layer), o);
        std::vector<std::vector<std::byte>> ref;
        for (std::size_t l = 0; l < n; ++l)
            s.store(l, ref.emplace_back(spillway::test::random_bytes(layer, l)));
        s.flush();
        // Only the last layer stored is resident; the first acquire reads layer 0.
        tier.fail_nth(spillway::fault_op::read, 1, EIO);
        auto msg = error_of([&] { (void)s.acquire(0); });
        CHECK(
            contains(msg, "read of layer 0 (key 'params-0', 4096 bytes) from tier 'faulty(host)'"));
        CHECK_THROWS_AS((tier.fail_nth(spillway::fault_op::read, 1, EIO), (void)s.acquire(0)),
                        std::system_error);
        CHECK(same(s.acquire(0).bytes(), ref[0]));
        s.release(0);
        CHECK(s.stats().failed_reads == 2);
    }
    SUBCASE("a failed write-back keeps the layer dirty in memory; the data survive") {
        faulty tier;
        param_stream s(tier, spillway::uniform_layers(n, layer), options_with(2 * layer));
        std::vector<std::vector<std::byte>> ref;
        for (std::size_t l = 0; l < n; ++l)
            s.store(l, ref.emplace_back(spillway::test::random_bytes(layer, l)));
        s.flush();
        for (std::size_t l = 0; l < n; ++l) {
            (void)s.acquire(l);
            s.release(l);
        }
        tier.fail_always(spillway::fault_op::write, EIO);
        std::string msg;
        std::size_t stopped_at = n;
        for (std::size_t l = n; l-- > 0;) {
            try {
                auto v = s.acquire_for_update(l);
                update_bytes(v.bytes(), 0, l);
                update_bytes(ref[l], 0, l);
                s.release(l, layer_change::updated);
            } catch (const std::system_error& e) {
                msg = e.what();
                CHECK(e.code().value() == EIO);
                stopped_at = l;
                break;
            }
        }
        REQUIRE(stopped_at < n);
        CHECK(contains(
            msg, "write-back of layer 3 (key 'params-3', 4096 bytes) to tier 'faulty(host)'"));
        CHECK(s.dirty(3));
        CHECK(s.in_memory(3));
        tier.clear_faults();
        // Backward goes on from the layer the error stopped; then every byte is checked.
        for (std::size_t l = stopped_at + 1; l-- > 0;) {
            auto v = s.acquire_for_update(l);
            CHECK(same(v.bytes(), ref[l]));
            update_bytes(v.bytes(), 0, l);
            update_bytes(ref[l], 0, l);
            s.release(l, layer_change::updated);
        }
        s.flush();
        for (std::size_t l = 0; l < n; ++l) {
            std::vector<std::byte> on_tier(layer);
            tier.read(s.key_of(l), on_tier).wait();
            CHECK(on_tier == ref[l]);
        }
    }
    SUBCASE("a failed store is reported once by the next call, and flush() retries it") {
        faulty tier;
        param_stream s(tier, spillway::uniform_layers(n, layer), options_with(n * layer));
        tier.fail_nth(spillway::fault_op::write, 2, ENOSPC);
        std::vector<std::vector<std::byte>> ref;
        for (std::size_t l = 0; l < 2; ++l)
            s.store(l, ref.emplace_back(spillway::test::random_bytes(layer, l)));
        ref.emplace_back(spillway::test::random_bytes(layer, 2));
        auto msg = error_of([&] { s.store(2, ref[2]); });
        CHECK(
            contains(msg, "store of layer 1 (key 'params-1', 4096 bytes) to tier 'faulty(host)'"));
        CHECK(s.dirty(1));
        CHECK_FALSE(s.progress().done());
        s.store(2, ref[2]);  // reported once: the call goes through now
        s.store(3, ref.emplace_back(spillway::test::random_bytes(layer, 3)));
        s.flush();
        CHECK(s.progress().done());
        CHECK(s.progress().bytes_stored == n * layer);
        for (std::size_t l = 0; l < n; ++l) {
            CHECK(same(s.acquire(l).bytes(), ref[l]));
            s.release(l);
        }
    }
}

TEST_CASE("blobs are erased by the destructor unless kept; a new stream adopts them") {
    host_tier tier;
    const auto sizes = std::vector<std::size_t>{100, 5000, 40};
    std::vector<std::vector<std::byte>> ref;
    {
        auto o = options_with(3 * 4096);
        o.blobs = blob_lifetime::keep;
        o.key_prefix = "model";
        param_stream s(tier, sizes, o);
        for (std::size_t l = 0; l < sizes.size(); ++l)
            s.store(l, ref.emplace_back(spillway::test::random_bytes(sizes[l], l)));
        auto p = s.progress();
        CHECK(p.bytes_total == 5140);
        CHECK(p.layer_count == 3);
        auto v = s.acquire_for_update(1);
        update_bytes(v.bytes(), 9, 1);
        update_bytes(ref[1], 9, 1);
        s.release(1, layer_change::updated);
        CHECK(s.dirty(1));
        s.flush();  // the destructor writes nothing
        CHECK_FALSE(s.dirty(1));
    }
    CHECK(tier.used() == 5140);
    {
        auto o = options_with(8192);
        o.key_prefix = "model";
        o.contents = initial_contents::adopt_existing;
        param_stream s(tier, sizes, o);
        CHECK(s.progress().done());
        for (std::size_t l = 0; l < sizes.size(); ++l) {
            CHECK(same(s.acquire(l).bytes(), ref[l]));
            s.release(l);
        }
        CHECK(s.stats().bytes_written == 0);
    }
    CHECK(tier.used() == 0);  // erase_on_destroy erased the adopted blobs
}

TEST_CASE("stores overlap their writes and report progress") {
    probed_tier tier(true, 3);
    const std::size_t n = 12;
    param_stream s(tier, spillway::uniform_layers(n, 8192), options_with(4 * 8192));
    tier.probe = [&] { return s.resident_bytes(); };
    std::size_t last = 0;
    for (std::size_t l = 0; l < n; ++l) {
        s.fill(l, [&](spillway::layer_update_view v) {
            for (auto& x : v.as<std::uint32_t>()) x = static_cast<std::uint32_t>(l);
        });
        auto p = s.progress();
        CHECK(p.bytes_stored >= last);
        CHECK(p.bytes_total == n * 8192);
        last = p.bytes_stored;
    }
    s.flush();
    CHECK(s.progress().done());
    CHECK(s.stats().writes == n);
    CHECK(tier.max_seen.load() <= 4 * 8192);
    for (std::size_t l = 0; l < n; ++l) {
        auto v = s.acquire(l).as<std::uint32_t>();
        CHECK(std::all_of(v.begin(), v.end(), [&](std::uint32_t x) { return x == l; }));
        s.release(l);
    }
}

TEST_CASE("the update hand-off: another thread writes a held layer while backward goes on") {
    // The pattern of an update running under backward (update_pipeline's streamed update):
    // the trainer thread acquires layer l for update and hands its bytes to the updating
    // thread, acquires layer l-1 for its own backward, and releases l as updated once the
    // update says it is done. Only the trainer thread calls the stream.
    probed_tier tier(true, 11);
    const std::size_t n = 6;
    const std::size_t floats = 2048;
    param_stream s(tier, spillway::uniform_layers(n, floats * 4), options_with(3 * floats * 4, 2));
    std::vector<std::vector<float>> ref(n, std::vector<float>(floats));
    for (std::size_t l = 0; l < n; ++l) {
        for (std::size_t i = 0; i < floats; ++i) ref[l][i] = static_cast<float>(l * floats + i);
        s.fill(l, [&](spillway::layer_update_view v) {
            std::copy(ref[l].begin(), ref[l].end(), v.as<float>().begin());
        });
    }
    for (std::size_t step = 0; step < 3; ++step) {
        for (std::size_t l = 0; l < n; ++l) {
            auto v = s.acquire(l).as<float>();
            CHECK(std::equal(v.begin(), v.end(), ref[l].begin()));
            s.release(l);
        }
        std::thread updater;
        std::size_t in_update = n;
        for (std::size_t l = n; l-- > 0;) {
            auto v = s.acquire_for_update(l);
            if (updater.joinable()) {
                updater.join();
                s.release(in_update, layer_change::updated);
            }
            auto p = v.as<float>();
            CHECK(std::equal(p.begin(), p.end(), ref[l].begin()));
            for (auto& x : ref[l]) x = x * 0.5f + 1.0f;
            updater = std::thread([p] {
                for (auto& x : p) x = x * 0.5f + 1.0f;
            });
            in_update = l;
        }
        updater.join();
        s.release(in_update, layer_change::updated);
    }
    s.flush();
    CHECK(s.stats().peak_resident_bytes <= 3 * floats * 4);
    for (std::size_t l = 0; l < n; ++l) {
        std::vector<float> on_tier(floats);
        tier.inner.read(s.key_of(l), std::as_writable_bytes(std::span(on_tier))).wait();
        CHECK(on_tier == ref[l]);
    }
}

TEST_CASE("prefetch reads ahead in the current direction; depth 0 reads on demand") {
    const std::size_t n = 6;
    const std::size_t layer = 4096;
    for (std::size_t depth : {std::size_t{0}, std::numeric_limits<std::size_t>::max()}) {
        CAPTURE(depth);
        host_tier tier;
        auto o = options_with(3 * layer);
        o.prefetch_depth = depth;
        param_stream s(tier, spillway::uniform_layers(n, layer), o);
        for (std::size_t l = 0; l < n; ++l) s.store(l, spillway::test::random_bytes(layer, l));
        s.flush();
        (void)s.acquire(0);
        s.release(0);
        const auto before = s.stats();
        for (std::size_t l = 1; l < n; ++l) {
            (void)s.acquire(l);
            if (depth != 0) {  // the next two layers of forward are in memory already
                CHECK(s.in_memory(std::min(l + 1, n - 1)));
                CHECK(s.in_memory(std::min(l + 2, n - 1)));
            }
            s.release(l);
        }
        const auto mid = s.stats();
        for (std::size_t l = n; l-- > 0;) {
            (void)s.acquire(l);
            if (depth != 0 && l >= 2) CHECK(s.in_memory(l - 2));  // backward's next ones
            s.release(l);
        }
        const auto after = s.stats();
        CHECK(after.reads - mid.reads == n - 3);  // the last 3 of forward start backward
        const auto reads = after.reads - before.reads;
        if (depth == 0) {
            CHECK(after.demand_reads - before.demand_reads == reads);
            CHECK(after.served_prefetched == 0);
        } else {
            CHECK(after.demand_reads - before.demand_reads == 0);
            CHECK(after.served_prefetched - before.served_prefetched >= reads);
        }
    }
}

TEST_CASE("backward_only: state updated in backward is prefetched while forward runs") {
    // An optimizer's moments: acquired for update in backward only, N-1..0 every step. Belady
    // on that order gives up the layer just updated (needed latest); prefetch reads the next
    // ones in the order, so between two backwards (while forward runs) the stream already
    // reads the last layers' state for the next.
    // With prefetch_depth 1 prefetch reads only the next layer: one buffer rotates and the
    // others stay resident across steps (fewer bytes, less read ahead while forward runs).
    constexpr std::size_t n = 8;
    constexpr std::size_t layer = 4096;
    for (std::size_t depth : {std::size_t{1}, std::numeric_limits<std::size_t>::max()})
    for (std::size_t k = 1; k <= n + 1; ++k) {
        CAPTURE(depth);
        CAPTURE(k);
        probed_tier tier;
        auto o = options_with(k * layer);
        o.pattern = spillway::visit_pattern::backward_only;
        o.prefetch_depth = depth;
        param_stream s(tier, spillway::uniform_layers(n, layer), o);
        std::size_t depth1_reads = 0;  // over the steps after the first
        tier.probe = [&] { return s.resident_bytes(); };
        std::vector<std::vector<std::byte>> ref;
        for (std::size_t l = 0; l < n; ++l) {
            ref.push_back(spillway::test::random_bytes(layer, l + 100));
            s.store(l, ref[l]);
        }
        s.flush();
        for (std::size_t step = 0; step < 4; ++step) {
            const auto before = s.stats();
            for (std::size_t l = n; l-- > 0;) {
                auto v = s.acquire_for_update(l);
                CHECK(same(v.bytes(), ref[l]));
                update_bytes(v.bytes(), step, l);
                update_bytes(ref[l], step, l);
                s.release(l, layer_change::updated);
            }
            // Between backwards: the next backward's first layers are in memory (prefetch on
            // a synchronous tier): min(k, n) of them, or with depth 1 the first one.
            const std::size_t kept = std::min(k, n);
            const auto after = s.stats();
            CHECK(s.in_memory(n - 1));
            if (depth > 1)
                for (std::size_t l = 0; l < n; ++l) CHECK(s.in_memory(l) == (l >= n - kept));
            if (step == 0) continue;
            CHECK(after.waits - before.waits == 0);
            CHECK(after.demand_reads - before.demand_reads == 0);
            const std::size_t reads = after.reads - before.reads;
            CHECK(after.writes - before.writes == reads);  // each layer read was updated
            if (k >= n) {
                CHECK(reads == 0);
            } else if (depth > 1) {
                CHECK(reads == n);  // every layer is read and written once a step
            } else {
                // Belady keeps layers across steps; the held layer cannot be given up, so
                // about k - 2 of them stay.
                CHECK(reads <= n - k + 2);
                depth1_reads += reads;
            }
        }
        if (depth == 1 && k >= 3 && k < n) CHECK(depth1_reads < 3 * n);
        CHECK(s.stats().peak_resident_bytes <= k * layer);
        CHECK(tier.max_seen.load() <= k * layer);
        s.flush();
        for (std::size_t l = 0; l < n; ++l) {
            std::vector<std::byte> on_tier(layer);
            tier.inner.read(s.key_of(l), on_tier).wait();
            CHECK(on_tier == ref[l]);
        }
    }
}
