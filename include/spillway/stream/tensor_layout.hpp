// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/stream/tensor_layout.hpp: where a tensor-major trainer keeps each layer's
/// tensors, so that a layer can be gathered into one contiguous blob (what a param_stream
/// or an update pipeline stores per layer) and scattered back.
///
/// A tensor-major trainer (llm.c's layout) keeps one arena per tensor kind with every layer
/// in it: ln1w of layer l at ln1w + l*C, qkvw of layer l at qkvw + l*3C*C, and its gradients
/// in a second arena of the same shape. A tensor_layout lists the kinds: each with its name,
/// the base pointer of layer 0's params (and of its gradients), the floats one layer has, and
/// the stride from one layer to the next. Layer l's blob is the kinds' tensors of layer l,
/// one after the other in the order the kinds were given: kind k at blob_offset(k).
///
/// Guarantees:
/// - gather and scatter copy exactly layer_floats() floats each way, bit for bit:
///   scatter(gather(l)) leaves the arena as it was, and a blob gathered, stored and read back
///   restores the layer's tensors exactly.
/// - The constructor refuses (std::invalid_argument naming the kind and the field) a kind
///   without params, with count 0, with a stride below its count, or whose layers overlap
///   another tensor (of its own kind or another) in the params or in the gradients: a
///   scatter then writes each float of the arena at most once.
/// - Every call checks the layer and the blob's size before it touches memory, and throws
///   std::invalid_argument naming them; gradient calls throw std::logic_error naming the
///   kind when a kind has no gradients.
/// - The layout holds pointers, never memory: the trainer keeps its arenas alive, and
///   const member functions may run on several threads (for different layers or blobs).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace spillway {

/// One tensor kind of a tensor-major trainer: layer l's tensor is `count` floats at
/// params + l * stride (and its gradient at grads + l * stride).
struct tensor_kind {
    std::string name;         ///< for messages ("ln1w", "qkvw", ...)
    float* params = nullptr;  ///< layer 0's tensor in the params arena (required)
    float* grads = nullptr;   ///< layer 0's gradient in the gradients arena (nullptr: none)
    std::size_t count = 0;    ///< floats of one layer's tensor (> 0)
    std::size_t stride = 0;   ///< floats from layer l's tensor to layer l+1's (>= count)
};

/// The tensor kinds of `layers` layers, and the copies between the arenas and a layer's
/// contiguous blob (see the file comment).
class tensor_layout {
public:
    /// Checks `kinds` for `layers` layers (see the file comment for what is refused).
    /// @throws std::invalid_argument naming the kind and the field
    tensor_layout(std::size_t layers, std::vector<tensor_kind> kinds)
        : layers_(layers), kinds_(std::move(kinds)) {
        if (layers_ == 0) throw std::invalid_argument("tensor_layout: layers must be > 0");
        if (kinds_.empty()) throw std::invalid_argument("tensor_layout: no tensor kinds");
        for (const auto& k : kinds_) {
            const std::string what = "tensor_layout: kind '" + k.name + "'";
            if (!k.params) throw std::invalid_argument(what + " has no params pointer");
            if (k.count == 0) throw std::invalid_argument(what + " has count 0");
            if (k.stride < k.count)
                throw std::invalid_argument(what + ": stride " + std::to_string(k.stride) +
                                            " is below its count " + std::to_string(k.count) +
                                            " (its layers would overlap)");
            offsets_.push_back(floats_);
            floats_ += k.count;
        }
        check_disjoint(&tensor_kind::params, "params");
        check_disjoint(&tensor_kind::grads, "grads");
    }

    /// Layers of the model.
    [[nodiscard]] std::size_t layers() const noexcept { return layers_; }
    /// Floats of one layer's blob: the kinds' counts summed.
    [[nodiscard]] std::size_t layer_floats() const noexcept { return floats_; }
    /// Bytes of one layer's blob (what a param_stream stores per layer).
    [[nodiscard]] std::size_t layer_nbytes() const noexcept { return floats_ * sizeof(float); }
    /// The kinds, in blob order.
    [[nodiscard]] const std::vector<tensor_kind>& kinds() const noexcept { return kinds_; }
    /// Where kind k starts in a layer's blob, in floats.
    [[nodiscard]] std::size_t blob_offset(std::size_t k) const { return offsets_.at(k); }

    /// Copies layer `layer`'s params from the arenas into `blob` (layer_floats() floats).
    void gather_params(std::size_t layer, std::span<float> blob) const {
        gather(&tensor_kind::params, layer, blob, "gather_params");
    }
    /// Copies `blob` (layer_floats() floats) into layer `layer`'s params in the arenas.
    void scatter_params(std::size_t layer, std::span<const float> blob) const {
        scatter(&tensor_kind::params, layer, blob, "scatter_params");
    }
    /// Copies layer `layer`'s gradients from the gradient arenas into `blob`.
    void gather_grads(std::size_t layer, std::span<float> blob) const {
        gather(&tensor_kind::grads, layer, blob, "gather_grads");
    }
    /// Copies `blob` into layer `layer`'s gradients in the gradient arenas.
    void scatter_grads(std::size_t layer, std::span<const float> blob) const {
        scatter(&tensor_kind::grads, layer, blob, "scatter_grads");
    }
    /// Sets layer `layer`'s gradients to +0.0 (before gradient kernels that add into their
    /// buffer, as llm.c's do).
    void zero_grads(std::size_t layer) const {
        copy_layer(layer, floats_, "zero_grads", &tensor_kind::grads,
                   [](float* at, std::size_t, std::size_t n) { std::fill_n(at, n, 0.0f); });
    }

private:
    void gather(float* tensor_kind::*arena, std::size_t layer, std::span<float> blob,
                const char* what) const {
        copy_layer(layer, blob.size(), what, arena, [&](float* at, std::size_t off, std::size_t n) {
            std::memcpy(blob.data() + off, at, n * sizeof(float));
        });
    }
    void scatter(float* tensor_kind::*arena, std::size_t layer, std::span<const float> blob,
                 const char* what) const {
        copy_layer(layer, blob.size(), what, arena, [&](float* at, std::size_t off, std::size_t n) {
            std::memcpy(at, blob.data() + off, n * sizeof(float));
        });
    }

    // Calls fn(pointer in the arena, offset in the blob, count) for each kind of `layer`,
    // after checking the layer, the blob's size and (for gradients) every kind's pointer.
    template <class Fn>
    void copy_layer(std::size_t layer, std::size_t blob_floats, const char* what,
                    float* tensor_kind::*arena, Fn&& fn) const {
        const std::string call = std::string("tensor_layout::") + what;
        if (layer >= layers_)
            throw std::invalid_argument(call + ": layer " + std::to_string(layer) +
                                        " out of range (" + std::to_string(layers_) + " layers)");
        if (blob_floats != floats_)
            throw std::invalid_argument(call + ": the blob has " + std::to_string(blob_floats) +
                                        " floats, a layer has " + std::to_string(floats_));
        for (const auto& k : kinds_)
            if (!(k.*arena))
                throw std::logic_error(call + ": kind '" + k.name + "' has no gradients pointer");
        for (std::size_t i = 0; i < kinds_.size(); ++i) {
            const auto& k = kinds_[i];
            fn(k.*arena + layer * k.stride, offsets_[i], k.count);
        }
    }

    // Refuses two tensors (any kinds, any layers) that share a float of the `which` arena.
    void check_disjoint(float* tensor_kind::*which, const char* arena) const {
        struct span_at {
            const float* begin;
            const float* end;
            const tensor_kind* kind;
            std::size_t layer;
        };
        std::vector<span_at> spans;
        for (const auto& k : kinds_) {
            if (!(k.*which)) continue;
            for (std::size_t l = 0; l < layers_; ++l) {
                const float* b = k.*which + l * k.stride;
                spans.push_back({b, b + k.count, &k, l});
            }
        }
        std::sort(spans.begin(), spans.end(), [](const span_at& a, const span_at& b) {
            return std::less<const float*>{}(a.begin, b.begin);
        });
        for (std::size_t i = 1; i < spans.size(); ++i)
            if (std::less<const float*>{}(spans[i].begin, spans[i - 1].end))
                throw std::invalid_argument("tensor_layout: the " + std::string(arena) +
                                            " of kind '" + spans[i - 1].kind->name + "' layer " +
                                            std::to_string(spans[i - 1].layer) +
                                            " overlap those of kind '" + spans[i].kind->name +
                                            "' layer " + std::to_string(spans[i].layer));
    }

    std::size_t layers_;
    std::vector<tensor_kind> kinds_;
    std::vector<std::size_t> offsets_;  // kind k's offset in a blob, in floats
    std::size_t floats_ = 0;            // floats per layer
};

}  // namespace spillway
