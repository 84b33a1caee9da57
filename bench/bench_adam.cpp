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
#include <spillway/optim/adam.hpp>

#include "support/bench_env.hpp"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <random>
#include <thread>
#include <type_traits>
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
template <class Grad>
SPILLWAY_TARGET_AVX512 inline __m512i grad_bits16(const Grad* g) noexcept {
    if constexpr (std::is_same_v<Grad, float>) return _mm512_loadu_si512(g);
    else return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g)));
}
template <class Grad, class Copy>
SPILLWAY_TARGET_AVX512 void stream_avx512(float* p, float* m, float* v, const Grad* g, Copy* out, std::size_t n,
                                          std::uint32_t zero) noexcept {
    const __m512i z = _mm512_set1_epi32(static_cast<int>(zero));
    std::size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i pv = _mm512_loadu_si512(p + i), mv = _mm512_loadu_si512(m + i), vv = _mm512_loadu_si512(v + i);
        pv = _mm512_xor_si512(pv, _mm512_and_si512(grad_bits16(g + i), z));
        _mm512_storeu_si512(p + i, pv);
        _mm512_storeu_si512(m + i, _mm512_xor_si512(mv, z));
        _mm512_storeu_si512(v + i, _mm512_xor_si512(vv, z));
        if constexpr (!std::is_same_v<Copy, no_copy>)
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_cvtepi32_epi16(pv));
    }
    stream_scalar(p + i, m + i, v + i, g + i, out ? out + i : out, n - i, zero);
}
#if defined(__GNUC__) && !defined(__clang__)
#  pragma GCC diagnostic pop
#endif
#endif

template <class Grad, class Copy>
void run_stream(simd_level level, thread_pool& pool) {
    arrays& a = data();
    const std::size_t tile = spillway::detail::adam_tile, tiles = (a.n + tile - 1) / tile;
    const std::uint32_t zero = hidden_zero;
    pool.parallel_for(
        tiles,
        [&](std::size_t b, std::size_t e) {
            std::size_t lo = b * tile, hi = std::min(a.n, e * tile);
            Copy* out = nullptr;
            if constexpr (!std::is_same_v<Copy, no_copy>) out = a.copy<Copy>() + lo;
#if SPILLWAY_X86_SIMD
            if (level == simd_level::avx512)
                return stream_avx512(a.p.get() + lo, a.m.get() + lo, a.v.get() + lo, a.grads<Grad>() + lo, out, hi - lo,
                                     zero);
#endif
            (void)level;
            stream_scalar(a.p.get() + lo, a.m.get() + lo, a.v.get() + lo, a.grads<Grad>() + lo, out, hi - lo, zero);
        },
        4);
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
    const simd_level stream_level = spillway::detail::best_simd_level();
    if (level != simd_level::scalar) run_step<Grad, Copy>(level, check, 1, pool);  // warm-up
    run_stream<Grad, Copy>(stream_level, pool);
    double work_s = 0, limit_s = 0;
    std::int64_t t = 2;
    for (auto _ : state) {
        auto t0 = clock_type::now();
        run_stream<Grad, Copy>(stream_level, pool);
        auto t1 = clock_type::now();
        run_step<Grad, Copy>(level, check, t++, pool);
        auto t2 = clock_type::now();
        const double step_s = std::chrono::duration<double>(t2 - t1).count();
        limit_s += std::chrono::duration<double>(t1 - t0).count();
        work_s += step_s;
        state.SetIterationTime(step_s);
    }
    set_counters(state, bytes_per_param<Grad, Copy>(), work_s, limit_s);
}

// The limit alone, for the table.
template <class Grad, class Copy>
void BM_stream(benchmark::State& state) {
    thread_pool& pool = pool_for(static_cast<std::size_t>(state.range(0)));
    run_stream<Grad, Copy>(spillway::detail::best_simd_level(), pool);
    for (auto _ : state) run_stream<Grad, Copy>(spillway::detail::best_simd_level(), pool);
    set_counters(state, bytes_per_param<Grad, Copy>(), 0, 0);
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
