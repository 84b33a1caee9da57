// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/stream/param_stream_options.hpp: what a param_stream is built with, what it
/// reports, and the arithmetic of its memory budget.
///
/// Guarantees:
/// - Plain values: copying options builds a second stream like the first.
/// - charge_of() is the one rule by which the stream counts a buffer against its budget,
///   and smallest_budget() is computed with it, so a budget of exactly
///   smallest_budget(sizes, options) is accepted and one byte less is refused.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "spillway/io/aligned_buffer.hpp"

namespace spillway {

/// What happens to the stream's blobs on the tier when the stream is destroyed.
enum class blob_lifetime {
    erase_on_destroy,  ///< the destructor erases every blob the stream wrote or adopted
    keep,              ///< the blobs stay (call flush() first: the destructor writes nothing)
};

/// Where the layers' first contents come from.
enum class initial_contents {
    stored_by_caller,  ///< the caller store()s or fill()s every layer before acquiring it
    adopt_existing,    ///< the tier already holds every layer's blob (a resumed run): each
                       ///< key must exist with exactly the layer's size
};

/// How release() leaves a layer.
enum class layer_change {
    unchanged,  ///< the bytes are as acquired (or the caller's changes may be dropped)
    updated,    ///< the caller wrote new parameters (only after acquire_for_update): the
                ///< layer is dirty and is written back once before its buffer is reused
};

/// The order in which a training loop visits the stream's layers, step after step: what
/// prefetch reads ahead and what Belady's rule gives up.
enum class visit_pattern {
    /// 0..N-1 (forward), then N-1..0 (backward): parameters, which both passes read.
    forward_and_backward,
    /// N-1..0 every step: state that only backward's layer-by-layer updates touch, such as
    /// an optimizer's moments. Prefetch then reads the last layers' state while forward runs.
    backward_only,
};

/// How a param_stream runs.
struct param_stream_options {
    /// The most bytes of parameter buffers resident at once (> 0): layers held, resident,
    /// being read or written, and free buffers kept for reuse. Never exceeded; at least
    /// smallest_budget(), which the constructor names when it refuses a smaller one.
    std::size_t memory_budget = 0;
    /// The most layers the trainer holds (acquired, not yet released) at once (>= 1): 1 for
    /// a loop that releases each layer before acquiring the next; 2 when backward holds a
    /// layer while the update of the previous one still writes into it.
    std::size_t held_layers = 1;
    /// How many layers, in order of their next visit, prefetch looks at (0: no prefetch,
    /// every read is issued by the acquire that needs it). The budget bounds it anyway.
    std::size_t prefetch_depth = std::numeric_limits<std::size_t>::max();
    /// The order of the acquires (see visit_pattern); another order still works, but each
    /// acquire off the pattern resynchronises the cursor and prefetch reads the wrong layers.
    visit_pattern pattern = visit_pattern::forward_and_backward;
    std::string key_prefix = "params";  ///< tier keys are "<key_prefix>-<layer>"
    blob_lifetime blobs = blob_lifetime::erase_on_destroy;           ///< see blob_lifetime
    initial_contents contents = initial_contents::stored_by_caller;  ///< see initial_contents
    memory_lock lock = memory_lock::unlocked;                        ///< mlock() the layer buffers
    /// page_size::automatic: buffers of 2 MiB or more get transparent huge pages (and are
    /// charged in whole 2 MiB pages); page_size::base: 4 KiB pages only.
    page_size pages = page_size::automatic;
};

/// What a stream has done since it was built (param_stream::stats()). A plain value:
/// subtract two snapshots to see one step.
struct param_stream_stats {
    std::uint64_t bytes_read = 0;     ///< bytes of successful reads from the tier
    std::uint64_t bytes_written = 0;  ///< bytes of successful writes to the tier (stores too)
    std::uint64_t reads = 0;          ///< successful reads
    std::uint64_t writes = 0;         ///< successful writes (stores and write-backs)
    std::uint64_t failed_reads = 0;   ///< reads that ended in an error
    std::uint64_t failed_writes = 0;  ///< writes that ended in an error
    std::uint64_t acquires = 0;       ///< successful acquire() and acquire_for_update() calls
    /// Acquires served from bytes that were in memory without a read for this use: kept
    /// across a turn of the order, or since a store. No tier traffic.
    std::uint64_t served_resident = 0;
    /// Acquires served by a read that prefetch had issued before the acquire.
    std::uint64_t served_prefetched = 0;
    /// Acquires that issued their own read (prefetch had not reached the layer).
    std::uint64_t demand_reads = 0;
    std::uint64_t waits = 0;         ///< acquires that blocked (for their read, or for room)
    double wait_seconds = 0;         ///< time acquires spent blocked
    std::uint64_t evictions = 0;     ///< layer buffers given up to make room
    std::size_t resident_bytes = 0;  ///< bytes of buffers the stream holds now (charged)
    std::size_t peak_resident_bytes =
        0;                          ///< most resident_bytes since construction or reset_peak()
    std::size_t memory_budget = 0;  ///< param_stream_options::memory_budget
};

/// How far the layers' first contents have reached the tier (param_stream::store_progress()).
struct store_progress {
    std::size_t layers_stored = 0;  ///< layers whose stored contents' write completed (or adopted)
    std::size_t layer_count = 0;    ///< layers in the stream
    std::size_t bytes_stored = 0;   ///< bytes of those layers
    std::size_t bytes_total = 0;    ///< bytes of every layer
    /// True when every layer's contents are on the tier.
    [[nodiscard]] bool done() const noexcept { return layers_stored == layer_count; }
};

/// The bytes a buffer for a layer of `nbytes` counts against the budget: its allocation,
/// whole 4 KiB blocks (at least one), or whole 2 MiB pages for a buffer that gets
/// transparent huge pages (page_size::automatic and 2 MiB or more), whose last page the
/// kernel may fault in whole.
constexpr std::size_t charge_of(std::size_t nbytes,
                                page_size pages = page_size::automatic) noexcept {
    const std::size_t cap = align_up(nbytes == 0 ? 1 : nbytes);
    if (pages == page_size::automatic && cap >= huge_page_bytes)
        return align_up(cap, huge_page_bytes);
    return cap;
}

/// The smallest memory_budget a param_stream over layers of `layer_nbytes` accepts with
/// `options`: the charges of the options.held_layers largest layers together (all of them
/// when there are fewer), so that every acquire the trainer may make finds room.
inline std::size_t smallest_budget(std::span<const std::size_t> layer_nbytes,
                                   const param_stream_options& options) {
    std::vector<std::size_t> charges;
    charges.reserve(layer_nbytes.size());
    for (auto n : layer_nbytes) charges.push_back(charge_of(n, options.pages));
    const std::size_t k = std::min(std::max<std::size_t>(options.held_layers, 1), charges.size());
    std::partial_sort(charges.begin(), charges.begin() + static_cast<std::ptrdiff_t>(k),
                      charges.end(), std::greater<>());
    std::size_t total = 0;
    for (std::size_t i = 0; i < k; ++i) total += charges[i];
    return total;
}

/// `count` layers of `nbytes` each: the layer list of a model whose layers are alike.
inline std::vector<std::size_t> uniform_layers(std::size_t count, std::size_t nbytes) {
    return std::vector<std::size_t>(count, nbytes);
}

}  // namespace spillway
