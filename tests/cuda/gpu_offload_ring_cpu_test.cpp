// SPDX-License-Identifier: Apache-2.0
// The gpu_offload example's budgeted run on the CPU: the plan a device budget buys and its
// refusal (examples/gpu_offload/layer_ring.hpp), the weight schedule (every layer visited
// forward then backward, every use finding its layer in its slot, no slot refilled before
// its last use), and the whole pass (offload_step.hpp) run over a simulated GPU whose
// streams execute in random interleavings that respect only the declared orderings
// (stream order, events, the stash's documented waits): several steps must give the
// losses and gradients of the in-memory reference bit for bit, so an ordering the pass
// forgot shows up as different bits. Device memory starts as NaN bytes, so a read of a
// buffer nothing wrote shows up too.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <thrust/execution_policy.h>

#include "gpu_offload/layer_ring.hpp"
#include "gpu_offload/mlp_step.hpp"
#include "gpu_offload/offload_step.hpp"

using gpu_offload::ring_plan;
using gpu_offload::ring_sizes;
using spillway::float16;
using spillway::from_float;
using spillway::to_float;

TEST_CASE("parse_bytes: suffixes are powers of 1024; garbage, 0 and huge sizes are refused naming the flag") {
    using gpu_offload::parse_bytes;
    CHECK(parse_bytes("--device-budget", "2G") == (std::size_t{2} << 30));
    CHECK(parse_bytes("--device-budget", "512M") == (std::size_t{512} << 20));
    CHECK(parse_bytes("--device-budget", "1.5GiB") == (std::size_t{3} << 29));
    CHECK(parse_bytes("--device-budget", "64KB") == 65536);
    CHECK(parse_bytes("--device-budget", "1073741824") == (std::size_t{1} << 30));
    CHECK(parse_bytes("--device-budget", "3t") == (std::size_t{3} << 40));
    for (const char* bad : {"", "G", "-1G", "0", "2X", "2 G", "abc", "1e30"}) {
        CAPTURE(bad);
        try {
            (void)parse_bytes("--device-budget", bad);
            FAIL("accepted");
        } catch (const std::invalid_argument& e) {
            CHECK(std::string(e.what()).find("--device-budget") == 0);
        }
    }
}

TEST_CASE("plan_ring: the minimum, the refusal naming budget and minimum, and what more budget buys") {
    const ring_sizes sz{.weight_slot = 1000 * 256, .grad_slot = 1000 * 256, .activation = 10 * 256, .fixed = 7 * 256};
    const std::size_t n = 9;
    const std::size_t minimum = 2 * sz.weight_slot + sz.grad_slot + 2 * sz.activation + sz.fixed;
    CHECK(gpu_offload::minimum_plan(sz, n).device_bytes() == minimum);

    SUBCASE("below the minimum: refused with both numbers in the message") {
        try {
            (void)gpu_offload::plan_ring(sz, n, minimum - 1);
            FAIL("accepted");
        } catch (const std::invalid_argument& e) {
            const std::string what = e.what();
            CHECK(what.find(std::to_string(minimum - 1) + " bytes") != std::string::npos);
            CHECK(what.find(std::to_string(minimum) + " bytes") != std::string::npos);
            CHECK(what.find("below the minimum") != std::string::npos);
        }
    }
    SUBCASE("exactly the minimum") {
        ring_plan p = gpu_offload::plan_ring(sz, n, minimum);
        CHECK(p.weight_slots == 2);
        CHECK(p.grad_slots == 1);
        CHECK(p.activation_buffers == 2);
        CHECK(p.device_bytes() == minimum);
        CHECK(p.streams_weights());
    }
    SUBCASE("then a second gradient slot, then activation buffers, then weight slots") {
        ring_plan p = gpu_offload::plan_ring(sz, n, minimum + sz.grad_slot);
        CHECK(p.grad_slots == 2);
        CHECK(p.activation_buffers == 2);
        p = gpu_offload::plan_ring(sz, n, minimum + sz.grad_slot + 2 * sz.activation);
        CHECK(p.activation_buffers == 4);
        CHECK(p.weight_slots == 2);
        p = gpu_offload::plan_ring(sz, n, minimum + sz.grad_slot + 2 * sz.activation + 3 * sz.weight_slot + 5);
        CHECK(p.weight_slots == 5);
        CHECK(p.device_bytes() <= minimum + sz.grad_slot + 2 * sz.activation + 3 * sz.weight_slot + 5);
    }
    SUBCASE("every budget: within it, and the most weight slots it holds, at most one per layer") {
        for (std::size_t budget = minimum; budget < minimum + 12 * sz.weight_slot; budget += 37 * 256 + 11) {
            ring_plan p = gpu_offload::plan_ring(sz, n, budget);
            CAPTURE(budget);
            CHECK(p.device_bytes() <= budget);
            CHECK(p.weight_slots <= n);
            CHECK(p.activation_buffers <= 4);
            if (p.weight_slots < n) CHECK(p.device_bytes() + sz.weight_slot > budget);
        }
    }
    SUBCASE("no budget: every layer resident") {
        ring_plan p = gpu_offload::plan_ring(sz, n);
        CHECK(p.weight_slots == n);
        CHECK(p.grad_slots == 2);
        CHECK(p.activation_buffers == 4);
        CHECK_FALSE(p.streams_weights());
    }
    SUBCASE("two layers (one hidden): two activation buffers at most") {
        ring_plan p = gpu_offload::plan_ring(sz, 2);
        CHECK(p.weight_slots == 2);
        CHECK(p.activation_buffers == 2);
    }
}

TEST_CASE("ring_sizes_of: slots hold the largest layer, buffers the activations, all 256-byte aligned") {
    gpu_offload::mlp_shape s{.batch = 3, .in = 50, .hidden = 7, .out = 5, .layers = 3};
    ring_sizes r = gpu_offload::ring_sizes_of(s);
    CHECK(s.max_layer_params() == 50 * 7 + 7);
    CHECK(r.weight_slot == gpu_offload::align_device((50 * 7 + 7) * 2));
    CHECK(r.activation == gpu_offload::align_device(3 * 7 * 4));
    CHECK(r.weight_slot % 256 == 0);
    CHECK(r.fixed % 256 == 0);
    CHECK(s.params() == (50 * 7 + 7) + 2 * (7 * 7 + 7) + (7 * 5 + 5));
    CHECK(s.offset(3) + s.layer_params(3) == s.params());
}

// Replays a schedule the way the GPU executes it: a load lands in its slot after its
// after_use finished and before its first use. Checks every property the header promises.
static void check_schedule(std::size_t n, std::size_t k) {
    CAPTURE(n);
    CAPTURE(k);
    const gpu_offload::step_schedule s = gpu_offload::schedule_weights(n, k);
    const std::size_t kk = std::min(n, k);
    REQUIRE(s.uses.size() == 2 * n);
    CHECK(s.loads.size() == n + (n - kk));
    CHECK(s.initial.size() == kk);
    // Every layer forward in order, then backward in reverse.
    for (std::size_t u = 0; u < 2 * n; ++u) {
        CHECK(s.uses[u].layer == (u < n ? u : 2 * n - 1 - u));
        CHECK((s.uses[u].direction == gpu_offload::pass::forward) == (u < n));
        CHECK(s.uses[u].slot < kk);
    }
    // Loads: forward load l into slot l mod K; issued in order, each after its slot's last
    // use and before its first use; each use issues at most one load, into its own slot.
    std::size_t then_loads = 0;
    for (std::size_t i = 0; i < s.loads.size(); ++i) {
        const auto& ld = s.loads[i];
        if (i < n) CHECK(ld.slot == i % kk);
        if (i > 0) CHECK(s.loads[i - 1].first_use < ld.first_use);  // in the order needed
        CHECK(ld.layer < n);
        CHECK(s.uses[ld.first_use].layer == ld.layer);
        CHECK(s.uses[ld.first_use].wait_load == i);
        if (ld.after_use) {
            CHECK(*ld.after_use < ld.first_use);
            CHECK(s.uses[*ld.after_use].then_load == i);
            CHECK(s.uses[*ld.after_use].slot == ld.slot);
            ++then_loads;
        } else {
            CHECK(std::find(s.initial.begin(), s.initial.end(), i) != s.initial.end());
        }
        if (i > 0 && ld.after_use && s.loads[i - 1].after_use) CHECK(*s.loads[i - 1].after_use < *ld.after_use);
    }
    CHECK(then_loads == s.loads.size() - kk);
    // Replay: slot contents over time. At use u a slot holds the layer of the newest load
    // into it that is issued before u (initial ones, or after_use < u).
    std::vector<std::optional<std::size_t>> slot(kk);  // load index held
    std::vector<bool> landed(s.loads.size(), false);
    for (std::size_t i : s.initial) slot[s.loads[i].slot] = i;
    for (std::size_t u = 0; u < 2 * n; ++u) {
        const auto& use = s.uses[u];
        REQUIRE(slot[use.slot].has_value());
        const std::size_t held = *slot[use.slot];
        CHECK(s.loads[held].layer == use.layer);  // the use finds its layer in its slot
        if (use.wait_load) CHECK(*use.wait_load == held);
        if (!landed[held]) {
            CHECK(use.wait_load == held);  // the first use of a load waits for it
            landed[held] = true;
        }
        if (use.then_load) {
            // The slot is refilled only now: no later use reads the load it held.
            for (std::size_t later = u + 1; later < 2 * n; ++later)
                if (s.uses[later].slot == use.slot && s.uses[later].layer == use.layer)
                    CHECK(s.uses[later].wait_load.has_value());
            slot[use.slot] = *use.then_load;
        }
    }
    // Every load was used.
    CHECK(std::all_of(landed.begin(), landed.end(), [](bool b) { return b; }));
}

TEST_CASE("schedule_weights: every layer forward then backward, each use in its slot, no refill in use") {
    for (std::size_t n = 2; n <= 12; ++n)
        for (std::size_t k = 2; k <= n + 2; ++k) check_schedule(n, k);
    CHECK_THROWS_AS((void)gpu_offload::schedule_weights(1, 2), std::invalid_argument);
    CHECK_THROWS_AS((void)gpu_offload::schedule_weights(5, 1), std::invalid_argument);
}

TEST_CASE("grad and activation buffers: slots in turn, waits on the copy G positions back") {
    CHECK(gpu_offload::grad_slot(0, 2) == 0);
    CHECK(gpu_offload::grad_slot(3, 2) == 1);
    CHECK_FALSE(gpu_offload::grad_slot_wait(1, 2).has_value());
    CHECK(gpu_offload::grad_slot_wait(2, 2) == 0);
    CHECK(gpu_offload::grad_slot_wait(1, 1) == 0);
    for (std::size_t l = 1; l < 10; ++l) {
        CHECK(gpu_offload::backward_activation_buffer(l) != gpu_offload::backward_activation_buffer(l - 1));
        for (std::size_t a = 2; a <= 4; ++a)
            CHECK(gpu_offload::forward_activation_buffer(l, a) != gpu_offload::forward_activation_buffer(l - 1, a));
    }
}

namespace {

/// How far a simulated GPU runs ahead after each call the host makes.
enum class sim_pace {
    lazy,    ///< nothing runs until the host blocks: everything enqueued far ahead
    eager,   ///< everything runnable runs at once
    random,  ///< a random number of runnable operations, from streams of random weights
};

/// A GPU simulated on the CPU: streams are queues of operations that run in stream order;
/// an operation waiting for an event runs once the event's record it captured ran; which
/// stream runs next is random, each stream drawn with a weight from 1 to 2^12 fixed at its
/// creation, so some runs starve a stream for many operations (a copy stream falling far
/// behind compute, or running far ahead). Memory is host memory filled with 0xFF (NaN in
/// fp16 and fp32). Kernels run with thrust::host when their operation runs.
class sim_gpu {
public:
    using stream_type = std::size_t;
    using event_type = std::size_t;

    sim_gpu(std::uint32_t seed, sim_pace pace) : rng_(seed), pace_(pace) {}

    stream_type make_stream() {
        streams_.emplace_back();
        weights_.push_back(std::exp2(std::uniform_real_distribution<double>(0.0, 12.0)(rng_)));
        return streams_.size() - 1;
    }
    event_type make_event(gpu_offload::event_use) {
        events_.push_back({});
        return events_.size() - 1;
    }
    std::byte* allocate(std::size_t nbytes) {
        memory_.push_back(std::make_unique<std::byte[]>(nbytes));
        std::memset(memory_.back().get(), 0xFF, nbytes);
        allocated_ += nbytes;
        return memory_.back().get();
    }
    void copy(void* dst, const void* src, std::size_t nbytes, stream_type s) {
        enqueue(s, {.run = [dst, src, nbytes] { std::memcpy(dst, src, nbytes); }, .event = std::nullopt, .generation = 0});
    }
    void record(event_type e, stream_type s) {
        const std::uint64_t g = ++events_[e].recorded;
        enqueue(s, {.run = [this, e, g] { events_[e].completed = std::max(events_[e].completed, g); },
                     .event = std::nullopt,
                     .generation = 0});
    }
    void wait(stream_type s, event_type e) { enqueue(s, {.run = {}, .event = e, .generation = events_[e].recorded}); }
    template <class Fn>
    void run(stream_type s, Fn fn) {
        enqueue(s, {.run = [fn] { fn(thrust::host); }, .event = std::nullopt, .generation = 0});
    }
    void synchronize(stream_type s) {
        drain_until([&] { return streams_[s].empty(); });
    }
    float elapsed_ms(event_type, event_type) { return 0; }

    /// Runs operations (random streams) until `done()`; throws when nothing can run.
    void drain_until(const std::function<bool()>& done) {
        while (!done())
            if (!run_one()) throw std::logic_error("sim_gpu: deadlock: nothing can run and the host waits");
    }
    /// An event's captured record has run.
    [[nodiscard]] bool reached(event_type e, std::uint64_t generation) const {
        return events_[e].completed >= generation;
    }
    [[nodiscard]] std::uint64_t recorded(event_type e) const { return events_[e].recorded; }
    [[nodiscard]] std::size_t allocated_bytes() const { return allocated_; }
    [[nodiscard]] std::size_t operations() const { return operations_; }

private:
    struct op {
        std::function<void()> run;
        std::optional<event_type> event;  // a wait: runnable once the event reached generation
        std::uint64_t generation = 0;
    };
    struct event_state {
        std::uint64_t recorded = 0, completed = 0;
    };

    void enqueue(stream_type s, op o) {
        streams_[s].push_back(std::move(o));
        advance();
    }
    void advance() {
        if (pace_ == sim_pace::lazy) return;
        if (pace_ == sim_pace::eager) {
            while (run_one()) {
            }
            return;
        }
        for (int i = static_cast<int>(rng_() % 4); i > 0; --i)
            if (!run_one()) return;
    }
    bool runnable(const std::deque<op>& q) const {
        return !q.empty() && (!q.front().event || events_[*q.front().event].completed >= q.front().generation);
    }
    bool run_one() {
        std::vector<std::size_t> ready;
        for (std::size_t s = 0; s < streams_.size(); ++s)
            if (runnable(streams_[s])) ready.push_back(s);
        if (ready.empty()) return false;
        double total = 0;
        for (std::size_t r : ready) total += weights_[r];
        double pick = std::uniform_real_distribution<double>(0.0, total)(rng_);
        std::size_t chosen = ready.back();
        for (std::size_t r : ready) {
            if (pick < weights_[r]) {
                chosen = r;
                break;
            }
            pick -= weights_[r];
        }
        auto& q = streams_[chosen];
        op o = std::move(q.front());
        q.pop_front();
        if (o.run) o.run();
        ++operations_;
        return true;
    }

    std::mt19937 rng_;
    sim_pace pace_;
    std::vector<std::deque<op>> streams_;
    std::vector<double> weights_;
    std::vector<event_state> events_;
    std::vector<std::unique_ptr<std::byte[]>> memory_;
    std::size_t allocated_ = 0;
    std::size_t operations_ = 0;
};

/// The device stash's API and documented orderings over sim_gpu: save copies out on the
/// side stream after an event on compute; prefetch copies in after an event on compute;
/// load makes compute wait for the arrival; release waits for copies no load waited for.
/// Misuse (a released handle, a load of a tensor not yet saved) throws.
class sim_stash {
public:
    struct entry {
        std::vector<std::byte> host;
        std::size_t nbytes = 0;
        bool copied = false, released = false, unwaited = false;
        void* prefetch_target = nullptr;
        std::size_t produced = 0, dst_free = 0, arrived = 0;
        std::uint64_t arrived_generation = 0;
    };
    struct handle {
        std::shared_ptr<entry> e;
    };

    explicit sim_stash(sim_gpu& gpu) : gpu_(gpu), side_(gpu.make_stream()) {}

    void begin_layer(std::uint32_t) { ++scopes_; }
    void end_layer() { --scopes_; }
    void start_backward() { CHECK(scopes_ == 0); }

    handle save(const spillway::tensor_desc& desc, const void* src, std::size_t compute) {
        auto e = std::make_shared<entry>();
        e->nbytes = spillway::extent_bytes(desc);
        e->host.resize(e->nbytes);
        e->produced = gpu_.make_event(gpu_offload::event_use::ordering);
        e->dst_free = gpu_.make_event(gpu_offload::event_use::ordering);
        e->arrived = gpu_.make_event(gpu_offload::event_use::ordering);
        gpu_.record(e->produced, compute);
        gpu_.wait(side_, e->produced);
        entry* p = e.get();
        gpu_.run(side_, [p, src](const auto&) {
            std::memcpy(p->host.data(), src, p->nbytes);
            p->copied = true;
        });
        ++saves_;
        return handle{e};
    }
    void wait_copied(const handle& h) {
        live(h);
        gpu_.drain_until([&] { return h.e->copied; });
    }
    void prefetch(const handle& h, void* dst, std::size_t compute) {
        entry& e = live(h);
        gpu_.record(e.dst_free, compute);
        gpu_.wait(side_, e.dst_free);
        entry* p = &e;
        gpu_.run(side_, [p, dst](const auto&) { std::memcpy(dst, p->host.data(), p->nbytes); });
        gpu_.record(e.arrived, side_);
        e.arrived_generation = gpu_.recorded(e.arrived);
        e.prefetch_target = dst;
        e.unwaited = true;
    }
    void load(const handle& h, void* dst, std::size_t compute) {
        entry& e = live(h);
        if (e.prefetch_target != dst) prefetch(h, dst, compute);
        gpu_.wait(compute, e.arrived);
        e.unwaited = false;
        ++loads_;
    }
    void release(handle& h) {
        entry& e = live(h);
        if (e.unwaited) gpu_.drain_until([&] { return gpu_.reached(e.arrived, e.arrived_generation); });
        e.released = true;
    }

    std::size_t saves_ = 0, loads_ = 0;

private:
    entry& live(const handle& h) {
        if (!h.e || h.e->released) throw std::invalid_argument("sim_stash: empty or released handle");
        return *h.e;
    }
    sim_gpu& gpu_;
    std::size_t side_;
    int scopes_ = 0;
};

/// The in-memory reference: the CPU-only run's forward and backward.
struct reference {
    gpu_offload::mlp_shape s;
    std::vector<float> hidden, y, loss, d0, d1;
    std::vector<float16> grads;
    explicit reference(const gpu_offload::mlp_shape& shape)
        : s(shape), hidden(s.layers * s.batch * s.hidden), y(s.batch * s.out), loss(s.batch),
          d0(s.backward_elements()), d1(s.backward_elements()), grads(s.params()) {}
    void step(const float* x, const float* t, const float16* params, float loss_scale) {
        gpu_offload::mlp_tensors m{.s = s, .x = x, .t = t, .params = params, .hidden = hidden.data(), .y = y.data(),
                                   .sample_loss = loss.data(), .d0 = d0.data(), .d1 = d1.data(),
                                   .grads = grads.data(),
                                   .dy_coef = 2.0f * loss_scale / static_cast<float>(s.batch * s.out)};
        gpu_offload::forward(thrust::host, m);
        gpu_offload::backward(thrust::host, m);
    }
};

/// A small deterministic update applied to both copies: p -= 2^-6 * g / scale, in fp16.
void sgd(std::vector<float16>& params, const std::vector<float16>& grads, float loss_scale) {
    for (std::size_t i = 0; i < params.size(); ++i)
        params[i] = from_float<float16>(to_float(params[i]) - 0.015625f * to_float(grads[i]) / loss_scale);
}

void run_budgeted(const gpu_offload::mlp_shape& s, const ring_plan& plan, sim_pace pace, std::uint32_t seed) {
    CAPTURE(s.layers);
    CAPTURE(plan.weight_slots);
    CAPTURE(plan.grad_slots);
    CAPTURE(plan.activation_buffers);
    CAPTURE(static_cast<int>(pace));
    CAPTURE(seed);
    const float loss_scale = 64.0f;
    std::mt19937 rng(seed * 7919u + 1);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float16> params(s.params());
    for (std::size_t l = 0; l <= s.layers; ++l)
        for (std::size_t i = 0; i < s.layer_params(l); ++i)
            params[s.offset(l) + i] = from_float<float16>(u(rng) * 0.7f);
    std::vector<float16> ref_params = params, grads(s.params());
    std::vector<float> x(s.batch * s.in), t(s.batch * s.out), loss(s.batch);

    sim_gpu gpu(seed, pace);
    sim_stash stash(gpu);
    gpu_offload::offloaded_pass<sim_gpu, sim_stash> pass(gpu, stash, s, plan, loss_scale);
    CHECK(gpu.allocated_bytes() == plan.device_bytes());
    reference ref(s);
    int forward_hooks = 0;
    for (std::uint64_t step = 1; step <= 3; ++step) {
        for (auto& v : x) v = u(rng);
        for (auto& v : t) v = u(rng);
        std::fill(grads.begin(), grads.end(), from_float<float16>(1e4f));  // every gradient must be written
        gpu_offload::pass_stats st = pass.run(step, x.data(), t.data(), params.data(), grads.data(), loss.data(),
                                              [&] { ++forward_hooks; });
        ref.step(x.data(), t.data(), ref_params.data(), loss_scale);
        CHECK(std::memcmp(loss.data(), ref.loss.data(), loss.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(grads.data(), ref.grads.data(), grads.size() * sizeof(float16)) == 0);
        std::size_t weight_bytes = 0;
        for (const auto& ld : pass.schedule().loads) weight_bytes += s.layer_params(ld.layer) * 2;
        CHECK(st.weight_bytes_in == weight_bytes);
        CHECK(st.grad_bytes_out == s.params() * 2);
        CHECK(st.activation_bytes_out == s.layers * s.batch * s.hidden * 4);
        CHECK(st.activation_bytes_in == st.activation_bytes_out);
        sgd(params, grads, loss_scale);
        sgd(ref_params, ref.grads, loss_scale);
    }
    CHECK(forward_hooks == 3);
    CHECK(stash.saves_ == 3 * s.layers);
    CHECK(stash.loads_ == 3 * s.layers);
}

}  // namespace

TEST_CASE("offloaded pass over a simulated GPU: bit-identical to the in-memory pass for every ring and schedule") {
    const std::vector<gpu_offload::mlp_shape> shapes = {
        {.batch = 3, .in = 5, .hidden = 7, .out = 4, .layers = 1},
        {.batch = 4, .in = 6, .hidden = 9, .out = 3, .layers = 4},
        {.batch = 2, .in = 11, .hidden = 5, .out = 13, .layers = 6},  // in and out wider than hidden
    };
    for (const auto& s : shapes) {
        const ring_sizes sz = gpu_offload::ring_sizes_of(s);
        const std::size_t n = s.linear_layers();
        for (std::size_t k = 2; k <= n; ++k)
            for (std::size_t g = 1; g <= 2; ++g)
                for (std::size_t a = 2; a <= 4; ++a) {
                    const ring_plan plan{.layers = n, .weight_slots = k, .grad_slots = g, .activation_buffers = a,
                                         .sizes = sz};
                    run_budgeted(s, plan, sim_pace::lazy, 1);
                    run_budgeted(s, plan, sim_pace::eager, 2);
                    for (std::uint32_t seed = 3; seed < 16; ++seed) run_budgeted(s, plan, sim_pace::random, seed);
                }
    }
}

TEST_CASE("offloaded pass: the plan from a budget, and a plan made for another model is refused") {
    gpu_offload::mlp_shape s{.batch = 2, .in = 3, .hidden = 4, .out = 2, .layers = 3};
    const ring_sizes sz = gpu_offload::ring_sizes_of(s);
    const std::size_t minimum = gpu_offload::minimum_plan(sz, s.linear_layers()).device_bytes();
    // A second gradient slot, a third activation buffer (3 hidden layers), a third weight slot.
    ring_plan p =
        gpu_offload::plan_ring(sz, s.linear_layers(), minimum + sz.grad_slot + sz.activation + sz.weight_slot);
    CHECK(p.weight_slots == 3);
    CHECK(p.activation_buffers == 3);
    CHECK(p.streams_weights());
    run_budgeted(s, p, sim_pace::random, 42);

    // The configuration of the ctest examples.gpu_offload_budget: 3 of 7 layers resident.
    gpu_offload::mlp_shape ctest_shape{.batch = 16, .in = 64, .hidden = 256, .out = 16, .layers = 6};
    ring_plan ctest_plan = gpu_offload::plan_ring(gpu_offload::ring_sizes_of(ctest_shape), 7, 800 * 1024);
    CHECK(ctest_plan.weight_slots == 3);
    CHECK(ctest_plan.grad_slots == 2);
    CHECK(ctest_plan.activation_buffers == 4);
    run_budgeted(ctest_shape, ctest_plan, sim_pace::random, 7);

    sim_gpu gpu(1, sim_pace::eager);
    sim_stash stash(gpu);
    gpu_offload::mlp_shape other = s;
    other.hidden = 300;
    using pass_type = gpu_offload::offloaded_pass<sim_gpu, sim_stash>;
    CHECK_THROWS_AS(pass_type(gpu, stash, other, p, 1.0f), std::invalid_argument);
}
