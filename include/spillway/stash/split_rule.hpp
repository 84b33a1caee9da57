// spillway/stash/split_rule.hpp: where forward stops offloading (TBA's adaptive split).
//
// Backward takes about twice as long as forward, so offloading has a window of about three
// forward times from the first save to the moment backward needs the bytes back. A layer N
// (in forward order) can be offloaded when the storage can write everything saved before N
// and write and read back N itself in the time left for it:
//
//     required(N) = (bytes before N + 2 x bytes of N) / (3 x forward time - 2 x time before N)
//
// The first layer whose required bandwidth exceeds the measured tier bandwidth, and every
// layer after it, stay in memory (their I/O could not be hidden behind compute).
//
// Guarantees: tba_split() is a pure function of its inputs; it returns layers.size() when
// every layer can be offloaded and 0 when none can; a non-positive window counts as
// infinitely demanding (the layer is kept).
#pragma once

#include <cstddef>
#include <limits>
#include <span>

namespace spillway {

/// What a profiling step measured about one layer, in forward order.
struct layer_profile {
    std::size_t offload_bytes = 0;  // bytes this layer would offload (tensors above the keep threshold)
    double start_seconds = 0;       // when the layer began, from the start of forward
};

/// Bytes per second layer N of `layers` needs (TBA's rule, above).
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
/// kept. `bandwidth` is the tier's measured bytes per second (the slower direction).
inline std::size_t tba_split(std::span<const layer_profile> layers, double forward_seconds, double bandwidth) {
    for (std::size_t n = 0; n < layers.size(); ++n)
        if (required_bandwidth(layers, n, forward_seconds) > bandwidth) return n;
    return layers.size();
}

}  // namespace spillway
