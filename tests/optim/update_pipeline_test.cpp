// SPDX-License-Identifier: Apache-2.0
// The update pipeline: bit-identical to the in-memory AdamW step for every order, resident
// set, gradient type, gradient path and tier (host, file, virtual over two files); I/O
// exactly as the theory says; faults that lose nothing; save and restore.
#include <doctest/doctest.h>

#include <spillway/optim/update_pipeline.hpp>
#include <spillway/schedule/lr_schedule.hpp>
#include <spillway/tier/faulty_tier.hpp>
#include <spillway/tier/file_tier.hpp>
#include <spillway/tier/host_tier.hpp>
#include <spillway/tier/throttled_tier.hpp>
#include <spillway/tier/virtual_tier.hpp>

#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <condition_variable>
#include <map>
#include <mutex>
#include <memory>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "support/abandoned_directory.hpp"
#include "support/temp_dir.hpp"

using namespace spillway;

namespace {

constexpr std::size_t subgroup = 128;
constexpr std::size_t params_total = 8 * subgroup + 37;  // 9 subgroups, the last one short

template <class T>
T from_f(float x) {
    if constexpr (std::is_same_v<T, float>)
        return x;
    else
        return from_float<T>(x);
}

/// Gradients of step k: normal values times `scale` (the loss scale), deterministic.
template <class Grad>
std::vector<Grad> make_grads(std::size_t n, std::uint64_t seed, float scale,
                             bool with_inf = false) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> d(0.0f, 0.5f);
    std::vector<Grad> g(n);
    for (auto& x : g) x = from_f<Grad>(d(rng) * scale);
    if (with_inf) g[n / 2] = from_f<Grad>(std::numeric_limits<float>::infinity());
    return g;
}

std::vector<float> make_params(std::size_t n, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    std::vector<float> p(n);
    for (auto& x : p) x = d(rng);
    return p;
}

template <class T>
bool bits_equal(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

adamw_config test_adam() {
    return adamw_config{
        .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.01f};
}

/// The plain in-memory AdamW over the whole arrays: the reference.
template <class Grad, class Copy>
struct reference {
    std::vector<float> p, m, v;
    std::vector<Copy> copy;
    std::int64_t steps = 0;
    double max_norm;
    explicit reference(std::vector<float> init, double max_grad_norm)
        : p(std::move(init)),
          m(p.size(), 0.0f),
          v(p.size(), 0.0f),
          copy(p.size()),
          max_norm(max_grad_norm) {}
    step_result step(const std::vector<Grad>& g, float scale) {
        double total = 0;
        for (std::size_t s = 0; s * subgroup < p.size(); ++s) {
            std::size_t c = std::min(subgroup, p.size() - s * subgroup);
            total +=
                grad_sum_squares<Grad>(std::span<const Grad>(g).subspan(s * subgroup, c), scale);
        }
        if (!std::isfinite(total)) return step_result::skipped_overflow;
        float clip = max_norm > 0 ? clip_coefficient(total, max_norm) : 1.0f;
        adamw_step_args args{.step = steps + 1, .grad_scale = scale, .clip_coef = clip};
        step_result r;
        if constexpr (std::is_same_v<Copy, float>) {
            r = adamw_step<Grad>(test_adam(), args, p, m, v, std::span<const Grad>(g));
            copy = p;
        } else {
            r = adamw_step<Grad, Copy>(test_adam(), args, p, m, v, std::span<const Grad>(g),
                                       std::span<Copy>(copy));
        }
        if (r == step_result::applied) ++steps;
        return r;
    }
};

/// Checks a pipeline's full state against the reference, bit for bit.
template <class P, class R>
void check_state(P& pipe, const R& ref) {
    for (std::size_t s = 0; s < pipe.subgroup_count(); ++s) {
        std::size_t c = pipe.subgroup_elements(s);
        std::vector<float> p(c), m(c), v(c);
        pipe.read_state(s, p, m, v);
        bool ok = std::memcmp(p.data(), ref.p.data() + s * subgroup, c * 4) == 0 &&
                  std::memcmp(m.data(), ref.m.data() + s * subgroup, c * 4) == 0 &&
                  std::memcmp(v.data(), ref.v.data() + s * subgroup, c * 4) == 0;
        CHECK_MESSAGE(ok, "subgroup " << s << " differs from the reference");
    }
}

enum class tier_kind { host, file, virtual_two_files };
const char* kind_name(tier_kind k) {
    return k == tier_kind::host ? "host" : k == tier_kind::file ? "file" : "virtual(file,file)";
}

using two_file_tier = virtual_tier<null_lock, file_tier<>, file_tier<>>;

/// Owns one tier of the given kind (and its directories).
struct tier_box {
    std::unique_ptr<test::temp_dir> d1, d2;
    std::unique_ptr<host_tier> host;
    std::unique_ptr<file_tier<>> file;
    std::unique_ptr<two_file_tier> vt;
    explicit tier_box(tier_kind k) {
        if (k == tier_kind::host) host = std::make_unique<host_tier>();
        if (k == tier_kind::file) {
            d1 = std::make_unique<test::temp_dir>("pipe-file");
            file = std::make_unique<file_tier<>>(d1->path());
        }
        if (k == tier_kind::virtual_two_files) {
            d1 = std::make_unique<test::temp_dir>("pipe-vt-a");
            d2 = std::make_unique<test::temp_dir>("pipe-vt-b");
            virtual_tier_options o;
            o.bandwidths = {2.0, 1.0};
            vt = std::make_unique<two_file_tier>(o, child_args(d1->path()), child_args(d2->path()));
        }
    }
    template <class Fn>
    void visit(Fn&& fn) {
        if (host)
            fn(*host);
        else if (file)
            fn(*file);
        else
            fn(*vt);
    }
};

template <class Grad, class Copy, class Tier>
void run_equivalence(Tier& tier, subgroup_order order, std::size_t buffers, gradient_path path,
                     const char* what, std::size_t streaming = 3) {
    CAPTURE(what);
    CAPTURE(buffers);
    CAPTURE(streaming);
    CAPTURE(static_cast<int>(order));
    CAPTURE(static_cast<int>(path));
    auto init = make_params(params_total, 11);
    pipeline_config cfg{.param_count = params_total,
                        .subgroup_size = subgroup,
                        .host_buffers = buffers,
                        .streaming_buffers = streaming,
                        .adam = test_adam(),
                        .max_grad_norm = 2.0};
    pipeline_options opt;
    opt.order = order;
    opt.resident = buffers > streaming ? resident_policy::keep_last_updated : resident_policy::none;
    opt.gradients = path;
    update_pipeline<Tier, Grad, Copy> pipe(tier, cfg, init, opt);
    reference<Grad, Copy> ref(init, 2.0);
    std::vector<Copy> copy(params_total);
    constexpr int steps = 5;
    const float scale = std::is_same_v<Grad, float16> ? 256.0f : 1.0f;
    for (int k = 0; k < steps; ++k) {
        bool overflow = k == 2;  // one skipped step in the middle
        auto g = make_grads<Grad>(params_total, 100 + static_cast<unsigned>(k), scale, overflow);
        auto copy_before = copy;
        auto written_before = tier.stats().bytes_written;
        auto r = pipe.update(g, copy, update_args{.grad_scale = scale});
        auto rr = ref.step(g, scale);
        REQUIRE(r == rr);
        if (r == step_result::skipped_overflow) {
            CHECK(bits_equal(copy, copy_before));
            CHECK(tier.stats().bytes_written == written_before);
            CHECK(pipe.last_stats().subgroups_read == 0);
        } else {
            CHECK_MESSAGE(bits_equal(copy, ref.copy), "compute copy differs after step " << k);
        }
    }
    CHECK(pipe.steps() == ref.steps);
    check_state(pipe, ref);
}

template <class Grad, class Copy>
void equivalence_over_tiers() {
    for (auto kind : {tier_kind::host, tier_kind::file, tier_kind::virtual_two_files}) {
        tier_box box(kind);
        box.visit([&](auto& tier) {
            for (auto order : {subgroup_order::alternating, subgroup_order::ascending})
                for (std::size_t buffers : {3u, 4u, 6u, 14u})
                    run_equivalence<Grad, Copy>(tier, order, buffers, gradient_path::lazy_widening,
                                                kind_name(kind));
            // More streaming buffers, with and without a resident set beside them.
            run_equivalence<Grad, Copy>(tier, subgroup_order::alternating, 8,
                                        gradient_path::lazy_widening, kind_name(kind), 5);
            run_equivalence<Grad, Copy>(tier, subgroup_order::alternating, 6,
                                        gradient_path::lazy_widening, kind_name(kind), 6);
            // The DeepSpeed-like baseline and a mixed one.
            run_equivalence<Grad, Copy>(tier, subgroup_order::ascending, 3,
                                        gradient_path::fp32_on_tier, kind_name(kind));
            run_equivalence<Grad, Copy>(tier, subgroup_order::alternating, 5,
                                        gradient_path::fp32_on_tier, kind_name(kind));
            CHECK_MESSAGE(tier.used() == 0, "pipelines left blobs on " << kind_name(kind));
        });
    }
}

}  // namespace

TEST_CASE("bit-identical to the in-memory AdamW: fp16 gradients, fp16 copy") {
    equivalence_over_tiers<float16, float16>();
}
TEST_CASE("bit-identical to the in-memory AdamW: bf16 gradients, bf16 copy") {
    equivalence_over_tiers<bfloat16, bfloat16>();
}
TEST_CASE("bit-identical to the in-memory AdamW: fp32 gradients, fp32 copy") {
    equivalence_over_tiers<float, float>();
}
TEST_CASE("bit-identical to the in-memory AdamW: fp16 gradients, bf16 copy") {
    host_tier tier;
    run_equivalence<float16, bfloat16>(tier, subgroup_order::alternating, 5,
                                       gradient_path::lazy_widening, "host");
}

TEST_CASE("with R resident buffers every call after the first reads and writes R subgroups fewer") {
    const std::size_t n = 10;
    const std::size_t count = n * subgroup;
    auto init = make_params(count, 3);
    // (host buffers, streaming buffers): R = min(buffers - streaming, n).
    const std::pair<std::size_t, std::size_t> shapes[] = {{3, 3},  {4, 3}, {5, 3}, {8, 3}, {13, 3},
                                                          {14, 3}, {8, 5}, {8, 8}, {16, 4}};
    for (auto order : {subgroup_order::alternating, subgroup_order::ascending}) {
        for (const auto& shape : shapes) {
            // Not a structured binding: clang 14 cannot capture one (CAPTURE's lambda).
            const std::size_t buffers = shape.first, streaming = shape.second;
            CAPTURE(buffers);
            CAPTURE(streaming);
            CAPTURE(static_cast<int>(order));
            host_tier tier;
            pipeline_config cfg{.param_count = count,
                                .subgroup_size = subgroup,
                                .host_buffers = buffers,
                                .streaming_buffers = streaming,
                                .adam = test_adam()};
            pipeline_options opt;
            opt.order = order;
            update_pipeline<host_tier, bfloat16> pipe(tier, cfg, init, opt);
            const std::size_t r = std::min(buffers - streaming, n);
            CHECK(pipe.resident_capacity() == r);
            const std::uint64_t blob = 12 * subgroup;
            std::vector<bfloat16> copy(count);
            for (int k = 0; k < 4; ++k) {
                auto g = make_grads<bfloat16>(count, 7 + static_cast<unsigned>(k), 1.0f);
                auto before = tier.stats();
                REQUIRE(pipe.update(g, copy) == step_result::applied);
                auto after = tier.stats();
                const auto& st = pipe.last_stats();
                std::size_t reads = k == 0 ? n : n - r;
                CHECK(st.subgroups_read == reads);
                CHECK(st.subgroups_written == n - r);
                CHECK(st.served_from_resident == (k == 0 ? 0 : r));
                CHECK(st.bytes_read == reads * blob);
                CHECK(st.bytes_written == (n - r) * blob);
                // Through the tier's own counters, and the per-child view.
                CHECK(after.since(before).bytes_read == reads * blob);
                CHECK(after.since(before).bytes_written == (n - r) * blob);
                REQUIRE(st.children.size() == 1);
                CHECK(st.children[0].bytes_read == reads * blob);
                CHECK(st.children[0].bytes_written == (n - r) * blob);
                CHECK(pipe.resident_subgroups().size() == r);
                // No read issued, no read waited for; and the waits and the compute are
                // disjoint stretches of the call, so together they fit in it.
                if (reads == 0) CHECK(st.read_wait_seconds == 0);
                CHECK(st.compute_seconds > 0);
                CHECK(st.read_wait_seconds + st.compute_seconds + st.write_wait_seconds <=
                      st.seconds + 1e-9);
            }
            if (order == subgroup_order::alternating && r > 0 && r < n) {
                // The resident ones are exactly the first ones of the next order.
                auto next = pipe.next_order();
                auto res = pipe.resident_subgroups();
                std::vector<std::size_t> first(next.begin(),
                                               next.begin() + static_cast<std::ptrdiff_t>(r));
                std::sort(first.begin(), first.end());
                CHECK(first == res);
            }
        }
    }
}

TEST_CASE("pieces: blobs split over several keys, through a narrow window, give the same bits") {
    const std::size_t sg = 3 * 1024;          // 36 KiB blobs: 9 pieces of 4 KiB
    const std::size_t count = 5 * sg + 1000;  // the last subgroup short (3 pieces)
    auto init = make_params(count, 23);
    for (auto kind : {tier_kind::host, tier_kind::file, tier_kind::virtual_two_files}) {
        tier_box box(kind);
        box.visit([&](auto& tier) {
            using tier_t = std::remove_reference_t<decltype(tier)>;
            for (std::size_t window : {1u, 3u}) {
                for (auto path : {gradient_path::lazy_widening, gradient_path::fp32_on_tier}) {
                    CAPTURE(kind_name(kind));
                    CAPTURE(window);
                    CAPTURE(static_cast<int>(path));
                    pipeline_config cfg{.param_count = count,
                                        .subgroup_size = sg,
                                        .host_buffers = 4,
                                        .adam = test_adam(),
                                        .piece_bytes = 4096,
                                        .pieces_in_flight = window};
                    pipeline_options opt;
                    opt.gradients = path;
                    update_pipeline<tier_t, float16> pipe(tier, cfg, init, opt);
                    CHECK(pipe.piece_count(0) == 9);
                    CHECK(pipe.piece_count(5) == 3);
                    CHECK(tier.contains(pipe.key(1) + ".8"));
                    reference<float16, float16> ref(init, 0.0);
                    std::vector<float16> copy(count);
                    for (int k = 0; k < 4; ++k) {
                        auto g = make_grads<float16>(count, 700 + static_cast<unsigned>(k), 1.0f);
                        if (k == 1) pipe.begin_prefetch();
                        REQUIRE(pipe.update(g, copy) == ref.step(g, 1.0f));
                        CHECK(bits_equal(copy, ref.copy));
                        const auto& st = pipe.last_stats();
                        CHECK(st.subgroups_read + st.served_from_resident == pipe.subgroup_count());
                    }
                    std::vector<float> params(count);
                    pipe.read_params(params);
                    CHECK(bits_equal(params, ref.p));
                }
            }
            CHECK(tier.used() == 0);
        });
    }
}

TEST_CASE("begin_prefetch: reads issued before update(), picked up, bit-identical results") {
    const std::size_t n = 10;
    const std::size_t count = n * subgroup;
    const std::uint64_t blob = 12 * subgroup;
    auto init = make_params(count, 17);
    for (auto path : {gradient_path::lazy_widening, gradient_path::fp32_on_tier}) {
        for (std::size_t buffers : {3u, 5u, 8u}) {
            CAPTURE(buffers);
            CAPTURE(static_cast<int>(path));
            host_tier plain_tier, prefetch_tier;
            pipeline_config cfg{.param_count = count,
                                .subgroup_size = subgroup,
                                .host_buffers = buffers,
                                .adam = test_adam(),
                                .max_grad_norm = 1.5};
            pipeline_options opt;
            opt.gradients = path;
            update_pipeline<host_tier, float16> plain(plain_tier, cfg, init, opt);
            update_pipeline<host_tier, float16> pre(prefetch_tier, cfg, init, opt);
            reference<float16, float16> ref(init, 1.5);
            std::vector<float16> copy_plain(count), copy_pre(count);
            for (int k = 0; k < 5; ++k) {
                const bool overflow = k == 2;  // a skipped step keeps the prefetch for the next one
                auto g = make_grads<float16>(count, 400 + static_cast<unsigned>(k), 1.0f, overflow);
                auto r_plain = plain.update(g, copy_plain);
                // Backward of the trainer: the prefetch overlaps it.
                const std::size_t resident = pre.resident_subgroups().size();
                const std::size_t free_buffers = buffers - resident - pre.prefetched_count();
                const std::size_t usable =
                    path == gradient_path::fp32_on_tier ? free_buffers - 1 : free_buffers;
                const std::size_t already = pre.prefetched_count();
                auto before = prefetch_tier.stats();
                const std::size_t started = pre.begin_prefetch();
                CHECK(started == std::min(usable, n - resident - already));
                CHECK(pre.prefetched_count() == already + started);
                CHECK(pre.begin_prefetch() == 0);  // nothing free is left (or all are read)
                auto after_prefetch = prefetch_tier.stats();
                CHECK(after_prefetch.since(before).bytes_read ==
                      started * blob);  // issued before update()
                auto r_pre = pre.update(g, copy_pre);
                auto after_update = prefetch_tier.stats();
                REQUIRE(r_pre == r_plain);
                REQUIRE(r_pre == ref.step(g, 1.0f));
                const auto& st = pre.last_stats();
                if (r_pre == step_result::skipped_overflow) {
                    CHECK(pre.prefetched_count() == already + started);
                    continue;
                }
                CHECK(st.served_from_prefetch == already + started);
                CHECK(pre.prefetched_count() == 0);
                // The pipeline counts every state read of the call, the tier only those of
                // the call itself.
                CHECK(st.subgroups_read == plain.last_stats().subgroups_read);
                const std::uint64_t grad_bytes =
                    path == gradient_path::fp32_on_tier ? 4 * count : 0;
                CHECK(st.bytes_read == st.subgroups_read * blob + grad_bytes);
                CHECK(after_update.since(after_prefetch).bytes_read ==
                      (st.subgroups_read - st.served_from_prefetch) * blob + grad_bytes);
                CHECK(bits_equal(copy_pre, copy_plain));
                CHECK(bits_equal(copy_pre, ref.copy));
            }
            check_state(pre, ref);
            // save() and read_state() take back the prefetched buffers when they need one.
            pre.begin_prefetch();
            check_state(pre, ref);
        }
    }
}

TEST_CASE(
    "lazy update: the first reads go out before the gradient check, and a skipped step keeps "
    "them") {
    const std::size_t n = 10;
    const std::size_t count = n * subgroup;
    const std::uint64_t blob = 12 * subgroup;
    auto init = make_params(count, 29);
    for (std::size_t buffers : {3u, 6u}) {
        CAPTURE(buffers);
        host_tier tier;
        pipeline_config cfg{.param_count = count,
                            .subgroup_size = subgroup,
                            .host_buffers = buffers,
                            .adam = test_adam(),
                            .max_grad_norm = 1.5};
        update_pipeline<host_tier, float16> pipe(tier, cfg, init);
        reference<float16, float16> ref(init, 1.5);
        std::vector<float16> copy(count);
        for (int k = 0; k < 4; ++k) {
            const bool overflow = k == 1 || k == 2;  // two skipped steps in a row
            auto g = make_grads<float16>(count, 700 + static_cast<unsigned>(k), 1.0f, overflow);
            const std::size_t resident = pipe.resident_subgroups().size();
            const std::size_t pending = pipe.prefetched_count();
            auto before = tier.stats();
            auto r = pipe.update(g, copy);
            REQUIRE(r == ref.step(g, 1.0f));
            const auto& st = pipe.last_stats();
            if (r == step_result::skipped_overflow) {
                // Nothing written, but every free buffer was already reading when the check
                // found the overflow; the reads wait for the next call.
                CHECK(tier.stats().bytes_written == before.bytes_written);
                CHECK(pipe.prefetched_count() == std::min(buffers - resident, n - resident));
                CHECK(tier.stats().since(before).bytes_read ==
                      (pipe.prefetched_count() - pending) * blob);
                continue;
            }
            CHECK(pipe.prefetched_count() == 0);
            CHECK(st.served_from_prefetch == 0);  // the trainer prefetched nothing
            CHECK(st.subgroups_read + st.served_from_resident == n);
            CHECK(bits_equal(copy, ref.copy));
        }
        check_state(pipe, ref);
    }
}

TEST_CASE("lazy hand-over: backward checks the gradients, update() skips the check, same bits") {
    const std::size_t n = 9;
    const std::size_t count = n * subgroup;
    auto init = make_params(count, 31);
    host_tier tier;
    pipeline_config cfg{.param_count = count,
                        .subgroup_size = subgroup,
                        .host_buffers = 4,
                        .adam = test_adam(),
                        .max_grad_norm = 1.5};
    update_pipeline<host_tier, float16> pipe(tier, cfg, init);
    reference<float16, float16> ref(init, 1.5);
    std::vector<float16> copy(count);
    // The trainer's gradient buffer, refilled every step (the same span each time).
    std::vector<float16> g(count);
    auto fill = [&](unsigned k, float scale, bool with_inf) {
        g = make_grads<float16>(count, 900 + k, scale, with_inf);
    };

    SUBCASE("handed over: the check moves out of update(), nothing is read or written by it") {
        for (unsigned k = 0; k < 3; ++k) {
            fill(k, 128.0f, false);
            auto before = tier.stats();
            // It returns the check's sum of squares: the library's, over the same gradients.
            CHECK(pipe.hand_over_gradients(g, update_args{.grad_scale = 128.0f}) ==
                  grad_sum_squares(std::span<const float16>(g), 128.0f));
            CHECK(tier.stats().bytes_read == before.bytes_read);
            CHECK(tier.stats().bytes_written == before.bytes_written);
            REQUIRE(pipe.update(g, copy, update_args{.grad_scale = 128.0f}) == ref.step(g, 128.0f));
            CHECK(pipe.last_stats().handover_seconds > 0);
            CHECK(pipe.last_stats().handover_bytes_written == 0);
            CHECK(bits_equal(copy, ref.copy));
        }
        check_state(pipe, ref);
    }
    SUBCASE("an overflow found in the hand-over skips the step; the next step checks afresh") {
        fill(0, 1.0f, true);
        CHECK_FALSE(std::isfinite(pipe.hand_over_gradients(g)));
        REQUIRE(pipe.update(g, copy) == step_result::skipped_overflow);
        REQUIRE(ref.step(g, 1.0f) == step_result::skipped_overflow);
        // Same buffer, now finite, not handed over: update() must not reuse the stale result.
        fill(1, 1.0f, false);
        REQUIRE(pipe.update(g, copy) == step_result::applied);
        REQUIRE(ref.step(g, 1.0f) == step_result::applied);
        CHECK(pipe.last_stats().handover_seconds == 0);
        CHECK(bits_equal(copy, ref.copy));
        // And the other way round: a finite hand-over, then the buffer is refilled with an
        // inf and handed to update() without a new hand-over; the old result is consumed.
        fill(2, 1.0f, false);
        pipe.hand_over_gradients(g);
        REQUIRE(pipe.update(g, copy) == ref.step(g, 1.0f));
        fill(3, 1.0f, true);
        CHECK(pipe.update(g, copy) == step_result::skipped_overflow);
        check_state(pipe, ref);
    }
    SUBCASE("a different span or scale at update() is checked again") {
        fill(4, 1.0f, false);
        pipe.hand_over_gradients(g);
        auto other = make_grads<float16>(count, 950, 1.0f, /*with_inf=*/true);
        CHECK(pipe.update(other, copy) == step_result::skipped_overflow);  // not g's result
        fill(5, 2.0f, false);
        pipe.hand_over_gradients(g, update_args{.grad_scale = 1.0f});
        REQUIRE(pipe.update(g, copy, update_args{.grad_scale = 2.0f}) == ref.step(g, 2.0f));
        CHECK(pipe.last_stats().handover_seconds == 0);  // the hand-over's scale differed
        CHECK(bits_equal(copy, ref.copy));
        check_state(pipe, ref);
    }
    SUBCASE("bad arguments are refused") {
        const std::string grads_size =
            "grads has 10 elements, expected param_count " + std::to_string(count);
        CHECK_THROWS_WITH_AS(pipe.hand_over_gradients(std::span<const float16>(g).first(10)),
                             doctest::Contains(grads_size.c_str()), std::invalid_argument);
        CHECK_THROWS_WITH_AS(
            pipe.hand_over_gradients(g, update_args{.grad_scale = 0.0f}),
            doctest::Contains(
                "grad_scale must be finite, > 0 and at least 1/FLT_MAX (about 2.9e-39), got 0"),
            std::invalid_argument);
    }
}

TEST_CASE("child_io::since is tier_stats::since of the bytes and busy seconds") {
    const tier_stats before{.bytes_read = 100,
                            .bytes_written = 7,
                            .reads = 1,
                            .read_busy_seconds = 0.1,
                            .write_busy_seconds = 0.3};
    const tier_stats after{.bytes_read = 4196,
                           .bytes_written = 7,
                           .reads = 3,
                           .read_busy_seconds = 0.7,
                           .write_busy_seconds = 0.3};
    const child_io d = child_io::of("after", after).since(child_io::of("before", before));
    const tier_stats want = after.since(before);
    CHECK(d.name == "after");
    CHECK(d.bytes_read == want.bytes_read);
    CHECK(d.bytes_written == 0);
    CHECK(d.read_busy_seconds == want.read_busy_seconds);  // the same subtraction, same bits
    CHECK(d.write_busy_seconds == 0.0);
    CHECK(d.busy_fraction(0.6) == want.read_busy_seconds / 1.2);
}

TEST_CASE("per-child bytes of a virtual tier add up to the pipeline's traffic") {
    test::temp_dir a("pipe-child-a"), b("pipe-child-b");
    virtual_tier_options o;
    o.bandwidths = {2.0, 1.0};
    // The test is about the accounting: with adaptive placement a loaded machine's timings
    // could send every key of a call to one child (a CI run once read nothing from child 0).
    o.placement = placement_mode::fixed;
    two_file_tier vt(o, child_args(a.path()), child_args(b.path()));
    const std::size_t count = 12 * subgroup;
    auto init = make_params(count, 9);
    pipeline_config cfg{
        .param_count = count, .subgroup_size = subgroup, .host_buffers = 5, .adam = test_adam()};
    update_pipeline<two_file_tier, float16> pipe(vt, cfg, init);
    std::vector<float16> copy(count);
    for (int k = 0; k < 3; ++k) {
        auto g = make_grads<float16>(count, 50 + static_cast<unsigned>(k), 1.0f);
        REQUIRE(pipe.update(g, copy) == step_result::applied);
        const auto& st = pipe.last_stats();
        REQUIRE(st.children.size() == 2);
        CHECK(st.children[0].bytes_read + st.children[1].bytes_read == st.bytes_read);
        CHECK(st.children[0].bytes_written + st.children[1].bytes_written == st.bytes_written);
        CHECK(st.children[0].bytes_read > 0);
        CHECK(st.children[1].bytes_read > 0);
    }
}

TEST_CASE("a path's busy time covers its throttled transfers and stays within the call") {
    // Reads and writes each capped at 256 KiB/s with a burst of 64 bytes: however the
    // operations are spaced (a slow sanitizer build computes between them), each one waits
    // for all but 64 of its bytes at that rate, so a call's k transfers of B bytes in all keep
    // the path busy for at least (B - 64 k) / rate seconds in that direction.
    const std::size_t count = params_total;
    const double rate = 256.0 * 1024;
    const std::size_t burst = 64;
    throttled_tier<host_tier> tier(
        throttle_config::separate(bandwidth_limit{rate, burst}, bandwidth_limit{rate, burst}));
    auto init = make_params(count, 31);
    pipeline_config cfg{
        .param_count = count, .subgroup_size = subgroup, .host_buffers = 5, .adam = test_adam()};
    update_pipeline<throttled_tier<host_tier>, float16> pipe(tier, cfg, init);
    std::vector<float16> copy(count);
    for (int k = 0; k < 2; ++k) {
        auto g = make_grads<float16>(count, 70 + static_cast<unsigned>(k), 1.0f);
        REQUIRE(pipe.update(g, copy) == step_result::applied);
        const auto& st = pipe.last_stats();
        REQUIRE(st.children.size() == 1);
        const auto& c = st.children[0];
        REQUIRE(st.subgroups_read > 0);
        REQUIRE(st.subgroups_written > 0);
        const double min_read =
            static_cast<double>(c.bytes_read - burst * st.subgroups_read) / rate;
        const double min_write =
            static_cast<double>(c.bytes_written - burst * st.subgroups_written) / rate;
        CHECK(c.read_busy_seconds >= 0.95 * min_read);
        CHECK(c.write_busy_seconds >= 0.95 * min_write);
        // Transfers still in flight when update() returns are the writes it waited for, so
        // neither direction can have been busy longer than the call (plus the clock's grain).
        CHECK(c.read_busy_seconds <= st.seconds + 1e-3);
        CHECK(c.write_busy_seconds <= st.seconds + 1e-3);
        // The throttle alone keeps each direction busy for its minimum: the fraction is at
        // least their mean share of the call, and at most the whole call.
        CHECK(c.busy_fraction(st.seconds) >= 0.95 * (min_read + min_write) / (2 * st.seconds));
        CHECK(c.busy_fraction(st.seconds) <= 1.0 + 1e-3 / st.seconds);
        CHECK(c.busy_fraction(0) == 0);
    }
}

TEST_CASE("a failing tier names the subgroup, loses nothing, and a retry equals a clean run") {
    const std::size_t count = params_total;
    auto init = make_params(count, 21);
    auto grads_of = [&](int k) {
        return make_grads<float16>(count, 300 + static_cast<unsigned>(k), 1.0f);
    };
    pipeline_config cfg{.param_count = count,
                        .subgroup_size = subgroup,
                        .host_buffers = 5,
                        .adam = test_adam(),
                        .max_grad_norm = 1.0};

    SUBCASE("the failing subgroup is named") {
        faulty_tier<host_tier> tier;
        pipeline_options opt;
        opt.order = subgroup_order::ascending;
        opt.resident = resident_policy::none;
        update_pipeline<faulty_tier<host_tier>, float16> pipe(tier, cfg, init, opt);
        std::vector<float16> copy(count);
        tier.fail_nth(fault_op::write, 3, EIO);  // host tier: writes go 0, 1, 2, ...
        try {
            pipe.update(grads_of(0), copy);
            FAIL("the update succeeded over a failing write");
        } catch (const std::system_error& e) {
            CHECK(e.code().value() == EIO);
            std::string msg = e.what();
            CHECK(msg.find("subgroup 2 ") != std::string::npos);
            CHECK(msg.find("'optim-2'") != std::string::npos);
            CHECK(msg.find("writing") != std::string::npos);
        }
        tier.clear_faults();
        tier.fail_nth(fault_op::read, 5, ENODEV);
        try {
            pipe.update(grads_of(0), copy);
            FAIL("the update succeeded over a failing read");
        } catch (const std::system_error& e) {
            CHECK(e.code().value() == ENODEV);
            std::string msg = e.what();
            CHECK(msg.find("reading subgroup ") != std::string::npos);
            CHECK(msg.find("'optim-") != std::string::npos);
        }
    }

    SUBCASE("every fault position, reads and writes, then a retry") {
        for (auto op : {fault_op::read, fault_op::write}) {
            for (std::uint64_t nth = 1; nth <= 12; ++nth) {
                for (auto order : {subgroup_order::alternating, subgroup_order::ascending}) {
                    CAPTURE(nth);
                    CAPTURE(static_cast<int>(op));
                    faulty_tier<host_tier> tier;
                    pipeline_options opt;
                    opt.order = order;
                    update_pipeline<faulty_tier<host_tier>, float16> pipe(tier, cfg, init, opt);
                    reference<float16, float16> ref(init, 1.0);
                    std::vector<float16> copy(count);
                    for (int k = 0; k < 4; ++k) {
                        auto g = grads_of(k);
                        if (k == 1) tier.fail_nth(op, nth, EIO);
                        bool failed = false;
                        try {
                            pipe.update(g, copy);
                        } catch (const std::system_error& e) {
                            failed = true;
                            CHECK(std::string(e.what()).find("subgroup") != std::string::npos);
                        }
                        if (failed) {
                            tier.clear_faults();
                            CHECK(pipe.steps() == ref.steps);  // the step did not count
                            REQUIRE(pipe.update(g, copy) == step_result::applied);
                        }
                        ref.step(g, 1.0f);
                        CHECK(bits_equal(copy, ref.copy));
                    }
                    check_state(pipe, ref);
                }
            }
        }
    }

    SUBCASE("a dead path during the update keeps every updated subgroup in memory") {
        faulty_tier<host_tier> tier;
        pipeline_config big = cfg;
        big.host_buffers = 12;  // more buffers than subgroups: writes fail, states stay
        pipeline_options opt;
        opt.resident = resident_policy::none;
        update_pipeline<faulty_tier<host_tier>, float16> pipe(tier, big, init, opt);
        reference<float16, float16> ref(init, 1.0);
        std::vector<float16> copy(count);
        auto g0 = grads_of(0);
        tier.fail_always(fault_op::write, EIO);
        CHECK_THROWS_WITH_AS(pipe.update(g0, copy), doctest::Contains("writing subgroup "),
                             std::system_error);
        const auto kept = pipe.resident_subgroups();
        REQUIRE_FALSE(kept.empty());  // updated but unwritten: kept
        // Mixed steps refuse to save, naming the first subgroup that holds the newer step.
        const std::string mixed = "subgroup " +
                                  std::to_string(*std::min_element(kept.begin(), kept.end())) +
                                  " holds step 1 but the pipeline is at step 0";
        CHECK_THROWS_WITH_AS(pipe.save("unused"), doctest::Contains(mixed.c_str()),
                             std::logic_error);
        tier.clear_faults();
        REQUIRE(pipe.update(g0, copy) == step_result::applied);
        ref.step(g0, 1.0f);
        CHECK(bits_equal(copy, ref.copy));
        auto g1 = grads_of(1);
        REQUIRE(pipe.update(g1, copy) == step_result::applied);
        ref.step(g1, 1.0f);
        CHECK(bits_equal(copy, ref.copy));
        check_state(pipe, ref);
    }

    SUBCASE("faults in the fp32 gradient hand-over") {
        faulty_tier<host_tier> tier;
        pipeline_options opt;
        opt.gradients = gradient_path::fp32_on_tier;
        opt.order = subgroup_order::ascending;
        opt.resident = resident_policy::none;
        update_pipeline<faulty_tier<host_tier>, float16> pipe(tier, cfg, init, opt);
        reference<float16, float16> ref(init, 1.0);
        std::vector<float16> copy(count);
        auto g = grads_of(0);
        tier.fail_nth(fault_op::write, 2, EIO);
        try {
            pipe.hand_over_gradients(g);
            FAIL("hand-over succeeded over a failing write");
        } catch (const std::system_error& e) {
            CHECK(std::string(e.what()).find("fp32 gradients of subgroup 1 ") != std::string::npos);
        }
        CHECK_THROWS_WITH_AS(pipe.update(copy),
                             doctest::Contains("the gradients of step 1 were not handed over"),
                             std::invalid_argument);  // nothing handed over
        tier.clear_faults();
        pipe.hand_over_gradients(g);
        REQUIRE(pipe.update(copy) == step_result::applied);
        ref.step(g, 1.0f);
        CHECK(bits_equal(copy, ref.copy));
        CHECK(pipe.last_stats().handover_seconds > 0);
        CHECK(pipe.last_stats().handover_bytes_written == 4 * count);
    }
}

TEST_CASE("save and restore round trip, over different tiers and buffers") {
    test::temp_dir root("pipe-save");
    const auto dir = root.path() / "ckpt";
    const std::size_t count = params_total;
    auto init = make_params(count, 31);
    pipeline_config cfg{
        .param_count = count, .subgroup_size = subgroup, .host_buffers = 6, .adam = test_adam()};
    host_tier tier_a;
    update_pipeline<host_tier, bfloat16> a(tier_a, cfg, init);
    std::vector<bfloat16> copy_a(count), copy_b(count);
    for (int k = 0; k < 3; ++k)
        a.update(make_grads<bfloat16>(count, 500 + static_cast<unsigned>(k), 1.0f), copy_a);
    a.save(dir);
    // Every file is 0600 and listed in the manifest; no temporary directory is left.
    std::size_t files = 0;
    for (auto& e : std::filesystem::directory_iterator(dir)) {
        struct stat st {};
        REQUIRE(::stat(e.path().c_str(), &st) == 0);
        CHECK((st.st_mode & 0777) == 0600);
        ++files;
    }
    CHECK(files == a.subgroup_count() + 1);
    for (auto& e : std::filesystem::directory_iterator(root.path()))
        CHECK(e.path().filename() == "ckpt");

    test::temp_dir files_b("pipe-restore");
    file_tier<> tier_b(files_b.path());
    pipeline_config cfg_b = cfg;
    cfg_b.host_buffers = 3;
    auto b = update_pipeline<file_tier<>, bfloat16>::restore(dir, tier_b, cfg_b);
    CHECK(b.steps() == a.steps());
    CHECK(b.next_order().walk() == a.next_order().walk());
    for (int k = 3; k < 6; ++k) {
        auto g = make_grads<bfloat16>(count, 500 + static_cast<unsigned>(k), 1.0f);
        a.update(g, copy_a);
        b.update(g, copy_b);
        CHECK(bits_equal(copy_a, copy_b));
    }
    std::vector<float> pa(count), pb(count);
    a.read_params(pa);
    b.read_params(pb);
    CHECK(bits_equal(pa, pb));

    // Saving again replaces the previous save atomically.
    a.save(dir);
    host_tier tier_c;
    auto c = update_pipeline<host_tier, bfloat16>::restore(dir, tier_c, cfg);
    CHECK(c.steps() == a.steps());

    // A config of another shape is refused, naming the field.
    pipeline_config wrong = cfg;
    wrong.subgroup_size = 64;
    host_tier t2;
    try {
        auto d = update_pipeline<host_tier, bfloat16>::restore(dir, t2, wrong);
        FAIL("restored into a different shape");
    } catch (const std::invalid_argument& e) {
        CHECK(std::string(e.what()).find("subgroup_size") != std::string::npos);
    }
    CHECK(t2.used() == 0);
}

// Saves to `dir` a pipeline over a host tier (fp16 gradients, `buffers` host buffers, initial
// params from `seed`) after one update; returns its config.
pipeline_config save_after_one_step(const std::filesystem::path& dir, std::uint64_t seed,
                                    std::size_t buffers) {
    pipeline_config cfg{.param_count = params_total,
                        .subgroup_size = subgroup,
                        .host_buffers = buffers,
                        .adam = test_adam()};
    host_tier tier;
    update_pipeline<host_tier, float16> pipe(tier, cfg, make_params(params_total, seed));
    std::vector<float16> copy(params_total);
    pipe.update(make_grads<float16>(params_total, 1, 1.0f), copy);
    pipe.save(dir);
    return cfg;
}

TEST_CASE("a save that fails part-way keeps the previous good save") {
    test::temp_dir root("pipe-crash");
    const auto dir = root.path() / "ckpt";
    auto init = make_params(params_total, 41);
    pipeline_config cfg{.param_count = params_total,
                        .subgroup_size = subgroup,
                        .host_buffers = 3,
                        .adam = test_adam()};
    faulty_tier<host_tier> tier;
    pipeline_options opt;
    opt.resident = resident_policy::none;
    update_pipeline<faulty_tier<host_tier>, float16> pipe(tier, cfg, init, opt);
    std::vector<float16> copy(params_total);
    pipe.update(make_grads<float16>(params_total, 1, 1.0f), copy);
    pipe.save(dir);
    std::vector<float> saved(params_total);
    pipe.read_params(saved);
    pipe.update(make_grads<float16>(params_total, 2, 1.0f), copy);
    tier.fail_nth(fault_op::read, 4, EIO);  // the save dies while reading subgroup 3
    CHECK_THROWS_WITH_AS(pipe.save(dir), doctest::Contains("reading subgroup 3 "),
                         std::system_error);
    tier.clear_faults();
    for (auto& e : std::filesystem::directory_iterator(root.path()))
        CHECK(e.path().filename() == "ckpt");
    host_tier other;
    auto back = update_pipeline<host_tier, float16>::restore(dir, other, cfg);
    CHECK(back.steps() == 1);
    std::vector<float> restored(params_total);
    back.read_params(restored);
    CHECK(bits_equal(saved, restored));
    // A directory that is not a save is never replaced.
    auto foreign = root.path() / "foreign";
    std::filesystem::create_directory(foreign);
    std::ofstream(foreign / "data.txt") << "precious";
    const std::string refused =
        foreign.string() + " exists and is not an optimizer save (no manifest.txt)";
    CHECK_THROWS_WITH_AS(pipe.save(foreign), doctest::Contains(refused.c_str()),
                         std::invalid_argument);
    CHECK(std::filesystem::exists(foreign / "data.txt"));
}

TEST_CASE("a save removes what killed saves left beside it, and nothing a living save uses") {
    test::temp_dir root("pipe-killed");
    const auto dir = root.path() / "ckpt";
    const auto killed = test::abandoned_by_child(root.path(), "ckpt.tmp-", SIGKILL);
    const auto exited = test::abandoned_by_child(root.path(), "ckpt.tmp-", 0);
    auto living = owned_directory::create(root.path(), "ckpt.tmp-");  // a save in another thread
    const auto other = test::abandoned_by_child(root.path(), "other.tmp-", SIGKILL);
    std::filesystem::create_directory(root.path() / "ckpt.tmp-user");  // not made by a save
    const auto cfg = save_after_one_step(dir, 43, 3);
    CHECK_FALSE(std::filesystem::exists(killed));
    CHECK_FALSE(std::filesystem::exists(exited));
    CHECK(std::filesystem::exists(living.path() / owned_directory::owner_file));
    CHECK(std::filesystem::exists(other / "state.bin"));
    CHECK(std::filesystem::exists(root.path() / "ckpt.tmp-user"));
    // The save itself holds no lock file, and nothing of its own is left beside it.
    CHECK_FALSE(std::filesystem::exists(dir / owned_directory::owner_file));
    std::size_t entries = 0;
    for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator(root.path())) ++entries;
    CHECK(entries == 4);  // ckpt, the living save, other.tmp-*, ckpt.tmp-user
    host_tier again;
    CHECK(update_pipeline<host_tier, float16>::restore(dir, again, cfg).steps() == 1);
}

TEST_CASE("a corrupted or truncated save is refused, naming the subgroup") {
    test::temp_dir root("pipe-corrupt");
    const auto dir = root.path() / "ckpt";
    const auto cfg = save_after_one_step(dir, 51, 4);
    auto file = [&](int s) {
        char name[32];
        std::snprintf(name, sizeof name, "subgroup-%06d.bin", s);
        return dir / name;
    };
    auto expect_refused = [&](const std::string& needle) {
        host_tier tier;
        try {
            auto p = update_pipeline<host_tier, float16>::restore(dir, tier, cfg);
            FAIL("a damaged save was restored");
        } catch (const std::runtime_error& e) {
            CHECK_MESSAGE(std::string(e.what()).find(needle) != std::string::npos, e.what());
        }
        CHECK(tier.used() == 0);  // nothing left behind
    };
    // Flip one bit in subgroup 3.
    {
        std::fstream f(file(3), std::ios::in | std::ios::out | std::ios::binary);
        f.seekg(100);
        char c = 0;
        f.read(&c, 1);
        c = static_cast<char>(c ^ 0x10);
        f.seekp(100);
        f.write(&c, 1);
    }
    expect_refused("subgroup 3 is corrupted");
    // Repair by flipping back, then truncate subgroup 5.
    {
        std::fstream f(file(3), std::ios::in | std::ios::out | std::ios::binary);
        f.seekg(100);
        char c = 0;
        f.read(&c, 1);
        c = static_cast<char>(c ^ 0x10);
        f.seekp(100);
        f.write(&c, 1);
    }
    {
        host_tier ok;
        CHECK_NOTHROW(update_pipeline<host_tier, float16>::restore(dir, ok, cfg));
    }
    std::filesystem::resize_file(file(5), 1000);
    expect_refused("subgroup 5 is truncated");
    std::filesystem::remove(file(5));
    try {
        host_tier tier;
        auto p = update_pipeline<host_tier, float16>::restore(dir, tier, cfg);
        FAIL("a save with a missing file was restored");
    } catch (const std::system_error& e) {
        CHECK(e.code().value() == ENOENT);
        CHECK(std::string(e.what()).find("subgroup 5") != std::string::npos);
    }
}

// Runs `fn` in a forked child and returns what it threw ("system_error <errno>: <what>",
// "exception: <what>") or "returned", or nothing when it did not finish within `limit` (the
// child is then killed): a restore that blocks fails the test instead of hanging the suite.
template <class F>
std::optional<std::string> outcome_within(std::chrono::milliseconds limit, F&& fn) {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::close(fds[0]);
        std::string msg = "returned";
        try {
            fn();
        } catch (const std::system_error& e) {
            msg = "system_error " + std::to_string(e.code().value()) + ": " + e.what();
        } catch (const std::exception& e) {
            msg = std::string("exception: ") + e.what();
        }
        for (std::size_t done = 0; done < msg.size();) {
            const ssize_t n = ::write(fds[1], msg.data() + done, msg.size() - done);
            if (n <= 0) break;
            done += static_cast<std::size_t>(n);
        }
        ::_exit(0);
    }
    ::close(fds[1]);
    const auto deadline = std::chrono::steady_clock::now() + limit;
    std::string out;
    bool finished = false;
    while (!finished) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) break;
        pollfd pfd{fds[0], POLLIN, 0};
        const int r = ::poll(&pfd, 1, static_cast<int>(left.count()));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        char buf[4096];
        const ssize_t n = ::read(fds[0], buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            finished = true;  // the child exited: its end of the pipe closed
        else
            out.append(buf, static_cast<std::size_t>(n));
    }
    ::close(fds[0]);
    if (!finished) ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!finished) return std::nullopt;
    return out;
}

std::filesystem::path subgroup_file(const std::filesystem::path& dir, std::size_t s) {
    char name[32];
    std::snprintf(name, sizeof name, "subgroup-%06zu.bin", s);
    return dir / name;
}

TEST_CASE(
    "restore refuses a FIFO in place of a subgroup file or of manifest.txt at once, naming the "
    "path") {
    // A FIFO opened without O_NONBLOCK (or through an ifstream) blocks for ever waiting for
    // a writer: restore must refuse it at once.
    test::temp_dir root("pipe-fifo");
    for (const std::string which : {"subgroup", "manifest"}) {
        INFO(which);
        const auto dir = root.path() / ("ckpt-" + which);
        const auto cfg = save_after_one_step(dir, 52, 4);
        const auto victim = which == "subgroup" ? subgroup_file(dir, 6) : dir / "manifest.txt";
        std::filesystem::remove(victim);
        REQUIRE(::mkfifo(victim.c_str(), 0600) == 0);
        const auto t0 = std::chrono::steady_clock::now();
        const auto outcome = outcome_within(std::chrono::seconds(20), [&] {
            host_tier tier;
            auto p = update_pipeline<host_tier, float16>::restore(dir, tier, cfg);
        });
        REQUIRE_MESSAGE(outcome.has_value(), "restore blocked on a FIFO (killed after 20 s)");
        INFO(*outcome);
        CHECK(outcome->starts_with("system_error "));
        CHECK(outcome->find(victim.string() + " is a FIFO") != std::string::npos);
        CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
        if (which == "subgroup") CHECK(outcome->find("subgroup 6") != std::string::npos);
    }
}

TEST_CASE("restore says a directory in place of a subgroup file is a directory") {
    // A directory has a size (4096 bytes on ext4): it must not be reported as a truncated file.
    test::temp_dir root("pipe-dir-subgroup");
    const auto dir = root.path() / "ckpt";
    const auto cfg = save_after_one_step(dir, 53, 4);
    std::filesystem::remove(subgroup_file(dir, 2));
    std::filesystem::create_directory(subgroup_file(dir, 2));
    host_tier tier;
    try {
        auto p = update_pipeline<host_tier, float16>::restore(dir, tier, cfg);
        FAIL("a save with a directory for a subgroup file was restored");
    } catch (const std::system_error& e) {
        const std::string what = e.what();
        INFO(what);
        CHECK(e.code().value() == EISDIR);
        CHECK(what.find(subgroup_file(dir, 2).string() + " is a directory") != std::string::npos);
        CHECK(what.find("subgroup 2") != std::string::npos);
        CHECK(what.find("truncated") == std::string::npos);
    }
    CHECK(tier.used() == 0);
}

TEST_CASE("restore says a deleted manifest.txt is missing, naming its path") {
    // The message says the manifest is missing and names it, not just "open failed: No such
    // file or directory".
    test::temp_dir root("pipe-no-manifest");
    const auto dir = root.path() / "ckpt";
    const auto cfg = save_after_one_step(dir, 54, 4);
    std::filesystem::remove(dir / "manifest.txt");
    host_tier tier;
    try {
        auto p = update_pipeline<host_tier, float16>::restore(dir, tier, cfg);
        FAIL("a save without its manifest was restored");
    } catch (const std::system_error& e) {
        const std::string what = e.what();
        INFO(what);
        CHECK(e.code().value() == ENOENT);
        CHECK(what.find("the manifest " + (dir / "manifest.txt").string() + " is missing") !=
              std::string::npos);
    }
    CHECK(tier.used() == 0);
}

TEST_CASE("a refused restore over a file tier leaves nothing on it, even with writes in flight") {
    // restore() writes each checked subgroup to the tier without waiting: when a later one is
    // refused, the earlier writes may still be in flight, and erasing their keys before they
    // finish would let them come back (a second restore then found "already holds key").
    test::temp_dir root("pipe-refused-file");
    const auto dir = root.path() / "ckpt";
    auto init = make_params(params_total, 57);
    pipeline_config cfg{.param_count = params_total,
                        .subgroup_size = subgroup,
                        .host_buffers = 3,
                        .adam = test_adam()};
    {
        host_tier tier;
        update_pipeline<host_tier, float> pipe(tier, cfg, init);
        pipe.save(dir);
    }
    const std::size_t last = (params_total + subgroup - 1) / subgroup - 1;
    {
        char name[32];
        std::snprintf(name, sizeof name, "subgroup-%06zu.bin", last);
        std::fstream f(dir / name, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(8);
        f.put('\x5a');
    }
    std::filesystem::create_directories(root.path() / "tier");
    file_tier<> tier(root.path() / "tier");
    using file_pipeline = update_pipeline<file_tier<>, float>;
    const std::string refusal = "subgroup " + std::to_string(last) + " is corrupted";
    for (int attempt = 0; attempt < 2; ++attempt) {
        INFO("attempt " << attempt);
        CHECK_THROWS_WITH_AS(file_pipeline::restore(dir, tier, cfg),
                             doctest::Contains(refusal.c_str()), std::runtime_error);
        CHECK(tier.used() == 0);
        for (std::size_t s = 0; s <= last; ++s)
            CHECK_FALSE(tier.contains("optim-" + std::to_string(s)));
    }
}

TEST_CASE("a save's manifest is checked too: an edited step is refused, a format-1 save restores") {
    test::temp_dir root("pipe-manifest");
    const auto dir = root.path() / "ckpt";
    auto init = make_params(params_total, 58);
    pipeline_config cfg{.param_count = params_total,
                        .subgroup_size = subgroup,
                        .host_buffers = 4,
                        .adam = test_adam()};
    const auto grads = make_grads<float>(params_total, 3, 1.0f);
    std::vector<float> want(params_total), got(params_total);
    {
        host_tier tier;
        update_pipeline<host_tier, float> pipe(tier, cfg, init);
        pipe.update(grads, want);
        pipe.save(dir / "");  // a trailing '/' names the same directory
        pipe.update(grads, want);
    }
    REQUIRE(std::filesystem::exists(dir / "manifest.txt"));
    std::string text;
    {
        std::ifstream f(dir / "manifest.txt", std::ios::binary);
        text.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
    auto write_manifest = [&](const std::string& t) {
        std::ofstream(dir / "manifest.txt", std::ios::binary | std::ios::trunc) << t;
    };
    // The step drives Adam's bias correction: a save whose step was changed would restore
    // into different updates, so the manifest's own checksum refuses it.
    const auto step_at = text.find("\nstep 1\n");
    REQUIRE(step_at != std::string::npos);
    std::string edited = text;
    edited.replace(step_at, 8, "\nstep 7\n");
    write_manifest(edited);
    {
        using host_pipeline = update_pipeline<host_tier, float>;
        host_tier tier;
        CHECK_THROWS_WITH_AS(host_pipeline::restore(dir, tier, cfg),
                             doctest::Contains("manifest_crc"), std::runtime_error);
        CHECK(tier.used() == 0);
    }
    // A format-1 manifest (before the checksum) restores and continues with the same bits.
    std::string v1 = text;
    v1.replace(v1.find("spillway-optimizer-state 2"), 26, "spillway-optimizer-state 1");
    const auto crc_at = v1.find("manifest_crc ");
    REQUIRE(crc_at != std::string::npos);
    v1.erase(crc_at, v1.find('\n', crc_at) + 1 - crc_at);
    write_manifest(v1);
    {
        host_tier tier;
        auto pipe = update_pipeline<host_tier, float>::restore(dir, tier, cfg);
        CHECK(pipe.steps() == 1);
        pipe.update(grads, got);
        CHECK(got == want);
    }
}

TEST_CASE("a subgroup_size above param_count means one subgroup, whatever its size") {
    // Buffer sizes come from the largest subgroup, not from subgroup_size: (2^62 + 1) * 12
    // bytes would wrap around to 12.
    auto init = make_params(2000, 59);
    const auto grads = make_grads<float>(2000, 4, 1.0f);
    std::vector<float> want(2000), got(2000);
    for (std::size_t size :
         {std::size_t{2000}, (std::size_t{1} << 62) + 1, std::numeric_limits<std::size_t>::max()}) {
        INFO("subgroup_size " << size);
        host_tier tier;
        pipeline_config cfg{
            .param_count = 2000, .subgroup_size = size, .host_buffers = 3, .adam = test_adam()};
        update_pipeline<host_tier, float> pipe(tier, cfg, init);
        CHECK(pipe.subgroup_count() == 1);
        pipe.update(grads, size == 2000 ? want : got);
        if (size != 2000) CHECK(got == want);
    }
}

namespace {

/// One pipeline with master_params over `tier` against the reference, K steps with an
/// overflow in the middle: the caller's params and the state stay bit-identical, and every
/// call moves 8 bytes per parameter of the subgroups it reads and writes.
template <class Grad, class Tier>
void run_master_equivalence(Tier& tier, subgroup_order order, std::size_t buffers,
                            gradient_path path, const char* what) {
    CAPTURE(what);
    CAPTURE(buffers);
    CAPTURE(static_cast<int>(order));
    CAPTURE(static_cast<int>(path));
    auto init = make_params(params_total, 13);
    std::vector<float> params(params_total, 0.0f);  // the constructor copies init here
    pipeline_config cfg{.param_count = params_total,
                        .subgroup_size = subgroup,
                        .host_buffers = buffers,
                        .adam = test_adam(),
                        .max_grad_norm = 2.0};
    pipeline_options opt;
    opt.order = order;
    opt.resident = buffers > 3 ? resident_policy::keep_last_updated : resident_policy::none;
    opt.gradients = path;
    opt.master_params = params;
    update_pipeline<Tier, Grad, float> pipe(tier, cfg, init, opt);
    CHECK(bits_equal(params, init));
    CHECK(pipe.host_buffer_bytes() >= buffers * 8 * subgroup);
    reference<Grad, float> ref(init, 2.0);
    const float scale = std::is_same_v<Grad, float16> ? 256.0f : 1.0f;
    const std::size_t n = pipe.subgroup_count();
    const std::size_t r = pipe.resident_capacity();
    for (int k = 0; k < 5; ++k) {
        bool overflow = k == 2;
        auto g = make_grads<Grad>(params_total, 200 + static_cast<unsigned>(k), scale, overflow);
        auto before = params;
        // Every other call passes the params as copy_out (the same span), the others none.
        std::span<float> out = k % 2 ? std::span<float>(params) : std::span<float>();
        auto res = pipe.update(g, out, update_args{.grad_scale = scale});
        REQUIRE(res == ref.step(g, scale));
        if (res == step_result::skipped_overflow) {
            CHECK(bits_equal(params, before));
            continue;
        }
        CHECK_MESSAGE(bits_equal(params, ref.p), "params differ after step " << k);
        const auto& st = pipe.last_stats();
        std::uint64_t state = 0;  // bytes of m and v of the subgroups read
        for (std::size_t s = 0; s < n; ++s) state += 8 * pipe.subgroup_elements(s);
        if (path == gradient_path::lazy_widening && r == 0) {
            CHECK(st.bytes_read == state);
            CHECK(st.bytes_written == state);
        }
        CHECK(st.bytes_written <= state);
    }
    check_state(pipe, ref);
}

}  // namespace

TEST_CASE(
    "master params in the caller's memory: bit-identical, 8 bytes per parameter on the tier") {
    for (auto kind : {tier_kind::host, tier_kind::file, tier_kind::virtual_two_files}) {
        tier_box box(kind);
        box.visit([&](auto& tier) {
            for (auto order : {subgroup_order::alternating, subgroup_order::ascending})
                for (std::size_t buffers : {3u, 5u, 14u})
                    run_master_equivalence<bfloat16>(tier, order, buffers,
                                                     gradient_path::lazy_widening, kind_name(kind));
            run_master_equivalence<float16>(tier, subgroup_order::alternating, 4,
                                            gradient_path::lazy_widening, kind_name(kind));
            run_master_equivalence<float>(tier, subgroup_order::alternating, 6,
                                          gradient_path::lazy_widening, kind_name(kind));
            run_master_equivalence<float16>(tier, subgroup_order::ascending, 3,
                                            gradient_path::fp32_on_tier, kind_name(kind));
            CHECK_MESSAGE(tier.used() == 0, "pipelines left blobs on " << kind_name(kind));
        });
    }
    // The exact traffic with a resident set: 8 bytes per parameter of n - R subgroups.
    const std::size_t n = 10, count = n * subgroup;
    auto init = make_params(count, 5);
    std::vector<float> params = init;
    host_tier tier;
    pipeline_options opt;
    opt.master_params = params;
    update_pipeline<host_tier, bfloat16, float> pipe(
        tier,
        {.param_count = count, .subgroup_size = subgroup, .host_buffers = 6, .adam = test_adam()},
        params, opt);
    CHECK(tier.used() == n * 8 * subgroup);
    for (int k = 0; k < 3; ++k) {
        REQUIRE(pipe.update(make_grads<bfloat16>(count, 9 + static_cast<unsigned>(k), 1.0f),
                            params) == step_result::applied);
        const std::size_t reads = k == 0 ? n : n - 3;
        CHECK(pipe.last_stats().bytes_read == reads * 8 * subgroup);
        CHECK(pipe.last_stats().bytes_written == (n - 3) * 8 * subgroup);
    }
}

TEST_CASE(
    "on_subgroup_updated: each subgroup once, in visiting order, its params final when announced") {
    // The trainer's pattern: update() on a thread of its own, the main thread reading each
    // subgroup's params as soon as they are announced while the rest of the update runs.
    test::temp_dir dir("pipe-announce");
    file_tier<> tier(dir.path());
    const std::size_t n = 9, count = params_total;
    auto init = make_params(count, 17);
    std::vector<float> params = init;
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::size_t> announced;  // subgroups, in the order announced
    pipeline_options opt;
    opt.master_params = params;
    opt.on_subgroup_updated = [&](std::size_t s) {
        std::lock_guard lock(mu);
        announced.push_back(s);
        cv.notify_all();
    };
    update_pipeline<file_tier<>, bfloat16, float> pipe(
        tier,
        {.param_count = count, .subgroup_size = subgroup, .host_buffers = 5, .adam = test_adam()},
        params, opt);
    REQUIRE(pipe.subgroup_count() == n);
    reference<bfloat16, float> ref(init, 0.0);
    for (int k = 0; k < 4; ++k) {
        auto g =
            make_grads<bfloat16>(count, 300 + static_cast<unsigned>(k), 1.0f, /*with_inf=*/k == 2);
        const auto order = pipe.next_order();
        {
            std::lock_guard lock(mu);
            announced.clear();
        }
        step_result res{};
        std::thread updater([&] { res = pipe.update(g, params); });
        const auto expected = ref.step(g, 1.0f);
        std::vector<std::vector<float>> seen;  // each subgroup's params when announced
        if (expected == step_result::applied) {
            for (std::size_t p = 0; p < n; ++p) {
                std::unique_lock lock(mu);
                cv.wait(lock, [&] { return announced.size() > p; });
                const std::size_t s = announced[p];
                lock.unlock();
                CHECK(s == order[p]);
                auto slice =
                    std::span<const float>(params).subspan(s * subgroup, pipe.subgroup_elements(s));
                seen.emplace_back(slice.begin(), slice.end());
            }
        }
        updater.join();
        REQUIRE(res == expected);
        if (res == step_result::skipped_overflow) {
            CHECK(announced.empty());
            continue;
        }
        CHECK(announced.size() == n);
        CHECK_MESSAGE(bits_equal(params, ref.p), "params differ after step " << k);
        for (std::size_t p = 0; p < n; ++p) {
            const std::size_t s = order[p];
            std::vector<float> final_slice(
                params.begin() + static_cast<std::ptrdiff_t>(s * subgroup),
                params.begin() +
                    static_cast<std::ptrdiff_t>(s * subgroup + pipe.subgroup_elements(s)));
            CHECK_MESSAGE(bits_equal(seen[p], final_slice),
                          "subgroup " << s << " changed after it was announced");
        }
    }
}

TEST_CASE(
    "master params in the caller's memory: a fault loses nothing and a retry equals a clean run") {
    const std::size_t count = params_total;
    auto init = make_params(count, 23);
    pipeline_config cfg{.param_count = count,
                        .subgroup_size = subgroup,
                        .host_buffers = 5,
                        .adam = test_adam(),
                        .max_grad_norm = 1.0};
    for (auto op : {fault_op::read, fault_op::write}) {
        for (std::uint64_t nth = 1; nth <= 10; ++nth) {
            CAPTURE(nth);
            CAPTURE(static_cast<int>(op));
            faulty_tier<host_tier> tier;
            std::vector<float> params = init;
            pipeline_options opt;
            opt.master_params = params;
            update_pipeline<faulty_tier<host_tier>, float16, float> pipe(tier, cfg, init, opt);
            reference<float16, float> ref(init, 1.0);
            for (int k = 0; k < 4; ++k) {
                auto g = make_grads<float16>(count, 400 + static_cast<unsigned>(k), 1.0f);
                if (k == 1) tier.fail_nth(op, nth, EIO);
                bool failed = false;
                try {
                    pipe.update(g, params);
                } catch (const std::system_error& e) {
                    failed = true;
                    CHECK(std::string(e.what()).find("subgroup") != std::string::npos);
                }
                if (failed) {
                    tier.clear_faults();
                    CHECK(pipe.steps() == ref.steps);
                    REQUIRE(pipe.update(g, params) == step_result::applied);
                }
                ref.step(g, 1.0f);
                CHECK(bits_equal(params, ref.p));
            }
            check_state(pipe, ref);
        }
    }
}

TEST_CASE("master params in the caller's memory: saves restore into either kind of pipeline") {
    test::temp_dir root("pipe-master-save");
    const std::size_t count = params_total;
    auto init = make_params(count, 61);
    pipeline_config cfg{
        .param_count = count, .subgroup_size = subgroup, .host_buffers = 5, .adam = test_adam()};
    auto grads = [&](int k) {
        return make_grads<bfloat16>(count, 600 + static_cast<unsigned>(k), 1.0f);
    };

    // A: master params in memory; B: the usual pipeline. Same steps, same bits.
    std::vector<float> pa = init;
    pipeline_options oa;
    oa.master_params = pa;
    host_tier ta, tb;
    update_pipeline<host_tier, bfloat16, float> a(ta, cfg, init, oa);
    update_pipeline<host_tier, bfloat16, float> b(tb, cfg, init);
    std::vector<float> copy_b(count);
    for (int k = 0; k < 3; ++k) {
        a.update(grads(k), pa);
        b.update(grads(k), copy_b);
    }
    REQUIRE(bits_equal(pa, copy_b));
    a.save(root.path() / "from-master");
    b.save(root.path() / "from-tier");
    // The two saves are the same bytes (the format does not depend on the mode).
    for (std::size_t s = 0; s < a.subgroup_count(); ++s) {
        char name[48];
        std::snprintf(name, sizeof name, "subgroup-%06zu.bin", s);
        std::ifstream fa(root.path() / "from-master" / name, std::ios::binary),
            fb(root.path() / "from-tier" / name, std::ios::binary);
        std::string xa((std::istreambuf_iterator<char>(fa)), {}),
            xb((std::istreambuf_iterator<char>(fb)), {});
        CHECK_MESSAGE(xa == xb, "subgroup " << s << " saved differently");
        CHECK(xa.size() == 12 * a.subgroup_elements(s));
    }

    // Cross restores: the usual save into a master pipeline (the params land in the caller's
    // memory), the master save into a usual pipeline; both continue like A.
    std::vector<float> pc(count, -7.0f);
    pipeline_options oc;
    oc.master_params = pc;
    test::temp_dir fc("pipe-master-restore");
    file_tier<> tc(fc.path());
    auto c = update_pipeline<file_tier<>, bfloat16, float>::restore(root.path() / "from-tier", tc,
                                                                    cfg, oc);
    CHECK(bits_equal(pc, pa));
    host_tier td;
    auto d =
        update_pipeline<host_tier, bfloat16, float>::restore(root.path() / "from-master", td, cfg);
    std::vector<float> copy_d(count);
    for (int k = 3; k < 6; ++k) {
        a.update(grads(k), pa);
        c.update(grads(k), pc);
        d.update(grads(k), copy_d);
        CHECK(bits_equal(pa, pc));
        CHECK(bits_equal(pa, copy_d));
    }
    std::vector<float> m1(subgroup), m2(subgroup), v1(subgroup), v2(subgroup);
    a.read_state(2, {}, m1, v1);
    d.read_state(2, {}, m2, v2);
    CHECK(bits_equal(m1, m2));
    CHECK(bits_equal(v1, v2));

    // A damaged save is refused and the caller's params stay as they were.
    {
        std::fstream f(root.path() / "from-master" / "subgroup-000004.bin",
                       std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(8);
        f.write("xxxx", 4);
    }
    std::vector<float> pe(count, 3.0f);
    const auto pe_before = pe;
    pipeline_options oe;
    oe.master_params = pe;
    host_tier te;
    try {
        auto e = update_pipeline<host_tier, bfloat16, float>::restore(root.path() / "from-master",
                                                                      te, cfg, oe);
        FAIL("a corrupted save was restored");
    } catch (const std::runtime_error& e) {
        CHECK(std::string(e.what()).find("subgroup 4 is corrupted") != std::string::npos);
    }
    CHECK(bits_equal(pe, pe_before));
    CHECK(te.used() == 0);
}

TEST_CASE("master params in the caller's memory: bad uses are refused up front") {
    auto init = make_params(params_total, 71);
    pipeline_config cfg{.param_count = params_total,
                        .subgroup_size = subgroup,
                        .host_buffers = 3,
                        .adam = test_adam()};
    host_tier tier;
    std::vector<float> params = init, other(params_total);
    pipeline_options opt;
    opt.master_params = params;
    // A 16-bit compute copy cannot hold the master params.
    try {
        update_pipeline<host_tier, float16, float16> p(tier, cfg, init, opt);
        FAIL("master_params with an fp16 copy was accepted");
    } catch (const std::invalid_argument& e) {
        CHECK(std::string(e.what()).find("ParamCopy = float") != std::string::npos);
    }
    // The wrong size, naming both counts.
    pipeline_options small = opt;
    small.master_params = std::span<float>(params).first(params_total - 1);
    try {
        update_pipeline<host_tier, float16, float> p(tier, cfg, init, small);
        FAIL("a short master_params was accepted");
    } catch (const std::invalid_argument& e) {
        CHECK(std::string(e.what()).find(std::to_string(params_total - 1)) != std::string::npos);
    }
    CHECK(tier.used() == 0);
    // copy_out that is not master_params.
    update_pipeline<host_tier, float16, float> p(tier, cfg, init, opt);
    auto g = make_grads<float16>(params_total, 1, 1.0f);
    CHECK_THROWS_WITH_AS(p.update(g, other), doctest::Contains("copy_out is not master_params"),
                         std::invalid_argument);
    CHECK(p.steps() == 0);
    CHECK(bits_equal(params, init));
}

TEST_CASE("the trace has one track each for reads, compute and writes") {
    trace::recorder rec;
    host_tier tier;
    auto init = make_params(params_total, 61);
    pipeline_config cfg{.param_count = params_total,
                        .subgroup_size = subgroup,
                        .host_buffers = 4,
                        .adam = test_adam()};
    pipeline_options opt;
    opt.recorder = &rec;
    update_pipeline<host_tier, float16> pipe(tier, cfg, init, opt);
    rec.clear();
    std::vector<float16> copy(params_total);
    pipe.update(make_grads<float16>(params_total, 1, 1.0f), copy);
    auto tracks = rec.tracks();
    std::map<std::string, std::size_t> per;
    for (auto& e : rec.events()) per[tracks.at(e.track)]++;
    CHECK(per["reads"] == pipe.last_stats().subgroups_read);
    CHECK(per["writes"] == pipe.last_stats().subgroups_written);
    CHECK(per["compute"] == pipe.subgroup_count());
    CHECK(rec.json().find("\"adam 0\"") != std::string::npos);
}

TEST_CASE("bad configurations and arguments are refused up front") {
    host_tier tier;
    auto init = make_params(params_total, 1);
    pipeline_config cfg{.param_count = params_total,
                        .subgroup_size = subgroup,
                        .host_buffers = 2,
                        .adam = test_adam()};
    auto expect_invalid = [&](pipeline_config c, pipeline_options o, const std::string& needle) {
        try {
            update_pipeline<host_tier, float16> p(tier, c, init, o);
            FAIL("accepted");
        } catch (const std::invalid_argument& e) {
            CHECK_MESSAGE(std::string(e.what()).find(needle) != std::string::npos, e.what());
        }
    };
    expect_invalid(cfg, {}, "host_buffers");
    cfg.host_buffers = 3;
    auto c1 = cfg;
    c1.streaming_buffers = 2;
    expect_invalid(c1, {}, "streaming_buffers is 2");
    c1.host_buffers = 5;
    c1.streaming_buffers = 6;
    expect_invalid(c1, {}, "at most host_buffers (5)");
    auto c2 = cfg;
    c2.subgroup_size = 0;
    expect_invalid(c2, {}, "subgroup_size");
    c2 = cfg;
    c2.adam.lr = -1;
    expect_invalid(c2, {}, "lr");
    c2 = cfg;
    c2.max_grad_norm = -1;
    expect_invalid(c2, {}, "max_grad_norm");
    pipeline_options o;
    o.key_prefix = "../escape";
    expect_invalid(cfg, o, "key_prefix");
    c2 = cfg;
    c2.param_count = params_total + 1;
    expect_invalid(c2, {}, "initial_params");
    CHECK(tier.used() == 0);

    update_pipeline<host_tier, float16> p(tier, cfg, init);
    std::vector<float16> copy(params_total), short_copy(10);
    auto g = make_grads<float16>(params_total, 1, 1.0f);
    const std::string grads_size =
        "grads has 10 elements, expected param_count " + std::to_string(params_total);
    const std::string copy_size =
        "copy_out has 10 elements, expected param_count " + std::to_string(params_total);
    CHECK_THROWS_WITH_AS(p.update(std::span<const float16>(g).first(10), copy),
                         doctest::Contains(grads_size.c_str()), std::invalid_argument);
    CHECK_THROWS_WITH_AS(p.update(g, short_copy), doctest::Contains(copy_size.c_str()),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(
        p.update(g, copy, update_args{.grad_scale = 0.0f}),
        doctest::Contains(
            "grad_scale must be finite, > 0 and at least 1/FLT_MAX (about 2.9e-39), got 0"),
        std::invalid_argument);
    CHECK(p.prefetched_count() == 0);  // refused before any read was issued
    // A second pipeline with the same keys on the same tier is refused.
    CHECK_THROWS_WITH_AS((update_pipeline<host_tier, float16>(tier, cfg, init)),
                         doctest::Contains("already holds key 'optim-0'"), std::invalid_argument);
    CHECK(p.update(g, {}) == step_result::applied);  // no compute copy is fine
}

namespace {

/// A backward pass on a thread of its own: writes the gradients of one step into the
/// trainer's buffer from the top of the parameter block down, in chunks that do not follow
/// the subgroups, and tells the gate how far it got. Until written, every gradient is NaN, so
/// an update that read one before its gate opened would throw or give other bits.
template <class Grad>
class fake_backward {
public:
    explicit fake_backward(std::vector<Grad>& buffer) : buf_(buffer) {}
    ~fake_backward() {
        if (thread_.joinable()) thread_.join();
    }

    void start(std::vector<Grad> values, std::size_t chunk) {
        std::fill(buf_.begin(), buf_.end(), from_f<Grad>(std::numeric_limits<float>::quiet_NaN()));
        final_from_ = buf_.size();
        thread_ = std::thread([this, values = std::move(values), chunk] {
            for (std::size_t end = buf_.size(); end > 0;) {
                const std::size_t begin = end > chunk ? end - chunk : 0;
                std::this_thread::sleep_for(std::chrono::microseconds(300));
                std::copy(values.begin() + static_cast<std::ptrdiff_t>(begin),
                          values.begin() + static_cast<std::ptrdiff_t>(end),
                          buf_.begin() + static_cast<std::ptrdiff_t>(begin));
                std::lock_guard lock(mu_);
                final_from_ = end = begin;
                cv_.notify_all();
            }
        });
    }
    void join() { thread_.join(); }

    /// The gate (update_args::gradients_final); records what it was asked.
    gradient_gate gate() {
        return [this](std::size_t begin, std::size_t end, std::chrono::microseconds wait) {
            std::unique_lock lock(mu_);
            asked_.emplace_back(begin, end);
            return cv_.wait_for(lock, wait, [&] { return final_from_ <= begin; });
        };
    }
    std::vector<std::pair<std::size_t, std::size_t>> asked() {
        std::lock_guard lock(mu_);
        return asked_;
    }

private:
    std::vector<Grad>& buf_;
    std::thread thread_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::size_t final_from_ = 0;
    std::vector<std::pair<std::size_t, std::size_t>> asked_;
};

}  // namespace

TEST_CASE(
    "streamed update under a backward pass: each subgroup waits for its gradients, same bits") {
    // The trainer's pattern: master params in its memory, fp32 gradients in a buffer that
    // backward fills while update() runs on another thread.
    for (auto kind : {tier_kind::host, tier_kind::file, tier_kind::virtual_two_files}) {
        CAPTURE(kind_name(kind));
        tier_box box(kind);
        box.visit([&](auto& tier) {
            using tier_t = std::remove_reference_t<decltype(tier)>;
            auto init = make_params(params_total, 23);
            std::vector<float> params = init;
            pipeline_options opt;
            opt.master_params = params;
            update_pipeline<tier_t, float, float> pipe(tier,
                                                       {.param_count = params_total,
                                                        .subgroup_size = subgroup,
                                                        .host_buffers = 5,
                                                        .adam = test_adam()},
                                                       params, opt);
            reference<float, float> ref(init, 0.0);
            std::vector<float> grads(params_total);
            fake_backward<float> backward(grads);
            for (int k = 0; k < 4; ++k) {
                auto values = make_grads<float>(params_total, 700 + static_cast<unsigned>(k), 1.0f);
                backward.start(values, 50);
                REQUIRE(
                    pipe.update(grads, params, update_args{.gradients_final = backward.gate()}) ==
                    step_result::applied);
                backward.join();
                REQUIRE(ref.step(values, 1.0f) == step_result::applied);
                CHECK_MESSAGE(bits_equal(params, ref.p), "params differ after step " << k);
                // The norm of the per-subgroup checks, summed in subgroup order as the up-front
                // check sums.
                double total = 0;
                for (std::size_t s = 0; s < pipe.subgroup_count(); ++s)
                    total += grad_sum_squares<float>(std::span<const float>(values).subspan(
                                                         s * subgroup, pipe.subgroup_elements(s)),
                                                     1.0f);
                CHECK(pipe.last_stats().grad_norm == std::sqrt(total));
                CHECK(pipe.last_stats().gradient_wait_seconds > 0);
            }
            check_state(pipe, ref);
            // The gate was asked about whole subgroups only.
            for (auto [begin, end] : backward.asked()) {
                CHECK(begin % subgroup == 0);
                CHECK(end == std::min(begin + subgroup, params_total));
            }
        });
    }
}

TEST_CASE(
    "streamed update: an inf gradient throws naming the subgroup, and a retry finishes the step "
    "once") {
    test::temp_dir dir("pipe-streamed-inf");
    file_tier<> tier(dir.path());
    auto init = make_params(params_total, 29);
    std::vector<float16> copy(params_total);
    update_pipeline<file_tier<>, float16> pipe(tier,
                                               {.param_count = params_total,
                                                .subgroup_size = subgroup,
                                                .host_buffers = 4,
                                                .adam = test_adam()},
                                               init);
    reference<float16, float16> ref(init, 0.0);
    std::vector<float16> grads(params_total);
    fake_backward<float16> backward(grads);
    // Step 1 ascends; step 2 descends, the walk a trainer streams under backward.
    auto g1 = make_grads<float16>(params_total, 40, 1.0f);
    REQUIRE(pipe.update(g1, copy) == ref.step(g1, 1.0f));
    const auto order = pipe.next_order();
    REQUIRE(order[0] == pipe.subgroup_count() - 1);
    const std::size_t bad = 5;  // visited at position 3 of the descending walk
    const std::size_t position =
        static_cast<std::size_t>(std::find(order.begin(), order.end(), bad) - order.begin());
    auto g2 = make_grads<float16>(params_total, 41, 1.0f);
    auto g2_inf = g2;
    g2_inf[bad * subgroup + 7] = from_f<float16>(std::numeric_limits<float>::infinity());
    backward.start(g2_inf, 64);
    try {
        (void)pipe.update(grads, copy, update_args{.gradients_final = backward.gate()});
        FAIL("a streamed update with an inf gradient returned");
    } catch (const gradient_overflow_error& e) {
        CHECK(e.subgroup() == bad);
        CHECK(e.subgroups_updated() == position);
        const std::string what = e.what();
        CHECK(what.find("subgroup " + std::to_string(bad)) != std::string::npos);
        CHECK(what.find("inf or NaN") != std::string::npos);
    }
    backward.join();
    CHECK(pipe.steps() == 1);  // the step is not complete
    // The trainer mends the gradient and calls again: the subgroups before `bad` are not
    // updated twice, and the result is the step with the mended gradients.
    grads = g2;
    REQUIRE(pipe.update(grads, copy) == step_result::applied);
    REQUIRE(ref.step(g2, 1.0f) == step_result::applied);
    CHECK(bits_equal(copy, ref.copy));
    check_state(pipe, ref);
}

TEST_CASE("streamed update: clipping and the fp32 gradient path are refused up front") {
    host_tier tier;
    auto init = make_params(params_total, 3);
    std::vector<float16> copy(params_total);
    auto g = make_grads<float16>(params_total, 4, 1.0f);
    auto open = [](std::size_t, std::size_t, std::chrono::microseconds) { return true; };
    {
        update_pipeline<host_tier, float16> pipe(tier,
                                                 {.param_count = params_total,
                                                  .subgroup_size = subgroup,
                                                  .host_buffers = 4,
                                                  .adam = test_adam(),
                                                  .max_grad_norm = 1.0},
                                                 init);
        CHECK_THROWS_WITH_AS(pipe.update(g, copy, update_args{.gradients_final = open}),
                             doctest::Contains("cannot clip"), std::invalid_argument);
        CHECK(pipe.steps() == 0);
    }
    {
        pipeline_options opt;
        opt.gradients = gradient_path::fp32_on_tier;
        update_pipeline<host_tier, float16> pipe(tier,
                                                 {.param_count = params_total,
                                                  .subgroup_size = subgroup,
                                                  .host_buffers = 4,
                                                  .adam = test_adam()},
                                                 init, opt);
        CHECK_THROWS_WITH_AS(pipe.update(g, copy, update_args{.gradients_final = open}),
                             doctest::Contains("lazy widening"), std::invalid_argument);
        CHECK(pipe.steps() == 0);
    }
}

TEST_CASE(
    "streamed update: a gate that throws (backward failed) loses nothing, and a retry finishes the "
    "step") {
    test::temp_dir dir("pipe-streamed-gate");
    file_tier<> tier(dir.path());
    auto init = make_params(params_total, 37);
    std::vector<float16> copy(params_total);
    update_pipeline<file_tier<>, float16> pipe(tier,
                                               {.param_count = params_total,
                                                .subgroup_size = subgroup,
                                                .host_buffers = 5,
                                                .adam = test_adam()},
                                               init);
    reference<float16, float16> ref(init, 0.0);
    auto g1 = make_grads<float16>(params_total, 50, 1.0f);
    REQUIRE(pipe.update(g1, copy) == ref.step(g1, 1.0f));
    // The descending walk: the gate opens for three subgroups, then backward fails.
    auto g2 = make_grads<float16>(params_total, 51, 1.0f);
    std::size_t opened = 0;
    auto gate = [&](std::size_t, std::size_t, std::chrono::microseconds) -> bool {
        if (opened == 3) throw std::runtime_error("backward failed");
        ++opened;
        return true;
    };
    CHECK_THROWS_WITH_AS(pipe.update(g2, copy, update_args{.gradients_final = gate}),
                         doctest::Contains("backward failed"), std::runtime_error);
    CHECK(opened == 3);
    CHECK(pipe.steps() == 1);
    // The three subgroups already hold step 2; a plain call applies the rest, each once.
    REQUIRE(pipe.update(g2, copy) == step_result::applied);
    REQUIRE(ref.step(g2, 1.0f) == step_result::applied);
    CHECK(bits_equal(copy, ref.copy));
    check_state(pipe, ref);
}

// ---- Per-step hyper-parameters and resuming with a set step count ------------------------

namespace {

/// The config of the per-step tests: test_adam() over params_total parameters.
pipeline_config scheduled_config(std::size_t host_buffers) {
    return {.param_count = params_total,
            .subgroup_size = subgroup,
            .host_buffers = host_buffers,
            .adam = test_adam()};
}

/// The learning rate and weight decay of 0-based step k: a warmup then a decay, and a weight
/// decay that changes too, so that every step runs with its own values.
step_hparams varying_hparams(int k) {
    return step_hparams{.lr = 2e-2f / static_cast<float>(k + 1) + 1e-3f * static_cast<float>(k),
                        .weight_decay = k % 2 == 0 ? 0.01f : 0.1f};
}

/// adamw_step over the whole arrays with step k's hparams: the reference of the per-step runs.
template <class Grad>
struct scheduled_reference {
    std::vector<float> p, m, v;
    std::int64_t steps = 0;
    explicit scheduled_reference(std::vector<float> init)
        : p(std::move(init)), m(p.size(), 0.0f), v(p.size(), 0.0f) {}
    void step(const std::vector<Grad>& g, float scale, const step_hparams& h) {
        adamw_step_args args{.step = steps + 1, .grad_scale = scale};
        REQUIRE(adamw_step<Grad>(with_step(test_adam(), h), args, p, m, v,
                                 std::span<const Grad>(g)) == step_result::applied);
        ++steps;
    }
};

template <class Grad, class Tier>
void run_scheduled(Tier& tier, gradient_path path, std::size_t buffers, const char* what) {
    CAPTURE(what);
    CAPTURE(static_cast<int>(path));
    CAPTURE(buffers);
    auto init = make_params(params_total, 17);
    const pipeline_config cfg = scheduled_config(buffers);
    pipeline_options opt;
    opt.gradients = path;
    update_pipeline<Tier, Grad, float> pipe(tier, cfg, init, opt);
    scheduled_reference<Grad> ref(init);
    scheduled_reference<Grad> constant(init);  // the config's lr at every step
    std::vector<float> copy(params_total);
    const float scale = std::is_same_v<Grad, float16> ? 128.0f : 1.0f;
    for (int k = 0; k < 6; ++k) {
        auto g = make_grads<Grad>(params_total, 300 + static_cast<unsigned>(k), scale);
        const step_hparams h = varying_hparams(k);
        if (path == gradient_path::fp32_on_tier && k % 2 == 1) {
            // The two-call form: hand over in backward, update with this step's hparams.
            pipe.hand_over_gradients(g, update_args{.grad_scale = scale, .hparams = h});
            REQUIRE(pipe.update(std::span<float>(copy)) == step_result::applied);
        } else {
            REQUIRE(pipe.update(g, copy, update_args{.grad_scale = scale, .hparams = h}) ==
                    step_result::applied);
        }
        ref.step(g, scale, h);
        constant.step(g, scale, hparams_of(test_adam()));
        CHECK_MESSAGE(bits_equal(copy, ref.p), "params differ after step " << k);
    }
    check_state(pipe, ref);
    CHECK_FALSE(bits_equal(ref.p, constant.p));  // the per-step values did reach the step
}

}  // namespace

TEST_CASE("lr and weight decay per call: bit-identical to adamw_step with the same values") {
    for (auto kind : {tier_kind::host, tier_kind::file, tier_kind::virtual_two_files}) {
        tier_box box(kind);
        box.visit([&](auto& tier) {
            for (std::size_t buffers : {3u, 5u}) {
                run_scheduled<float>(tier, gradient_path::lazy_widening, buffers, kind_name(kind));
                run_scheduled<float16>(tier, gradient_path::lazy_widening, buffers,
                                       kind_name(kind));
                run_scheduled<bfloat16>(tier, gradient_path::fp32_on_tier, buffers,
                                        kind_name(kind));
            }
            CHECK(tier.used() == 0);
        });
    }
}

TEST_CASE("lr per call: the config's values are the default, bad values are refused up front") {
    host_tier tier;
    auto init = make_params(params_total, 5);
    const pipeline_config cfg = scheduled_config(3);
    update_pipeline<host_tier, float, float> a(tier, cfg, init, {.key_prefix = "a"});
    update_pipeline<host_tier, float, float> b(tier, cfg, init, {.key_prefix = "b"});
    std::vector<float> pa(params_total), pb(params_total);
    auto g = make_grads<float>(params_total, 9, 1.0f);
    a.update(g, pa);
    b.update(g, pb, update_args{.hparams = hparams_of(test_adam())});
    CHECK(bits_equal(pa, pb));
    const auto written = tier.stats().bytes_written;
    CHECK_THROWS_WITH_AS(b.update(g, pb, update_args{.hparams = step_hparams{.lr = -1.0f}}),
                         doctest::Contains("lr = -1"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(
        b.update(g, pb, update_args{.hparams = step_hparams{.lr = 1e-3f, .weight_decay = NAN}}),
        doctest::Contains("weight_decay = nan"), std::invalid_argument);
    CHECK(tier.stats().bytes_written == written);  // refused before any I/O
    CHECK(b.steps() == 1);
}

namespace {

/// Runs steps [first, last) of the scheduled run on `pipe`.
template <class P>
void scheduled_steps(P& pipe, int first, int last, std::vector<float>& copy) {
    for (int k = first; k < last; ++k) {
        auto g = make_grads<float16>(params_total, 500 + static_cast<unsigned>(k), 64.0f);
        REQUIRE(
            pipe.update(g, copy, update_args{.grad_scale = 64.0f, .hparams = varying_hparams(k)}) ==
            step_result::applied);
    }
}

/// Every subgroup's params, m and v, concatenated subgroup by subgroup.
template <class P>
std::vector<float> whole_state(P& pipe) {
    std::vector<float> out;
    for (std::size_t s = 0; s < pipe.subgroup_count(); ++s) {
        const std::size_t c = pipe.subgroup_elements(s);
        std::vector<float> p(c), m(c), v(c);
        pipe.read_state(s, p, m, v);
        out.insert(out.end(), p.begin(), p.end());
        out.insert(out.end(), m.begin(), m.end());
        out.insert(out.end(), v.begin(), v.end());
    }
    return out;
}

}  // namespace

TEST_CASE("a resume with write_state and set_steps equals the uninterrupted run, bit for bit") {
    test::temp_dir dir("pipe-resume-steps");
    file_tier<> tier(dir.path());
    auto init = make_params(params_total, 23);
    const pipeline_config cfg = scheduled_config(5);
    using pipe_t = update_pipeline<file_tier<>, float16, float>;
    std::vector<float> whole_copy(params_total);
    pipe_t whole(tier, cfg, init, {.key_prefix = "whole"});
    scheduled_steps(whole, 0, 7, whole_copy);
    const auto expected = whole_state(whole);

    // The interrupted run: 4 steps, then its state as a trainer's own checkpoint would hold it.
    std::vector<float> saved_params(params_total);
    std::vector<std::vector<float>> saved_m, saved_v;
    std::int64_t saved_steps = 0;
    {
        std::vector<float> copy(params_total);
        pipe_t first(tier, cfg, init, {.key_prefix = "first"});
        scheduled_steps(first, 0, 4, copy);
        saved_steps = first.steps();
        for (std::size_t s = 0; s < first.subgroup_count(); ++s) {
            const std::size_t c = first.subgroup_elements(s);
            saved_m.emplace_back(c);
            saved_v.emplace_back(c);
            first.read_state(s, std::span<float>(saved_params).subspan(s * subgroup, c),
                             saved_m.back(), saved_v.back());
        }
    }
    REQUIRE(saved_steps == 4);
    auto resume = [&](std::int64_t steps, const char* prefix) {
        // [resume-own-checkpoint-begin]
        // Built from the checkpoint's params; then each subgroup's m and v, and the step count.
        auto p = std::make_unique<pipe_t>(tier, cfg, saved_params,
                                          pipeline_options{.key_prefix = prefix});
        std::span<const float> params(saved_params);
        for (std::size_t s = 0; s < p->subgroup_count(); ++s)
            p->write_state(s, params.subspan(s * subgroup, p->subgroup_elements(s)), saved_m[s],
                           saved_v[s]);
        p->set_steps(steps);  // the next update applies step steps + 1
        // [resume-own-checkpoint-end]
        return p;
    };
    {
        auto resumed = resume(saved_steps, "resumed");
        CHECK(resumed->steps() == 4);
        std::vector<float> copy(params_total);
        scheduled_steps(*resumed, 4, 7, copy);
        CHECK(resumed->steps() == 7);
        CHECK(bits_equal(whole_state(*resumed), expected));
        CHECK(bits_equal(copy, whole_copy));
    }
    {
        // Without the step count the bias corrections restart at step 1: other bits.
        auto wrong = resume(0, "wrong");
        std::vector<float> copy(params_total);
        scheduled_steps(*wrong, 4, 7, copy);
        CHECK_FALSE(bits_equal(whole_state(*wrong), expected));
    }
}

TEST_CASE("write_state over resident and prefetched subgroups, then set_steps: the same bits") {
    host_tier tier;
    auto init = make_params(params_total, 29);
    const pipeline_config cfg = scheduled_config(6);
    using pipe_t = update_pipeline<host_tier, float16, float>;
    std::vector<float> ca(params_total), cb(params_total);
    pipe_t a(tier, cfg, init, {.key_prefix = "a"});
    pipe_t b(tier, cfg, init, {.key_prefix = "b"});
    scheduled_steps(a, 0, 6, ca);
    scheduled_steps(b, 0, 3, cb);
    REQUIRE(!b.resident_subgroups().empty());
    const auto state = whole_state(b);
    b.begin_prefetch();
    REQUIRE(b.prefetched_count() > 0);
    // Scramble, then put the state back: a resident subgroup's buffer and the tier's copies.
    std::size_t at = 0;
    for (std::size_t s = 0; s < b.subgroup_count(); ++s) {
        const std::size_t c = b.subgroup_elements(s);
        std::vector<float> junk(c, 7.0f);
        b.write_state(s, junk, junk, junk);
        std::span<const float> all(state);
        b.write_state(s, all.subspan(at, c), all.subspan(at + c, c), all.subspan(at + 2 * c, c));
        at += 3 * c;
    }
    CHECK(b.prefetched_count() == 0);
    b.set_steps(3);
    scheduled_steps(b, 3, 6, cb);
    CHECK(bits_equal(whole_state(b), whole_state(a)));
    CHECK(bits_equal(ca, cb));

    CHECK_THROWS_WITH_AS(b.set_steps(-1), doctest::Contains("got -1"), std::invalid_argument);
    std::vector<float> short_m(3);
    CHECK_THROWS_WITH_AS(b.write_state(0, short_m, short_m, short_m),
                         doctest::Contains("params has 3 elements, subgroup 0 has 128"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(b.write_state(99, {}, {}, {}),
                         doctest::Contains("subgroup 99 out of range"), std::invalid_argument);
}

TEST_CASE("a cosine schedule through update_args::hparams equals adamw_step at each step's lr") {
    test::temp_dir dir("pipe-schedule");
    file_tier<> tier(dir.path());
    auto init = make_params(params_total, 31);
    const pipeline_config cfg = scheduled_config(3);
    update_pipeline<file_tier<>, bfloat16, float> pipe(tier, cfg, init);
    std::vector<float> copy(params_total), p = init, m(params_total, 0.0f), v(params_total, 0.0f);
    std::vector<float> lrs;
    // [schedule-per-step-begin]
    const lr_schedule schedule{.decay = lr_decay::cosine,
                               .lr = 6e-4f,
                               .lr_min = 6e-5f,
                               .warmup_steps = 2,
                               .total_steps = 8};
    validate(schedule);
    for (std::int64_t k = 0; k < 8; ++k) {  // k: the 0-based step
        const auto grads = make_grads<bfloat16>(params_total, 700 + k, 1.0f);
        const step_hparams h{.lr = learning_rate(schedule, k), .weight_decay = 0.1f};
        pipe.update(grads, copy, update_args{.hparams = h});
        // [schedule-per-step-end]
        lrs.push_back(h.lr);
        adamw_step<bfloat16>(with_step(test_adam(), h), adamw_step_args{.step = k + 1}, p, m, v,
                             std::span<const bfloat16>(grads));
        CHECK_MESSAGE(bits_equal(copy, p), "step " << k);
    }
    CHECK(lrs[1] == 6e-4f);  // the end of the warmup
    CHECK(lrs[7] < lrs[2]);  // decaying
}
