// SPDX-License-Identifier: Apache-2.0
// spillway/optim/detail/baseline_handover.hpp: the DeepSpeed-like gradient path of the
// update pipeline, gradient_path::fp32_on_tier (not public).
//
// In backward the trainer hands its gradients over: each subgroup's gradients are widened to
// fp32 in a free host buffer (the section after the subgroup's state) and written to the
// tier under "<state key>.grad". The update reads them back into the same section of the
// buffer that holds the subgroup's state, so the Adam step reads fp32 gradients from the
// buffer instead of the trainer's 16-bit ones: 4 more bytes per parameter read and written
// per step, which is what the baseline measures.
//
// Guarantees:
// - Inactive (gradient_path::lazy_widening), every member is a no-op: the pipeline calls
//   them unconditionally, and the lazy path's behaviour does not depend on this file.
// - A failed gradient write or read is rethrown naming the subgroup, its state key and the
//   tier; a buffer whose gradient read failed keeps its state if it is the newest (resident)
//   and is freed otherwise, as after any read error.
// - One gradient read per buffer at a time; every read is waited for before its buffer is
//   reused, and drain() waits for all of them (before the keys are erased).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "spillway/io/completion.hpp"
#include "spillway/optim/detail/subgroup_buffers.hpp"
#include "spillway/optim/half.hpp"
#include "spillway/optim/pipeline_config.hpp"
#include "spillway/optim/update_stats.hpp"
#include "spillway/tier/storage_tier.hpp"

namespace spillway::detail {

/// The fp32 gradients of gradient_path::fp32_on_tier, on the tier and in the buffers.
template <storage_tier Tier>
class baseline_handover {
public:
    using clock = std::chrono::steady_clock;

    /// Active when `path` is gradient_path::fp32_on_tier. The caller keeps `tier`, `bufs`,
    /// `config` and `*stats` alive.
    baseline_handover(Tier& tier, gradient_path path, subgroup_buffers<Tier>& bufs,
                      const pipeline_config& config, std::size_t state_floats, update_stats* stats)
        : tier_(tier),
          bufs_(bufs),
          cfg_(config),
          state_floats_(state_floats),
          stats_(stats),
          reads_(bufs.size()) {
        if (path != gradient_path::fp32_on_tier) return;
        for (std::size_t s = 0; s < bufs.subgroup_count(); ++s)
            keys_.push_back(bufs.key(s) + ".grad");
    }
    baseline_handover(const baseline_handover&) = delete;
    baseline_handover& operator=(const baseline_handover&) = delete;

    /// Whether the gradients go through the tier (gradient_path::fp32_on_tier).
    [[nodiscard]] bool active() const noexcept { return !keys_.empty(); }

    /// Subgroup s's fp32 gradients in buffer b: the section after its state.
    [[nodiscard]] std::span<float> section(std::size_t b, std::size_t s) noexcept {
        const std::size_t c = cfg_.subgroup_elements(s);
        return bufs_[b].mem.template as<float>().subspan(state_floats_ * c, c);
    }

    /// Backward's hand-over: widens each subgroup's gradients into a free buffer and writes
    /// them to the tier, pipelined over the free buffers (resident ones keep their state;
    /// prefetched ones are taken back if none is free). Adds the bytes written to `written`.
    template <class Grad>
    void write(std::span<const Grad> grads, std::uint64_t& written) {
        if (!active()) return;
        std::vector<io_completion> ops(bufs_.size());
        std::vector<std::ptrdiff_t> holder(bufs_.size(), -1);
        std::vector<std::size_t> usable;
        if (bufs_.count(buffer_use::free) == 0) bufs_.cancel_prefetch();
        for (std::size_t b = 0; b < bufs_.size(); ++b)
            if (bufs_[b].use == buffer_use::free) usable.push_back(b);
        if (usable.empty())
            throw std::logic_error("update_pipeline: no free buffer for the gradient hand-over");
        auto settle = [&](std::size_t b) {
            if (!ops[b].valid()) return;
            auto s = static_cast<std::size_t>(holder[b]);
            try {
                ops[b].wait();
            } catch (...) {
                for (auto& o : ops) drain_op(o);
                bufs_.rethrow_named(std::current_exception(), s,
                                    "handing over the fp32 gradients of");
            }
            written += sizeof(float) * cfg_.subgroup_elements(s);
        };
        for (std::size_t s = 0; s < bufs_.subgroup_count(); ++s) {
            std::size_t b = usable[s % usable.size()];
            settle(b);  // the write issued len(usable) subgroups ago
            const std::size_t c = cfg_.subgroup_elements(s);
            auto g = grads.subspan(s * cfg_.subgroup_size, c);
            auto f = section(b, s);
            if constexpr (std::is_same_v<Grad, float>)
                std::memcpy(f.data(), g.data(), c * sizeof(float));
            else
                widen(g, f);
            holder[b] = static_cast<std::ptrdiff_t>(s);
            ops[b] = tier_.write(keys_[s], std::as_bytes(std::span<const float>(f)));
        }
        for (std::size_t b : usable) settle(b);
    }

    /// Issues the read of subgroup s's gradients into buffer b, unless one is in flight.
    void issue_read(std::size_t b, std::size_t s) {
        if (!active() || reads_[b].valid()) return;
        reads_[b] = tier_.read(keys_[s], std::as_writable_bytes(section(b, s)));
    }

    /// Waits for subgroup s's gradients in buffer b (issuing the read first if needed); the
    /// wait counts as read-wait. On failure the buffer is kept resident if its state is the
    /// newest and freed otherwise, and the error is rethrown, named.
    void wait_read(std::size_t b, std::size_t s) {
        if (!active()) return;
        if (!reads_[b].valid()) issue_read(b, s);
        auto t0 = clock::now();
        try {
            reads_[b].wait();
        } catch (...) {
            stats_->read_wait_seconds += seconds_since(t0);
            if (!bufs_[b].dirty)
                bufs_.release(b);
            else
                bufs_.keep_resident(b);
            bufs_.rethrow_named(std::current_exception(), s, "reading the fp32 gradients of");
        }
        stats_->read_wait_seconds += seconds_since(t0);
        stats_->bytes_read += sizeof(float) * cfg_.subgroup_elements(s);
    }

    /// Waits for every gradient read in flight, dropping their errors.
    void drain() noexcept {
        for (auto& o : reads_) drain_op(o);
    }

    /// Erases every gradient key (after drain()).
    void erase_all() noexcept {
        for (const auto& k : keys_) {
            try {
                tier_.erase(k);
            } catch (...) {
            }
        }
    }

private:
    static void drain_op(io_completion& o) noexcept {
        try {
            if (o.valid()) o.wait();
        } catch (...) {
        }
    }
    static double seconds_since(clock::time_point t0) {
        return std::chrono::duration<double>(clock::now() - t0).count();
    }

    Tier& tier_;
    subgroup_buffers<Tier>& bufs_;
    const pipeline_config& cfg_;
    std::size_t state_floats_;
    update_stats* stats_;
    std::vector<std::string> keys_;     // "<state key>.grad" per subgroup; empty: inactive
    std::vector<io_completion> reads_;  // per buffer: its gradient read in flight
};

}  // namespace spillway::detail
