// SPDX-License-Identifier: Apache-2.0
// examples/gpu_offload/mlp_step.hpp: the forward and backward pass of an MLP with L hidden
// layers of width H (x -> relu(x W0 + b0) -> ... -> relu(. W_{L-1} + b_{L-1}) -> W_L + b_L,
// mean squared error) as Thrust kernels written once: the GPU run executes them with
// spillway::cuda::stream_policy(stream) on device memory, the CPU-only run with thrust::host
// on host memory, and both give the same bits. Each kernel works on one linear layer, so a
// run may hold only some layers' weights at a time (offload_step.hpp).
//
// Why the bits agree: every output element is computed by one functor call that walks its
// sum in a fixed order with explicit fmaf (correctly rounded on both sides), the remaining
// operations are single IEEE adds, multiplies and compares, and the build turns off
// contraction (--fmad=false); parameters are the fp16 compute copy, widened exactly by
// to_float; gradients are rounded to fp16 by from_float on both sides.
//
// Shapes (row-major): x (B, I), hidden pre-activations h_l (B, H), y (B, O), t (B, O).
// Linear layer l (0 <= l <= L) has fan_in = I for l = 0 else H, fan_out = O for l = L else
// H; its parameters and gradients share one layout, W_l (fan_in, fan_out) | b_l (fan_out),
// and the layers follow each other in the flat arrays: layer 0 | layer 1 | ... | layer L.
// With L = 1 this is W1 (I, H) | b1 (H) | W2 (H, O) | b2 (O), the 2-layer MLP.
#pragma once

#include <algorithm>
#include <cstddef>
#include <math.h>  // fmaf on host and device

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include <spillway/config.hpp>
#include <spillway/optim/half.hpp>

#include "layer_ring.hpp"

namespace gpu_offload {

using spillway::float16;

/// The MLP's sizes and where each layer sits in the flat parameter array.
struct mlp_shape {
    std::size_t batch = 64, in = 256, hidden = 1024, out = 64;
    std::size_t layers = 1;  ///< hidden layers L (>= 1); the model has L + 1 linear layers

    /// Linear layers N = L + 1.
    [[nodiscard]] std::size_t linear_layers() const { return layers + 1; }
    /// Inputs of linear layer l.
    [[nodiscard]] std::size_t fan_in(std::size_t l) const { return l == 0 ? in : hidden; }
    /// Outputs of linear layer l.
    [[nodiscard]] std::size_t fan_out(std::size_t l) const { return l == layers ? out : hidden; }
    /// Parameters of linear layer l: W (fan_in, fan_out) and b (fan_out).
    [[nodiscard]] std::size_t layer_params(std::size_t l) const { return fan_in(l) * fan_out(l) + fan_out(l); }
    /// Where linear layer l starts in the flat arrays.
    [[nodiscard]] std::size_t offset(std::size_t l) const {
        if (l == 0) return 0;
        return layer_params(0) + (l - 1) * layer_params(1);  // layers 1..L-1 are all H x H
    }
    /// Parameters in total.
    [[nodiscard]] std::size_t params() const { return offset(layers) + layer_params(layers); }
    /// The largest layer's parameters.
    [[nodiscard]] std::size_t max_layer_params() const {
        std::size_t m = std::max(layer_params(0), layer_params(layers));
        return layers > 1 ? std::max(m, layer_params(1)) : m;
    }
    /// Elements of one backward buffer (dL/d pre-activation of any layer but the first).
    [[nodiscard]] std::size_t backward_elements() const { return batch * std::max(hidden, out); }
};

/// The device bytes of each buffer the budgeted run holds (layer_ring.hpp plans with them):
/// a weight or gradient slot holds the largest layer in fp16; an activation buffer one
/// hidden pre-activation in fp32; the fixed part is x, t, y, the per-sample loss and two
/// backward buffers.
[[nodiscard]] inline ring_sizes ring_sizes_of(const mlp_shape& s) {
    ring_sizes r;
    r.weight_slot = align_device(s.max_layer_params() * sizeof(float16));
    r.grad_slot = r.weight_slot;
    r.activation = align_device(s.batch * s.hidden * sizeof(float));
    r.fixed = align_device(s.batch * s.in * sizeof(float)) + 2 * align_device(s.batch * s.out * sizeof(float)) +
              align_device(s.batch * sizeof(float)) + 2 * align_device(s.backward_elements() * sizeof(float));
    return r;
}

/// What a linear layer's input goes through before the matrix product.
enum class input_kind {
    data,    ///< the batch x, used as is
    hidden,  ///< the previous layer's pre-activation, through relu
};

/// The operands of one linear layer in one pass (device memory for the GPU run, host memory
/// for the CPU).
struct layer_tensors {
    std::size_t batch = 0, fan_in = 0, fan_out = 0;
    const float* in = nullptr;      // (B, fan_in): x, or the previous layer's pre-activation
    const float16* w = nullptr;     // W (fan_in, fan_out) | b (fan_out), the compute copy
    float* out = nullptr;           // (B, fan_out) pre-activation (forward)
    const float* d_out = nullptr;   // (B, fan_out) dL/d out times the loss scale (backward)
    float* d_in = nullptr;          // (B, fan_in) dL/d in (pre-relu) times the loss scale (backward)
    float16* grad = nullptr;        // dW | db, same layout as w, times the loss scale
};

/// The loss and its gradient.
struct loss_tensors {
    std::size_t batch = 0, out = 0;
    const float* y = nullptr;    // (B, O)
    const float* t = nullptr;    // (B, O) targets
    float* sample_loss = nullptr;  // (B) sum over O of (y - t)^2
    float* dy = nullptr;         // (B, O) dL/dy times the loss scale
    float dy_coef = 0;           // 2 * loss_scale / (B * O)
};

SPILLWAY_HOST_DEVICE float relu(float v) { return v > 0.0f ? v : 0.0f; }

/// The activation applied to a dot product's left operand.
struct identity_fn {
    /// v unchanged.
    SPILLWAY_HOST_DEVICE float operator()(float v) const { return v; }
};
/// max(v, 0).
struct relu_fn {
    SPILLWAY_HOST_DEVICE float operator()(float v) const { return relu(v); }
};

/// acc + sum over i < n of act(a[i * a_stride]) * w[i * w_stride], in order of i, each step
/// one fmaf: the same bits on every backend.
template <class Activation>
SPILLWAY_HOST_DEVICE float dot(float acc, const float* a, std::size_t a_stride, const float16* w,
                               std::size_t w_stride, std::size_t n, Activation act) {
    for (std::size_t i = 0; i < n; ++i) acc = fmaf(act(a[i * a_stride]), spillway::to_float(w[i * w_stride]), acc);
    return acc;
}

// out[b, j] = b[j] + sum_i act(in[b, i]) * W[i, j]        idx = b * fan_out + j
template <class Activation>
struct linear_fn {
    layer_tensors m;
    SPILLWAY_HOST_DEVICE void operator()(std::size_t idx) const {
        std::size_t b = idx / m.fan_out, j = idx % m.fan_out;
        m.out[idx] = dot(spillway::to_float(m.w[m.fan_in * m.fan_out + j]), m.in + b * m.fan_in, 1, m.w + j, m.fan_out,
                         m.fan_in, Activation{});
    }
};
// sample_loss[b] = sum_k (y[b, k] - t[b, k])^2
struct loss_fn {
    loss_tensors m;
    SPILLWAY_HOST_DEVICE void operator()(std::size_t b) const {
        float acc = 0.0f;
        for (std::size_t k = 0; k < m.out; ++k) {
            float d = m.y[b * m.out + k] - m.t[b * m.out + k];
            acc = fmaf(d, d, acc);
        }
        m.sample_loss[b] = acc;
    }
};
// dy[b, k] = (y - t) * 2 * scale / (B * O)
struct dy_fn {
    loss_tensors m;
    SPILLWAY_HOST_DEVICE void operator()(std::size_t idx) const { m.dy[idx] = (m.y[idx] - m.t[idx]) * m.dy_coef; }
};
// dW[i, j] = sum_b act(in[b, i]) * d_out[b, j]  (idx < fan_in * fan_out),
// db[j] = sum_b d_out[b, j]  (the last fan_out)
template <class Activation>
struct weight_grad_fn {
    layer_tensors m;
    SPILLWAY_HOST_DEVICE void operator()(std::size_t idx) const {
        float acc = 0.0f;
        if (idx < m.fan_in * m.fan_out) {
            std::size_t i = idx / m.fan_out, j = idx % m.fan_out;
            for (std::size_t b = 0; b < m.batch; ++b)
                acc = fmaf(Activation{}(m.in[b * m.fan_in + i]), m.d_out[b * m.fan_out + j], acc);
        } else {
            std::size_t j = idx - m.fan_in * m.fan_out;
            for (std::size_t b = 0; b < m.batch; ++b) acc += m.d_out[b * m.fan_out + j];
        }
        m.grad[idx] = spillway::from_float<float16>(acc);
    }
};
// d_in[b, i] = (in[b, i] > 0) * sum_j d_out[b, j] * W[i, j]    idx = b * fan_in + i
struct input_grad_fn {
    layer_tensors m;
    SPILLWAY_HOST_DEVICE void operator()(std::size_t idx) const {
        std::size_t b = idx / m.fan_in, i = idx % m.fan_in;
        m.d_in[idx] = m.in[idx] > 0.0f ? dot(0.0f, m.d_out + b * m.fan_out, 1, m.w + i * m.fan_out, 1, m.fan_out,
                                             identity_fn{})
                                       : 0.0f;
    }
};

/// Runs `fn` for every index in [0, count) on `policy`.
template <class Policy, class Fn>
void launch(const Policy& policy, std::size_t count, Fn fn) {
    thrust::counting_iterator<std::size_t> first(0);
    thrust::for_each(policy, first, first + count, fn);
}

/// Forward of one linear layer: m.out from m.in and m.w.
template <class Policy>
void forward_layer(const Policy& p, const layer_tensors& m, input_kind kind) {
    if (kind == input_kind::data)
        launch(p, m.batch * m.fan_out, linear_fn<identity_fn>{m});
    else
        launch(p, m.batch * m.fan_out, linear_fn<relu_fn>{m});
}
/// The per-sample loss and dy.
template <class Policy>
void loss_and_dy(const Policy& p, const loss_tensors& m) {
    launch(p, m.batch, loss_fn{m});
    launch(p, m.batch * m.out, dy_fn{m});
}
/// Backward of one linear layer: m.grad from m.in and m.d_out; for a hidden input also
/// m.d_in (from m.d_out, m.w and the relu mask of m.in).
template <class Policy>
void backward_layer(const Policy& p, const layer_tensors& m, input_kind kind) {
    const std::size_t count = m.fan_in * m.fan_out + m.fan_out;
    if (kind == input_kind::data) {
        launch(p, count, weight_grad_fn<identity_fn>{m});
    } else {
        launch(p, count, weight_grad_fn<relu_fn>{m});
        launch(p, m.batch * m.fan_in, input_grad_fn{m});
    }
}

/// The whole model in one memory (the CPU-only run, and the tests' reference): every
/// layer's weights, every hidden pre-activation and the gradients of every layer.
struct mlp_tensors {
    mlp_shape s;
    const float* x = nullptr;         // (B, I)
    const float* t = nullptr;         // (B, O)
    const float16* params = nullptr;  // compute copy, flat layout
    float* hidden = nullptr;          // L x (B, H): h_0 .. h_{L-1}
    float* y = nullptr;               // (B, O)
    float* sample_loss = nullptr;     // (B)
    float* d0 = nullptr;              // (B, max(H, O)): backward buffers, used in turn
    float* d1 = nullptr;
    float16* grads = nullptr;         // flat layout, scaled by the loss scale
    float dy_coef = 0;                // 2 * loss_scale / (B * O)
};

/// Layer l's operands within `m`; backward position q = N - 1 - l reads d_out from d0 for
/// even q, d1 for odd q (dy is in d0) and writes d_in into the other.
[[nodiscard]] inline layer_tensors layer_of(const mlp_tensors& m, std::size_t l) {
    const mlp_shape& s = m.s;
    const std::size_t q = s.layers - l;
    layer_tensors t;
    t.batch = s.batch;
    t.fan_in = s.fan_in(l);
    t.fan_out = s.fan_out(l);
    t.in = l == 0 ? m.x : m.hidden + (l - 1) * s.batch * s.hidden;
    t.w = m.params + s.offset(l);
    t.out = l == s.layers ? m.y : m.hidden + l * s.batch * s.hidden;
    t.d_out = q % 2 == 0 ? m.d0 : m.d1;
    t.d_in = q % 2 == 0 ? m.d1 : m.d0;
    t.grad = m.grads + s.offset(l);
    return t;
}

/// The input kind of linear layer l.
[[nodiscard]] inline input_kind input_of(std::size_t l) { return l == 0 ? input_kind::data : input_kind::hidden; }

/// Forward through every layer, then the loss and dy (into m.d0).
template <class Policy>
void forward(const Policy& p, const mlp_tensors& m) {
    for (std::size_t l = 0; l <= m.s.layers; ++l) forward_layer(p, layer_of(m, l), input_of(l));
    loss_and_dy(p, loss_tensors{.batch = m.s.batch, .out = m.s.out, .y = m.y, .t = m.t, .sample_loss = m.sample_loss,
                                .dy = m.d0, .dy_coef = m.dy_coef});
}
/// Backward through every layer, last first: every gradient.
template <class Policy>
void backward(const Policy& p, const mlp_tensors& m) {
    for (std::size_t q = 0; q <= m.s.layers; ++q) {
        const std::size_t l = m.s.layers - q;
        backward_layer(p, layer_of(m, l), input_of(l));
    }
}

}  // namespace gpu_offload
