// SPDX-License-Identifier: Apache-2.0
// examples/gpu_offload/mlp_step.hpp: the forward and backward pass of a 2-layer MLP
// (x -> relu(x W1 + b1) -> W2 + b2, mean squared error) as Thrust kernels written once: the
// GPU run executes them with spillway::cuda::stream_policy(stream) on device memory, the
// CPU-only run with thrust::host on host memory, and both give the same bits.
//
// Why the bits agree: every output element is computed by one functor call that walks its
// sum in a fixed order with explicit fmaf (correctly rounded on both sides), the remaining
// operations are single IEEE adds, multiplies and compares, and the build turns off
// contraction (--fmad=false); parameters are the fp16 compute copy, widened exactly by
// to_float; gradients are rounded to fp16 by from_float on both sides.
//
// Shapes (row-major): x (B, I), h_pre (B, H), y (B, O), t (B, O); params and grads share one
// layout: W1 (I, H) | b1 (H) | W2 (H, O) | b2 (O).
#pragma once

#include <cstddef>
#include <math.h>  // fmaf on host and device

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include <spillway/config.hpp>
#include <spillway/optim/half.hpp>

namespace gpu_offload {

using spillway::float16;

/// The MLP's sizes and where each tensor sits in the flat parameter array.
struct mlp_shape {
    std::size_t batch = 64, in = 256, hidden = 1024, out = 64;
    [[nodiscard]] SPILLWAY_HOST_DEVICE std::size_t w1() const { return 0; }
    [[nodiscard]] SPILLWAY_HOST_DEVICE std::size_t b1() const { return in * hidden; }
    [[nodiscard]] SPILLWAY_HOST_DEVICE std::size_t w2() const { return b1() + hidden; }
    [[nodiscard]] SPILLWAY_HOST_DEVICE std::size_t b2() const { return w2() + hidden * out; }
    [[nodiscard]] SPILLWAY_HOST_DEVICE std::size_t params() const { return b2() + out; }
};

/// The pointers one pass works on (device memory for the GPU run, host memory for the CPU).
struct mlp_tensors {
    mlp_shape s;
    const float* x = nullptr;         // (B, I)
    const float* t = nullptr;         // (B, O) targets
    const float16* params = nullptr;  // compute copy, flat layout
    float* h_pre = nullptr;           // (B, H) pre-activation: saved for backward
    float* y = nullptr;               // (B, O)
    float* sample_loss = nullptr;     // (B) sum over O of (y - t)^2
    float* dy = nullptr;              // (B, O) dL/dy times the loss scale
    float* dh = nullptr;              // (B, H) dL/dh_pre times the loss scale
    float16* grads = nullptr;         // flat layout, scaled by the loss scale
    float dy_coef = 0;                // 2 * loss_scale / (B * O)
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

// h_pre[b, j] = b1[j] + sum_i x[b, i] * W1[i, j]
struct hidden_fn {
    mlp_tensors m;
    SPILLWAY_HOST_DEVICE void operator()(std::size_t idx) const {
        std::size_t b = idx / m.s.hidden, j = idx % m.s.hidden;
        m.h_pre[idx] = dot(spillway::to_float(m.params[m.s.b1() + j]), m.x + b * m.s.in, 1, m.params + m.s.w1() + j,
                           m.s.hidden, m.s.in, identity_fn{});
    }
};
// y[b, k] = b2[k] + sum_j relu(h_pre[b, j]) * W2[j, k]
struct output_fn {
    mlp_tensors m;
    SPILLWAY_HOST_DEVICE void operator()(std::size_t idx) const {
        std::size_t b = idx / m.s.out, k = idx % m.s.out;
        m.y[idx] = dot(spillway::to_float(m.params[m.s.b2() + k]), m.h_pre + b * m.s.hidden, 1, m.params + m.s.w2() + k,
                       m.s.out, m.s.hidden, relu_fn{});
    }
};
// sample_loss[b] = sum_k (y[b, k] - t[b, k])^2
struct loss_fn {
    mlp_tensors m;
    SPILLWAY_HOST_DEVICE void operator()(std::size_t b) const {
        float acc = 0.0f;
        for (std::size_t k = 0; k < m.s.out; ++k) {
            float d = m.y[b * m.s.out + k] - m.t[b * m.s.out + k];
            acc = fmaf(d, d, acc);
        }
        m.sample_loss[b] = acc;
    }
};
// dy[b, k] = (y - t) * 2 * scale / (B * O)
struct dy_fn {
    mlp_tensors m;
    SPILLWAY_HOST_DEVICE void operator()(std::size_t idx) const { m.dy[idx] = (m.y[idx] - m.t[idx]) * m.dy_coef; }
};
// dW2[j, k] = sum_b relu(h_pre[b, j]) * dy[b, k]  (idx < H * O), db2[k] = sum_b dy[b, k]  (the last O)
struct grad_layer2_fn {
    mlp_tensors m;
    SPILLWAY_HOST_DEVICE void operator()(std::size_t idx) const {
        float acc = 0.0f;
        if (idx < m.s.hidden * m.s.out) {
            std::size_t j = idx / m.s.out, k = idx % m.s.out;
            for (std::size_t b = 0; b < m.s.batch; ++b)
                acc = fmaf(relu(m.h_pre[b * m.s.hidden + j]), m.dy[b * m.s.out + k], acc);
            m.grads[m.s.w2() + idx] = spillway::from_float<float16>(acc);
        } else {
            std::size_t k = idx - m.s.hidden * m.s.out;
            for (std::size_t b = 0; b < m.s.batch; ++b) acc += m.dy[b * m.s.out + k];
            m.grads[m.s.b2() + k] = spillway::from_float<float16>(acc);
        }
    }
};
// dh[b, j] = (h_pre[b, j] > 0) * sum_k dy[b, k] * W2[j, k]
struct dh_fn {
    mlp_tensors m;
    SPILLWAY_HOST_DEVICE void operator()(std::size_t idx) const {
        std::size_t b = idx / m.s.hidden, j = idx % m.s.hidden;
        float acc = dot(0.0f, m.dy + b * m.s.out, 1, m.params + m.s.w2() + j * m.s.out, 1, m.s.out, identity_fn{});
        m.dh[idx] = m.h_pre[idx] > 0.0f ? acc : 0.0f;
    }
};
// dW1[i, j] = sum_b x[b, i] * dh[b, j]  (idx < I * H), db1[j] = sum_b dh[b, j]  (the last H)
struct grad_layer1_fn {
    mlp_tensors m;
    SPILLWAY_HOST_DEVICE void operator()(std::size_t idx) const {
        float acc = 0.0f;
        if (idx < m.s.in * m.s.hidden) {
            std::size_t i = idx / m.s.hidden, j = idx % m.s.hidden;
            for (std::size_t b = 0; b < m.s.batch; ++b) acc = fmaf(m.x[b * m.s.in + i], m.dh[b * m.s.hidden + j], acc);
            m.grads[m.s.w1() + idx] = spillway::from_float<float16>(acc);
        } else {
            std::size_t j = idx - m.s.in * m.s.hidden;
            for (std::size_t b = 0; b < m.s.batch; ++b) acc += m.dh[b * m.s.hidden + j];
            m.grads[m.s.b1() + j] = spillway::from_float<float16>(acc);
        }
    }
};

/// Runs `fn` for every index in [0, count) on `policy`.
template <class Policy, class Fn>
void launch(const Policy& policy, std::size_t count, Fn fn) {
    thrust::counting_iterator<std::size_t> first(0);
    thrust::for_each(policy, first, first + count, fn);
}

/// Forward, layer 1: h_pre.
template <class Policy>
void forward_hidden(const Policy& p, const mlp_tensors& m) {
    launch(p, m.s.batch * m.s.hidden, hidden_fn{m});
}
/// Forward, layer 2 and the loss: y and sample_loss.
template <class Policy>
void forward_output(const Policy& p, const mlp_tensors& m) {
    launch(p, m.s.batch * m.s.out, output_fn{m});
    launch(p, m.s.batch, loss_fn{m});
}
/// Backward: every gradient (needs h_pre back in place).
template <class Policy>
void backward(const Policy& p, const mlp_tensors& m) {
    launch(p, m.s.batch * m.s.out, dy_fn{m});
    launch(p, m.s.hidden * m.s.out + m.s.out, grad_layer2_fn{m});
    launch(p, m.s.batch * m.s.hidden, dh_fn{m});
    launch(p, m.s.in * m.s.hidden + m.s.hidden, grad_layer1_fn{m});
}

}  // namespace gpu_offload
