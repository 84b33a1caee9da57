// SPDX-License-Identifier: Apache-2.0
// examples/gpu_offload/offload_step.hpp: one forward and backward pass of the MLP with its
// weights off the device: the fp16 weights of every layer stay in pinned host memory, and
// the pass streams them through the ring of weight slots that layer_ring.hpp plans; the
// gradients leave through a ring of gradient slots; the saved activations go through a
// device stash. Written over two small interfaces so that the CPU tests run the very same
// protocol with a simulated GPU (tests/cuda/gpu_offload_ring_cpu_test.cpp):
// - Gpu: stream_type, event_type; make_stream(); make_event(event_use); allocate(nbytes)
//   (device memory the Gpu frees); copy(dst, src, nbytes, stream) (asynchronous, any
//   direction); record(event, stream); wait(stream, event) (the stream waits for the
//   event's latest record); run(stream, fn) (calls fn(policy) with the Thrust policy of the
//   stream: the kernels are enqueued, not finished); synchronize(stream) (blocks the host);
//   elapsed_ms(from, to) (two timing events, both finished).
// - Stash: spillway::cuda::device_stash's begin_layer, end_layer, save, wait_copied,
//   start_backward, prefetch, load and release, with their guarantees.
//
// One pass (streams: compute, h2d for weights, d2h for gradients; the stash's side stream
// for activations), with N = L + 1 linear layers, K weight slots, G gradient slots and A
// activation buffers:
//  1. Copy the batch (x, t) into device memory on compute.
//  2. Issue the step's first K weight loads on h2d: slots are free (the previous pass
//     ended), so nothing waits.
//  3. Forward, layer l = 0..N-1 (use l of the schedule):
//     a. if this use is the first one of its load, make compute wait for the load's event
//        (timed: the weight wait);
//     b. for a hidden layer, take activation buffer l mod A for h_l: wait on the host until
//        the stash copied out the tensor it held (so compute never overwrites a tensor the
//        side stream still reads);
//     c. enqueue the layer's kernel;
//     d. if the schedule refills this slot now: record `freed` on compute, make h2d wait
//        for it, copy the next layer in, record `loaded` on h2d (so the copy starts only
//        once this layer's kernel finished and runs while the next layers compute);
//     e. a hidden layer's h_l goes to the stash (save: the copy out starts on the side
//        stream once compute passed the kernel); the output layer is followed by the loss,
//        dy and the copy of the per-sample losses to pinned host memory.
//  4. Start backward: the stash prefetches h_{L-1} into activation buffer (L-1) mod 2.
//  5. Backward, layer l = N-1..0 (backward position q = N-1-l):
//     a. the weight wait as in 3a (only layers the ring no longer held were reloaded);
//     b. gradient slot q mod G: if q >= G, compute waits (timed) for the copy out of
//        position q - G, which used the slot before;
//     c. for l >= 1, load h_{l-1} (compute waits for its arrival, timed), and prefetch
//        h_{l-2} into the other of buffers 0 and 1 (its previous tensor's readers are
//        enqueued before: the stash orders the copy in after them);
//     d. enqueue the layer's weight gradients into the slot and, for l >= 1, dL/dh_{l-1};
//     e. record `ready` on compute; d2h waits for it, copies the slot into the pinned
//        gradients at the layer's offset and records `copied`;
//     f. refill this use's weight slot if the schedule says so, as in 3d;
//     g. release h_{l-1} in the stash.
//  6. Synchronize the three streams: the pinned gradients and losses are final, every
//     slot is free for the next pass, and the pinned weights may be rewritten.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <spillway/stash/tensor_desc.hpp>

#include "layer_ring.hpp"
#include "mlp_step.hpp"

namespace gpu_offload {

/// What an event is for.
enum class event_use {
    ordering,  ///< only orders streams (no timestamps)
    timing,    ///< also timestamps (elapsed_ms)
};

/// What one pass did and waited for.
struct pass_stats {
    double gpu_ms = 0;               ///< compute stream, from the pass's start to its last kernel
    double wait_weights_ms = 0;      ///< compute waiting for weight loads
    double wait_grads_ms = 0;        ///< compute waiting for a gradient slot's copy out
    double wait_activations_ms = 0;  ///< compute waiting for saved activations to arrive
    std::size_t weight_bytes_in = 0;      ///< weights copied into slots
    std::size_t grad_bytes_out = 0;       ///< gradients copied to pinned host memory
    std::size_t activation_bytes_out = 0;  ///< saved activations the stash copied off the device
    std::size_t activation_bytes_in = 0;   ///< and back
    std::size_t batch_bytes = 0;           ///< x and t in, the per-sample losses out
};

/// The budgeted forward and backward pass (see the header comment). The Gpu and the Stash
/// must outlive it; it allocates plan.device_bytes() of device memory from the Gpu once.
template <class Gpu, class Stash>
class offloaded_pass {
public:
    using stream_type = typename Gpu::stream_type;
    using event_type = typename Gpu::event_type;
    using handle_type = std::remove_cvref_t<decltype(std::declval<Stash&>().save(
        std::declval<const spillway::tensor_desc&>(), std::declval<const void*>(), std::declval<stream_type>()))>;

    /// Creates the streams and events and allocates the device buffers of `plan` (made by
    /// plan_ring for this shape). Throws std::invalid_argument when the plan does not fit the
    /// shape; whatever the Gpu throws.
    offloaded_pass(Gpu& gpu, Stash& stash, const mlp_shape& shape, const ring_plan& plan, float loss_scale)
        : gpu_(gpu), stash_(stash), s_(shape), plan_(plan), sched_(schedule_weights(plan.layers, plan.weight_slots)),
          dy_coef_(2.0f * loss_scale / static_cast<float>(shape.batch * shape.out)) {
        const ring_sizes sizes = ring_sizes_of(s_);
        if (plan.layers != s_.linear_layers() || plan.sizes.weight_slot != sizes.weight_slot ||
            plan.sizes.grad_slot != sizes.grad_slot || plan.sizes.activation != sizes.activation ||
            plan.sizes.fixed != sizes.fixed || plan.grad_slots < 1 || plan.activation_buffers < 2)
            throw std::invalid_argument("offloaded_pass: the ring plan was not made for this model");
        compute_ = gpu_.make_stream();
        h2d_ = gpu_.make_stream();
        d2h_ = gpu_.make_stream();
        std::byte* base = gpu_.allocate(plan_.device_bytes());
        std::size_t at = 0;
        auto carve = [&](std::size_t nbytes) {
            std::byte* p = base + at;
            at += nbytes;
            return p;
        };
        for (std::size_t i = 0; i < plan_.weight_slots; ++i)
            weights_.push_back(reinterpret_cast<float16*>(carve(sizes.weight_slot)));
        for (std::size_t i = 0; i < plan_.grad_slots; ++i)
            grads_.push_back(reinterpret_cast<float16*>(carve(sizes.grad_slot)));
        for (std::size_t i = 0; i < plan_.activation_buffers; ++i)
            activations_.push_back(reinterpret_cast<float*>(carve(sizes.activation)));
        x_ = reinterpret_cast<float*>(carve(align_device(s_.batch * s_.in * sizeof(float))));
        t_ = reinterpret_cast<float*>(carve(align_device(s_.batch * s_.out * sizeof(float))));
        y_ = reinterpret_cast<float*>(carve(align_device(s_.batch * s_.out * sizeof(float))));
        loss_ = reinterpret_cast<float*>(carve(align_device(s_.batch * sizeof(float))));
        d_[0] = reinterpret_cast<float*>(carve(align_device(s_.backward_elements() * sizeof(float))));
        d_[1] = reinterpret_cast<float*>(carve(align_device(s_.backward_elements() * sizeof(float))));
        if (at != plan_.device_bytes()) throw std::logic_error("offloaded_pass: device buffers do not add up to the plan");
        for (std::size_t i = 0; i < plan_.weight_slots; ++i) {
            loaded_.push_back(gpu_.make_event(event_use::ordering));
            freed_.push_back(gpu_.make_event(event_use::ordering));
        }
        for (std::size_t i = 0; i < plan_.grad_slots; ++i) {
            ready_.push_back(gpu_.make_event(event_use::ordering));
            copied_.push_back(gpu_.make_event(event_use::ordering));
        }
        begin_ = gpu_.make_event(event_use::timing);
        end_ = gpu_.make_event(event_use::timing);
        handles_.resize(s_.layers);
        pending_.resize(plan_.activation_buffers);
    }
    offloaded_pass(const offloaded_pass&) = delete;
    offloaded_pass& operator=(const offloaded_pass&) = delete;

    /// The weight schedule the pass follows.
    [[nodiscard]] const step_schedule& schedule() const noexcept { return sched_; }

    /// Runs step `step` (> 0; it versions the saved tensors): reads x (B, I), t (B, O) and
    /// the fp16 weights `params` (flat layout) from pinned host memory, writes every fp16
    /// gradient (times the loss scale) into `grads` and the per-sample losses (B) into
    /// `sample_loss` (pinned host memory); returns once they are there. `after_forward`, if
    /// set, is called once the forward pass is enqueued. The caller keeps every pointer
    /// valid and unchanged (params) or untouched (grads, sample_loss) during the call.
    pass_stats run(std::uint64_t step, const float* x, const float* t, const float16* params, float16* grads,
                   float* sample_loss, const std::function<void()>& after_forward = {}) {
        const std::size_t n = s_.linear_layers(), hidden = s_.layers;
        const std::size_t a = plan_.activation_buffers, g_slots = plan_.grad_slots;
        pass_stats st;
        timers_used_ = 0;
        gpu_.record(begin_, compute_);
        // 1.
        gpu_.copy(x_, x, s_.batch * s_.in * sizeof(float), compute_);
        gpu_.copy(t_, t, s_.batch * s_.out * sizeof(float), compute_);
        st.batch_bytes = (s_.batch * s_.in + s_.batch * s_.out + s_.batch) * sizeof(float);
        // 2.
        for (std::size_t i : sched_.initial) issue_load(i, params, st);
        // 3.
        for (std::size_t l = 0; l < n; ++l) {
            const weight_use& u = sched_.uses[l];
            if (u.wait_load) timed(timer_kind::weights, [&] { gpu_.wait(compute_, loaded_[u.slot]); });
            layer_tensors m = layer(l, u.slot);
            m.in = l == 0 ? x_ : activations_[forward_activation_buffer(l - 1, a)];
            std::size_t buffer = 0;
            if (l < hidden) {
                buffer = forward_activation_buffer(l, a);
                claim(buffer);
                m.out = activations_[buffer];
            } else {
                m.out = y_;
            }
            stash_.begin_layer(static_cast<std::uint32_t>(l));
            gpu_.run(compute_, [m, kind = input_of(l)](const auto& policy) { forward_layer(policy, m, kind); });
            if (u.then_load) refill(*u.then_load, u.slot, params, st);
            if (l < hidden) {
                handles_[l] = stash_.save(describe_hidden(l, step), m.out, compute_);
                pending_[buffer] = l;
                st.activation_bytes_out += s_.batch * s_.hidden * sizeof(float);
            } else {
                loss_tensors lt{.batch = s_.batch, .out = s_.out, .y = y_, .t = t_, .sample_loss = loss_, .dy = d_[0],
                                .dy_coef = dy_coef_};
                gpu_.run(compute_, [lt](const auto& policy) { loss_and_dy(policy, lt); });
                gpu_.copy(sample_loss, loss_, s_.batch * sizeof(float), compute_);
            }
            stash_.end_layer();
        }
        if (after_forward) after_forward();
        // 4.
        stash_.start_backward();
        {
            const std::size_t b = backward_activation_buffer(hidden - 1);
            claim(b);
            stash_.prefetch(handles_[hidden - 1], activations_[b], compute_);
        }
        // 5.
        for (std::size_t q = 0; q < n; ++q) {
            const std::size_t l = n - 1 - q;
            const weight_use& u = sched_.uses[n + q];
            if (u.wait_load) timed(timer_kind::weights, [&] { gpu_.wait(compute_, loaded_[u.slot]); });
            const std::size_t g = grad_slot(q, g_slots);
            if (grad_slot_wait(q, g_slots)) timed(timer_kind::grads, [&] { gpu_.wait(compute_, copied_[g]); });
            layer_tensors m = layer(l, u.slot);
            m.d_out = d_[q % 2];
            m.d_in = d_[(q + 1) % 2];
            m.grad = grads_[g];
            if (l >= 1) {
                const std::size_t h = l - 1, b = backward_activation_buffer(h);
                timed(timer_kind::activations, [&] { stash_.load(handles_[h], activations_[b], compute_); });
                m.in = activations_[b];
                st.activation_bytes_in += s_.batch * s_.hidden * sizeof(float);
                if (h >= 1) {
                    const std::size_t next = backward_activation_buffer(h - 1);
                    claim(next);
                    stash_.prefetch(handles_[h - 1], activations_[next], compute_);
                }
            } else {
                m.in = x_;
            }
            gpu_.run(compute_, [m, kind = input_of(l)](const auto& policy) { backward_layer(policy, m, kind); });
            gpu_.record(ready_[g], compute_);
            gpu_.wait(d2h_, ready_[g]);
            gpu_.copy(grads + s_.offset(l), grads_[g], s_.layer_params(l) * sizeof(float16), d2h_);
            gpu_.record(copied_[g], d2h_);
            st.grad_bytes_out += s_.layer_params(l) * sizeof(float16);
            if (u.then_load) refill(*u.then_load, u.slot, params, st);
            if (l >= 1) {
                const std::size_t h = l - 1;
                stash_.release(handles_[h]);
                for (auto& p : pending_)
                    if (p == h) p.reset();
            }
        }
        gpu_.record(end_, compute_);
        // 6.
        gpu_.synchronize(compute_);
        gpu_.synchronize(d2h_);
        gpu_.synchronize(h2d_);
        st.gpu_ms = gpu_.elapsed_ms(begin_, end_);
        for (std::size_t i = 0; i < timers_used_; ++i) {
            const double ms = gpu_.elapsed_ms(timers_[i].begin, timers_[i].end);
            switch (timers_[i].kind) {
            case timer_kind::weights: st.wait_weights_ms += ms; break;
            case timer_kind::grads: st.wait_grads_ms += ms; break;
            case timer_kind::activations: st.wait_activations_ms += ms; break;
            }
        }
        return st;
    }

private:
    enum class timer_kind { weights, grads, activations };
    struct timer {
        timer_kind kind;
        event_type begin, end;
    };

    layer_tensors layer(std::size_t l, std::size_t slot) const {
        layer_tensors m;
        m.batch = s_.batch;
        m.fan_in = s_.fan_in(l);
        m.fan_out = s_.fan_out(l);
        m.w = weights_[slot];
        return m;
    }

    spillway::tensor_desc describe_hidden(std::size_t l, std::uint64_t step) const {
        spillway::tensor_desc d;
        d.name = "h";
        d.name += std::to_string(l);
        d.storage_id = l + 1;
        d.version = step;  // a new tensor every step
        d.type = spillway::dtype::f32;
        d.shape = {static_cast<std::int64_t>(s_.batch), static_cast<std::int64_t>(s_.hidden)};
        return d;
    }

    // Brackets `fn` (which makes compute wait) with timing events on compute: the time
    // between them is the time compute stood still.
    template <class Fn>
    void timed(timer_kind kind, Fn&& fn) {
        if (timers_used_ == timers_.size())
            timers_.push_back({kind, gpu_.make_event(event_use::timing), gpu_.make_event(event_use::timing)});
        timer& tm = timers_[timers_used_++];
        tm.kind = kind;
        gpu_.record(tm.begin, compute_);
        fn();
        gpu_.record(tm.end, compute_);
    }

    // Load i of the schedule: h2d waits for the end of the slot's last use (if any), copies
    // the layer in and records `loaded`.
    void issue_load(std::size_t i, const float16* params, pass_stats& st) {
        const weight_load& ld = sched_.loads[i];
        if (ld.after_use) gpu_.wait(h2d_, freed_[ld.slot]);
        const std::size_t nbytes = s_.layer_params(ld.layer) * sizeof(float16);
        gpu_.copy(weights_[ld.slot], params + s_.offset(ld.layer), nbytes, h2d_);
        gpu_.record(loaded_[ld.slot], h2d_);
        st.weight_bytes_in += nbytes;
    }
    // Steps 3d and 5f: the slot's last use is enqueued on compute.
    void refill(std::size_t load, std::size_t slot, const float16* params, pass_stats& st) {
        gpu_.record(freed_[slot], compute_);
        issue_load(load, params, st);
    }
    // Before compute or a prefetch writes activation buffer b: the stash has copied out the
    // tensor saved from it.
    void claim(std::size_t b) {
        if (auto h = pending_[b]) {
            stash_.wait_copied(handles_[*h]);
            pending_[b].reset();
        }
    }

    Gpu& gpu_;
    Stash& stash_;
    mlp_shape s_;
    ring_plan plan_;
    step_schedule sched_;
    float dy_coef_;
    stream_type compute_{}, h2d_{}, d2h_{};
    std::vector<float16*> weights_, grads_;
    std::vector<float*> activations_;
    float *x_ = nullptr, *t_ = nullptr, *y_ = nullptr, *loss_ = nullptr;
    float* d_[2] = {nullptr, nullptr};
    std::vector<event_type> loaded_, freed_, ready_, copied_;
    event_type begin_{}, end_{};
    std::vector<timer> timers_;
    std::size_t timers_used_ = 0;
    std::vector<handle_type> handles_;                  // per hidden layer, this step's saved tensor
    std::vector<std::optional<std::size_t>> pending_;  // per activation buffer: the hidden layer whose save may still read it
};

}  // namespace gpu_offload
