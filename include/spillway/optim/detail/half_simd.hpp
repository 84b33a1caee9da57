// SPDX-License-Identifier: Apache-2.0
// spillway/optim/detail/half_simd.hpp: AVX-512 and AVX2+F16C kernels for fp16/bf16 conversion.
//
// Guarantees: every function here gives, element by element, exactly the bits of the scalar
// to_float / from_float in half.hpp (fp16 through the F16C instructions, which round to
// nearest even and quiet NaNs the same way; bf16 through integer rounding, which keeps
// subnormals, unlike vcvtneps2bf16). Functions carry the target attribute of their level and
// must only run where detail::supported(level) holds. Outputs of nontemporal_min_bytes or
// more are written with streaming stores (and an sfence before returning), so the results
// are visible to other threads exactly as with ordinary stores once the call returns.
#pragma once

#include "spillway/optim/detail/half_core.hpp"
#include "spillway/optim/detail/simd.hpp"

#include <cstddef>
#include <cstdint>

#if SPILLWAY_X86_SIMD
// GCC 12's AVX-512 intrinsics self-initialise an undefined vector (`__Y = __Y`), which
// -Wmaybe-uninitialized reports at every use once inlined; the values are never read.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
namespace spillway::detail {

/// Outputs of at least this many bytes are written with streaming (non-temporal) stores:
/// they would not stay in the caches anyway, and streaming skips the read that an ordinary
/// store of a missing line costs (write-allocate). Below it, ordinary stores keep the result
/// in cache for whoever reads it next.
inline constexpr std::size_t nontemporal_min_bytes = std::size_t{8} << 20;

/// Elements of T before p reaches an `align`-byte boundary.
template <class T>
inline std::size_t elements_to_boundary(const T* p, std::size_t align) noexcept {
    auto addr = reinterpret_cast<std::uintptr_t>(p);
    return ((align - addr % align) % align) / sizeof(T);
}

// ---- AVX-512: 16 lanes ---------------------------------------------------------------------
// Loads 16 values (or the lanes of `k`, others 0) widened to float.
SPILLWAY_TARGET_AVX512 inline __m512 load16(const float* p) noexcept {
    return _mm512_loadu_ps(p);
}
SPILLWAY_TARGET_AVX512 inline __m512 load16(const float16* p) noexcept {
    // maskz form: the plain one trips a false -Wmaybe-uninitialized in GCC 12's header
    return _mm512_maskz_cvtph_ps(static_cast<__mmask16>(0xffff),
                                 _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
SPILLWAY_TARGET_AVX512 inline __m512 load16(const bfloat16* p) noexcept {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
SPILLWAY_TARGET_AVX512 inline __m512 load16(const float* p, __mmask16 k) noexcept {
    return _mm512_maskz_loadu_ps(k, p);
}
SPILLWAY_TARGET_AVX512 inline __m512 load16(const float16* p, __mmask16 k) noexcept {
    return _mm512_maskz_cvtph_ps(static_cast<__mmask16>(0xffff), _mm256_maskz_loadu_epi16(k, p));
}
SPILLWAY_TARGET_AVX512 inline __m512 load16(const bfloat16* p, __mmask16 k) noexcept {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
// Rounds 16 floats to 16 halves (as 16-bit lanes).
SPILLWAY_TARGET_AVX512 inline __m256i round16(__m512 x, const float16*) noexcept {
    return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
SPILLWAY_TARGET_AVX512 inline __m256i round16(__m512 x, const bfloat16*) noexcept {
    __m512i u = _mm512_castps_si512(x);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, r, q));
}
template <class Half>
SPILLWAY_TARGET_AVX512 inline void store16(Half* p, __m512 x) noexcept {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), round16(x, p));
}
template <class Half>
SPILLWAY_TARGET_AVX512 inline void store16(Half* p, __m512 x, __mmask16 k) noexcept {
    _mm256_mask_storeu_epi16(p, k, round16(x, p));
}
SPILLWAY_TARGET_AVX512 inline __mmask16 tail_mask16(std::size_t n) noexcept {
    return static_cast<__mmask16>((1u << n) - 1u);
}

template <class Half>
SPILLWAY_TARGET_AVX512 void widen_avx512(const Half* in, float* out, std::size_t n) noexcept {
    std::size_t i = 0;
    if (n * sizeof(float) >= nontemporal_min_bytes) {  // peel to a 64-byte line, then stream
        i = elements_to_boundary(out, 64);
        widen_scalar(in, out, i);
        for (; i + 64 <= n; i += 64) {
            __m512 a = load16(in + i), b = load16(in + i + 16), c = load16(in + i + 32),
                   d = load16(in + i + 48);
            _mm512_stream_ps(out + i, a);
            _mm512_stream_ps(out + i + 16, b);
            _mm512_stream_ps(out + i + 32, c);
            _mm512_stream_ps(out + i + 48, d);
        }
        _mm_sfence();
    }
    for (; i + 64 <= n; i += 64) {
        __m512 a = load16(in + i), b = load16(in + i + 16), c = load16(in + i + 32),
               d = load16(in + i + 48);
        _mm512_storeu_ps(out + i, a);
        _mm512_storeu_ps(out + i + 16, b);
        _mm512_storeu_ps(out + i + 32, c);
        _mm512_storeu_ps(out + i + 48, d);
    }
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, load16(in + i));
    if (i < n) {
        __mmask16 k = tail_mask16(n - i);
        _mm512_mask_storeu_ps(out + i, k, load16(in + i, k));
    }
}
template <class Half>
SPILLWAY_TARGET_AVX512 void narrow_avx512(const float* in, Half* out, std::size_t n) noexcept {
    std::size_t i = 0;
    // Peel to a 64-byte line, then stream whole lines (two rounded vectors each): for bf16 this
    // is faster than streaming each line in two 32-byte halves.
    if (n * sizeof(Half) >= nontemporal_min_bytes) {
        i = elements_to_boundary(out, 64);
        narrow_scalar(in, out, i);
        for (; i + 64 <= n; i += 64) {
            __m512 a = _mm512_loadu_ps(in + i), b = _mm512_loadu_ps(in + i + 16);
            __m512 c = _mm512_loadu_ps(in + i + 32), d = _mm512_loadu_ps(in + i + 48);
            _mm512_stream_si512(
                reinterpret_cast<__m512i*>(out + i),
                _mm512_inserti64x4(_mm512_castsi256_si512(round16(a, out)), round16(b, out), 1));
            _mm512_stream_si512(
                reinterpret_cast<__m512i*>(out + i + 32),
                _mm512_inserti64x4(_mm512_castsi256_si512(round16(c, out)), round16(d, out), 1));
        }
        _mm_sfence();
    }
    for (; i + 64 <= n; i += 64) {
        __m512 a = _mm512_loadu_ps(in + i), b = _mm512_loadu_ps(in + i + 16);
        __m512 c = _mm512_loadu_ps(in + i + 32), d = _mm512_loadu_ps(in + i + 48);
        store16(out + i, a);
        store16(out + i + 16, b);
        store16(out + i + 32, c);
        store16(out + i + 48, d);
    }
    for (; i + 16 <= n; i += 16) store16(out + i, _mm512_loadu_ps(in + i));
    if (i < n) {
        __mmask16 k = tail_mask16(n - i);
        store16(out + i, _mm512_maskz_loadu_ps(k, in + i), k);
    }
}

// ---- AVX2 + F16C: 8 lanes ------------------------------------------------------------------
SPILLWAY_TARGET_AVX2 inline __m256 load8(const float* p) noexcept {
    return _mm256_loadu_ps(p);
}
SPILLWAY_TARGET_AVX2 inline __m256 load8(const float16* p) noexcept {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
SPILLWAY_TARGET_AVX2 inline __m256 load8(const bfloat16* p) noexcept {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
SPILLWAY_TARGET_AVX2 inline __m128i round8(__m256 x, const float16*) noexcept {
    return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
SPILLWAY_TARGET_AVX2 inline __m128i round8(__m256 x, const bfloat16*) noexcept {
    __m256i u = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    __m256i s = _mm256_blendv_epi8(r, q, nan);  // lanes <= 0xffff: unsigned saturation is exact
    return _mm_packus_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}
template <class Half>
SPILLWAY_TARGET_AVX2 inline void store8(Half* p, __m256 x) noexcept {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), round8(x, p));
}

template <class Half>
SPILLWAY_TARGET_AVX2 void widen_avx2(const Half* in, float* out, std::size_t n) noexcept {
    std::size_t i = 0;
    if (n * sizeof(float) >= nontemporal_min_bytes) {  // peel to 32 bytes, then stream
        i = elements_to_boundary(out, 32);
        widen_scalar(in, out, i);
        for (; i + 32 <= n; i += 32) {
            __m256 a = load8(in + i), b = load8(in + i + 8), c = load8(in + i + 16),
                   d = load8(in + i + 24);
            _mm256_stream_ps(out + i, a);
            _mm256_stream_ps(out + i + 8, b);
            _mm256_stream_ps(out + i + 16, c);
            _mm256_stream_ps(out + i + 24, d);
        }
        _mm_sfence();
    }
    for (; i + 32 <= n; i += 32) {
        __m256 a = load8(in + i), b = load8(in + i + 8), c = load8(in + i + 16),
               d = load8(in + i + 24);
        _mm256_storeu_ps(out + i, a);
        _mm256_storeu_ps(out + i + 8, b);
        _mm256_storeu_ps(out + i + 16, c);
        _mm256_storeu_ps(out + i + 24, d);
    }
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, load8(in + i));
    widen_scalar(in + i, out + i, n - i);
}
template <class Half>
SPILLWAY_TARGET_AVX2 void narrow_avx2(const float* in, Half* out, std::size_t n) noexcept {
    std::size_t i = 0;
    if (n * sizeof(Half) >= nontemporal_min_bytes) {  // peel to 16 bytes, then stream
        i = elements_to_boundary(out, 16);
        narrow_scalar(in, out, i);
        for (; i + 32 <= n; i += 32) {
            __m256 a = _mm256_loadu_ps(in + i), b = _mm256_loadu_ps(in + i + 8);
            __m256 c = _mm256_loadu_ps(in + i + 16), d = _mm256_loadu_ps(in + i + 24);
            _mm_stream_si128(reinterpret_cast<__m128i*>(out + i), round8(a, out));
            _mm_stream_si128(reinterpret_cast<__m128i*>(out + i + 8), round8(b, out));
            _mm_stream_si128(reinterpret_cast<__m128i*>(out + i + 16), round8(c, out));
            _mm_stream_si128(reinterpret_cast<__m128i*>(out + i + 24), round8(d, out));
        }
        _mm_sfence();
    }
    for (; i + 32 <= n; i += 32) {
        __m256 a = _mm256_loadu_ps(in + i), b = _mm256_loadu_ps(in + i + 8);
        __m256 c = _mm256_loadu_ps(in + i + 16), d = _mm256_loadu_ps(in + i + 24);
        store8(out + i, a);
        store8(out + i + 8, b);
        store8(out + i + 16, c);
        store8(out + i + 24, d);
    }
    for (; i + 8 <= n; i += 8) store8(out + i, _mm256_loadu_ps(in + i));
    narrow_scalar(in + i, out + i, n - i);
}

}  // namespace spillway::detail
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif  // SPILLWAY_X86_SIMD
