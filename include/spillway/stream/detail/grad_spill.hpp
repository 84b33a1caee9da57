// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/stream/detail/grad_spill.hpp: the fp16 gradients of one step kept between
/// backward and the deferred update of layer_optimizer (layer_optimizer.hpp), in a fixed set
/// of layer buffers over a storage tier.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "spillway/error.hpp"
#include "spillway/io/aligned_buffer.hpp"
#include "spillway/io/completion.hpp"
#include "spillway/stream/param_stream_options.hpp"
#include "spillway/tier/storage_tier.hpp"

namespace spillway::detail {

/// The fp16 gradients of one step on their way from backward, which puts layers L-1..0, to
/// the update in the next forward, which takes them 0..L-1 (last in, first out), through
/// `slots` layer buffers over the streams' tier (keys "<prefix>-<layer>"):
/// - put(l) fills a free buffer; when none is free, the buffer of the highest layer (taken
///   last) gives way: its write, issued when the previous put filled the last free buffer,
///   has had a layer's backward to finish. The last `slots` layers put are never written.
/// - take(l) returns l's bytes: in memory, or read (prefetched: each done() starts the read
///   of the next layer on the tier into the buffer it frees); done(l) drops them.
/// - discard() drops a step's gradients (a skipped step).
/// Buffers are allocated once (slots * charge_of(the largest layer's bytes): the spill
/// window). Tier errors are rethrown naming the layer, its key and the tier; a failed write
/// loses the step's gradients, so it stops the run. Not thread-safe (the trainer's thread).
template <storage_tier Tier>
class grad_spill {
public:
    /// Over `tier`, for layers of `layer_nbytes` bytes, with `slots` buffers (clamped to
    /// 1..layers) of the largest layer's size.
    grad_spill(Tier& tier, std::string prefix, std::vector<std::size_t> layer_nbytes,
               std::size_t slots)
        : tier_(tier),
          prefix_(std::move(prefix)),
          sizes_(std::move(layer_nbytes)),
          nbytes_(sizes_.empty() ? 0 : *std::max_element(sizes_.begin(), sizes_.end())),
          where_(sizes_.size(), at::none),
          written_(sizes_.size(), false) {
        const std::size_t layers = sizes_.size();
        bufs_.resize(std::clamp<std::size_t>(slots, 1, layers));
        for (auto& b : bufs_)
            b.mem = aligned_buffer(nbytes_, memory_lock::unlocked, default_alignment,
                                   buffer_fill::uninitialized);
    }
    ~grad_spill() {
        for (auto& b : bufs_) b.io = io_completion{};  // (waits)
        for (std::size_t l = 0; l < where_.size(); ++l) {
            try {
                if (written_[l] && tier_.contains(key(l))) tier_.erase(key(l));
            } catch (...) {  // a destructor reports nothing
            }
        }
    }
    grad_spill(const grad_spill&) = delete;
    grad_spill& operator=(const grad_spill&) = delete;

    /// Layer l's gradients: `fill(std::span<std::byte>)` writes all of them (its layer's size).
    template <class Fill>
    void put(std::size_t l, Fill&& fill) {
        if (where_.at(l) != at::none)
            throw std::logic_error("grad_spill: layer " + std::to_string(l) +
                                   " put twice (its gradients were not taken)");
        buffer& b = buffer_for_put();
        fill(std::span<std::byte>(b.mem.data(), sizes_[l]));
        b.layer = l;
        b.st = state::dirty;
        where_[l] = at::memory;
        if (l > 0 && !free_buffer())  // write the next victim while backward goes on
            if (buffer* w = highest(state::dirty)) issue_write(*w);
    }

    /// Layer l's gradients (put this step), valid until done(l).
    std::span<const std::byte> take(std::size_t l) {
        if (where_.at(l) == at::none)
            throw std::logic_error("grad_spill: take of layer " + std::to_string(l) +
                                   ", which has no gradients");
        if (where_[l] == at::tier) issue_read(buffer_for_put(), l);  // (not prefetched)
        buffer& b = buffer_of(l);
        if (b.st == state::reading) finish(b);
        return {b.mem.data(), sizes_[l]};
    }

    /// Drops layer l's gradients (taken); starts reading the next layers on the tier into
    /// the buffers that are free.
    void done(std::size_t l) {
        buffer& b = buffer_of(l);
        if (b.st == state::writing) finish(b);
        b.st = state::free;
        where_[l] = at::none;
        for (std::size_t n = l + 1; n < where_.size(); ++n) {
            if (where_[n] != at::tier) continue;
            buffer* f = free_buffer();
            if (!f) break;
            issue_read(*f, n);
        }
    }

    /// Drops every layer's gradients (a skipped step).
    void discard() noexcept {
        for (auto& b : bufs_) {
            b.io = io_completion{};  // (waits; an error no longer matters)
            b.st = state::free;
        }
        std::fill(where_.begin(), where_.end(), at::none);
    }

    [[nodiscard]] std::uint64_t bytes_read() const noexcept { return read_; }
    [[nodiscard]] std::uint64_t bytes_written() const noexcept { return wrote_; }
    [[nodiscard]] std::size_t resident_bytes() const noexcept {
        return bufs_.size() * charge_of(nbytes_);
    }

private:
    enum class at { none, memory, tier };  // where a layer's gradients of this step are
    enum class state { free, dirty, writing, clean, reading };
    struct buffer {
        aligned_buffer mem;
        io_completion io;
        std::size_t layer = 0;
        state st = state::free;
    };

    std::string key(std::size_t l) const { return prefix_ + "-" + std::to_string(l); }

    buffer* free_buffer() noexcept {
        for (auto& b : bufs_)
            if (b.st == state::free) return &b;
        return nullptr;
    }
    buffer* highest(state st) noexcept {
        buffer* h = nullptr;
        for (auto& b : bufs_)
            if (b.st == st && (!h || b.layer > h->layer)) h = &b;
        return h;
    }
    buffer& buffer_of(std::size_t l) {
        for (auto& b : bufs_)
            if (b.st != state::free && b.layer == l) return b;
        throw std::logic_error("grad_spill: layer " + std::to_string(l) + " is not in memory");
    }
    // A buffer for a put (or a read): a free one, or the highest layer's after its write
    // (that layer is then on the tier only).
    buffer& buffer_for_put() {
        if (buffer* f = free_buffer()) return *f;
        buffer* v = nullptr;
        for (auto& b : bufs_)
            if (!v || b.layer > v->layer) v = &b;
        if (v->st == state::dirty) issue_write(*v);
        if (v->st == state::writing || v->st == state::reading) finish(*v);
        where_[v->layer] = at::tier;
        v->st = state::free;
        return *v;
    }
    void issue_write(buffer& b) {
        b.st = state::writing;
        written_[b.layer] = true;
        try {
            b.io = tier_.write(key(b.layer),
                               std::span<const std::byte>(b.mem.data(), sizes_[b.layer]));
        } catch (...) {
            b.io = io_completion::failed(std::current_exception());
        }
    }
    void issue_read(buffer& b, std::size_t l) {
        b.layer = l;
        b.st = state::reading;
        where_[l] = at::memory;
        try {
            b.io = tier_.read(key(l), std::span<std::byte>(b.mem.data(), sizes_[l]));
        } catch (...) {
            b.io = io_completion::failed(std::current_exception());
        }
    }
    // Waits for b's read or write; rethrows its error naming the layer, the key and the tier.
    void finish(buffer& b) {
        const bool reading = b.st == state::reading;
        try {
            b.io.wait();
        } catch (...) {
            b.st = state::free;
            where_[b.layer] = at::none;
            std::rethrow_exception(with_context(
                std::current_exception(),
                "grad_spill: " + std::string(reading ? "read" : "write") + " of layer " +
                    std::to_string(b.layer) + "'s gradients (key '" + key(b.layer) + "', " +
                    std::to_string(sizes_[b.layer]) + " bytes) " + (reading ? "from" : "to") +
                    " tier '" + std::string(tier_.name()) + "'"));
        }
        (reading ? read_ : wrote_) += sizes_[b.layer];
        b.st = state::clean;
    }

    Tier& tier_;
    std::string prefix_;
    std::vector<std::size_t> sizes_;
    std::size_t nbytes_;  // the buffers' size: the largest layer's
    std::vector<buffer> bufs_;
    std::vector<at> where_;
    std::vector<bool> written_;  // a blob of the layer may be on the tier
    std::uint64_t read_ = 0, wrote_ = 0;
};

}  // namespace spillway::detail
