// SPDX-License-Identifier: Apache-2.0
// spillway/optim/detail/adam_simd.hpp: AVX-512 and AVX2 kernels of the AdamW step, the
// non-finite gradient scan and the sum of squares. See adam_kernels.hpp for the guarantees
// (lane by lane the same operations as adamw_update).
#pragma once

#include "spillway/optim/adam_formula.hpp"
#include "spillway/optim/detail/adam_scalar.hpp"
#include "spillway/optim/detail/half_simd.hpp"
#include "spillway/optim/detail/simd.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <type_traits>

#if SPILLWAY_X86_SIMD
// GCC 12's AVX-512 intrinsics self-initialise an undefined vector (`__Y = __Y`), which
// -Wmaybe-uninitialized reports at every use once inlined; the values are never read.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
namespace spillway::detail {

// ---- Software prefetch ---------------------------------------------------------------------
// The step's loads are its four streams (p, m, v, g). The square root and division in each
// iteration hold up the loads behind them, which the hardware prefetcher alone does not hide;
// prefetching each stream 2 KiB of fp32 ahead hides that latency behind the loads and brings
// the step close to the speed of a plain stream of the same bytes. Elements, not bytes.
inline constexpr std::size_t adamw_prefetch_ahead = 512;

// Prefetches element i + adamw_prefetch_ahead of each stream when it lies inside [0, n)
// (a pointer past the arrays is never formed).
template <class Grad>
inline void prefetch_streams(const float* p, const float* m, const float* v, const Grad* g,
                             std::size_t i, std::size_t n) noexcept {
    if (i + adamw_prefetch_ahead >= n) return;
    const std::size_t j = i + adamw_prefetch_ahead;
    _mm_prefetch(reinterpret_cast<const char*>(p + j), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(m + j), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(v + j), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(g + j), _MM_HINT_T0);
}

// The overflow scan reads one stream, the gradients; fetching each 64-byte line 1 KiB ahead
// keeps more of its loads in flight than the hardware prefetcher does (a longer distance
// gains nothing more). Bytes, not elements: the scan reads the gradients as raw bits,
// whatever their type.
inline constexpr std::size_t scan_prefetch_ahead = 1024;

// Prefetches the line at byte offset `at` + scan_prefetch_ahead when it lies inside [0, nbytes).
inline void prefetch_scan(const char* bytes, std::size_t at, std::size_t nbytes) noexcept {
    if (at + scan_prefetch_ahead < nbytes)
        _mm_prefetch(bytes + at + scan_prefetch_ahead, _MM_HINT_T0);
}

// ---- AVX-512 -------------------------------------------------------------------------------
struct adamw_coefficients512 {
    __m512 grad_mul, decay, beta1, one_minus_beta1, beta2, one_minus_beta2, inv_sqrt_bias2, eps,
        neg_step_size;
};
SPILLWAY_TARGET_AVX512 inline adamw_coefficients512 broadcast512(
    const adamw_coefficients& c) noexcept {
    return {_mm512_set1_ps(c.grad_mul),       _mm512_set1_ps(c.decay),
            _mm512_set1_ps(c.beta1),          _mm512_set1_ps(c.one_minus_beta1),
            _mm512_set1_ps(c.beta2),          _mm512_set1_ps(c.one_minus_beta2),
            _mm512_set1_ps(c.inv_sqrt_bias2), _mm512_set1_ps(c.eps),
            _mm512_set1_ps(c.neg_step_size)};
}
// adamw_update (adam_formula.hpp), 16 lanes, the same operations in the same order.
SPILLWAY_TARGET_AVX512 inline void update16(const adamw_coefficients512& k, __m512& p, __m512& m,
                                            __m512& v, __m512 g) noexcept {
    g = _mm512_mul_ps(g, k.grad_mul);
    __m512 pd = _mm512_mul_ps(p, k.decay);
    m = _mm512_fmadd_ps(k.beta1, m, _mm512_mul_ps(k.one_minus_beta1, g));
    v = _mm512_fmadd_ps(k.beta2, v, _mm512_mul_ps(_mm512_mul_ps(k.one_minus_beta2, g), g));
    __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(v), k.inv_sqrt_bias2, k.eps);
    p = _mm512_fmadd_ps(k.neg_step_size, _mm512_div_ps(m, denom), pd);
}

template <class Grad, class Copy>
SPILLWAY_TARGET_AVX512 void adamw_avx512(const adamw_coefficients& c, float* p, float* m, float* v,
                                         const Grad* g, Copy* out, std::size_t n) noexcept {
    const adamw_coefficients512 k = broadcast512(c);
    std::size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        prefetch_streams(p, m, v, g, i, n);
        __m512 pv = _mm512_loadu_ps(p + i), mv = _mm512_loadu_ps(m + i),
               vv = _mm512_loadu_ps(v + i);
        update16(k, pv, mv, vv, load16(g + i));
        _mm512_storeu_ps(p + i, pv);
        _mm512_storeu_ps(m + i, mv);
        _mm512_storeu_ps(v + i, vv);
        if constexpr (!std::is_same_v<Copy, no_copy>) store16(out + i, pv);
    }
    if (i < n) {  // masked tail: lanes past n read as 0 and are never stored
        __mmask16 t = tail_mask16(n - i);
        __m512 pv = _mm512_maskz_loadu_ps(t, p + i), mv = _mm512_maskz_loadu_ps(t, m + i);
        __m512 vv = _mm512_maskz_loadu_ps(t, v + i);
        update16(k, pv, mv, vv, load16(g + i, t));
        _mm512_mask_storeu_ps(p + i, t, pv);
        _mm512_mask_storeu_ps(m + i, t, mv);
        _mm512_mask_storeu_ps(v + i, t, vv);
        if constexpr (!std::is_same_v<Copy, no_copy>) store16(out + i, pv, t);
    }
}

template <class Grad>
SPILLWAY_TARGET_AVX512 bool any_nonfinite_avx512(const Grad* g, std::size_t n) noexcept {
    // Non-finite <=> the magnitude bits are >= the infinity pattern; keep the running max.
    const auto* bytes = reinterpret_cast<const char*>(g);
    const std::size_t nbytes = n * sizeof(Grad);
    std::size_t i = 0;
    if constexpr (std::is_same_v<Grad, float>) {
        const __m512i abs = _mm512_set1_epi32(0x7fffffff);
        __m512i a0 = _mm512_setzero_si512(), a1 = a0;
        for (; i + 128 <= nbytes; i += 128) {
            prefetch_scan(bytes, i, nbytes);
            prefetch_scan(bytes, i + 64, nbytes);
            a0 = _mm512_max_epu32(a0, _mm512_and_si512(_mm512_loadu_si512(bytes + i), abs));
            a1 = _mm512_max_epu32(a1, _mm512_and_si512(_mm512_loadu_si512(bytes + i + 64), abs));
        }
        a0 = _mm512_max_epu32(a0, a1);
        for (; i < nbytes; i += 64) {
            __mmask16 t = tail_mask16(std::min<std::size_t>(16, (nbytes - i) / 4));
            a0 =
                _mm512_max_epu32(a0, _mm512_and_si512(_mm512_maskz_loadu_epi32(t, bytes + i), abs));
        }
        return _mm512_cmpge_epu32_mask(a0, _mm512_set1_epi32(0x7f800000)) != 0;
    } else {
        const __m512i abs = _mm512_set1_epi16(0x7fff);
        __m512i a0 = _mm512_setzero_si512(), a1 = a0;
        for (; i + 128 <= nbytes; i += 128) {
            prefetch_scan(bytes, i, nbytes);
            prefetch_scan(bytes, i + 64, nbytes);
            a0 = _mm512_max_epu16(a0, _mm512_and_si512(_mm512_loadu_si512(bytes + i), abs));
            a1 = _mm512_max_epu16(a1, _mm512_and_si512(_mm512_loadu_si512(bytes + i + 64), abs));
        }
        a0 = _mm512_max_epu16(a0, a1);
        for (; i < nbytes; i += 64) {
            std::size_t left = std::min<std::size_t>(32, (nbytes - i) / 2);
            auto t = static_cast<__mmask32>(left == 32 ? 0xffffffffu : (1u << left) - 1u);
            a0 =
                _mm512_max_epu16(a0, _mm512_and_si512(_mm512_maskz_loadu_epi16(t, bytes + i), abs));
        }
        const short inf = std::is_same_v<Grad, float16> ? 0x7c00 : 0x7f80;
        return _mm512_cmpge_epu16_mask(a0, _mm512_set1_epi16(inf)) != 0;
    }
}

template <class Grad>
SPILLWAY_TARGET_AVX512 void sum_squares_avx512(const Grad* g, std::size_t n,
                                               double* lanes) noexcept {
    __m512d a0 = _mm512_loadu_pd(lanes), a1 = _mm512_loadu_pd(lanes + 8);
    std::size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = load16(g + i);
        __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
        __m512d hi =
            _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
        a0 = _mm512_add_pd(a0, _mm512_mul_pd(lo, lo));
        a1 = _mm512_add_pd(a1, _mm512_mul_pd(hi, hi));
    }
    _mm512_storeu_pd(lanes, a0);
    _mm512_storeu_pd(lanes + 8, a1);
    sum_squares_scalar(g + i, n - i, lanes);  // i is a multiple of 16: lane numbering continues
}

// ---- AVX2 + FMA + F16C ---------------------------------------------------------------------
struct adamw_coefficients256 {
    __m256 grad_mul, decay, beta1, one_minus_beta1, beta2, one_minus_beta2, inv_sqrt_bias2, eps,
        neg_step_size;
};
SPILLWAY_TARGET_AVX2 inline adamw_coefficients256 broadcast256(
    const adamw_coefficients& c) noexcept {
    return {_mm256_set1_ps(c.grad_mul),       _mm256_set1_ps(c.decay),
            _mm256_set1_ps(c.beta1),          _mm256_set1_ps(c.one_minus_beta1),
            _mm256_set1_ps(c.beta2),          _mm256_set1_ps(c.one_minus_beta2),
            _mm256_set1_ps(c.inv_sqrt_bias2), _mm256_set1_ps(c.eps),
            _mm256_set1_ps(c.neg_step_size)};
}
SPILLWAY_TARGET_AVX2 inline void update8(const adamw_coefficients256& k, __m256& p, __m256& m,
                                         __m256& v, __m256 g) noexcept {
    g = _mm256_mul_ps(g, k.grad_mul);
    __m256 pd = _mm256_mul_ps(p, k.decay);
    m = _mm256_fmadd_ps(k.beta1, m, _mm256_mul_ps(k.one_minus_beta1, g));
    v = _mm256_fmadd_ps(k.beta2, v, _mm256_mul_ps(_mm256_mul_ps(k.one_minus_beta2, g), g));
    __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(v), k.inv_sqrt_bias2, k.eps);
    p = _mm256_fmadd_ps(k.neg_step_size, _mm256_div_ps(m, denom), pd);
}

template <class Grad, class Copy>
SPILLWAY_TARGET_AVX2 void adamw_avx2(const adamw_coefficients& c, float* p, float* m, float* v,
                                     const Grad* g, Copy* out, std::size_t n) noexcept {
    const adamw_coefficients256 k = broadcast256(c);
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        if (i % 16 == 0)
            prefetch_streams(p, m, v, g, i, n);  // one 64-byte line of fp32 per two vectors
        __m256 pv = _mm256_loadu_ps(p + i), mv = _mm256_loadu_ps(m + i),
               vv = _mm256_loadu_ps(v + i);
        update8(k, pv, mv, vv, load8(g + i));
        _mm256_storeu_ps(p + i, pv);
        _mm256_storeu_ps(m + i, mv);
        _mm256_storeu_ps(v + i, vv);
        if constexpr (!std::is_same_v<Copy, no_copy>) store8(out + i, pv);
    }
    if (i < n) {  // padded tail: the same vector code on a zero-filled copy of the last lanes
        std::size_t r = n - i;
        alignas(32) float tp[8] = {}, tm[8] = {}, tv[8] = {};
        Grad tg[8] = {};
        std::memcpy(tp, p + i, r * sizeof(float));
        std::memcpy(tm, m + i, r * sizeof(float));
        std::memcpy(tv, v + i, r * sizeof(float));
        std::memcpy(tg, g + i, r * sizeof(Grad));
        __m256 pv = _mm256_load_ps(tp), mv = _mm256_load_ps(tm), vv = _mm256_load_ps(tv);
        update8(k, pv, mv, vv, load8(tg));
        _mm256_store_ps(tp, pv);
        _mm256_store_ps(tm, mv);
        _mm256_store_ps(tv, vv);
        std::memcpy(p + i, tp, r * sizeof(float));
        std::memcpy(m + i, tm, r * sizeof(float));
        std::memcpy(v + i, tv, r * sizeof(float));
        if constexpr (!std::is_same_v<Copy, no_copy>) {
            Copy to[8];
            store8(to, pv);
            std::memcpy(out + i, to, r * sizeof(Copy));
        }
    }
}

template <class Grad>
SPILLWAY_TARGET_AVX2 bool any_nonfinite_avx2(const Grad* g, std::size_t n) noexcept {
    const auto* bytes = reinterpret_cast<const char*>(g);
    const std::size_t nbytes = n * sizeof(Grad);
    std::size_t i = 0;
    bool bad = false;
    if constexpr (std::is_same_v<Grad, float>) {
        const __m256i abs = _mm256_set1_epi32(0x7fffffff);
        __m256i a0 = _mm256_setzero_si256(), a1 = a0;
        for (; i + 64 <= nbytes; i += 64) {
            prefetch_scan(bytes, i, nbytes);
            a0 = _mm256_max_epu32(
                a0, _mm256_and_si256(
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes + i)), abs));
            a1 = _mm256_max_epu32(
                a1, _mm256_and_si256(
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes + i + 32)), abs));
        }
        a0 = _mm256_max_epu32(a0, a1);
        // a >= inf <=> max(a, inf) == a
        const __m256i inf = _mm256_set1_epi32(0x7f800000);
        bad = _mm256_movemask_epi8(_mm256_cmpeq_epi32(_mm256_max_epu32(a0, inf), a0)) != 0;
    } else {
        const __m256i abs = _mm256_set1_epi16(0x7fff);
        __m256i a0 = _mm256_setzero_si256(), a1 = a0;
        for (; i + 64 <= nbytes; i += 64) {
            prefetch_scan(bytes, i, nbytes);
            a0 = _mm256_max_epu16(
                a0, _mm256_and_si256(
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes + i)), abs));
            a1 = _mm256_max_epu16(
                a1, _mm256_and_si256(
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes + i + 32)), abs));
        }
        a0 = _mm256_max_epu16(a0, a1);
        const __m256i inf = _mm256_set1_epi16(std::is_same_v<Grad, float16> ? 0x7c00 : 0x7f80);
        bad = _mm256_movemask_epi8(_mm256_cmpeq_epi16(_mm256_max_epu16(a0, inf), a0)) != 0;
    }
    std::size_t done = i / sizeof(Grad);
    return bad || any_nonfinite_scalar(g + done, n - done);
}

template <class Grad>
SPILLWAY_TARGET_AVX2 void sum_squares_avx2(const Grad* g, std::size_t n, double* lanes) noexcept {
    __m256d a0 = _mm256_loadu_pd(lanes), a1 = _mm256_loadu_pd(lanes + 4);
    __m256d a2 = _mm256_loadu_pd(lanes + 8), a3 = _mm256_loadu_pd(lanes + 12);
    std::size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 x = load8(g + i), y = load8(g + i + 8);
        __m256d x0 = _mm256_cvtps_pd(_mm256_castps256_ps128(x)),
                x1 = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
        __m256d y0 = _mm256_cvtps_pd(_mm256_castps256_ps128(y)),
                y1 = _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1));
        a0 = _mm256_add_pd(a0, _mm256_mul_pd(x0, x0));
        a1 = _mm256_add_pd(a1, _mm256_mul_pd(x1, x1));
        a2 = _mm256_add_pd(a2, _mm256_mul_pd(y0, y0));
        a3 = _mm256_add_pd(a3, _mm256_mul_pd(y1, y1));
    }
    _mm256_storeu_pd(lanes, a0);
    _mm256_storeu_pd(lanes + 4, a1);
    _mm256_storeu_pd(lanes + 8, a2);
    _mm256_storeu_pd(lanes + 12, a3);
    sum_squares_scalar(g + i, n - i, lanes);
}

}  // namespace spillway::detail
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif  // SPILLWAY_X86_SIMD
