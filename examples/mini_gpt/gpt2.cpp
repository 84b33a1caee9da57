// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/gpt2.cpp: the GPT-2 kernels and the forward/backward passes.
// Structure learned from llm.c's train_gpt2.c (one function pair per layer type); the matrix
// products go to OpenBLAS's cblas_sgemm, called on slices of the output from our own thread
// pool (OpenBLAS itself runs single-threaded, so the split is ours and deterministic).
#include "gpt2.hpp"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numbers>
#include <stdexcept>

#include "spillway/optim/detail/simd.hpp"

namespace mini_gpt {

namespace {

using clock_type = std::chrono::steady_clock;
double ms_since(clock_type::time_point t0) {
    return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}
std::size_t sz(int v) {
    return static_cast<std::size_t>(v);
}

// ---- The kernels' loops on the CPU's widest vectors ------------------------------------------
// The build targets every x86-64 (SSE2), so a loop compiled as usual uses 4-float vectors and
// no FMA. Each kernel's parallel body runs through run_simd(), which calls it from a copy
// compiled for AVX-512 or AVX2 + FMA (the library's SIMD choice: the CPU's widest level,
// capped by SPILLWAY_SIMD): `flatten` inlines the body and everything it calls (exp_approx,
// the lane sums) into that copy, so its loops vectorise for that target.
// Results are deterministic on a machine; another level may round differently (FMA).
#if SPILLWAY_X86_SIMD
template <class Fn>
[[gnu::flatten]] SPILLWAY_TARGET_AVX512 void run_avx512(const Fn& fn, std::size_t a,
                                                        std::size_t b) {
    fn(a, b);
}
template <class Fn>
[[gnu::flatten]] SPILLWAY_TARGET_AVX2 void run_avx2(const Fn& fn, std::size_t a, std::size_t b) {
    fn(a, b);
}
#endif

template <class Fn>
void run_simd(const Fn& fn, std::size_t a, std::size_t b) {
#if SPILLWAY_X86_SIMD
    const spillway::detail::simd_level level =
        spillway::detail::best_simd_level();  // cached by the library
    if (level == spillway::detail::simd_level::avx512) return run_avx512(fn, a, b);
    if (level == spillway::detail::simd_level::avx2) return run_avx2(fn, a, b);
#endif
    fn(a, b);
}

/// pool.parallel_for(count, fn, grain), each chunk through run_simd.
template <class Fn>
void simd_for(thread_pool& pool, std::size_t count, const Fn& fn, std::size_t grain = 1) {
    pool.parallel_for(
        count, [&](std::size_t i0, std::size_t i1) { run_simd(fn, i0, i1); }, grain);
}

/// Runs fn(begin, end) in parallel over pieces that tile [0, count): as many as the pool runs
/// at once (thread_pool::chunks_per_thread per thread) where each can have at least `least`
/// items, as even as pieces whose sizes are multiples of 16 items allow (16 floats: a cache
/// line, and the matrix products' row unroll). Even pieces matter when they are few: 384 rows
/// for two threads become four pieces of 96, not three of 128 of which one thread would run
/// two.
template <class Fn>
void parallel_blocks(thread_pool& pool, std::size_t count, std::size_t least, const Fn& fn) {
    constexpr std::size_t align = 16;
    const std::size_t most = (pool.size() + 1) * thread_pool::chunks_per_thread;
    const std::size_t pieces =
        std::clamp<std::size_t>(count / std::max<std::size_t>(least, 1), 1, most);
    const std::size_t units = (count + align - 1) / align;
    const std::size_t per = (units + pieces - 1) / pieces * align;  // items per piece
    const std::size_t n = (count + per - 1) / per;
    simd_for(pool, n,
             [&](std::size_t p0, std::size_t p1) { fn(p0 * per, std::min(count, p1 * per)); });
}

/// A deterministic normal generator (splitmix64 + Box-Muller), the same on every platform.
class normal_rng {
public:
    explicit normal_rng(std::uint64_t seed) : state_(seed) {}
    double uniform() {  // (0, 1)
        std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        return (static_cast<double>(z >> 11) + 0.5) * 0x1.0p-53;
    }
    /// Moves the generator past `draws` normal() calls (each takes two uniforms): the state
    /// is a counter, so this is the same as drawing them.
    void skip_normals(std::uint64_t draws) { state_ += 2 * draws * 0x9E3779B97F4A7C15ull; }
    float normal(float stddev) {
        double u1 = uniform(), u2 = uniform();
        return static_cast<float>(stddev * std::sqrt(-2.0 * std::log(u1)) *
                                  std::cos(2.0 * std::numbers::pi * u2));
    }

private:
    std::uint64_t state_;
};

/// Partial sums per reduction: a sum over i is split into `lanes` running sums (lane j takes
/// i = j mod lanes) that are added at the end. The order is fixed, so results are the same
/// every run; the compiler keeps the lanes in vector registers, which it may not do for one
/// running sum (that would reorder the additions).
constexpr std::size_t lanes = 8;

/// sum over i < n of term(i), in `lanes` partial sums of type Acc.
template <class Acc, class Term>
Acc lane_sum(std::size_t n, Term&& term) {
    Acc acc[lanes] = {};
    std::size_t i = 0;
    for (; i + lanes <= n; i += lanes)
        for (std::size_t j = 0; j < lanes; ++j) acc[j] += static_cast<Acc>(term(i + j));
    for (std::size_t j = 0; i + j < n; ++j) acc[j] += static_cast<Acc>(term(i + j));
    Acc total = 0;
    for (Acc a : acc) total += a;
    return total;
}

/// max over i < n of x[i] (n >= 1), in `lanes` partial maxima.
float lane_max(const float* x, std::size_t n) {
    float acc[lanes];
    std::fill(acc, acc + lanes, x[0]);
    std::size_t i = 0;
    for (; i + lanes <= n; i += lanes)
        for (std::size_t j = 0; j < lanes; ++j) acc[j] = acc[j] < x[i + j] ? x[i + j] : acc[j];
    for (; i < n; ++i) acc[0] = acc[0] < x[i] ? x[i] : acc[0];
    return *std::max_element(acc, acc + lanes);
}

}  // namespace

// ---- Config and layout ------------------------------------------------------------------

void gpt2_config::validate() const {
    auto positive = [](int v, const char* name) {
        if (v <= 0)
            throw std::invalid_argument(std::string(name) + " must be positive, got " +
                                        std::to_string(v));
    };
    positive(max_seq_len, "max_seq_len");
    positive(vocab_size, "vocab_size");
    positive(padded_vocab_size, "padded_vocab_size");
    positive(num_layers, "num_layers");
    positive(num_heads, "num_heads");
    positive(channels, "channels");
    if (padded_vocab_size < vocab_size)
        throw std::invalid_argument("padded_vocab_size " + std::to_string(padded_vocab_size) +
                                    " is smaller than vocab_size " + std::to_string(vocab_size));
    if (channels % num_heads != 0)
        throw std::invalid_argument("channels " + std::to_string(channels) +
                                    " is not divisible by num_heads " + std::to_string(num_heads));
    if (vocab_size > 65536)
        throw std::invalid_argument("vocab_size " + std::to_string(vocab_size) +
                                    " does not fit uint16 token files (at most 65536)");
    // The parameter count, in double (32-bit fields can ask for more than 2^64 floats, which
    // would wrap to a small count in 64-bit integers; a double holds the bound check exactly
    // enough): at most 2^38 floats (1 TiB).
    const double C = channels, L = num_layers;
    const double total =
        padded_vocab_size * C + max_seq_len * C + L * (12 * C * C + 13 * C) + 2 * C;
    if (total > 0x1p38) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.3g", total);
        throw std::invalid_argument(
            std::string("the config asks for ") + buf +
            " parameters, more than the 2^38 (1 TiB of fp32) this trainer takes");
    }
}

namespace {
constexpr int first_layer_kind = 2, last_layer_kind = 13;  // ln1w .. fcprojb
bool is_layer_kind(int kind) {
    return kind >= first_layer_kind && kind <= last_layer_kind;
}
}  // namespace

param_layout::param_layout(const gpt2_config& c) : layers_(c.num_layers) {
    std::size_t Vp = sz(c.padded_vocab_size), C = sz(c.channels), L = sz(c.num_layers),
                maxT = sz(c.max_seq_len);
    sizes = {Vp * C, maxT * C, L * C,         L * C,     L * 3 * C * C, L * 3 * C, L * C * C, L * C,
             L * C,  L * C,    L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C,     C,         C};
    for (int i = 0; i < num_param_tensors; ++i) {
        llmc_offsets[sz(i)] = total;
        total += sizes[sz(i)];
    }
    for (int k = first_layer_kind; k <= last_layer_kind; ++k) {
        in_layer_[sz(k)] = layer_floats_;
        layer_floats_ += sizes[sz(k)] / L;
    }
}

std::size_t param_layout::offset(int kind, int layer) const noexcept {
    const std::size_t embeddings = sizes[0] + sizes[1], layers = layer_floats_ * sz(layers_);
    switch (kind) {
        case 0:
            return 0;
        case 1:
            return sizes[0];
        case 14:
            return embeddings + layers;
        case 15:
            return embeddings + layers + sizes[14];
        default:
            return embeddings + sz(layer) * layer_floats_ + in_layer_[sz(kind)];
    }
}

std::pair<std::size_t, std::size_t> param_layout::layer_range(int layer) const noexcept {
    if (layer < 0) return {0, sizes[0] + sizes[1]};
    if (layer >= layers_) return {offset(14), total};
    const std::size_t begin = offset(first_layer_kind, layer);
    return {begin, begin + layer_floats_};
}

void param_layout::convert(std::span<const float> from, std::span<float> to, bool to_llmc) const {
    if (from.size() != total || to.size() != total)
        throw std::invalid_argument(
            std::string("param_layout::") + (to_llmc ? "to_llmc_order" : "from_llmc_order") +
            ": blocks of " + std::to_string(from.size()) + " and " + std::to_string(to.size()) +
            " floats for a layout of " + std::to_string(total));
    // Every slice: one tensor for wte, wpe, lnfw, lnfb; one layer's part for the others.
    auto copy = [&](std::size_t model_at, std::size_t llmc_at, std::size_t n) {
        std::copy_n(from.data() + (to_llmc ? model_at : llmc_at), n,
                    to.data() + (to_llmc ? llmc_at : model_at));
    };
    for (int k = 0; k < num_param_tensors; ++k) {
        if (!is_layer_kind(k)) {
            copy(offset(k), llmc_offsets[sz(k)], sizes[sz(k)]);
            continue;
        }
        const std::size_t per_layer = sizes[sz(k)] / sz(layers_);
        for (int l = 0; l < layers_; ++l)
            copy(offset(k, l), llmc_offsets[sz(k)] + sz(l) * per_layer, per_layer);
    }
}

param_views::param_views(float* base, const param_layout& layout)
    : wte(base + layout.offset(0)),
      wpe(base + layout.offset(1)),
      lnfw(base + layout.offset(14)),
      lnfb(base + layout.offset(15)),
      base_(base),
      layout_(&layout) {}

layer_params param_views::layer(int l) const noexcept {
    auto at = [&](int kind) { return base_ + layout_->offset(kind, l); };
    return {at(2), at(3), at(4), at(5), at(6), at(7), at(8), at(9), at(10), at(11), at(12), at(13)};
}

layer_params layer_params_at(const param_layout& layout, int layer, float* begin) noexcept {
    // (a block as if the model's started layer_range(layer).first floats before `begin`:
    // only offsets inside the layer's range are formed from it)
    const std::size_t first = layout.layer_range(layer).first;
    auto at = [&](int kind) { return begin + (layout.offset(kind, layer) - first); };
    return {at(2), at(3), at(4), at(5), at(6), at(7), at(8), at(9), at(10), at(11), at(12), at(13)};
}

std::array<std::size_t, layer_acts::num_tensors> layer_acts::tensor_floats(const gpt2_config& c,
                                                                           int B, int T) {
    std::size_t BT = sz(B) * sz(T), C = sz(c.channels);
    std::size_t att = sz(B) * sz(c.num_heads) * sz(T) * sz(T);
    return {BT * C, BT, BT, 3 * BT * C, att,        BT * C, BT * C,
            BT * C, BT, BT, 4 * BT * C, 4 * BT * C, BT * C};
}

std::size_t layer_acts::floats(const gpt2_config& c, int B, int T) {
    std::size_t total = 0;
    for (std::size_t n : tensor_floats(c, B, T)) total += n;
    return total;
}

std::size_t layer_acts::stored_floats(const gpt2_config& c, int B, int T) {
    const auto sizes = tensor_floats(c, B, T);
    std::size_t total = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i)
        if (!recomputable(static_cast<int>(i))) total += sizes[i];
    return total;
}

layer_acts::layer_acts(float* block, const float* input, const gpt2_config& c, int B, int T)
    : inp(input) {
    auto sizes = tensor_floats(c, B, T);
    auto ptrs = tensors();
    for (std::size_t i = 0; i < ptrs.size(); ++i) {
        *ptrs[i] = block;
        block += sizes[i];
    }
}

in_memory_store::in_memory_store(const gpt2_config& c, int B, int T)
    : config_(c),
      B_(B),
      T_(T),
      blocks_(sz(c.num_layers), std::vector<float>(layer_acts::floats(c, B, T))),
      acts_(sz(c.num_layers)),
      bytes_(sz(c.num_layers) * layer_acts::floats(c, B, T) * sizeof(float)) {}

layer_acts in_memory_store::acquire(int layer, const float* inp) {
    auto l = static_cast<std::size_t>(layer);
    acts_[l] = layer_acts(blocks_[l].data(), inp, config_, B_, T_);
    return acts_[l];
}

double flops_per_token(const gpt2_config& c, int T) {
    double C = c.channels, L = c.num_layers;
    double n = L * 12.0 * C * C + C * c.padded_vocab_size;  // matmul params incl. the LM head
    return 6.0 * n + 12.0 * L * T * C;
}

// ---- Kernels ------------------------------------------------------------------------------

void encoder_forward(thread_pool& pool, float* out, const int* inp, const float* wte,
                     const float* wpe, int B, int T, int C) {
    simd_for(pool, sz(B) * sz(T), [&](std::size_t r0, std::size_t r1) {
        for (std::size_t r = r0; r < r1; ++r) {
            std::size_t t = r % sz(T);
            const float* we = wte + sz(inp[r]) * sz(C);
            const float* pe = wpe + t * sz(C);
            float* o = out + r * sz(C);
            for (int i = 0; i < C; ++i) o[i] = we[i] + pe[i];
        }
    });
}

void encoder_backward(thread_pool& pool, float* dwte, float* dwpe, const float* dout,
                      const int* inp, int B, int T, int C) {
    // Parallel over channels, so each gradient element is summed by one thread in token order.
    parallel_blocks(pool, sz(C), 16, [&](std::size_t c0, std::size_t c1) {
        for (std::size_t r = 0; r < sz(B) * sz(T); ++r) {
            std::size_t t = r % sz(T);
            const float* d = dout + r * sz(C);
            float* we = dwte + sz(inp[r]) * sz(C);
            float* pe = dwpe + t * sz(C);
            for (std::size_t i = c0; i < c1; ++i) {
                we[i] += d[i];
                pe[i] += d[i];
            }
        }
    });
}

namespace {
/// One row of LayerNorm's output from its mean m and rstd s (forward and its recompute).
inline void layernorm_row(float* o, const float* x, float m, float s, const float* weight,
                          const float* bias, int C) {
    for (int i = 0; i < C; ++i) o[i] = (x[i] - m) * s * weight[i] + bias[i];
}
}  // namespace

void layernorm_apply(thread_pool& pool, float* out, const float* inp, const float* weight,
                     const float* bias, const float* mean, const float* rstd, int N, int C) {
    simd_for(
        pool, sz(N),
        [&](std::size_t r0, std::size_t r1) {
            for (std::size_t r = r0; r < r1; ++r)
                layernorm_row(out + r * sz(C), inp + r * sz(C), mean[r], rstd[r], weight, bias, C);
        },
        4);
}

void layernorm_forward(thread_pool& pool, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C) {
    constexpr float eps = 1e-5f;
    simd_for(
        pool, sz(N),
        [&](std::size_t r0, std::size_t r1) {
            for (std::size_t r = r0; r < r1; ++r) {
                const float* x = inp + r * sz(C);
                const float m = lane_sum<float>(sz(C), [&](std::size_t i) { return x[i]; }) /
                                static_cast<float>(C);
                const float v =
                    lane_sum<float>(sz(C), [&](std::size_t i) { return (x[i] - m) * (x[i] - m); }) /
                    static_cast<float>(C);
                float s = 1.0f / std::sqrt(v + eps);
                layernorm_row(out + r * sz(C), x, m, s, weight, bias, C);
                mean[r] = m;
                rstd[r] = s;
            }
        },
        4);
}

namespace {
/// Columns of a sum over rows handled at once: their running sums fit in registers.
constexpr std::size_t column_block = 64;

/// out[c] = sum over rows r < rows of term(r, c), for c in [c0, c1), rows in order: each
/// column's running sum is local (a sum kept in `out` itself the compiler must store and
/// reload at every row, since `out` may alias the inputs), so the order of additions is the
/// plain loop's.
template <class Term>
void column_sums(float* out, std::size_t rows, std::size_t c0, std::size_t c1, const Term& term) {
    for (std::size_t b0 = c0; b0 < c1; b0 += column_block) {
        const std::size_t n = std::min(column_block, c1 - b0);
        float sum[column_block] = {};
        for (std::size_t r = 0; r < rows; ++r)
            for (std::size_t i = 0; i < n; ++i) sum[i] += term(r, b0 + i);
        std::copy(sum, sum + n, out + b0);
    }
}
}  // namespace

void layernorm_backward(thread_pool& pool, float* dinp, float* dweight, float* dbias,
                        const float* dout, const float* inp, const float* weight, const float* mean,
                        const float* rstd, int N, int C) {
    // 1. dinp, row by row.
    simd_for(
        pool, sz(N),
        [&](std::size_t r0, std::size_t r1) {
            for (std::size_t r = r0; r < r1; ++r) {
                const float* x = inp + r * sz(C);
                const float* d = dout + r * sz(C);
                float m = mean[r], s = rstd[r];
                const float dnorm_mean =
                    lane_sum<float>(sz(C), [&](std::size_t i) { return weight[i] * d[i]; }) /
                    static_cast<float>(C);
                const float dnorm_norm_mean =
                    lane_sum<float>(
                        sz(C), [&](std::size_t i) { return weight[i] * d[i] * ((x[i] - m) * s); }) /
                    static_cast<float>(C);
                float* di = dinp + r * sz(C);
                for (int i = 0; i < C; ++i) {
                    float norm = (x[i] - m) * s;
                    float dnorm = weight[i] * d[i];
                    di[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
                }
            }
        },
        4);
    // 2. dweight and dbias, channel by channel (each summed over rows, in row order, by one
    //    thread).
    parallel_blocks(pool, sz(C), 16, [&](std::size_t c0, std::size_t c1) {
        column_sums(dweight, sz(N), c0, c1, [&](std::size_t r, std::size_t i) {
            return dout[r * sz(C) + i] * ((inp[r * sz(C) + i] - mean[r]) * rstd[r]);
        });
        column_sums(dbias, sz(N), c0, c1,
                    [&](std::size_t r, std::size_t i) { return dout[r * sz(C) + i]; });
    });
}

void matmul_forward(thread_pool& pool, float* out, const float* inp, const float* weight,
                    const float* bias, int N, int C, int OC) {
    auto add_bias = [&](std::size_t n0, std::size_t n1, std::size_t o0, std::size_t o1) {
        if (!bias) return;
        for (std::size_t n = n0; n < n1; ++n)
            for (std::size_t o = o0; o < o1; ++o) out[n * sz(OC) + o] += bias[o];
    };
    if (OC >= N) {  // slices of output columns: out[:, o0:o1] = inp @ weight[o0:o1]^T
        parallel_blocks(pool, sz(OC), 64, [&](std::size_t o0, std::size_t o1) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, static_cast<int>(o1 - o0), C,
                        1.0f, inp, C, weight + o0 * sz(C), C, 0.0f, out + o0, OC);
            add_bias(0, sz(N), o0, o1);
        });
    } else {  // slices of output rows
        parallel_blocks(pool, sz(N), 16, [&](std::size_t n0, std::size_t n1) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n1 - n0), OC, C,
                        1.0f, inp + n0 * sz(C), C, weight, C, 0.0f, out + n0 * sz(OC), OC);
            add_bias(n0, n1, 0, sz(OC));
        });
    }
}

void matmul_backward(thread_pool& pool, float* dinp, float* dweight, float* dbias,
                     const float* dout, const float* inp, const float* weight, int N, int C,
                     int OC) {
    // 1. dinp (N,C) = dout (N,OC) @ weight (OC,C), split over the larger output dimension.
    if (N >= C) {
        parallel_blocks(pool, sz(N), 16, [&](std::size_t n0, std::size_t n1) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(n1 - n0), C, OC,
                        1.0f, dout + n0 * sz(OC), OC, weight, C, 0.0f, dinp + n0 * sz(C), C);
        });
    } else {
        parallel_blocks(pool, sz(C), 64, [&](std::size_t c0, std::size_t c1) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, static_cast<int>(c1 - c0), OC,
                        1.0f, dout, OC, weight + c0, C, 0.0f, dinp + c0, C);
        });
    }
    // 2. dweight (OC,C) = dout^T (OC,N) @ inp (N,C), and dbias (OC) = column sums of dout.
    parallel_blocks(pool, sz(OC), 64, [&](std::size_t o0, std::size_t o1) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(o1 - o0), C, N, 1.0f,
                    dout + o0, OC, inp, C, 0.0f, dweight + o0 * sz(C), C);
        if (dbias)
            column_sums(dbias, sz(N), o0, o1,
                        [&](std::size_t n, std::size_t o) { return dout[n * sz(OC) + o]; });
    });
}

void attention_forward(thread_pool& pool, float* out, float* att, const float* qkv, int B, int T,
                       int C, int NH) {
    // qkv (B,T,3C) holds q, k, v side by side; head h uses channels [h*hs, (h+1)*hs) of each.
    // One task per (b, h), three steps on that head's (T,T) slice of att:
    //  1. scores = q k^T / sqrt(hs), one matrix product (the masked half is computed and
    //     overwritten: cheaper than T products of growing length);
    //  2. each row t: causal softmax over t2 <= t, zeros after;
    //  3. out = att v, one matrix product (the zeros take no part).
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    simd_for(pool, sz(B) * sz(NH), [&](std::size_t p0, std::size_t p1) {
        for (std::size_t p = p0; p < p1; ++p) {
            const std::size_t b = p / sz(NH), h = p % sz(NH);
            const float* q = qkv + b * sz(T) * sz(C3) + h * sz(hs);
            const float* k = q + sz(C);
            const float* v = q + 2 * sz(C);
            float* a = att + p * sz(T) * sz(T);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, C3, k, C3,
                        0.0f, a, T);
            for (std::size_t t = 0; t < sz(T); ++t) {
                float* row = a + t * sz(T);
                const float maxv = lane_max(row, t + 1);
                for (std::size_t t2 = 0; t2 <= t; ++t2) row[t2] = exp_approx(row[t2] - maxv);
                const float inv =
                    1.0f / lane_sum<float>(t + 1, [&](std::size_t t2) { return row[t2]; });
                for (std::size_t t2 = 0; t2 <= t; ++t2) row[t2] *= inv;
                std::fill(row + t + 1, row + T, 0.0f);
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, v, C3,
                        0.0f, out + b * sz(T) * sz(C) + h * sz(hs), C);
        }
    });
}

void attention_backward(thread_pool& pool, float* dqkv, float* datt, const float* dout,
                        const float* qkv, const float* att, int B, int T, int C, int NH) {
    // One task per (b, h): it owns dq, dk, dv of that head, so no two tasks write the same float.
    // Per head, with att and datt (T,T) and q, k, v, dout (T,hs):
    //  1. datt = dout v^T and dv = att^T dout (out = att v);
    //  2. each row t: dpre[t2] = att[t2] (datt[t2] - sum_k att[k] datt[k]) / sqrt(hs) (softmax
    //     and scaling), in place in datt; att is 0 after t, so dpre is too;
    //  3. dq = dpre k and dk = dpre^T q (scores = q k^T / sqrt(hs)).
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    simd_for(pool, sz(B) * sz(NH), [&](std::size_t p0, std::size_t p1) {
        for (std::size_t p = p0; p < p1; ++p) {
            const std::size_t b = p / sz(NH), h = p % sz(NH);
            const std::size_t head = b * sz(T) * sz(C3) + h * sz(hs);
            const float* q = qkv + head;
            const float* k = q + sz(C);
            const float* v = q + 2 * sz(C);
            float* dq = dqkv + head;
            float* dk = dq + sz(C);
            float* dv = dq + 2 * sz(C);
            const float* d = dout + b * sz(T) * sz(C) + h * sz(hs);
            const float* a = att + p * sz(T) * sz(T);
            float* da = datt + p * sz(T) * sz(T);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, d, C, v, C3, 0.0f,
                        da, T);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, d, C, 0.0f,
                        dv, C3);
            for (std::size_t t = 0; t < sz(T); ++t) {
                const float* arow = a + t * sz(T);
                float* darow = da + t * sz(T);
                const float s =
                    lane_sum<float>(t + 1, [&](std::size_t t2) { return arow[t2] * darow[t2]; });
                for (std::size_t t2 = 0; t2 <= t; ++t2)
                    darow[t2] = arow[t2] * (darow[t2] - s) * scale;
                std::fill(darow + t + 1, darow + T, 0.0f);
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, da, T, k, C3,
                        0.0f, dq, C3);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, da, T, q, C3, 0.0f,
                        dk, C3);
        }
    });
}

namespace {
constexpr float gelu_scale = 0.7978845608028654f;  // sqrt(2/pi)
/// The GELU's inner argument u and its derivative du/dx.
inline float gelu_u(float x) noexcept {
    return gelu_scale * (x + 0.044715f * x * x * x);
}
inline float gelu_du(float x) noexcept {
    return gelu_scale * (1.0f + 3.0f * 0.044715f * x * x);
}
/// exp(-2u) is clamped at exp(60) (x below about -6.9), where x / (1 + exp(-2u)) is below 1e-25
/// in magnitude either way: never a denormal, even in the lanes a vectorised loop computes and
/// discards (see exp_approx).
constexpr float gelu_exp_upper = 60.0f;
}  // namespace

// 0.5 x (1 + tanh(u)) is written x * sigmoid(2u) = x / (1 + exp(-2u)): the same function
// without the cancellation of 1 + tanh(u) for negative x, and one exp_approx per element.
void gelu_forward(thread_pool& pool, float* out, const float* inp, std::size_t N) {
    parallel_blocks(pool, N, 4096, [&](std::size_t i0, std::size_t i1) {
        for (std::size_t i = i0; i < i1; ++i) {
            const float x = inp[i];
            out[i] = x / (1.0f + exp_approx(-2.0f * gelu_u(x), gelu_exp_upper));
        }
    });
}

void gelu_backward(thread_pool& pool, float* dinp, const float* inp, const float* dout,
                   std::size_t N) {
    // d/dx x sig(2u) = sig + x sig (1 - sig) 2 du/dx, with 1 - sig = e sig for e = exp(-2u).
    parallel_blocks(pool, N, 4096, [&](std::size_t i0, std::size_t i1) {
        for (std::size_t i = i0; i < i1; ++i) {
            const float x = inp[i];
            const float e = exp_approx(-2.0f * gelu_u(x), gelu_exp_upper);
            const float sig = 1.0f / (1.0f + e);
            const float grad = sig + 2.0f * x * gelu_du(x) * sig * (sig * e);
            dinp[i] = grad * dout[i];
        }
    });
}

void residual_forward(thread_pool& pool, float* out, const float* a, const float* b,
                      std::size_t N) {
    parallel_blocks(pool, N, 4096, [&](std::size_t i0, std::size_t i1) {
        for (std::size_t i = i0; i < i1; ++i) out[i] = a[i] + b[i];
    });
}

void softmax_crossentropy_forward(thread_pool& pool, float* logits, float* losses,
                                  const int* targets, int N, int V, int Vp) {
    simd_for(pool, sz(N), [&](std::size_t r0, std::size_t r1) {
        for (std::size_t r = r0; r < r1; ++r) {
            float* x = logits + r * sz(Vp);
            // 1. The row's maximum.
            const float maxv = lane_max(x, sz(V));
            // 2. exp(x - max) written in place and summed in the same pass, in float64 lanes
            //    (tens of thousands of terms); then the scaling.
            const double sum = lane_sum<double>(
                sz(V), [&](std::size_t i) { return x[i] = exp_approx(x[i] - maxv); });
            const float inv = static_cast<float>(1.0 / sum);
            for (std::size_t i = 0; i < sz(V); ++i) x[i] *= inv;
            std::fill(x + V, x + Vp, 0.0f);
            losses[r] = -std::log(x[targets[r]]);
        }
    });
}

void crossentropy_softmax_backward(thread_pool& pool, float* probs, const int* targets, float dloss,
                                   int N, int V, int Vp) {
    simd_for(pool, sz(N), [&](std::size_t r0, std::size_t r1) {
        for (std::size_t r = r0; r < r1; ++r) {
            float* p = probs + r * sz(Vp);
            const float target_grad = (p[targets[r]] - 1.0f) * dloss;
            for (std::size_t i = 0; i < sz(V); ++i) p[i] *= dloss;
            p[targets[r]] = target_grad;
            std::fill(p + V, p + Vp, 0.0f);
        }
    });
}

// ---- The model ------------------------------------------------------------------------------

gpt2::gpt2(const gpt2_config& config, thread_pool& pool, param_memory memory)
    : config_(config), pool_(pool), layout_((config.validate(), config)) {
    if (memory == param_memory::owned) {
        params_.assign(layout_.total, 0.0f);
        grads_.assign(layout_.total, 0.0f);
        own_store_ = std::make_unique<in_memory_params>(params_.data(), grads_.data(), layout_);
        pstore_ = own_store_.get();
    }
}

void gpt2::use_param_store(param_store* store) {
    if (!store && !own_store_)
        throw std::logic_error("gpt2: a model without its own parameters needs a param_store");
    pstore_ = store ? store : own_store_.get();
}

void init_gpt2_layer(const gpt2_config& c, std::uint64_t seed, int layer, std::span<float> out,
                     thread_pool* pool) {
    const param_layout layout(c);
    const auto [begin, end] = layout.layer_range(layer);
    if (out.size() != end - begin)
        throw std::invalid_argument("init_gpt2_layer: " + std::to_string(out.size()) +
                                    " floats for layer " + std::to_string(layer) + " of " +
                                    std::to_string(end - begin));
    // Draws in init_gpt2's order: wte (V rows), wpe, then qkvw, attprojw, fcw, fcprojw each
    // over all layers; everything else is 0 or 1.
    const std::size_t C = sz(c.channels), L = sz(c.num_layers), V = sz(c.vocab_size);
    const std::size_t wte_n = V * C, wpe_n = sz(c.max_seq_len) * C;
    const std::size_t qkv0 = wte_n + wpe_n, attproj0 = qkv0 + L * 3 * C * C,
                      fc0 = attproj0 + L * C * C, fcproj0 = fc0 + L * 4 * C * C;
    const float proj_std = 0.02f / std::sqrt(2.0f * static_cast<float>(L));
    std::fill(out.begin(), out.end(), 0.0f);
    auto normal = [&](float* w, std::size_t n, std::uint64_t first_draw, float stddev) {
        auto piece = [&](std::size_t from, std::size_t to) {
            normal_rng rng(seed);
            rng.skip_normals(first_draw + from);  // draw i of the tensor is draw first_draw+i
            for (std::size_t i = from; i < to; ++i) w[i] = rng.normal(stddev);
        };
        if (pool)
            pool->parallel_for(n, piece, std::size_t{1} << 14);
        else
            piece(0, n);
    };
    if (layer < 0) {  // wte (padded rows 0), wpe
        normal(out.data(), wte_n, 0, 0.02f);
        normal(out.data() + layout.sizes[0], wpe_n, wte_n, 0.02f);
        return;
    }
    if (layer >= c.num_layers) {  // lnfw 1, lnfb 0
        std::fill(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(C), 1.0f);
        return;
    }
    const layer_params w = layer_params_at(layout, layer, out.data());
    const std::size_t l = sz(layer);
    std::fill(w.ln1w, w.ln1w + C, 1.0f);
    normal(w.qkvw, 3 * C * C, qkv0 + l * 3 * C * C, 0.02f);
    normal(w.attprojw, C * C, attproj0 + l * C * C, proj_std);
    std::fill(w.ln2w, w.ln2w + C, 1.0f);
    normal(w.fcw, 4 * C * C, fc0 + l * 4 * C * C, 0.02f);
    normal(w.fcprojw, 4 * C * C, fcproj0 + l * 4 * C * C, proj_std);
}

void gpt2::init_gpt2(std::uint64_t seed) {
    // Drawn in llm.c's order (tensor by tensor over all layers), then laid out layer-major.
    normal_rng rng(seed);
    std::vector<float> llmc(layout_.total, 0.0f);
    auto at = [&](int kind) { return llmc.data() + layout_.llmc_offsets[sz(kind)]; };
    std::size_t C = sz(config_.channels), L = sz(config_.num_layers);
    float proj_std = 0.02f / std::sqrt(2.0f * static_cast<float>(L));
    auto normal = [&](float* w, std::size_t n, float stddev) {
        for (std::size_t i = 0; i < n; ++i) w[i] = rng.normal(stddev);
    };
    normal(at(0), sz(config_.vocab_size) * C, 0.02f);   // wte; padded rows stay 0
    normal(at(1), sz(config_.max_seq_len) * C, 0.02f);  // wpe
    std::fill(at(2), at(2) + L * C, 1.0f);              // ln1w
    normal(at(4), L * 3 * C * C, 0.02f);                // qkvw
    normal(at(6), L * C * C, proj_std);                 // attprojw
    std::fill(at(8), at(8) + L * C, 1.0f);              // ln2w
    normal(at(10), L * 4 * C * C, 0.02f);               // fcw
    normal(at(12), L * C * 4 * C, proj_std);            // fcprojw
    std::fill(at(14), at(14) + C, 1.0f);                // lnfw
    layout_.from_llmc_order(llmc, params_);
}

void gpt2::load_llmc_params(std::span<const float> llmc) {
    layout_.from_llmc_order(llmc, params_);
}

std::vector<float> gpt2::llmc_params() const {
    std::vector<float> out(layout_.total);
    layout_.to_llmc_order(params_, out);
    return out;
}

void gpt2::reserve(int B, int T) {
    if (T > config_.max_seq_len)
        throw std::invalid_argument("sequence length " + std::to_string(T) +
                                    " exceeds the model's max_seq_len " +
                                    std::to_string(config_.max_seq_len));
    if (B == B_ && T == T_) return;
    B_ = B;
    T_ = T;
    std::size_t BT = sz(B) * sz(T), C = sz(config_.channels);
    encoded_.assign(BT * C, 0.0f);
    lnf_.assign(BT * C, 0.0f);
    lnf_mean_.assign(BT, 0.0f);
    lnf_rstd_.assign(BT, 0.0f);
    logits_.assign(BT * sz(config_.padded_vocab_size), 0.0f);
    losses_.assign(BT, 0.0f);
    inputs_.assign(BT, 0);
    targets_.assign(BT, 0);
    dresidual_.assign(BT * C, 0.0f);
    dscratch_.assign(BT * C, 0.0f);
    dln_.assign(BT * C, 0.0f);
    dqkv_.assign(BT * 3 * C, 0.0f);
    dfch_.assign(BT * 4 * C, 0.0f);
    datt_.assign(sz(B) * sz(config_.num_heads) * sz(T) * sz(T), 0.0f);
}

std::size_t gpt2::fixed_activation_bytes() const noexcept {
    return (encoded_.size() + lnf_.size() + lnf_mean_.size() + lnf_rstd_.size() + logits_.size() +
            losses_.size()) *
           sizeof(float);
}

float gpt2::forward(const int* inputs, const int* targets, int B, int T, activation_store& store,
                    const param_gate& gate) {
    auto t0 = clock_type::now();
    double gate_ms = 0;
    auto wait_for = [&](int layer) {
        if (!gate) return;
        auto w0 = clock_type::now();
        gate(layer);
        gate_ms += ms_since(w0);
    };
    reserve(B, T);
    const int C = config_.channels, L = config_.num_layers, NH = config_.num_heads;
    const int V = config_.vocab_size, Vp = config_.padded_vocab_size, BT = B * T;
    const std::size_t Cs = sz(C);
    std::copy(inputs, inputs + BT, inputs_.begin());
    std::copy(targets, targets + BT, targets_.begin());
    for (int i = 0; i < BT; ++i) {
        if (inputs[i] < 0 || inputs[i] >= V || targets[i] < 0 || targets[i] >= V)
            throw std::invalid_argument("token id out of range [0, " + std::to_string(V) +
                                        ") at position " + std::to_string(i));
    }
    param_store& ps = *pstore_;
    const param_store::ends_t p = ps.ends_params();
    wait_for(-1);
    encoder_forward(pool_, encoded_.data(), inputs, p.wte, p.wpe, B, T, C);  // (B,T,C)
    const float* residual = encoded_.data();
    float* proj = dscratch_.data();  // (B,T,C) scratch for the projections' outputs
    for (int l = 0; l < L; ++l) {
        layer_acts a = store.acquire(l, residual);
        wait_for(l);
        const layer_params w = ps.forward_layer(l);
        layernorm_forward(pool_, a.ln1, a.ln1_mean, a.ln1_rstd, residual, w.ln1w, w.ln1b, BT, C);
        matmul_forward(pool_, a.qkv, a.ln1, w.qkvw, w.qkvb, BT, C, 3 * C);
        attention_forward(pool_, a.atty, a.att, a.qkv, B, T, C, NH);
        matmul_forward(pool_, proj, a.atty, w.attprojw, w.attprojb, BT, C, C);
        residual_forward(pool_, a.residual2, residual, proj, sz(BT) * Cs);
        layernorm_forward(pool_, a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, w.ln2w, w.ln2b, BT, C);
        matmul_forward(pool_, a.fch, a.ln2, w.fcw, w.fcb, BT, C, 4 * C);
        gelu_forward(pool_, a.fch_gelu, a.fch, sz(BT) * 4 * Cs);
        matmul_forward(pool_, proj, a.fch_gelu, w.fcprojw, w.fcprojb, BT, 4 * C, C);
        residual_forward(pool_, a.residual3, a.residual2, proj, sz(BT) * Cs);
        ps.forward_done(l);
        store.forward_done(l);
        residual = a.residual3;
    }
    wait_for(L);
    layernorm_forward(pool_, lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), residual, p.lnfw,
                      p.lnfb, BT, C);
    store.forward_end();
    matmul_forward(pool_, logits_.data(), lnf_.data(), p.wte, nullptr, BT, C,
                   Vp);  // (B,T,Vp), tied head
    softmax_crossentropy_forward(pool_, logits_.data(), losses_.data(), targets, BT, V, Vp);
    double sum = 0;
    for (float x : losses_) sum += x;
    times_.forward_ms = ms_since(t0);
    times_.param_wait_ms = gate_ms;
    return static_cast<float>(sum / BT);
}

void gpt2::backward(float loss_scale, activation_store& store, const grads_final_fn& grads_final) {
    auto t0 = clock_type::now();
    auto announce = [&](std::size_t from) {
        if (grads_final) grads_final(from);
    };
    double wait_ms = 0;
    auto need = [&](int l) {
        auto w0 = clock_type::now();
        layer_saved r = store.need(l);
        wait_ms += ms_since(w0);
        return r;
    };
    const int B = B_, T = T_, C = config_.channels, L = config_.num_layers, NH = config_.num_heads;
    const int V = config_.vocab_size, Vp = config_.padded_vocab_size, BT = B * T;
    const std::size_t Cs = sz(C);
    param_store& ps = *pstore_;
    const param_store::ends_t p = ps.ends_params(), g = ps.ends_grads();
    // Loss: mean over B*T positions, times the loss scale.
    crossentropy_softmax_backward(pool_, logits_.data(), targets_.data(),
                                  loss_scale / static_cast<float>(BT), BT, V, Vp);
    matmul_backward(pool_, dln_.data(), g.wte, nullptr, logits_.data(), lnf_.data(), p.wte, BT, C,
                    Vp);
    float* dres = dresidual_.data();  // gradient of the residual stream, (B,T,C)
    std::fill(dresidual_.begin(), dresidual_.end(), 0.0f);
    layernorm_backward(pool_, dres, g.lnfw, g.lnfb, dln_.data(), need(L - 1).residual3, p.lnfw,
                       lnf_mean_.data(), lnf_rstd_.data(), BT, C);
    store.done_with(L - 1, layer_acts::residual3_i);
    announce(layout_.layer_range(L).first);
    for (int l = L - 1; l >= 0; --l) {
        layer_saved a = need(l);
        const float* residual = a.inp;
        const layer_params pw = ps.backward_layer(l), gw = ps.layer_grads(l);
        // residual3 = residual2 + fcproj(gelu(fc(ln2(residual2)))): dres is d residual3.
        // Each tensor is given back (done_with) after the last kernel that reads it.
        if (a.recompute) gelu_forward(pool_, a.scratch.fch_gelu, a.fch, sz(BT) * 4 * Cs);
        matmul_backward(pool_, dfch_.data(), gw.fcprojw, gw.fcprojb, dres, a.fch_gelu, pw.fcprojw,
                        BT, 4 * C, C);
        store.done_with(l, layer_acts::fch_gelu_i);
        gelu_backward(pool_, dfch_.data(), a.fch, dfch_.data(), sz(BT) * 4 * Cs);
        store.done_with(l, layer_acts::fch_i);
        if (a.recompute)
            layernorm_apply(pool_, a.scratch.ln, a.residual2, pw.ln2w, pw.ln2b, a.ln2_mean,
                            a.ln2_rstd, BT, C);
        matmul_backward(pool_, dln_.data(), gw.fcw, gw.fcb, dfch_.data(), a.ln2, pw.fcw, BT, C,
                        4 * C);
        store.done_with(l, layer_acts::ln2_i);
        layernorm_backward(pool_, dres, gw.ln2w, gw.ln2b, dln_.data(), a.residual2, pw.ln2w,
                           a.ln2_mean, a.ln2_rstd, BT, C);
        store.done_with(l, layer_acts::residual2_i);
        // dres is now d residual2; residual2 = residual + attproj(attention(qkv(ln1(residual)))).
        if (a.recompute)
            attention_forward(pool_, a.scratch.atty, a.scratch.att, a.qkv, B, T, C, NH);
        matmul_backward(pool_, dscratch_.data(), gw.attprojw, gw.attprojb, dres, a.atty,
                        pw.attprojw, BT, C, C);
        store.done_with(l, layer_acts::atty_i);
        attention_backward(pool_, dqkv_.data(), datt_.data(), dscratch_.data(), a.qkv, a.att, B, T,
                           C, NH);
        store.done_with(l, layer_acts::att_i);
        store.done_with(l, layer_acts::qkv_i);
        if (a.recompute)
            layernorm_apply(pool_, a.scratch.ln, residual, pw.ln1w, pw.ln1b, a.ln1_mean, a.ln1_rstd,
                            BT, C);
        matmul_backward(pool_, dln_.data(), gw.qkvw, gw.qkvb, dqkv_.data(), a.ln1, pw.qkvw, BT, C,
                        3 * C);
        store.done_with(l, layer_acts::ln1_i);
        layernorm_backward(pool_, dres, gw.ln1w, gw.ln1b, dln_.data(), residual, pw.ln1w,
                           a.ln1_mean, a.ln1_rstd, BT, C);
        store.backward_done(l);  // dres is now d residual (the layer's input)
        ps.grads_done(l);
        announce(layout_.layer_range(l).first);
    }
    // The LM head's matmul_backward wrote g.wte; the embeddings add their part. Rows of wpe
    // past T get no gradient, so g.wpe starts from zero.
    std::fill(g.wpe, g.wpe + layout_.sizes[1], 0.0f);
    encoder_backward(pool_, g.wte, g.wpe, dres, inputs_.data(), B, T, C);
    announce(0);
    times_.backward_ms = ms_since(t0);
    times_.act_wait_ms = wait_ms;
}

}  // namespace mini_gpt
