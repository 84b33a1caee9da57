// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/stash/layer_stash.hpp: a layer's saved tensors declared once (names and sizes),
/// then computed into, saved, loaded and released by name over an activation_stash.
///
/// A trainer that offloads activations keeps, per layer, a buffer per tensor, the stash
/// handles of what it saved, the storage ids and versions the stash deduplicates on, and the
/// buffers the stash hands back for the next layer. layer_stash keeps all of that, using only
/// activation_stash's public API. Protocol, per training step:
///  1. begin_step(): every tensor gets a new version (the stash never deduplicates against
///     the bytes of an earlier step).
///  2. Forward, layer l: acquire(l) gives each declared tensor of layer l a buffer;
///     output<T>(l, name) is where the kernel writes it. Once nothing in forward writes a
///     tensor any more, save(l, name) hands its buffer to the stash (no copy), or recycle(l,
///     name) drops it when backward recomputes it instead. share(l, name, label) adds a
///     second reference to a tensor just saved, as a second op that saves the same tensor
///     does (the stash stores it once).
///  3. Backward, l = L-1..0: load<T>(l, name) returns the tensor's elements, read-only, until
///     it is released; release(l, name) after its last use frees room for the stash to
///     prefetch; release_layer(l) releases whatever is left of layer l.
///
/// Guarantees:
/// - Tensor (l, i) (the i-th declared) is one storage of its own: tensor_desc::storage_id is
///   first_storage_id + l * tensors + i, its version the step's, its shape {count}; the layer
///   scope is the one given to save() (default l), so a tensor that the next layer reads
///   first (a block's output, the next block's input) may be saved in that layer's scope.
/// - Buffer recycling: the free buffer save() gets back from the stash (save_and_exchange),
///   or the buffer recycle() drops, is kept for the same tensor of the next acquire(), one
///   per tensor: each layer is computed into the memory of a layer before it instead of
///   fresh pages. spare<T>(name) lends that buffer as scratch (allocating one if none is
///   kept) until the next acquire() takes it.
/// - held_bytes() is the capacity of every buffer held outside the stash (acquired and not
///   yet saved, and the spares): with the stash's resident bytes, all the memory the
///   activations take.
/// - Errors: an unknown name, a layer out of range, a type whose size is not the tensor's
///   element size, output() of a tensor not acquired, load() or share() of a tensor not
///   saved this step are std::invalid_argument naming the tensor; what the stash throws
///   passes through unchanged.
/// - Not thread-safe: one thread (the trainer's) calls it. The stash must outlive it; the
///   destructor releases every handle still held.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "spillway/error.hpp"
#include "spillway/io/aligned_buffer.hpp"
#include "spillway/stash/activation_stash.hpp"
#include "spillway/stash/layer_tensor.hpp"
#include "spillway/stash/tensor_desc.hpp"
#include "spillway/tier/storage_tier.hpp"

namespace spillway {

/// Options of a layer_stash.
struct layer_stash_options {
    /// The storage id of tensor 0 of layer 0; the ids up to first_storage_id + layers *
    /// tensors - 1 are this layer_stash's. Give two layer_stash on one activation_stash
    /// disjoint ranges.
    std::uint64_t first_storage_id = 1;
};

/// The per-layer bookkeeping of an activation_stash user (see the file comment).
/// @tparam Tier the activation_stash's tier
template <storage_tier Tier>
class layer_stash {
public:
    /// Declares `layers` layers of `tensors` each. `stash` must outlive this object.
    /// Throws std::invalid_argument for no layers, no tensors, or a name given twice.
    layer_stash(activation_stash<Tier>& stash, std::vector<layer_tensor> tensors,
                std::size_t layers, layer_stash_options options = {})
        : stash_(stash), tensors_(std::move(tensors)), layers_(layers), options_(options) {
        expect_argument(!tensors_.empty() && layers_ > 0,
                        "layer_stash: declare at least one layer and one tensor");
        for (std::size_t i = 0; i < tensors_.size(); ++i)
            for (std::size_t j = 0; j < i; ++j)
                expect_argument(tensors_[i].name != tensors_[j].name,
                                "layer_stash: tensor " + spillway::quoted(tensors_[i].name) +
                                    " declared twice");
        slots_.resize(layers_ * tensors_.size());
        spares_.resize(tensors_.size());
    }
    layer_stash(const layer_stash&) = delete;
    layer_stash& operator=(const layer_stash&) = delete;
    /// Releases every handle still held (errors are dropped: the stash is going away or
    /// resetting anyway).
    ~layer_stash() {
        for (std::size_t l = 0; l < layers_; ++l) {
            try {
                release_layer(l);
            } catch (...) {
            }
        }
    }

    /// The declared tensors, in declaration order.
    [[nodiscard]] const std::vector<layer_tensor>& tensors() const noexcept { return tensors_; }
    /// The number of layers declared.
    [[nodiscard]] std::size_t layers() const noexcept { return layers_; }
    /// The declaration index of `name`; throws std::invalid_argument for an unknown name.
    [[nodiscard]] std::size_t index(std::string_view name) const {
        for (std::size_t i = 0; i < tensors_.size(); ++i)
            if (tensors_[i].name == name) return i;
        throw std::invalid_argument("layer_stash: no tensor " + spillway::quoted(name) +
                                    " was declared");
    }
    /// Bytes of the tensor `name` (count times its element size).
    [[nodiscard]] std::size_t nbytes(std::string_view name) const { return nbytes_of(index(name)); }
    /// Capacity of the buffers held outside the stash (see the file comment).
    [[nodiscard]] std::size_t held_bytes() const noexcept { return held_; }

    // ---- forward ----------------------------------------------------------------------

    /// Starts a step: tensors saved from now on carry a new version.
    void begin_step() noexcept { ++version_; }

    /// Gives each tensor of `layer` a buffer to compute into, in declaration order: the one
    /// kept for that tensor (recycling), else a new one from the stash's pool
    /// (activation_stash::allocate). First releases what layer `layer` still held (a step
    /// that failed half-way).
    void acquire(std::size_t layer) {
        release_layer(layer);
        for (std::size_t i = 0; i < tensors_.size(); ++i) {
            slot& s = at(layer, i);
            if (spares_[i].data()) {
                s.buffer = std::move(spares_[i]);  // already counted in held_
            } else {
                s.buffer = stash_.allocate(nbytes_of(i));
                held_ += s.buffer.capacity();
            }
        }
    }

    /// Where forward writes tensor `name` of `layer`, from acquire() until save() or
    /// recycle(). Throws std::invalid_argument when it holds no buffer or sizeof(T) is not
    /// the tensor's element size.
    template <class T>
    [[nodiscard]] std::span<T> output(std::size_t layer, std::string_view name) {
        const std::size_t i = typed_index<T>(name);
        slot& s = at(layer, i);
        expect_argument(s.buffer.data() != nullptr,
                        "layer_stash::output: " + label(layer, i) +
                            " has no buffer (acquire() the layer first; "
                            "after save() or recycle() it is gone)");
        return s.buffer.template as<T>().first(tensors_[i].count);
    }

    /// Hands tensor `name` of `layer` to the stash in layer scope `scope` (default: `layer`);
    /// the free buffer the stash gives back is kept for the next acquire(). Throws
    /// std::invalid_argument when the tensor holds no buffer; the stash's errors otherwise
    /// (then the buffer stays with the tensor).
    void save(std::size_t layer, std::string_view name) { save(layer, name, layer); }
    /// @copydoc save(std::size_t, std::string_view)
    void save(std::size_t layer, std::string_view name, std::size_t scope) {
        const std::size_t i = index(name);
        slot& s = at(layer, i);
        expect_argument(s.buffer.data() != nullptr,
                        "layer_stash::save: " + label(layer, i) +
                            " has no buffer to save (acquire() it first)");
        const std::size_t capacity = s.buffer.capacity();
        const std::byte* bytes = s.buffer.data();
        stash_handle h =
            stash_.save_and_exchange(desc(layer, i, tensors_[i].name, scope), s.buffer);
        held_ -= capacity;  // the stash holds (and counts) it now
        s.bytes = bytes;
        s.handles.push_back(std::move(h));
        if (s.buffer.data()) {
            held_ += s.buffer.capacity();
            keep_spare(i, std::move(s.buffer));
        }
    }

    /// A second reference to tensor `name` of `layer`, saved this step and not yet released,
    /// as another op that saves the same tensor takes it: the stash finds the live tensor by
    /// its identity and stores nothing more. `what` names this save in messages ("layer <l>
    /// <what>"). Released with the tensor's own reference by release().
    void share(std::size_t layer, std::string_view name, std::string_view what) {
        share(layer, name, what, layer);
    }
    /// @copydoc share(std::size_t, std::string_view, std::string_view)
    void share(std::size_t layer, std::string_view name, std::string_view what, std::size_t scope) {
        const std::size_t i = index(name);
        slot& s = at(layer, i);
        if (!stash_.grad_enabled()) return;  // a no-grad scope saved nothing to share
        expect_argument(
            live(s), "layer_stash::share: " + label(layer, i) + " is not saved (save() it first)");
        // The identity matches a live tensor, so the stash takes a reference without reading
        // these bytes (the buffer they were saved from is the stash's now).
        s.handles.push_back(stash_.save(desc(layer, i, std::string(what), scope),
                                        std::span<const std::byte>(s.bytes, nbytes_of(i))));
    }

    /// Drops tensor `name` of `layer` without saving it (backward recomputes it): its buffer
    /// is kept for the next acquire() instead.
    void recycle(std::size_t layer, std::string_view name) {
        const std::size_t i = index(name);
        slot& s = at(layer, i);
        if (s.buffer.data()) keep_spare(i, std::move(s.buffer));
    }

    // ---- backward ---------------------------------------------------------------------

    /// True while tensor `name` of `layer` is saved and not released.
    [[nodiscard]] bool saved(std::size_t layer, std::string_view name) const {
        return live(slots_.at(layer * tensors_.size() + index(name)));
    }

    /// The elements of tensor `name` of `layer`, resident (waiting for a read when needed;
    /// activation_stash::load), valid until it is released. Throws std::invalid_argument when
    /// it is not saved or sizeof(T) is not its element size; the stash's load errors.
    template <class T>
    [[nodiscard]] std::span<const T> load(std::size_t layer, std::string_view name) {
        const std::size_t i = typed_index<T>(name);
        slot& s = at(layer, i);
        expect_argument(live(s),
                        "layer_stash::load: " + label(layer, i) + " is not saved this step");
        const std::span<const std::byte> bytes = stash_.load(s.handles.front());
        return {reinterpret_cast<const T*>(bytes.data()), bytes.size() / sizeof(T)};
    }

    /// Releases every reference to tensor `name` of `layer` (nothing when none is held).
    void release(std::size_t layer, std::string_view name) { release_slot(at(layer, index(name))); }

    /// Releases every tensor of `layer` in declaration order and frees the buffers it still
    /// holds.
    void release_layer(std::size_t layer) {
        for (std::size_t i = 0; i < tensors_.size(); ++i) {
            slot& s = at(layer, i);
            release_slot(s);
            if (s.buffer.data()) {
                held_ -= s.buffer.capacity();
                s.buffer = aligned_buffer();
            }
        }
    }

    /// The buffer kept for the next acquire() of tensor `name`, lent as scratch (one is
    /// allocated when none is kept); the next acquire() takes it back, contents and all.
    template <class T>
    [[nodiscard]] std::span<T> spare(std::string_view name) {
        const std::size_t i = typed_index<T>(name);
        if (!spares_[i].data()) {
            spares_[i] = stash_.allocate(nbytes_of(i));
            held_ += spares_[i].capacity();
        }
        return spares_[i].template as<T>().first(tensors_[i].count);
    }

private:
    struct slot {
        aligned_buffer buffer;              // computed into, until saved or recycled
        std::vector<stash_handle> handles;  // the save's reference, then share()s
        const std::byte* bytes = nullptr;   // where the saved bytes were (share())
    };

    slot& at(std::size_t layer, std::size_t i) {
        expect_argument(layer < layers_, "layer_stash: layer " + std::to_string(layer) +
                                             " is out of range (" + std::to_string(layers_) +
                                             " layers declared)");
        return slots_[layer * tensors_.size() + i];
    }
    static bool live(const slot& s) noexcept {
        return !s.handles.empty() && s.handles.front().valid();
    }
    std::size_t nbytes_of(std::size_t i) const noexcept {
        return tensors_[i].count * dtype_size(tensors_[i].type);
    }
    std::string label(std::size_t layer, std::size_t i) const {
        return "tensor " + spillway::quoted(tensors_[i].name) + " of layer " +
               std::to_string(layer);
    }
    template <class T>
    std::size_t typed_index(std::string_view name) const {
        static_assert(std::is_trivially_copyable_v<T>,
                      "layer_stash: tensors hold trivially copyable elements");
        const std::size_t i = index(name);
        expect_argument(sizeof(T) == dtype_size(tensors_[i].type),
                        "layer_stash: tensor " + spillway::quoted(name) + " holds " +
                            std::string(dtype_name(tensors_[i].type)) +
                            " elements, not elements of " + std::to_string(sizeof(T)) + " bytes");
        return i;
    }
    tensor_desc desc(std::size_t layer, std::size_t i, const std::string& what,
                     std::size_t scope) const {
        tensor_desc d;
        d.name = "layer " + std::to_string(layer) + " " + what;
        d.storage_id = options_.first_storage_id + layer * tensors_.size() + i;
        d.version = version_;
        d.type = tensors_[i].type;
        d.shape = {static_cast<std::int64_t>(tensors_[i].count)};
        d.layer = static_cast<std::uint32_t>(scope);
        return d;
    }
    // Keeps `buffer` (counted in held_) for the next acquire() of tensor i; one per tensor,
    // so the one it replaces is freed.
    void keep_spare(std::size_t i, aligned_buffer&& buffer) {
        if (spares_[i].data()) held_ -= spares_[i].capacity();
        spares_[i] = std::move(buffer);
    }
    void release_slot(slot& s) {
        for (auto& h : s.handles)
            if (h.valid()) stash_.release(h);
        s.handles.clear();
        s.bytes = nullptr;
    }

    activation_stash<Tier>& stash_;
    std::vector<layer_tensor> tensors_;
    std::size_t layers_;
    layer_stash_options options_;
    std::vector<slot> slots_;             // layer-major: slots_[layer * tensors + i]
    std::vector<aligned_buffer> spares_;  // per tensor: the buffer for the next acquire()
    std::uint64_t version_ = 0;
    std::size_t held_ = 0;
};

}  // namespace spillway
