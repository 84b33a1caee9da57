// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/gpt2.hpp: GPT-2 (as in llm.c and nanoGPT) on the CPU, in fp32.
//
// The model: token + learned position embeddings, L pre-LayerNorm blocks (causal multi-head
// self-attention, GELU(tanh) MLP, residuals), a final LayerNorm and an LM head tied to the
// token embedding. The vocabulary may be padded (Vp >= V): padded logits are ignored by the
// softmax and the cross-entropy, so padded rows of wte never receive a gradient.
//
// What this file guarantees:
// - Forward and backward are function pairs (`*_forward` / `*_backward`) with the shapes in
//   comments; B batch, T time, C channels, NH heads, hs = C/NH, V real vocab, Vp padded vocab.
// - Results are a pure function of (parameters, tokens, thread count): every kernel splits its
//   work into chunks that depend only on the sizes and the thread count, and each output is
//   computed by one thread in a fixed order. The same run twice gives the same bits.
// - Parameters live in one contiguous fp32 block, layer-major (param_layout: the embeddings,
//   then each layer's tensors together, then the final LayerNorm); gradients use the same
//   layout. Checkpoints are in llm.c's order (wte, wpe, ln1w over all layers, ln1b, ...);
//   load_llmc_params() and llmc_params() convert. Forward and backward reach them through a
//   param_store: the model's own blocks by default, or a store that streams each layer's
//   params and updates it in backward (--offload params, streamed_params.hpp).
// - Activations are grouped per layer (one contiguous block each, see layer_acts) so that a
//   store can keep, offload or bring back a whole layer at once (activation_store).
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "spillway/thread_pool.hpp"

namespace mini_gpt {

struct gpt2_config {
    int max_seq_len = 64;         // maxT: rows of wpe
    int vocab_size = 256;         // V: real tokens
    int padded_vocab_size = 256;  // Vp >= V: rows of wte
    int num_layers = 4;           // L
    int num_heads = 4;            // NH
    int channels = 128;           // C

    /// Throws std::invalid_argument naming the field when the config cannot describe a model
    /// (non-positive sizes, Vp < V, C not divisible by NH).
    void validate() const;
    friend bool operator==(const gpt2_config&, const gpt2_config&) = default;
};

/// The 16 parameter tensors in llm.c's order.
inline constexpr int num_param_tensors = 16;
inline constexpr std::array<const char*, num_param_tensors> param_names = {
    "wte",  "wpe",  "ln1w", "ln1b", "qkvw",    "qkvb",    "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw",  "fcb",  "fcprojw", "fcprojb", "lnfw",     "lnfb"};

/// Where each parameter tensor lives. The model keeps its block layer-major: wte, wpe, then
/// layer 0's twelve tensors (ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb,
/// fcprojw, fcprojb), ..., layer L-1's, then lnfw, lnfb. So each layer's parameters are one
/// contiguous run, and an optimizer that walks the block upwards finishes the embeddings,
/// then layer 0, then layer 1, ...: the trainer lets the next forward start on each layer as
/// soon as its parameters are updated. Checkpoints keep llm.c's order (one tensor per kind
/// over all layers, `param_names`); to_llmc_order() and from_llmc_order() convert.
struct param_layout {
    std::array<std::size_t, num_param_tensors> sizes{};  // floats of each kind, all layers together
    std::array<std::size_t, num_param_tensors>
        llmc_offsets{};  // where each kind starts in llm.c's order
    std::size_t total = 0;
    explicit param_layout(const gpt2_config& c);
    /// Where tensor `kind` of `layer` starts in the model's block (layer is ignored for wte,
    /// wpe, lnfw and lnfb).
    [[nodiscard]] std::size_t offset(int kind, int layer = 0) const noexcept;
    /// [begin, end) of the parameters layer `layer` reads in forward (its twelve tensors);
    /// layer -1 is the embeddings (wte, wpe), layer L the final LayerNorm.
    [[nodiscard]] std::pair<std::size_t, std::size_t> layer_range(int layer) const noexcept;
    /// Copies the model's block into llm.c's order, and back (both `total` floats; throws
    /// std::invalid_argument otherwise).
    void to_llmc_order(std::span<const float> model, std::span<float> llmc) const {
        convert(model, llmc, true);
    }
    void from_llmc_order(std::span<const float> llmc, std::span<float> model) const {
        convert(llmc, model, false);
    }

private:
    int layers_ = 0;
    std::size_t layer_floats_ = 0;  // one layer's twelve tensors
    std::array<std::size_t, num_param_tensors>
        in_layer_{};  // a layer tensor's offset within its layer
    void convert(std::span<const float> from, std::span<float> to, bool to_llmc) const;
};

/// One layer's parameter (or gradient) tensors.
struct layer_params {
    float *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw,
        *fcprojb;
};

/// Pointers into one parameter (or gradient) block in the model's (layer-major) layout.
struct param_views {
    float *wte, *wpe, *lnfw, *lnfb;
    param_views(float* base, const param_layout& layout);
    [[nodiscard]] layer_params layer(int l) const noexcept;

private:
    float* base_;
    const param_layout* layout_;
};

/// The parameters and gradients of one layer, laid out as one layer's run of the model's
/// block (param_layout::layer_range(layer)) starting at `begin`.
layer_params layer_params_at(const param_layout& layout, int layer, float* begin) noexcept;

/// Where the parameters and their gradients live during a step: the seam like
/// activation_store for activations. The embeddings (wte, wpe) and the final LayerNorm
/// ("the ends") are resident, read and written freely; each transformer layer's params are
/// asked for when used. Protocol, per step:
///  1. forward, l = 0..L-1: `forward_layer(l)` gives layer l's params (read only) until
///     `forward_done(l)`, which follows its forward at once;
///  2. backward, l = L-1..0: `backward_layer(l)` gives its params, `layer_grads(l)` the
///     buffer its gradients go to (backward overwrites every one of them, so no zeroing
///     pass); `grads_done(l)` says they are final: backward reads neither again this step
///     (a store may reduce them, update the layer and let it go).
class param_store {
public:
    /// Pointers to the ends' tensors (params or grads).
    struct ends_t {
        float *wte, *wpe, *lnfw, *lnfb;
    };
    virtual ~param_store() = default;
    virtual ends_t ends_params() = 0;
    virtual ends_t ends_grads() = 0;
    virtual layer_params forward_layer(int layer) = 0;
    virtual void forward_done(int layer) = 0;
    virtual layer_params backward_layer(int layer) = 0;
    virtual layer_params layer_grads(int layer) = 0;
    virtual void grads_done(int layer) = 0;
};

/// Today's store: views into one model-sized parameter block and one gradient block.
class in_memory_params final : public param_store {
public:
    in_memory_params(float* params, float* grads, const param_layout& layout)
        : p_(params, layout), g_(grads, layout) {}
    ends_t ends_params() override { return {p_.wte, p_.wpe, p_.lnfw, p_.lnfb}; }
    ends_t ends_grads() override { return {g_.wte, g_.wpe, g_.lnfw, g_.lnfb}; }
    layer_params forward_layer(int layer) override { return p_.layer(layer); }
    void forward_done(int) override {}
    layer_params backward_layer(int layer) override { return p_.layer(layer); }
    layer_params layer_grads(int layer) override { return g_.layer(layer); }
    void grads_done(int) override {}

private:
    param_views p_, g_;
};

/// Whether a gpt2 holds its parameters and gradients itself.
enum class param_memory {
    owned,     ///< model-sized params and grads blocks (params(), grads()) in memory
    external,  ///< none: the trainer gives a param_store (use_param_store) before forward
};

/// The activations one layer saves for its backward pass, as forward writes them. Each
/// pointer is one tensor; the in-memory store lays them out in one block per layer, the
/// offloading store gives each its own buffer.
struct layer_acts {
    const float* inp = nullptr;  // (B,T,C) the layer's input: the previous layer's residual3
    float* ln1 = nullptr;        // (B,T,C)
    float* ln1_mean = nullptr;   // (B,T)
    float* ln1_rstd = nullptr;   // (B,T)
    float* qkv = nullptr;        // (B,T,3C)
    float* att = nullptr;        // (B,NH,T,T) softmax probabilities
    float* atty = nullptr;       // (B,T,C)
    float* residual2 = nullptr;  // (B,T,C)
    float* ln2 = nullptr;        // (B,T,C)
    float* ln2_mean = nullptr;   // (B,T)
    float* ln2_rstd = nullptr;   // (B,T)
    float* fch = nullptr;        // (B,T,4C)
    float* fch_gelu = nullptr;   // (B,T,4C)
    float* residual3 = nullptr;  // (B,T,C) the layer's output
    static constexpr int num_tensors = 13;  // ln1 .. residual3, in this order
    /// Index of each owned tensor in tensors(), names and tensor_floats().
    enum tensor_index : int {
        ln1_i,
        ln1_mean_i,
        ln1_rstd_i,
        qkv_i,
        att_i,
        atty_i,
        residual2_i,
        ln2_i,
        ln2_mean_i,
        ln2_rstd_i,
        fch_i,
        fch_gelu_i,
        residual3_i
    };
    /// The owned tensors' names, in declaration order.
    static constexpr std::array<const char*, num_tensors> names = {
        "ln1", "ln1_mean", "ln1_rstd", "qkv", "att",      "atty",     "residual2",
        "ln2", "ln2_mean", "ln2_rstd", "fch", "fch_gelu", "residual3"};
    /// Pointers to the 13 owned tensors, in declaration order.
    [[nodiscard]] std::array<float**, num_tensors> tensors() noexcept {
        return {&ln1, &ln1_mean, &ln1_rstd, &qkv, &att,      &atty,     &residual2,
                &ln2, &ln2_mean, &ln2_rstd, &fch, &fch_gelu, &residual3};
    }
    /// The tensors backward can recompute cheaply (see layer_saved::recompute).
    static constexpr bool recomputable(int i) noexcept {
        return i == ln1_i || i == ln2_i || i == fch_gelu_i || i == att_i || i == atty_i;
    }
    /// Floats of each owned tensor for batch B and time T, in declaration order.
    static std::array<std::size_t, num_tensors> tensor_floats(const gpt2_config& c, int B, int T);
    /// Floats in one layer block (the sum of tensor_floats).
    static std::size_t floats(const gpt2_config& c, int B, int T);
    /// Floats of one layer block less the recomputable tensors: what a store that recomputes
    /// them writes per layer.
    static std::size_t stored_floats(const gpt2_config& c, int B, int T);
    layer_acts() = default;
    /// Lays the tensors out in one block of floats(c, B, T) floats.
    layer_acts(float* block, const float* input, const gpt2_config& c, int B, int T);
};

/// What backward reads of one layer (activation_store::need): the tensors forward saved,
/// read-only, with the shapes of layer_acts.
struct layer_saved {
    const float *inp = nullptr, *ln1 = nullptr, *ln1_mean = nullptr, *ln1_rstd = nullptr,
                *qkv = nullptr;
    const float *att = nullptr, *atty = nullptr, *residual2 = nullptr, *ln2 = nullptr,
                *ln2_mean = nullptr;
    const float *ln2_rstd = nullptr, *fch = nullptr, *fch_gelu = nullptr, *residual3 = nullptr;
    /// True when a store did not keep ln1, ln2, fch_gelu, att and atty (recomputable()): they
    /// then point to the buffers of `scratch` (ln1 and ln2 to the same one), and backward first
    /// recomputes each of them there, just before its first use (fch_gelu from fch, ln2 from
    /// residual2, att and atty from qkv, ln1 from inp with the kept LayerNorm statistics),
    /// with the same kernels on the same inputs as forward: the same bits, for cheap passes
    /// (two elementwise, one attention forward) instead of 7 (B,T,C) tensors and the (B,NH,T,T)
    /// attention probabilities' worth of storage traffic each way.
    bool recompute = false;
    /// Where backward recomputes (only with `recompute`): ln1 and ln2 (B,T,C), att (B,NH,T,T),
    /// atty (B,T,C), fch_gelu (B,T,4C).
    struct recompute_buffers {
        float *ln = nullptr, *att = nullptr, *atty = nullptr, *fch_gelu = nullptr;
    } scratch;
    layer_saved() = default;
    /// Every tensor of `a`, as forward wrote it (nothing to recompute).
    explicit layer_saved(const layer_acts& a) noexcept
        : inp(a.inp),
          ln1(a.ln1),
          ln1_mean(a.ln1_mean),
          ln1_rstd(a.ln1_rstd),
          qkv(a.qkv),
          att(a.att),
          atty(a.atty),
          residual2(a.residual2),
          ln2(a.ln2),
          ln2_mean(a.ln2_mean),
          ln2_rstd(a.ln2_rstd),
          fch(a.fch),
          fch_gelu(a.fch_gelu),
          residual3(a.residual3) {}
};

/// Where the per-layer activations live between forward and backward. The in-memory store
/// keeps them all; an offloading store (offload.cpp) hands them to Spillway's activation
/// stash and brings them back for backward. Protocol, for layers l = 0..L-1:
///  1. forward: `acquire(l, inp)` gives writable tensors for layer l (inp: its input);
///     `forward_done(l)` follows layer l's forward at once (the store may now offload every
///     tensor of layer l except its output residual3, which the next layer still reads);
///     after the final LayerNorm has read the last output, `forward_end()`.
///  2. backward, l = L-1..0: `need(l)` returns layer l's tensors with their contents, read-only
///     (layer_saved; it may be
///     called more than once per layer); `done_with(l, i)` says that layer l's backward reads
///     tensor i no more (the store may free it early, making room to prefetch layer l-1);
///     after layer l's backward, `backward_done(l)`.
class activation_store {
public:
    virtual ~activation_store() = default;
    virtual layer_acts acquire(int layer, const float* inp) = 0;
    virtual void forward_done(int layer) = 0;
    virtual void forward_end() = 0;
    virtual layer_saved need(int layer) = 0;
    virtual void done_with(int layer, layer_acts::tensor_index tensor) = 0;
    virtual void backward_done(int layer) = 0;
    /// Bytes of layer activations resident at the peak of the last step.
    [[nodiscard]] virtual std::size_t peak_bytes() const = 0;
    virtual void reset_peak() = 0;
    /// Bytes read from and written to storage so far (0 for a store that keeps everything in
    /// memory): subtract two to see one step.
    struct io_bytes {
        std::uint64_t read = 0, written = 0;
    };
    [[nodiscard]] virtual io_bytes traffic() const { return {}; }
    /// Lines for the summary table (bytes offloaded, dedup, forwarding...); may be empty.
    [[nodiscard]] virtual std::string report() const { return {}; }
};

/// Keeps every layer's block in memory (what `--offload none|optimizer` uses).
class in_memory_store final : public activation_store {
public:
    in_memory_store(const gpt2_config& c, int B, int T);
    layer_acts acquire(int layer, const float* inp) override;
    void forward_done(int) override {}
    void forward_end() override {}
    layer_saved need(int layer) override {
        return layer_saved(acts_[static_cast<std::size_t>(layer)]);
    }
    void done_with(int, layer_acts::tensor_index) override {}
    void backward_done(int) override {}
    [[nodiscard]] std::size_t peak_bytes() const override { return bytes_; }
    void reset_peak() override {}

private:
    gpt2_config config_;
    int B_, T_;
    std::vector<std::vector<float>> blocks_;
    std::vector<layer_acts> acts_;
    std::size_t bytes_;
};

/// Timings of one forward+backward, in milliseconds.
struct pass_times {
    double forward_ms = 0, backward_ms = 0, act_wait_ms = 0;
    double param_wait_ms = 0;  // forward waiting in its param_gate for parameters being updated
};

/// GPT-2 with its parameters, gradients and the activations outside the layer blocks.
class gpt2 {
public:
    /// A model of `config` whose parameters are zero; call init_gpt2() or load them.
    gpt2(const gpt2_config& config, spillway::thread_pool& pool,
         param_memory memory = param_memory::owned);

    /// Forward and backward take their params and put their gradients in `store` (which must
    /// outlive its use); nullptr: the model's own blocks (param_memory::owned only).
    void use_param_store(param_store* store);

    /// GPT-2 initialisation from `seed`: weights N(0, 0.02), residual projections
    /// N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weights 1; padded rows of wte are 0.
    void init_gpt2(std::uint64_t seed);

    /// Called by forward before it first reads the parameters of `layer` (-1: the embeddings,
    /// 0..L-1: a block, L: the final LayerNorm; param_layout::layer_range), in that order; it
    /// returns once they may be read (the trainer's wait for an update still running).
    using param_gate = std::function<void(int layer)>;

    /// Forward pass over inputs (B,T) and targets (B,T) (token ids < V); returns the mean
    /// cross-entropy. Activations go to `store`. B*T must fit the scratch given to
    /// reserve(); T <= max_seq_len. `gate` (may be empty) is asked before each layer's
    /// parameters are read; the time it takes is times().param_wait_ms.
    float forward(const int* inputs, const int* targets, int B, int T, activation_store& store,
                  const param_gate& gate = {});

    /// Called by backward each time more gradients are final: those of params [from, end of
    /// the block) hold their values for this step and will not change again in it (see
    /// backward()).
    using grads_final_fn = std::function<void(std::size_t from)>;

    /// Backward of the last forward: grads = d(loss * loss_scale)/d(params). Every gradient
    /// is overwritten (each is written once per step, so no zeroing pass is needed).
    /// `grads_final` (may be empty) hears, in this order, param_layout::layer_range(L).first
    /// (the final LayerNorm's gradients are done), layer_range(l).first after each layer
    /// l = L-1..0, and 0 at the end (the embeddings, whose wte also collects the LM head's
    /// part): the trainer's gate for an update that runs under backward. Backward reads the
    /// params of a layer only before it announces that layer (and wte's only before the
    /// first call), so such an update may change them once announced.
    void backward(float loss_scale, activation_store& store,
                  const grads_final_fn& grads_final = {});

    /// Allocates the activation scratch outside the layer blocks for batch B, time T.
    void reserve(int B, int T);

    [[nodiscard]] const gpt2_config& config() const noexcept { return config_; }
    [[nodiscard]] const param_layout& layout() const noexcept { return layout_; }
    [[nodiscard]] std::span<float> params() noexcept { return params_; }
    [[nodiscard]] std::span<const float> params() const noexcept { return params_; }
    [[nodiscard]] std::span<float> grads() noexcept { return grads_; }
    /// Sets the parameters from a block in llm.c's order (a checkpoint's), and gives them in it.
    void load_llmc_params(std::span<const float> llmc);
    [[nodiscard]] std::vector<float> llmc_params() const;
    /// Per-position losses of the last forward (B*T).
    [[nodiscard]] std::span<const float> losses() const noexcept { return losses_; }
    [[nodiscard]] const pass_times& times() const noexcept { return times_; }
    /// Bytes of activations outside the layer blocks (embedding output, final LN, logits).
    [[nodiscard]] std::size_t fixed_activation_bytes() const noexcept;

private:
    gpt2_config config_;
    spillway::thread_pool& pool_;
    param_layout layout_;
    std::vector<float> params_, grads_;  // empty with param_memory::external
    std::unique_ptr<in_memory_params> own_store_;
    param_store* pstore_ = nullptr;
    int B_ = 0, T_ = 0;
    // Activations outside the layer blocks.
    std::vector<float> encoded_;                    // (B,T,C)
    std::vector<float> lnf_, lnf_mean_, lnf_rstd_;  // (B,T,C), (B,T), (B,T)
    std::vector<float> logits_;                     // (B,T,Vp): logits, then probs, then dlogits
    std::vector<float> losses_;                     // (B,T)
    std::vector<int> inputs_, targets_;             // (B,T)
    // Gradient scratch of the activations.
    std::vector<float> dresidual_, dscratch_, dqkv_, datt_, dfch_, dln_;
    pass_times times_;
};

// ---- The kernels, exposed for the gradient tests -----------------------------------------
// All take the pool that parallelises them. `+=` in a comment means the kernel accumulates.
using spillway::thread_pool;

// out (B,T,C) = wte[inp] + wpe[t]
void encoder_forward(thread_pool& pool, float* out, const int* inp, const float* wte,
                     const float* wpe, int B, int T, int C);
// dwte (Vp,C) +=, dwpe (maxT,C) +=, from dout (B,T,C)
void encoder_backward(thread_pool& pool, float* dwte, float* dwpe, const float* dout,
                      const int* inp, int B, int T, int C);
// out (N,C) = the LayerNorm of inp with the mean and rstd layernorm_forward computed: the same
// bits as its out (backward's recompute)
void layernorm_apply(thread_pool& pool, float* out, const float* inp, const float* weight,
                     const float* bias, const float* mean, const float* rstd, int N, int C);
// out (N,C), mean (N), rstd (N) from inp (N,C), weight (C), bias (C)
void layernorm_forward(thread_pool& pool, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C);
// dinp (N,C) +=, dweight (C) =, dbias (C) = (overwritten)
void layernorm_backward(thread_pool& pool, float* dinp, float* dweight, float* dbias,
                        const float* dout, const float* inp, const float* weight, const float* mean,
                        const float* rstd, int N, int C);
// out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC); bias may be null
void matmul_forward(thread_pool& pool, float* out, const float* inp, const float* weight,
                    const float* bias, int N, int C, int OC);
// dinp (N,C) = dout (N,OC) @ weight (OC,C), dweight (OC,C) = dout^T @ inp, dbias (OC) = column sums
// of dout (may be null); all three overwritten
void matmul_backward(thread_pool& pool, float* dinp, float* dweight, float* dbias,
                     const float* dout, const float* inp, const float* weight, int N, int C,
                     int OC);
// out (B,T,C), att (B,NH,T,T) from qkv (B,T,3C): causal softmax(q k^T / sqrt(hs)) v
void attention_forward(thread_pool& pool, float* out, float* att, const float* qkv, int B, int T,
                       int C, int NH);
// dqkv (B,T,3C) = (overwritten), using datt scratch (B,NH,T,T)
void attention_backward(thread_pool& pool, float* dqkv, float* datt, const float* dout,
                        const float* qkv, const float* att, int B, int T, int C, int NH);
// exp(x) in float with relative error below 4e-7 for x in [-87, upper] (inputs outside are
// clamped to that range: no inf, no denormals; NaN stays NaN); branch-free and inline so that
// the loops calling it vectorise. `upper` (at most 88) is for callers that divide by the result:
// a vectorised loop computes the clamped case for every lane and blends afterwards, and
// x / (1 + exp(88)) is a denormal for |x| < 2, which costs an Intel core a microcode assist per
// vector (GELU passes 60).
inline float exp_approx(float x, float upper = 88.0f) noexcept {
    // 1. Clamp so that 2^n below stays a normal float: exp(-87) ~ 1.6e-38, exp(88) ~ 1.7e38.
    x = std::min(std::max(x, -87.0f), upper);
    // 2. x = n ln2 + r with n = round(x / ln2) (adding and subtracting 1.5 * 2^23 rounds to the
    //    nearest integer) and |r| <= ln2/2; ln2 in two parts so that n ln2 is exact enough.
    constexpr float round_magic = 0x1.8p23f;
    const float n = (x * 1.44269504088896341f + round_magic) - round_magic;
    const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    // 3. exp(r) by Cephes' expf polynomial, then times 2^n built in the exponent bits.
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    return p * std::bit_cast<float>((static_cast<std::int32_t>(n) + 127) << 23);
}

// out (N) = gelu_tanh(inp (N))
void gelu_forward(thread_pool& pool, float* out, const float* inp, std::size_t N);
// dinp (N) = gelu'(inp) * dout (overwritten; dinp may alias dout)
void gelu_backward(thread_pool& pool, float* dinp, const float* inp, const float* dout,
                   std::size_t N);
// out (N) = a (N) + b (N)
void residual_forward(thread_pool& pool, float* out, const float* a, const float* b, std::size_t N);
// logits (N,Vp) become probs in place (softmax over the first V, padded entries 0);
// losses (N) = -log probs[target]
void softmax_crossentropy_forward(thread_pool& pool, float* logits, float* losses,
                                  const int* targets, int N, int V, int Vp);
// probs (N,Vp) become dlogits in place: (probs - onehot(target)) * dloss; padded entries 0
void crossentropy_softmax_backward(thread_pool& pool, float* probs, const int* targets, float dloss,
                                   int N, int V, int Vp);

/// Model FLOPs of one training step (forward + backward) per token: 6 * non-embedding-matmul
/// params + the LM head and attention terms (as in the PaLM appendix).
double flops_per_token(const gpt2_config& c, int T);

/// gpt2::init_gpt2's values of layer `layer`'s params alone (param_layout::layer_range(layer):
/// -1 the embeddings, 0..L-1 a block, L the final LayerNorm), written to `out` (exactly that
/// range's floats): the same bits as the whole-model init for the same seed. The generator is
/// counter-based (SplitMix64), so each tensor's draws start at their index in the
/// whole-model order without drawing the ones before; for the same reason `pool` (optional)
/// may draw the pieces of a tensor on its threads with the same bits.
void init_gpt2_layer(const gpt2_config& c, std::uint64_t seed, int layer, std::span<float> out,
                     spillway::thread_pool* pool = nullptr);

}  // namespace mini_gpt
