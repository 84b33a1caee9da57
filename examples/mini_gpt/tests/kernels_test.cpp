// The vectorised kernels (exp_approx, GELU, the causal attention through matrix products, the
// softmax cross-entropy over a padded vocabulary, LayerNorm) against float64 references on
// random data, at sizes that are not multiples of the reduction lanes.
#include <doctest/doctest.h>

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

TEST_CASE("LayerNorm forward and backward match float64") {
    spillway::thread_pool pool(1);
    const int N = 9, C = 77;
    auto x = random_floats(static_cast<std::size_t>(N) * C, 2.0f, 7), w = random_floats(C, 1.0f, 8),
         bias = random_floats(C, 1.0f, 9), dout = random_floats(x.size(), 1.0f, 10);
    std::vector<float> out(x.size()), mean(N), rstd(N), dinp(x.size(), 0.0f), dw(C), db(C);
    layernorm_forward(pool, out.data(), mean.data(), rstd.data(), x.data(), w.data(), bias.data(), N, C);
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
    double worst_ulps = 0;  // the error in float epsilons of the terms' magnitude
    for (std::size_t i = 0; i < dinp.size(); ++i)
        worst_ulps = std::max(worst_ulps, std::abs(dinp[i] - want_dinp[i]) / (dinp_scale[i] * FLT_EPSILON));
    MESSAGE("LayerNorm backward: worst dinp error " << worst_ulps << " epsilons of its terms");
    CHECK(worst_ulps < 8);
    CHECK(worst_error(dw, want_dw, 1e-3) < 1e-5);
    CHECK(worst_error(db, want_db, 1e-3) < 1e-5);
}
