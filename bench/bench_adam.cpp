// SPDX-License-Identifier: Apache-2.0
// bench_adam: the mixed-precision AdamW step against the memory-bandwidth limit measured in
// the same binary, plus fp16/bf16 widening and narrowing against memcpy.
//
// Every step benchmark times, in each iteration, the step AND its limit: a streaming kernel
// with the step's exact access pattern and bytes (read p, g, m, v; write p, m, v in place,
// no arithmetic: each value is xor-ed with a zero the compiler cannot see, the gradient bits
// and-ed into it, so every load and store happens and no value changes), over the same
// threads and tiles. Both run
// under the same machine load, so `vs_limit` = limit time / step time = achieved bytes/s
// over the stream's bytes/s. Counted traffic per parameter: 12 (p, m, v read) + grad bytes
// + 12 (p, m, v written) (+ 2 for a compute copy). Use --benchmark_repetitions and medians.
//
// The limit kernel is the fastest of several, chosen in the same run per (gradient type,
// copy, threads) cell (limit_for; each iteration times the two fastest and takes the faster): every SIMD width up to the widest the machine has (AVX2,
// AVX-512), each with and without the step's software prefetch and with and without
// non-temporal stores. One plain stream is not a limit everywhere: where the hardware
// prefetcher lags, the step, which prefetches, beats a stream without prefetch. Every step and stream row's
// label names the winner, `limit_kernel=<width>[_prefetch][_nt|_ntcopy]` (e.g.
// avx512_prefetch_ntcopy: streaming stores for the compute copy alone);
// the stream rows also carry each candidate's best pass as counters GBps_<kernel>.
#include <spillway/optim/adam.hpp>

#include "support/bench_env.hpp"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using spillway::bfloat16;
using spillway::float16;
using spillway::detail::no_copy;
using spillway::detail::simd_level;
using spillway::thread_pool;
using clock_type = std::chrono::steady_clock;

std::size_t param_count() { return spillway::bench::smoke() ? (std::size_t{1} << 16) : (std::size_t{1} << 26); }
std::size_t all_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

thread_pool& pool_for(std::size_t threads) {
    static std::map<std::size_t, std::unique_ptr<thread_pool>> pools;
    auto& p = pools[threads];
    if (!p) p = std::make_unique<thread_pool>(threads - 1);
    return *p;
}

// 4 KiB-aligned storage, as the update pipeline's aligned buffers.
struct aligned_delete {
    void operator()(void* p) const noexcept { ::operator delete[](p, std::align_val_t{4096}); }
};
template <class T>
std::unique_ptr<T[], aligned_delete> aligned_array(std::size_t n) {
    return std::unique_ptr<T[], aligned_delete>(static_cast<T*>(::operator new[](n * sizeof(T), std::align_val_t{4096})));
}

// The arrays, allocated and first-touched once (by the threads that will use them).
struct arrays {
    std::size_t n;
    std::unique_ptr<float[], aligned_delete> p, m, v, g32;
    std::unique_ptr<float16[], aligned_delete> g16, copy16;
    std::unique_ptr<bfloat16[], aligned_delete> gbf, copybf;
    explicit arrays(std::size_t count)
        : n(count), p(aligned_array<float>(n)), m(aligned_array<float>(n)), v(aligned_array<float>(n)),
          g32(aligned_array<float>(n)), g16(aligned_array<float16>(n)), copy16(aligned_array<float16>(n)),
          gbf(aligned_array<bfloat16>(n)), copybf(aligned_array<bfloat16>(n)) {
        pool_for(all_threads()).parallel_for(n, [&](std::size_t b, std::size_t e) {
            std::mt19937 rng(static_cast<unsigned>(b));
            std::normal_distribution<float> nd(0.0f, 1.0f);
            for (std::size_t i = b; i < e; ++i) {
                float g = nd(rng) * 1e-2f;
                p[i] = nd(rng);
                m[i] = g;
                v[i] = g * g;
                g32[i] = g;
                g16[i] = spillway::from_float<float16>(g * 1024.0f);
                gbf[i] = spillway::from_float<bfloat16>(g);
                copy16[i] = float16{0};
                copybf[i] = bfloat16{0};
            }
        });
    }
    template <class Grad>
    const Grad* grads() const {
        if constexpr (std::is_same_v<Grad, float>) return g32.get();
        else if constexpr (std::is_same_v<Grad, float16>) return g16.get();
        else return gbf.get();
    }
    template <class Copy>
    Copy* copy() const {
        if constexpr (std::is_same_v<Copy, float16>) return copy16.get();
        else if constexpr (std::is_same_v<Copy, bfloat16>) return copybf.get();
        else return nullptr;
    }
};

arrays& data() {
    static arrays a(param_count());
    return a;
}

// ---- The limit: the step's access pattern without the arithmetic --------------------------
bool aligned_to(const void* at, std::uintptr_t alignment) noexcept {
    return reinterpret_cast<std::uintptr_t>(at) % alignment == 0;
}
// A zero the compiler cannot prove zero: the stream's stores are not no-ops to it.
volatile std::uint32_t hidden_zero = 0;

template <class Grad, class Copy>
void stream_scalar(float* p, float* m, float* v, const Grad* g, Copy* out, std::size_t n, std::uint32_t zero) noexcept {
    for (std::size_t i = 0; i < n; ++i) {
        std::uint32_t pb, mb, vb, gb = 0;
        std::memcpy(&pb, p + i, 4);
        std::memcpy(&mb, m + i, 4);
        std::memcpy(&vb, v + i, 4);
        std::memcpy(&gb, g + i, sizeof(Grad));
        pb ^= gb & zero;
        mb ^= zero;
        vb ^= zero;
        std::memcpy(p + i, &pb, 4);
        std::memcpy(m + i, &mb, 4);
        std::memcpy(v + i, &vb, 4);
        if constexpr (!std::is_same_v<Copy, no_copy>) std::memcpy(out + i, &pb, 2);
    }
}
#if SPILLWAY_X86_SIMD
#if defined(__GNUC__) && !defined(__clang__)  // GCC 12's AVX-512 headers: see detail/half_simd.hpp
#  pragma GCC diagnostic push
#  pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#  pragma GCC diagnostic ignored "-Wuninitialized"
#endif
// The stream kernels' switches: Prefetch fetches each stream 512 elements ahead, exactly as
// the step does (detail::prefetch_streams); NonTemporal writes p, m, v and the copy with
// streaming stores, which skip the cache on the way out; NonTemporalCopy streams the copy
// alone, the one output nothing reads first (a cached store reads its line before writing it). Both are the step's options in kind:
// a stream with them is still the step's access pattern, and may be the faster one on a
// machine, so the limit takes the fastest.
template <bool NonTemporal, class T, class V>
SPILLWAY_TARGET_AVX512 inline void store512(T* at, V x) noexcept {
    if constexpr (NonTemporal) _mm512_stream_si512(reinterpret_cast<__m512i*>(at), x);
    else _mm512_storeu_si512(at, x);
}
template <class Grad>
SPILLWAY_TARGET_AVX512 inline __m512i grad_bits16(const Grad* g) noexcept {
    if constexpr (std::is_same_v<Grad, float>) return _mm512_loadu_si512(g);
    else return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g)));
}
// p, m, v (n), g (n), out (n or null): 16 elements per iteration.
template <class Grad, class Copy, bool Prefetch, bool NonTemporal, bool NonTemporalCopy = NonTemporal>
SPILLWAY_TARGET_AVX512 void stream_avx512(float* p, float* m, float* v, const Grad* g, Copy* out, std::size_t n,
                                          std::uint32_t zero) noexcept {
    if constexpr (NonTemporal || NonTemporalCopy) {  // streaming stores need aligned addresses (tiles are)
        if (!aligned_to(p, 64) || !aligned_to(m, 64) || !aligned_to(v, 64) ||
            (out && !aligned_to(out, 32)))
            return stream_avx512<Grad, Copy, Prefetch, false, false>(p, m, v, g, out, n, zero);
    }
    const __m512i z = _mm512_set1_epi32(static_cast<int>(zero));
    std::size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        if constexpr (Prefetch) spillway::detail::prefetch_streams(p, m, v, g, i, n);
        __m512i pv = _mm512_loadu_si512(p + i), mv = _mm512_loadu_si512(m + i), vv = _mm512_loadu_si512(v + i);
        pv = _mm512_xor_si512(pv, _mm512_and_si512(grad_bits16(g + i), z));
        store512<NonTemporal>(p + i, pv);
        store512<NonTemporal>(m + i, _mm512_xor_si512(mv, z));
        store512<NonTemporal>(v + i, _mm512_xor_si512(vv, z));
        if constexpr (!std::is_same_v<Copy, no_copy>) {
            const __m256i half = _mm512_cvtepi32_epi16(pv);
            if constexpr (NonTemporalCopy) _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i), half);
            else _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), half);
        }
    }
    if constexpr (NonTemporal || NonTemporalCopy) _mm_sfence();
    stream_scalar(p + i, m + i, v + i, g + i, out ? out + i : out, n - i, zero);
}

template <bool NonTemporal, class T>
SPILLWAY_TARGET_AVX2 inline void store256(T* at, __m256i x) noexcept {
    if constexpr (NonTemporal) _mm256_stream_si256(reinterpret_cast<__m256i*>(at), x);
    else _mm256_storeu_si256(reinterpret_cast<__m256i*>(at), x);
}
template <class Grad>
SPILLWAY_TARGET_AVX2 inline __m256i grad_bits8(const Grad* g) noexcept {
    if constexpr (std::is_same_v<Grad, float>) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g));
    else return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g)));
}
// p, m, v (n), g (n), out (n or null): 8 elements per iteration, prefetching once per 16 as
// the step's AVX2 kernel does.
template <class Grad, class Copy, bool Prefetch, bool NonTemporal, bool NonTemporalCopy = NonTemporal>
SPILLWAY_TARGET_AVX2 void stream_avx2(float* p, float* m, float* v, const Grad* g, Copy* out, std::size_t n,
                                      std::uint32_t zero) noexcept {
    if constexpr (NonTemporal || NonTemporalCopy) {
        if (!aligned_to(p, 32) || !aligned_to(m, 32) || !aligned_to(v, 32) ||
            (out && !aligned_to(out, 16)))
            return stream_avx2<Grad, Copy, Prefetch, false, false>(p, m, v, g, out, n, zero);
    }
    const __m256i z = _mm256_set1_epi32(static_cast<int>(zero));
    const __m256i low16 = _mm256_set1_epi32(0xffff);
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        if constexpr (Prefetch)
            if (i % 16 == 0) spillway::detail::prefetch_streams(p, m, v, g, i, n);
        __m256i pv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i));
        const __m256i mv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(m + i));
        const __m256i vv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + i));
        pv = _mm256_xor_si256(pv, _mm256_and_si256(grad_bits8(g + i), z));
        store256<NonTemporal>(p + i, pv);
        store256<NonTemporal>(m + i, _mm256_xor_si256(mv, z));
        store256<NonTemporal>(v + i, _mm256_xor_si256(vv, z));
        if constexpr (!std::is_same_v<Copy, no_copy>) {
            // The low 16 bits of each lane, as the scalar stream's copy: pack, then gather the
            // two 128-bit lanes' halves.
            __m256i h = _mm256_packus_epi32(_mm256_and_si256(pv, low16), _mm256_and_si256(pv, low16));
            const __m128i half = _mm256_castsi256_si128(_mm256_permute4x64_epi64(h, 0x08));
            if constexpr (NonTemporalCopy) _mm_stream_si128(reinterpret_cast<__m128i*>(out + i), half);
            else _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), half);
        }
    }
    if constexpr (NonTemporal || NonTemporalCopy) _mm_sfence();
    stream_scalar(p + i, m + i, v + i, g + i, out ? out + i : out, n - i, zero);
}
#if defined(__GNUC__) && !defined(__clang__)
#  pragma GCC diagnostic pop
#endif
#endif

template <class Grad, class Copy>
using stream_fn = void (*)(float*, float*, float*, const Grad*, Copy*, std::size_t, std::uint32_t) noexcept;

/// One candidate limit kernel: its name (the `limit_kernel` the rows report) and code.
template <class Grad, class Copy>
struct stream_kernel {
    std::string name;  // e.g. "avx512_prefetch_nt": width, then the switches it uses
    stream_fn<Grad, Copy> run;
};

/// Every stream kernel this machine runs, up to best_simd_level() (SPILLWAY_SIMD caps it as
/// it caps the step): each SIMD width with and without prefetch and streaming stores (of every
/// output, and, with a compute copy, of the copy alone); the scalar loop only where no SIMD
/// level is supported.
template <class Grad, class Copy>
std::vector<stream_kernel<Grad, Copy>> stream_kernels() {
    std::vector<stream_kernel<Grad, Copy>> ks;
#if SPILLWAY_X86_SIMD
    const auto best = spillway::detail::best_simd_level();
    constexpr bool copies = !std::is_same_v<Copy, no_copy>;
    if (best >= simd_level::avx2) {
        ks.push_back({"avx2", &stream_avx2<Grad, Copy, false, false>});
        ks.push_back({"avx2_prefetch", &stream_avx2<Grad, Copy, true, false>});
        ks.push_back({"avx2_nt", &stream_avx2<Grad, Copy, false, true>});
        ks.push_back({"avx2_prefetch_nt", &stream_avx2<Grad, Copy, true, true>});
        if (copies) {
            ks.push_back({"avx2_ntcopy", &stream_avx2<Grad, Copy, false, false, true>});
            ks.push_back({"avx2_prefetch_ntcopy", &stream_avx2<Grad, Copy, true, false, true>});
        }
    }
    if (best >= simd_level::avx512) {
        ks.push_back({"avx512", &stream_avx512<Grad, Copy, false, false>});
        ks.push_back({"avx512_prefetch", &stream_avx512<Grad, Copy, true, false>});
        ks.push_back({"avx512_nt", &stream_avx512<Grad, Copy, false, true>});
        ks.push_back({"avx512_prefetch_nt", &stream_avx512<Grad, Copy, true, true>});
        if (copies) {
            ks.push_back({"avx512_ntcopy", &stream_avx512<Grad, Copy, false, false, true>});
            ks.push_back({"avx512_prefetch_ntcopy", &stream_avx512<Grad, Copy, true, false, true>});
        }
    }
#endif
    if (ks.empty()) ks.push_back({"scalar", &stream_scalar<Grad, Copy>});
    return ks;
}

/// One pass of `kernel` over the arrays, with the step's threads and tiles.
template <class Grad, class Copy>
void run_stream(stream_fn<Grad, Copy> kernel, thread_pool& pool) {
    arrays& a = data();
    const std::size_t tile = spillway::detail::adam_tile, tiles = (a.n + tile - 1) / tile;
    const std::uint32_t zero = hidden_zero;
    pool.parallel_for(
        tiles,
        [&](std::size_t b, std::size_t e) {
            std::size_t lo = b * tile, hi = std::min(a.n, e * tile);
            Copy* out = nullptr;
            if constexpr (!std::is_same_v<Copy, no_copy>) out = a.copy<Copy>() + lo;
            kernel(a.p.get() + lo, a.m.get() + lo, a.v.get() + lo, a.grads<Grad>() + lo, out, hi - lo, zero);
        },
        4);
}

/// The limit of a (Grad, Copy, threads) cell: the two fastest stream kernels, chosen once per
/// run (the same one twice where there is one candidate).
template <class Grad, class Copy>
struct stream_limit {
    stream_kernel<Grad, Copy> kernel;     // the fastest
    stream_kernel<Grad, Copy> runner_up;  // the second fastest
    std::vector<std::pair<std::string, double>> GBps;  // every candidate's best pass
};

/// Chooses the cell's limit kernel: after one warm-up pass each, every candidate runs
/// `rounds` passes, the candidates taking turns (so drift in a busy machine's load falls on
/// all alike); the two with the fastest single pass go on. Each row's iteration times both
/// beside the step and takes the faster (a busy machine's load moves between the choice and
/// the rows: one kernel alone, chosen in a noisy moment, let rows read 1.04-1.05). Cached per
/// cell: every row and repetition of the cell uses the same two.
template <class Grad, class Copy>
const stream_limit<Grad, Copy>& limit_for(std::size_t threads) {
    static std::map<std::size_t, stream_limit<Grad, Copy>> chosen;
    if (auto it = chosen.find(threads); it != chosen.end()) return it->second;
    thread_pool& pool = pool_for(threads);
    const auto ks = stream_kernels<Grad, Copy>();
    const int rounds = spillway::bench::smoke() ? 1 : 3;
    std::vector<double> best(ks.size(), std::numeric_limits<double>::infinity());
    for (const auto& k : ks) run_stream<Grad, Copy>(k.run, pool);
    for (int r = 0; r < rounds; ++r)
        for (std::size_t k = 0; k < ks.size(); ++k) {
            const auto t0 = clock_type::now();
            run_stream<Grad, Copy>(ks[k].run, pool);
            best[k] = std::min(best[k], std::chrono::duration<double>(clock_type::now() - t0).count());
        }
    stream_limit<Grad, Copy> lim;
    std::vector<std::size_t> order(ks.size());
    for (std::size_t k = 0; k < ks.size(); ++k) order[k] = k;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return best[a] < best[b]; });
    lim.kernel = ks[order[0]];
    lim.runner_up = ks[order.size() > 1 ? order[1] : order[0]];
    const double bytes = static_cast<double>(data().n) * (24.0 + sizeof(Grad) + (std::is_same_v<Copy, no_copy> ? 0.0 : 2.0));
    for (std::size_t k = 0; k < ks.size(); ++k) lim.GBps.emplace_back(ks[k].name, bytes / best[k] / 1e9);
    return chosen.emplace(threads, std::move(lim)).first->second;
}

template <class Grad, class Copy>
void run_step(simd_level level, spillway::grad_check check, std::int64_t t, thread_pool& pool) {
    arrays& a = data();
    // grad_scale 1024 for fp16 grads (stored scaled), 1 otherwise.
    const float scale = std::is_same_v<Grad, float16> ? 1024.0f : 1.0f;
    auto c = spillway::make_adamw_coefficients(spillway::adamw_config{.lr = 1e-4f, .weight_decay = 0.01f},
                                               spillway::adamw_step_args{.step = t, .grad_scale = scale});
    spillway::detail::adamw_step_at(level, c, check, a.p.get(), a.m.get(), a.v.get(), a.grads<Grad>(),
                                    a.copy<Copy>(), a.n, pool);
}

template <class Grad, class Copy>
constexpr double bytes_per_param() {
    return 24.0 + sizeof(Grad) + (std::is_same_v<Copy, no_copy> ? 0.0 : 2.0);
}

void set_counters(benchmark::State& state, double bytes_per_item, double work_s, double limit_s) {
    const double items = static_cast<double>(data().n) * static_cast<double>(state.iterations());
    state.SetItemsProcessed(static_cast<std::int64_t>(items));
    state.SetBytesProcessed(static_cast<std::int64_t>(items * bytes_per_item));
    state.counters["Gparams_per_s"] = benchmark::Counter(items / 1e9, benchmark::Counter::kIsRate);
    if (limit_s > 0) {
        state.counters["vs_limit"] = limit_s / work_s;
        state.counters["limit_GBps"] = items * bytes_per_item / limit_s / 1e9;
    }
}

// args: {threads, level (0 scalar, 1 avx2, 2 avx512), check (0 caller_verified, 1 scan)}
template <class Grad, class Copy>
void BM_adam(benchmark::State& state) {
    const auto threads = static_cast<std::size_t>(state.range(0));
    const auto level = static_cast<simd_level>(state.range(1));
    const auto check = state.range(2) ? spillway::grad_check::scan : spillway::grad_check::caller_verified;
    if (!spillway::detail::supported(level)) {
        state.SkipWithError("SIMD level not supported on this CPU");
        return;
    }
    thread_pool& pool = pool_for(threads);
    const auto& limit = limit_for<Grad, Copy>(threads);
    if (level != simd_level::scalar) run_step<Grad, Copy>(level, check, 1, pool);  // warm-up
    run_stream<Grad, Copy>(limit.kernel.run, pool);
    run_stream<Grad, Copy>(limit.runner_up.run, pool);
    double work_s = 0, limit_s = 0;
    std::int64_t t = 2, runner_up_won = 0, iterations = 0;
    for (auto _ : state) {
        auto t0 = clock_type::now();
        run_stream<Grad, Copy>(limit.runner_up.run, pool);
        auto t1 = clock_type::now();
        run_stream<Grad, Copy>(limit.kernel.run, pool);
        auto t2 = clock_type::now();
        run_step<Grad, Copy>(level, check, t++, pool);
        auto t3 = clock_type::now();
        const double step_s = std::chrono::duration<double>(t3 - t2).count();
        const double second_s = std::chrono::duration<double>(t1 - t0).count();
        const double first_s = std::chrono::duration<double>(t2 - t1).count();
        limit_s += std::min(first_s, second_s);
        runner_up_won += second_s < first_s;
        ++iterations;
        work_s += step_s;
        state.SetIterationTime(step_s);
    }
    set_counters(state, bytes_per_param<Grad, Copy>(), work_s, limit_s);
    // The kernel that was the faster in most iterations.
    state.SetLabel("limit_kernel=" + (2 * runner_up_won > iterations ? limit.runner_up.name : limit.kernel.name));
}

// The limit alone, for the table: the cell's winning kernel, and every candidate's best pass
// from the choice (counters GBps_<kernel>).
template <class Grad, class Copy>
void BM_stream(benchmark::State& state) {
    thread_pool& pool = pool_for(static_cast<std::size_t>(state.range(0)));
    const auto& limit = limit_for<Grad, Copy>(static_cast<std::size_t>(state.range(0)));
    run_stream<Grad, Copy>(limit.kernel.run, pool);
    for (auto _ : state) run_stream<Grad, Copy>(limit.kernel.run, pool);
    set_counters(state, bytes_per_param<Grad, Copy>(), 0, 0);
    for (const auto& [name, gbps] : limit.GBps) state.counters["GBps_" + name] = gbps;
    state.SetLabel("limit_kernel=" + limit.kernel.name);
}

std::int64_t best_level() { return static_cast<std::int64_t>(spillway::detail::best_simd_level()); }
std::int64_t all_threads_arg() { return static_cast<std::int64_t>(all_threads()); }

// The step: widest SIMD with and without the overflow scan, and AVX2 where AVX-512 is best.
void step_args(benchmark::internal::Benchmark* b) {
    for (std::int64_t threads : {std::int64_t{1}, all_threads_arg()}) {
        b->Args({threads, best_level(), 0});
        b->Args({threads, best_level(), 1});
        if (best_level() >= 2) b->Args({threads, 1, 0});
    }
    b->ArgNames({"threads", "simd", "scan"})->UseManualTime()->Unit(benchmark::kMillisecond);
}
// With a compute copy: widest SIMD, no scan.
void copy_args(benchmark::internal::Benchmark* b) {
    b->Args({1, best_level(), 0})->Args({all_threads_arg(), best_level(), 0});
    b->ArgNames({"threads", "simd", "scan"})->UseManualTime()->Unit(benchmark::kMillisecond);
}
// The plain scalar loop of the same formula (simd 0): 20-50x slower, so one timed pass.
void scalar_args(benchmark::internal::Benchmark* b) {
    b->Args({1, 0, 0})->Args({all_threads_arg(), 0, 0});
    b->ArgNames({"threads", "simd", "scan"})->UseManualTime()->Unit(benchmark::kMillisecond);
    b->Iterations(1)->Repetitions(1);
}
void stream_args(benchmark::internal::Benchmark* b) {
    b->Arg(1)->Arg(all_threads_arg())->ArgName("threads")->UseRealTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_adam<float, no_copy>)->Apply(step_args);
BENCHMARK(BM_adam<float16, no_copy>)->Apply(step_args);
BENCHMARK(BM_adam<bfloat16, no_copy>)->Apply(step_args);
BENCHMARK(BM_adam<float16, float16>)->Apply(copy_args);
BENCHMARK(BM_adam<bfloat16, bfloat16>)->Apply(copy_args);
BENCHMARK(BM_adam<float, no_copy>)->Apply(scalar_args);
BENCHMARK(BM_adam<float16, no_copy>)->Apply(scalar_args);
BENCHMARK(BM_adam<bfloat16, no_copy>)->Apply(scalar_args);
BENCHMARK(BM_stream<float, no_copy>)->Apply(stream_args);
BENCHMARK(BM_stream<float16, no_copy>)->Apply(stream_args);
BENCHMARK(BM_stream<bfloat16, no_copy>)->Apply(stream_args);

// ---- Widening and narrowing vs memcpy of the same bytes (one thread) -----------------------
// A conversion of n values reads in_bytes and writes out_bytes; the limit is a memcpy moving
// the same total, (in_bytes + out_bytes) / 2 each way, timed in the same iteration.
template <class Half, bool Widen>
void BM_convert(benchmark::State& state) {
    arrays& a = data();
    const auto level = static_cast<simd_level>(state.range(0));
    if (!spillway::detail::supported(level)) {
        state.SkipWithError("SIMD level not supported on this CPU");
        return;
    }
    const std::size_t n = a.n;
    // Own buffers: widen reads the gradients and writes `wide`; narrow reads the params and
    // writes `narrow_out`; memcpy copies between two scratch arrays. The step's arrays keep
    // their values. The outputs are written once here, untimed: otherwise the first row that
    // runs (the widest kernel) pays every first-touch page fault of its output (vs_limit 0.06
    // in its first repetition, 0.6-1.3 in the next).
    static auto wide = [n] {
        auto w = aligned_array<float>(n);
        std::memset(static_cast<void*>(w.get()), 0, n * sizeof(float));
        return w;
    }();
    static auto narrow_out = [n] {
        auto h = aligned_array<Half>(n);
        std::memset(static_cast<void*>(h.get()), 0, n * sizeof(Half));
        return h;
    }();
    static auto scratch_src = aligned_array<char>(n * 3), scratch_dst = aligned_array<char>(n * 3);
    const std::size_t copy_bytes = n * 3;  // (2n + 4n) / 2
    char* src = scratch_src.get();
    char* dst = scratch_dst.get();
    std::memset(src, 1, copy_bytes);
    std::memset(dst, 2, copy_bytes);
    double work_s = 0, limit_s = 0;
    for (auto _ : state) {
        auto t0 = clock_type::now();
        std::memcpy(dst, src, copy_bytes);
        benchmark::ClobberMemory();
        auto t1 = clock_type::now();
        if constexpr (Widen) spillway::detail::widen(level, a.grads<Half>(), wide.get(), n);
        else spillway::detail::narrow(level, a.p.get(), narrow_out.get(), n);
        benchmark::ClobberMemory();
        auto t2 = clock_type::now();
        limit_s += std::chrono::duration<double>(t1 - t0).count();
        work_s += std::chrono::duration<double>(t2 - t1).count();
        state.SetIterationTime(std::chrono::duration<double>(t2 - t1).count());
    }
    set_counters(state, 6.0, work_s, limit_s);
}
void convert_args(benchmark::internal::Benchmark* b) {
    for (std::int64_t l = static_cast<std::int64_t>(spillway::detail::best_simd_level()); l >= 0; --l) b->Arg(l);
    b->ArgName("simd")->UseManualTime()->Unit(benchmark::kMillisecond);
}
BENCHMARK(BM_convert<float16, true>)->Name("BM_widen<float16>")->Apply(convert_args);
BENCHMARK(BM_convert<bfloat16, true>)->Name("BM_widen<bfloat16>")->Apply(convert_args);
BENCHMARK(BM_convert<float16, false>)->Name("BM_narrow<float16>")->Apply(convert_args);
BENCHMARK(BM_convert<bfloat16, false>)->Name("BM_narrow<bfloat16>")->Apply(convert_args);

}  // namespace

BENCHMARK_MAIN();
