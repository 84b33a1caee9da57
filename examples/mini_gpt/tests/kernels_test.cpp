// SPDX-License-Identifier: Apache-2.0
// The vectorised kernels (exp_approx, GELU, the causal attention through matrix products, the
// softmax cross-entropy over a padded vocabulary, LayerNorm), the matrix products split over
// the thread pool and the embedding against float64 references on random data, at sizes that
// are not multiples of the reduction lanes or of the 16-item pieces.
#include <doctest/doctest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "blas_kernels.hpp"
#include "gpt2.hpp"

using namespace mini_gpt;

// OpenBLAS on the caller's thread, as the trainer sets it (blas::single_threaded()).
static const bool blas_single_threaded = (blas::single_threaded(), true);

namespace {

std::vector<float> random_floats(std::size_t n, float stddev, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, stddev);
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng);
    return v;
}

/// Largest |got - want| / (|want| + floor) over the two arrays.
double worst_error(const std::vector<float>& got, const std::vector<double>& want, double floor) {
    REQUIRE(got.size() == want.size());
    double worst = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        REQUIRE(std::isfinite(got[i]));
        worst = std::max(worst, std::abs(got[i] - want[i]) / (std::abs(want[i]) + floor));
    }
    return worst;
}

/// Largest |got - want| / scale over the arrays: the error measured against the sum of the
/// absolute values of the terms that make each entry (what float rounding is proportional to
/// when terms of both signs cancel).
double worst_scaled_error(const std::vector<float>& got, const std::vector<double>& want,
                          const std::vector<double>& scale) {
    REQUIRE(got.size() == want.size());
    REQUIRE(got.size() == scale.size());
    double worst = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        REQUIRE(std::isfinite(got[i]));
        worst = std::max(worst, std::abs(got[i] - want[i]) / scale[i]);
    }
    return worst;
}

/// Largest |a - b| / scale over two float arrays (the same kernel's results for two thread counts).
double worst_scaled_difference(const std::vector<float>& a, const std::vector<float>& b,
                               const std::vector<double>& scale) {
    REQUIRE(a.size() == b.size());
    double worst = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        REQUIRE(std::isfinite(a[i]));
        REQUIRE(std::isfinite(b[i]));
        worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]) / scale[i]);
    }
    return worst;
}

double gelu_ref(double x) { return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }

}  // namespace

TEST_CASE("exp_approx is within 4e-7 relative of exp, clamps instead of overflowing, keeps NaN") {
    std::mt19937_64 rng(1);
    std::uniform_real_distribution<float> u(-87.0f, 88.0f);
    double worst = 0;
    for (int i = 0; i < 1000000; ++i) {
        float x = u(rng);
        double want = std::exp(static_cast<double>(x));
        worst = std::max(worst, std::abs(exp_approx(x) - want) / want);
    }
    MESSAGE("exp_approx worst relative error " << worst);
    CHECK(worst < 4e-7);
    CHECK(exp_approx(0.0f) == 1.0f);
    CHECK(std::isfinite(exp_approx(1000.0f)));
    CHECK(exp_approx(-1000.0f) > 0.0f);
    CHECK(exp_approx(-1000.0f) < 2e-38f);
    CHECK(exp_approx(-std::numeric_limits<float>::infinity()) < 2e-38f);
    CHECK(std::isnan(exp_approx(std::numeric_limits<float>::quiet_NaN())));  // the fp16 overflow check sees it
    // A lower upper bound clamps there and leaves the range below it as it was.
    CHECK(exp_approx(100.0f, 60.0f) == exp_approx(60.0f));
    CHECK(exp_approx(59.5f, 60.0f) == exp_approx(59.5f));
    CHECK(exp_approx(-100.0f, 60.0f) == exp_approx(-100.0f));
}

TEST_CASE("GELU forward and backward match float64") {
    spillway::thread_pool pool(1);
    const std::size_t n = 10007;
    auto x = random_floats(n, 3.0f, 2), dout = random_floats(n, 1.0f, 3);
    std::vector<float> out(n), dinp(n);
    gelu_forward(pool, out.data(), x.data(), n);
    gelu_backward(pool, dinp.data(), x.data(), dout.data(), n);
    std::vector<double> want(n), dwant(n);
    for (std::size_t i = 0; i < n; ++i) {
        want[i] = gelu_ref(x[i]);
        const double xi = x[i], u = std::sqrt(2.0 / M_PI) * (xi + 0.044715 * xi * xi * xi);
        const double du = std::sqrt(2.0 / M_PI) * (1.0 + 3.0 * 0.044715 * xi * xi);
        dwant[i] = (0.5 * (1.0 + std::tanh(u)) + 0.5 * xi * du / (std::cosh(u) * std::cosh(u))) * dout[i];
    }
    // Relative down to 1e-6 (far out on the negative side, where 1 + tanh(u) cancels).
    CHECK(worst_error(out, want, 1e-6) < 2e-6);
    CHECK(worst_error(dinp, dwant, 1e-2) < 1e-5);  // gelu' crosses 0 near x = -0.75
    // dinp may alias dout (backward runs it in place on dfch): the same bits as into its own array.
    std::vector<float> in_place = dout;
    gelu_backward(pool, in_place.data(), x.data(), in_place.data(), n);
    CHECK(in_place == dinp);
}

TEST_CASE("causal attention forward and backward match float64") {
    spillway::thread_pool pool(1);
    const int B = 2, T = 13, C = 12, NH = 3, hs = C / NH;
    const std::size_t C3 = 3 * C, BT = static_cast<std::size_t>(B) * T;
    auto qkv = random_floats(BT * C3, 1.0f, 4), dout = random_floats(BT * C, 1.0f, 5);
    std::vector<float> out(BT * C), att(static_cast<std::size_t>(B) * NH * T * T), datt(att.size()),
        dqkv(BT * C3, std::numeric_limits<float>::quiet_NaN());
    attention_forward(pool, out.data(), att.data(), qkv.data(), B, T, C, NH);
    attention_backward(pool, dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);

    // float64: out = softmax(q k^T / sqrt(hs), causal) v; its gradient by the chain rule.
    std::vector<double> want(BT * C, 0.0), want_att(att.size(), 0.0), want_dqkv(BT * C3, 0.0);
    auto at = [&](int b, int t, std::size_t ch) { return static_cast<double>(qkv[(b * T + t) * C3 + ch]); };
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < NH; ++h)
            for (int t = 0; t < T; ++t) {
                std::vector<double> p(static_cast<std::size_t>(t + 1));
                double maxv = -1e300, sum = 0;
                for (int t2 = 0; t2 <= t; ++t2) {
                    double dot = 0;
                    for (int i = 0; i < hs; ++i) dot += at(b, t, h * hs + i) * at(b, t2, C + h * hs + i);
                    p[t2] = dot / std::sqrt(static_cast<double>(hs));
                    maxv = std::max(maxv, p[t2]);
                }
                for (auto& v : p) sum += (v = std::exp(v - maxv));
                for (auto& v : p) v /= sum;
                double* o = &want[(b * T + t) * C + h * hs];
                const float* d = &dout[(b * T + t) * C + h * hs];
                std::vector<double> dp(p.size());
                for (int t2 = 0; t2 <= t; ++t2) {
                    want_att[((b * NH + h) * T + t) * T + t2] = p[t2];
                    for (int i = 0; i < hs; ++i) {
                        o[i] += p[t2] * at(b, t2, 2 * C + h * hs + i);
                        dp[t2] += d[i] * at(b, t2, 2 * C + h * hs + i);
                        want_dqkv[(b * T + t2) * C3 + 2 * C + h * hs + i] += p[t2] * d[i];
                    }
                }
                double s = 0;
                for (int t2 = 0; t2 <= t; ++t2) s += p[t2] * dp[t2];
                for (int t2 = 0; t2 <= t; ++t2) {
                    double dscore = p[t2] * (dp[t2] - s) / std::sqrt(static_cast<double>(hs));
                    for (int i = 0; i < hs; ++i) {
                        want_dqkv[(b * T + t) * C3 + h * hs + i] += dscore * at(b, t2, C + h * hs + i);
                        want_dqkv[(b * T + t2) * C3 + C + h * hs + i] += dscore * at(b, t, h * hs + i);
                    }
                }
            }
    // Relative to the entries' scale (about 1): sums of terms of both signs.
    CHECK(worst_error(out, want, 1e-2) < 1e-5);
    CHECK(worst_error(att, want_att, 1e-2) < 1e-5);  // including the zeros above the diagonal
    CHECK(worst_error(dqkv, want_dqkv, 1e-2) < 1e-5);
}

TEST_CASE("softmax cross-entropy over a padded vocabulary matches float64") {
    spillway::thread_pool pool(1);
    const int N = 5, V = 50257, Vp = 50304;
    auto logits = random_floats(static_cast<std::size_t>(N) * Vp, 4.0f, 6);
    const std::vector<int> targets = {0, 17, 50256, 1234, 40000};
    std::vector<double> want_probs(logits.size(), 0.0), want_loss(N);
    for (int r = 0; r < N; ++r) {
        const float* x = &logits[static_cast<std::size_t>(r) * Vp];
        double maxv = -1e300, sum = 0;
        for (int i = 0; i < V; ++i) maxv = std::max(maxv, static_cast<double>(x[i]));
        for (int i = 0; i < V; ++i) sum += std::exp(x[i] - maxv);
        for (int i = 0; i < V; ++i) want_probs[static_cast<std::size_t>(r) * Vp + i] = std::exp(x[i] - maxv) / sum;
        want_loss[r] = -std::log(want_probs[static_cast<std::size_t>(r) * Vp + targets[r]]);
    }
    for (int i = V; i < Vp; ++i) logits[static_cast<std::size_t>(Vp) + i] = 1e30f;  // padding is never read
    std::vector<float> losses(N);
    softmax_crossentropy_forward(pool, logits.data(), losses.data(), targets.data(), N, V, Vp);
    CHECK(worst_error(logits, want_probs, 1e-12) < 2e-6);  // padded entries are exactly 0
    CHECK(worst_error(losses, want_loss, 0.0) < 1e-6);
    const float dloss = 0.25f;
    crossentropy_softmax_backward(pool, logits.data(), targets.data(), dloss, N, V, Vp);
    for (int r = 0; r < N; ++r) want_probs[static_cast<std::size_t>(r) * Vp + targets[r]] -= 1.0;
    for (auto& p : want_probs) p *= dloss;
    CHECK(worst_error(logits, want_probs, 1e-12) < 2e-6);
}

TEST_CASE("LayerNorm forward and backward match float64; backward adds to dinp; apply repeats forward's bits") {
    spillway::thread_pool pool(1);
    const int N = 9, C = 77;
    auto x = random_floats(static_cast<std::size_t>(N) * C, 2.0f, 7), w = random_floats(C, 1.0f, 8),
         bias = random_floats(C, 1.0f, 9), dout = random_floats(x.size(), 1.0f, 10);
    // dinp is documented `+=` (the residual stream's gradient collects it): start it from
    // random values, not zeros, so that a kernel that overwrote it would show.
    const std::vector<float> seed = random_floats(x.size(), 1.0f, 11);
    std::vector<float> out(x.size()), mean(N), rstd(N), dinp = seed, dw(C), db(C);
    layernorm_forward(pool, out.data(), mean.data(), rstd.data(), x.data(), w.data(), bias.data(), N, C);
    // The recompute in backward (layernorm_apply from the saved mean and rstd) must give
    // forward's bits, not just close values: backward's results may not depend on whether a
    // store kept ln1/ln2 or recomputed them.
    std::vector<float> applied(x.size(), std::numeric_limits<float>::quiet_NaN());
    layernorm_apply(pool, applied.data(), x.data(), w.data(), bias.data(), mean.data(), rstd.data(), N, C);
    CHECK(applied == out);
    layernorm_backward(pool, dinp.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(),
                       rstd.data(), N, C);
    std::vector<double> want(x.size()), want_dinp(x.size()), want_dw(C, 0.0), want_db(C, 0.0);
    // dinp is a difference of terms of order w*d that cancel in places: its float error is
    // bounded by a few ulps of the terms' magnitude (times rstd), not of the result.
    std::vector<double> dinp_scale(x.size());
    for (int r = 0; r < N; ++r) {
        const float* xr = &x[static_cast<std::size_t>(r) * C];
        const float* d = &dout[static_cast<std::size_t>(r) * C];
        double m = 0, v = 0, dm = 0, dnm = 0;
        for (int i = 0; i < C; ++i) m += xr[i];
        m /= C;
        for (int i = 0; i < C; ++i) v += (xr[i] - m) * (xr[i] - m);
        const double s = 1.0 / std::sqrt(v / C + 1e-5);
        for (int i = 0; i < C; ++i) {
            const double norm = (xr[i] - m) * s;
            want[static_cast<std::size_t>(r) * C + i] = norm * w[i] + bias[i];
            dm += w[i] * d[i] / C;
            dnm += w[i] * d[i] * norm / C;
            want_dw[i] += d[i] * norm;
            want_db[i] += d[i];
        }
        for (int i = 0; i < C; ++i) {
            want_dinp[static_cast<std::size_t>(r) * C + i] = (w[i] * d[i] - dm - (xr[i] - m) * s * dnm) * s;
            dinp_scale[static_cast<std::size_t>(r) * C + i] =
                (std::abs(w[i] * d[i]) + std::abs(dm) + std::abs((xr[i] - m) * s * dnm)) * s;
        }
    }
    CHECK(worst_error(out, want, 1e-3) < 1e-5);
    // The increment dinp - seed, whose float sum with the seed rounds once more: its error is
    // measured against the terms' magnitude plus the seed's.
    double worst_ulps = 0;  // the error in float epsilons of the terms' magnitude
    for (std::size_t i = 0; i < dinp.size(); ++i)
        worst_ulps = std::max(worst_ulps, std::abs((static_cast<double>(dinp[i]) - seed[i]) - want_dinp[i]) /
                                              ((dinp_scale[i] + std::abs(seed[i])) * FLT_EPSILON));
    MESSAGE("LayerNorm backward: worst dinp error " << worst_ulps << " epsilons of its terms");
    CHECK(worst_ulps < 8);
    CHECK(worst_error(dw, want_dw, 1e-3) < 1e-5);
    CHECK(worst_error(db, want_db, 1e-3) < 1e-5);
}

TEST_CASE("matrix products forward and backward match float64, split into pieces by each branch") {
    // parallel_blocks cuts each product into pieces of multiples of 16 (at most 8 with 3
    // workers, 2 with none), and the kernels pick what to split by the shape:
    //  (300,40,130): forward by rows (OC < N: 7 pieces of 48, the last 12), dinp by rows
    //                (N >= C: the same), dweight by OC in pieces of at least 64 (80 + 50);
    //  (37,260,520): forward by columns (OC >= N: 7 of 80, the last 40), dinp by columns
    //                (N < C: 4 of 80, the last 20), dweight 7 of 80.
    // Every piece but the first starts inside the matrices and the last ones are short, so a
    // wrong offset, leading dimension or length in any branch changes some entries. Outputs
    // start as NaN: an entry no piece wrote fails the finiteness check.
    spillway::thread_pool pool(3), one_thread(0);
    constexpr float nan = std::numeric_limits<float>::quiet_NaN();
    struct shape {
        int N, C, OC;
    };
    double worst = 0, worst_one_thread = 0;
    for (const shape sh : {shape{300, 40, 130}, shape{37, 260, 520}}) {
        const std::size_t N = static_cast<std::size_t>(sh.N), C = static_cast<std::size_t>(sh.C),
                          OC = static_cast<std::size_t>(sh.OC);
        const auto inp = random_floats(N * C, 1.0f, 20), weight = random_floats(OC * C, 1.0f, 21),
                   bias = random_floats(OC, 1.0f, 22), dout = random_floats(N * OC, 1.0f, 23);
        for (const bool with_bias : {true, false}) {
            INFO("N " << N << " C " << C << " OC " << OC << " bias " << with_bias);
            const float* b = with_bias ? bias.data() : nullptr;
            struct results {
                std::vector<float> out, dinp, dweight, dbias;
            };
            auto run = [&](spillway::thread_pool& p) {
                results r{std::vector<float>(N * OC, nan), std::vector<float>(N * C, nan),
                          std::vector<float>(OC * C, nan), std::vector<float>(with_bias ? OC : 0, nan)};
                matmul_forward(p, r.out.data(), inp.data(), weight.data(), b, sh.N, sh.C, sh.OC);
                matmul_backward(p, r.dinp.data(), r.dweight.data(), with_bias ? r.dbias.data() : nullptr,
                                dout.data(), inp.data(), weight.data(), sh.N, sh.C, sh.OC);
                return r;
            };
            // float64 sums, and the sums of the products' absolute values: sums of terms of both
            // signs, whose float error is relative to the latter, not to the result.
            std::vector<double> out(N * OC), out_scale(N * OC), dinp(N * C, 0.0), dinp_scale(N * C, 0.0),
                dweight(OC * C, 0.0), dweight_scale(OC * C, 0.0), dbias(with_bias ? OC : 0, 0.0),
                dbias_scale(with_bias ? OC : 0, 0.0);
            for (std::size_t n = 0; n < N; ++n)
                for (std::size_t o = 0; o < OC; ++o) {
                    double sum = b ? b[o] : 0.0, mag = std::abs(sum);
                    for (std::size_t c = 0; c < C; ++c) {
                        const double prod = static_cast<double>(inp[n * C + c]) * weight[o * C + c];
                        sum += prod;
                        mag += std::abs(prod);
                    }
                    out[n * OC + o] = sum;
                    out_scale[n * OC + o] = mag;
                    const double d = dout[n * OC + o];
                    for (std::size_t c = 0; c < C; ++c) {
                        dinp[n * C + c] += d * weight[o * C + c];
                        dinp_scale[n * C + c] += std::abs(d * weight[o * C + c]);
                        dweight[o * C + c] += d * inp[n * C + c];
                        dweight_scale[o * C + c] += std::abs(d * inp[n * C + c]);
                    }
                    if (with_bias) {
                        dbias[o] += d;
                        dbias_scale[o] += std::abs(d);
                    }
                }
            const results got = run(pool), single = run(one_thread);
            // Each entry: a float sum of up to 520 products; blocked and fused as OpenBLAS does
            // it, its error stays far below C * epsilon of the magnitudes.
            const double out_error = worst_scaled_error(got.out, out, out_scale),
                         dinp_error = worst_scaled_error(got.dinp, dinp, dinp_scale),
                         dweight_error = worst_scaled_error(got.dweight, dweight, dweight_scale),
                         dbias_error = worst_scaled_error(got.dbias, dbias, dbias_scale);
            CHECK(out_error < 1e-5);
            CHECK(dinp_error < 1e-5);
            CHECK(dweight_error < 1e-5);
            CHECK(dbias_error < 1e-5);
            worst = std::max({worst, out_error, dinp_error, dweight_error, dbias_error});
            // One thread splits at other boundaries (at most 2 pieces): the same results within
            // the same bound (each entry is still one sum over the reduced dimension).
            const double out_difference = worst_scaled_difference(single.out, got.out, out_scale),
                         dinp_difference = worst_scaled_difference(single.dinp, got.dinp, dinp_scale),
                         dweight_difference = worst_scaled_difference(single.dweight, got.dweight, dweight_scale),
                         dbias_difference = worst_scaled_difference(single.dbias, got.dbias, dbias_scale);
            CHECK(out_difference < 1e-5);
            CHECK(dinp_difference < 1e-5);
            CHECK(dweight_difference < 1e-5);
            CHECK(dbias_difference < 1e-5);
            worst_one_thread =
                std::max({worst_one_thread, out_difference, dinp_difference, dweight_difference, dbias_difference});
        }
    }
    MESSAGE("matmul: worst error " << worst << " of the products' magnitude; one thread against four: "
                                   << worst_one_thread);
}

TEST_CASE("encoder forward is exact and backward adds each position to its token's and position's rows") {
    // Token ids repeat (3 at seven positions over the batch, 1 and 0 in several): wte's rows
    // collect several positions each, in token order, from several rows of the batch. Rows 2
    // and 4 of wte and row 5 of wpe get nothing and must keep their values. C = 37 is not a
    // multiple of 16: backward's channel pieces are 32 and 5 with 3 workers.
    spillway::thread_pool pool(3);
    const int B = 3, T = 5, C = 37, Vp = 7, maxT = 6;
    const std::size_t Cs = C;
    const std::vector<int> tokens = {3, 1, 3, 3, 0, 5, 3, 1, 1, 6, 3, 0, 5, 3, 3};
    const auto wte = random_floats(Vp * Cs, 1.0f, 30), wpe = random_floats(maxT * Cs, 1.0f, 31),
               dout = random_floats(B * T * Cs, 1.0f, 32);
    std::vector<float> out(B * T * Cs, std::numeric_limits<float>::quiet_NaN());
    encoder_forward(pool, out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    // One float addition per entry: float64's sum of two floats, rounded to float, is exactly
    // the float sum.
    int wrong = 0;
    for (std::size_t r = 0; r < B * T; ++r)
        for (std::size_t i = 0; i < Cs; ++i) {
            const double want = static_cast<double>(wte[static_cast<std::size_t>(tokens[r]) * Cs + i]) +
                                wpe[(r % T) * Cs + i];
            wrong += out[r * Cs + i] != static_cast<float>(want);
        }
    CHECK(wrong == 0);

    // Backward accumulates (`+=`): start from random values.
    const auto dwte_seed = random_floats(Vp * Cs, 1.0f, 33), dwpe_seed = random_floats(maxT * Cs, 1.0f, 34);
    std::vector<float> dwte = dwte_seed, dwpe = dwpe_seed;
    encoder_backward(pool, dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
    std::vector<double> want_wte(dwte_seed.begin(), dwte_seed.end()), want_wpe(dwpe_seed.begin(), dwpe_seed.end()),
        wte_scale(Vp * Cs), wpe_scale(maxT * Cs);
    for (std::size_t i = 0; i < wte_scale.size(); ++i) wte_scale[i] = std::abs(want_wte[i]);
    for (std::size_t i = 0; i < wpe_scale.size(); ++i) wpe_scale[i] = std::abs(want_wpe[i]);
    for (std::size_t r = 0; r < B * T; ++r)
        for (std::size_t i = 0; i < Cs; ++i) {
            const double d = dout[r * Cs + i];
            const std::size_t we = static_cast<std::size_t>(tokens[r]) * Cs + i, pe = (r % T) * Cs + i;
            want_wte[we] += d;
            wte_scale[we] += std::abs(d);
            want_wpe[pe] += d;
            wpe_scale[pe] += std::abs(d);
        }
    // At most 8 float additions per entry (seven positions and the seed): each rounds by half
    // an epsilon of at most the magnitudes' sum. A lost or doubled term is off by about its
    // own size; an untouched row is exact.
    const double wte_error = worst_scaled_error(dwte, want_wte, wte_scale),
                 wpe_error = worst_scaled_error(dwpe, want_wpe, wpe_scale);
    MESSAGE("encoder backward: worst error " << wte_error << " (dwte), " << wpe_error
                                             << " (dwpe) of the terms' magnitude");
    CHECK(wte_error < 5e-7);
    CHECK(wpe_error < 5e-7);
}
