// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/stash/split_rule.hpp: where forward stops offloading (TBA's adaptive split).
///
/// Backward takes about twice as long as forward, so offloading has a window of about three
/// forward times from the first save to the moment backward needs the bytes back. A layer N
/// (in forward order) can be offloaded when the storage can write everything saved before N
/// and write and read back N itself in the time left for it:
///
///     required(N) = (bytes before N + 2 x bytes of N) / (3 x forward time - 2 x time before N)
///
/// The first layer whose required bandwidth exceeds the measured tier bandwidth, and every
/// layer after it, stay in memory (their I/O could not be hidden behind compute).
///
/// Guarantees: tba_split() is a pure function of its inputs; it returns layers.size() when
/// every layer can be offloaded and 0 when none can; a non-positive window counts as
/// infinitely demanding (the layer is kept).
#pragma once

#include <cstddef>
#include <limits>
#include <span>

namespace spillway {

/// What a profiling step measured about one layer; a step's profiles are in forward order
/// (the order layers first appear in the step).
struct layer_profile {
    /// Bytes this layer would offload: the sum of extent_bytes() of its distinct tensors at or
    /// above stash_options::keep_below_bytes (deduplicated saves and smaller tensors count 0).
    std::size_t offload_bytes = 0;
    /// When the layer began (its first save or begin_layer()), in seconds from the start of
    /// the step's forward; non-decreasing along a step's profiles.
    double start_seconds = 0;
};

/// Bytes per second the tier must sustain for layer `n` of `layers` (forward order) to be
/// offloaded with its I/O hidden behind compute: TBA's rule above, with `forward_seconds` the
/// measured forward time. Returns 0 when nothing up to and including layer `n` offloads, and
/// +infinity when the layer's window (3 x forward time - 2 x its start) is not positive.
/// Precondition: n < layers.size() (not checked). Pure; never throws.
inline double required_bandwidth(std::span<const layer_profile> layers, std::size_t n, double forward_seconds) {
    double before = 0;
    for (std::size_t i = 0; i < n; ++i) before += static_cast<double>(layers[i].offload_bytes);
    double window = 3.0 * forward_seconds - 2.0 * layers[n].start_seconds;
    double need = before + 2.0 * static_cast<double>(layers[n].offload_bytes);
    if (need <= 0) return 0;
    if (window <= 0) return std::numeric_limits<double>::infinity();
    return need / window;
}

/// The forward position of the first layer to keep in memory: every layer from it on is
/// kept, every layer before it offloads. `bandwidth` is the tier's bytes per second (the
/// slower of write and read); `forward_seconds` the profiling step's forward time. Returns
/// layers.size() when every layer can be offloaded (also for an empty span) and 0 when the
/// first layer already needs more than `bandwidth`. Pure; never throws.
inline std::size_t tba_split(std::span<const layer_profile> layers, double forward_seconds, double bandwidth) {
    for (std::size_t n = 0; n < layers.size(); ++n)
        if (required_bandwidth(layers, n, forward_seconds) > bandwidth) return n;
    return layers.size();
}

}  // namespace spillway
