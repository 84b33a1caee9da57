// SPDX-License-Identifier: Apache-2.0
// spillway/cuda/staged_copy.hpp: moves bytes between a storage tier and device memory in
// chunks, through a ring of pinned host buffers, so that the tier hop (disk, network) and
// the PCIe hop overlap.
//
// Layout: a staged blob of nbytes under `key` is stored as ceil(nbytes / chunk_bytes) tier
// blobs "<key>.<i>" (i = 0, 1, ...), each chunk_bytes long except the last. Both directions
// must use the same chunk size (a mismatch is reported, never misread).
//
// Guarantees:
// - stage_from_device() then stage_to_device() with the same key, size and chunk size gives
//   back the same bytes, for any size (0 included) and any storage_tier.
// - Overlap: with S slots (S >= 2, double-buffered by default) up to S chunks are in flight
//   at once, some on the tier hop and some on the PCIe hop. A slot is reused only after the
//   hop that last used it has finished, checked without blocking while there is other work,
//   so a steady transfer runs at the speed of its slower hop.
// - The device range is read or written only by copies enqueued on the call's `stream`, so
//   they follow the work enqueued on it before the call. Work on another stream that uses
//   the range is the caller's to order (an event and cudaStreamWaitEvent, as device_stash
//   does between its compute and side streams).
// - Pinned slots are page-aligned, so a file tier with O_DIRECT reads and writes them with no
//   bounce buffer and the copy engines reach them with no staging copy.
// - Errors: a missing chunk is std::system_error(ENOENT), and a chunk of the wrong size or
//   a blob longer than asked std::invalid_argument, naming the chunk's key and the sizes,
//   raised before any transfer starts; a tier failure is the tier's own error (naming the chunk's
//   key); a CUDA failure is std::system_error in cuda_category() naming the key and the chunk. On
//   any error every transfer already started is waited for before the call throws (the ring is
//   reusable); the device range (stage_to_device) or the tier's chunks (stage_from_device)
//   then hold undefined contents. A failed stage_from_device leaves earlier chunks of the
//   previous blob replaced or intact chunk by chunk: callers treat the key as lost.
// - One call at a time per staging_ring (it is not thread-safe); different rings may be
//   used concurrently, on different streams. Consecutive calls on one ring may use
//   different streams: a slot's device-to-host copy is ordered (cudaStreamWaitEvent on the
//   slot's event) after the host-to-device copy of an earlier call that still reads the
//   slot, and host writes into a slot wait for that event first, so no call overwrites a
//   slot another call's copy still uses.
// - A ring that cannot be built in full (pinned memory or an event unavailable) frees the
//   slots already built before its constructor throws.
// - copy_to_device() and copy_from_device() move pageable host memory (a stash's buffers)
//   to and from the device through the same ring, so a pageable buffer gets pinned-memory
//   bandwidth with the host copy of one chunk overlapping the PCIe copy of the next.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "spillway/cuda/cuda_error.hpp"
#include "spillway/cuda/pinned_buffer.hpp"
#include "spillway/error.hpp"
#include "spillway/io/completion.hpp"
#include "spillway/tier/storage_tier.hpp"

namespace spillway::cuda {

namespace detail {
/// Move-only owner of a CUDA event (created without timing); destroys it when it goes.
class event_owner {
public:
    /// Owns no event.
    event_owner() = default;
    /// Creates the event. Throws std::system_error (cuda_category()) naming `what`.
    explicit event_owner(std::string_view what) {
        check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming),
                   "cudaEventCreateWithFlags", what);
    }
    /// Takes o's event; o owns none.
    event_owner(event_owner&& o) noexcept : event_(std::exchange(o.event_, nullptr)) {}
    /// Destroys this owner's event and takes o's; o owns none.
    event_owner& operator=(event_owner&& o) noexcept {
        if (this != &o) {
            reset();
            event_ = std::exchange(o.event_, nullptr);
        }
        return *this;
    }
    event_owner(const event_owner&) = delete;
    event_owner& operator=(const event_owner&) = delete;
    /// Destroys the event (CUDA defers it until the work it waits for is done).
    ~event_owner() { reset(); }
    /// The event (nullptr when none is owned).
    [[nodiscard]] cudaEvent_t get() const noexcept { return event_; }

private:
    void reset() noexcept {
        if (event_) cudaEventDestroy(event_);
        event_ = nullptr;
    }
    cudaEvent_t event_ = nullptr;
};
}  // namespace detail

/// The pinned chunk buffers and the events of a staged transfer; reused across calls so
/// that nothing is allocated per transfer.
class staging_ring {
public:
    /// The default chunk: large enough to amortise a tier request and a copy launch.
    static constexpr std::size_t default_chunk_bytes = std::size_t{4} << 20;

    /// `slots` pinned buffers of chunk_bytes each (slots >= 2, chunk_bytes > 0 and a
    /// multiple of 4096 so that file tiers keep O_DIRECT for every chunk but the last).
    /// Throws std::invalid_argument naming the value, std::system_error (cuda_category())
    /// when pinned memory or events cannot be had.
    explicit staging_ring(std::size_t chunk_bytes = default_chunk_bytes, std::size_t slots = 2)
        : chunk_bytes_(chunk_bytes) {
        expect_argument(slots >= 2, "staging_ring: slots = " + std::to_string(slots) +
                                        " (at least 2 are needed for the two hops to overlap)");
        expect_argument(chunk_bytes > 0 && chunk_bytes % 4096 == 0,
                        "staging_ring: chunk_bytes = " + std::to_string(chunk_bytes) +
                            " must be a positive multiple of 4096");
        slots_.reserve(slots);
        for (std::size_t i = 0; i < slots;
             ++i)  // a throw frees the slots built so far (their owners)
            slots_.push_back(slot{pinned_buffer(chunk_bytes),
                                  detail::event_owner("staging_ring slot " + std::to_string(i)),
                                  io_completion{}});
    }
    staging_ring(const staging_ring&) = delete;
    staging_ring& operator=(const staging_ring&) = delete;
    /// Waits for the copies still using the slots, then frees them.
    ~staging_ring() {
        for (auto& s : slots_)
            if (s.copied.get()) cudaEventSynchronize(s.copied.get());
    }

    /// Bytes per chunk (and per slot).
    [[nodiscard]] std::size_t chunk_bytes() const noexcept { return chunk_bytes_; }
    /// Number of slots (chunks in flight at most).
    [[nodiscard]] std::size_t slots() const noexcept { return slots_.size(); }
    /// Slot i's pinned memory (for benchmarks that time one hop alone).
    [[nodiscard]] pinned_buffer& buffer(std::size_t i) { return slots_.at(i).memory; }

private:
    template <class Tier>
    friend void stage_to_device(Tier&, std::string_view, void*, std::size_t, cudaStream_t,
                                staging_ring&);
    template <class Tier>
    friend void stage_from_device(Tier&, std::string_view, const void*, std::size_t, cudaStream_t,
                                  staging_ring&);
    friend void copy_to_device(void*, std::span<const std::byte>, cudaStream_t, staging_ring&);
    friend void copy_from_device(std::span<std::byte>, const void*, cudaStream_t, staging_ring&);

    struct slot {
        pinned_buffer memory;
        detail::event_owner copied;  // recorded after the last copy that used the memory (created
                                     // unrecorded: waiting on it then waits for nothing)
        io_completion io;            // the last tier transfer that used the memory (if any)
    };
    std::size_t chunk_bytes_;
    std::vector<slot> slots_;
};

/// The tier key of chunk `index` of the staged blob `key`: "<key>.<index>".
[[nodiscard]] inline std::string chunk_key(std::string_view key, std::size_t index) {
    std::string k(key);
    k += '.';
    k += std::to_string(index);
    return k;
}

/// Number of chunks of a staged blob of nbytes.
[[nodiscard]] constexpr std::size_t chunk_count(std::size_t nbytes,
                                                std::size_t chunk_bytes) noexcept {
    return (nbytes + chunk_bytes - 1) / chunk_bytes;
}

namespace detail {
/// Bytes of chunk k of a blob of nbytes.
constexpr std::size_t chunk_length(std::size_t k, std::size_t nbytes,
                                   std::size_t chunk_bytes) noexcept {
    std::size_t offset = k * chunk_bytes;
    return nbytes - offset < chunk_bytes ? nbytes - offset : chunk_bytes;
}
inline std::string staged_context(std::string_view op, std::string_view key, std::size_t nbytes,
                                  std::size_t k) {
    return std::string(op) + " of key " + spillway::quoted(key) + " (" + bytes_str(nbytes) +
           "), chunk " + std::to_string(k);
}
/// True when the slot's last copy has finished; never blocks (query_done: no not-ready code
/// is left as the thread's last error). CUDA errors throw.
inline bool copy_finished(cudaEvent_t event, std::string_view what) {
    return query_done(cudaEventQuery(event), "cudaEventQuery", what);
}
/// Erases chunks first, first + 1, ... of `key` while they exist; returns how many.
template <class Tier>
std::size_t erase_chunks_from(Tier& tier, std::string_view key, std::size_t first) {
    std::size_t k = first;
    while (tier.erase(chunk_key(key, k))) ++k;
    return k - first;
}
/// Waits for every tier transfer still using a slot, swallowing its error (used on the
/// error path only: the first error is the one reported).
template <class Slots>
void drain_quietly(Slots& slots) noexcept {
    for (auto& s : slots) {
        if (s.io.valid()) {
            try {
                s.io.wait();
            } catch (...) {
            }
        }
        cudaEventSynchronize(s.copied.get());
    }
}
}  // namespace detail

/// Reads the staged blob `key` (nbytes, chunked as in the header comment) from `tier` into
/// device memory [device_dst, device_dst + nbytes), through `ring`. Returns when every chunk
/// has been read from the tier and its copy enqueued on `stream`: work the caller enqueues
/// on `stream` afterwards sees the bytes. Throws as described in the header comment.
///
/// Protocol (chunk k uses slot k % S):
///  1. Check that every chunk exists with its expected size and that there is no further
///     chunk (nothing is read otherwise).
///  2. Issue tier reads ahead, into every slot whose previous host-to-device copy has
///     finished (polled with cudaEventQuery, never waited for), up to S chunks ahead of the
///     chunk being copied.
///  3. If chunk k's read has not been issued yet (its slot was busy), wait for that slot's
///     copy to finish and issue the read.
///  4. Wait for chunk k's read, enqueue its copy to device_dst + k * chunk_bytes on
///     `stream` and record the slot's event after it; go on with chunk k + 1 at step 2, so
///     the next reads run while the copy does.
template <class Tier>
void stage_to_device(Tier& tier, std::string_view key, void* device_dst, std::size_t nbytes,
                     cudaStream_t stream, staging_ring& ring) {
    static_assert(storage_tier<Tier>, "stage_to_device: Tier must model storage_tier");
    validate_key(key, "stage_to_device: key");
    const std::size_t chunk = ring.chunk_bytes(), count = chunk_count(nbytes, chunk),
                      slots = ring.slots();
    for (std::size_t k = 0; k < count; ++k) {  // 1.
        std::string ck = chunk_key(key, k);
        auto size = tier.size_of(ck);
        std::size_t want = detail::chunk_length(k, nbytes, chunk);
        if (!size)
            throw std::system_error(
                ENOENT, std::generic_category(),
                tier.name() + ": " + detail::staged_context("stage_to_device", key, nbytes, k) +
                    ": no chunk " + spillway::quoted(ck) + " (was it staged with another size?)");
        if (*size != want)
            throw std::invalid_argument(
                tier.name() + ": " + detail::staged_context("stage_to_device", key, nbytes, k) +
                ": chunk " + spillway::quoted(ck) + " has " + bytes_str(*size) + " but " +
                bytes_str(want) + " were expected (chunk size " + bytes_str(chunk) + ")");
    }
    if (std::string extra = chunk_key(key, count); tier.contains(extra))
        throw std::invalid_argument(tier.name() + ": stage_to_device of key " +
                                    spillway::quoted(key) + " (" + bytes_str(nbytes) +
                                    "): the staged blob is longer (chunk " +
                                    spillway::quoted(extra) + " exists)");
    auto* dst = static_cast<std::byte*>(device_dst);
    auto& ss = ring.slots_;
    std::size_t next_read = 0;
    auto issue_read = [&](std::size_t j) {
        auto& s = ss[j % slots];
        s.io = tier.read(chunk_key(key, j),
                         s.memory.bytes().first(detail::chunk_length(j, nbytes, chunk)));
        ++next_read;
    };
    try {
        for (std::size_t k = 0; k < count; ++k) {
            const std::string what = detail::staged_context("stage_to_device", key, nbytes, k);
            while (next_read < count && next_read < k + slots &&  // 2.
                   detail::copy_finished(ss[next_read % slots].copied.get(), what))
                issue_read(next_read);
            auto& s = ss[k % slots];
            if (next_read == k) {  // 3.
                check_cuda(cudaEventSynchronize(s.copied.get()), "cudaEventSynchronize", what);
                issue_read(k);
            }
            std::size_t len = s.io.wait();  // 4.
            check_cuda(cudaMemcpyAsync(dst + k * chunk, s.memory.data(), len,
                                       cudaMemcpyHostToDevice, stream),
                       "cudaMemcpyAsync", what);
            check_cuda(cudaEventRecord(s.copied.get(), stream), "cudaEventRecord", what);
        }
    } catch (...) {
        detail::drain_quietly(ss);
        throw;
    }
}

/// Writes device memory [device_src, device_src + nbytes) to `tier` as the staged blob
/// `key` (chunked as in the header comment), through `ring`. The copies are enqueued on
/// `stream`, so they follow the work that produced the bytes. Returns when every chunk is
/// on the tier; chunks of an earlier, longer blob of the same key are erased. Throws as
/// described in the header comment.
///
/// Protocol (chunk k uses slot k % S):
///  1. Enqueue device-to-host copies ahead on `stream`, into every slot whose previous
///     tier write has completed (polled, never waited for), up to S chunks ahead of the
///     chunk being written; each copy is ordered after the slot's event (cudaStreamWaitEvent:
///     an earlier call's host-to-device copy out of the slot, maybe on another stream) and
///     the slot's event is recorded after it.
///  2. If chunk k's copy has not been enqueued yet (its slot was busy), wait for that slot's
///     write (rethrowing its error) and enqueue the copy as in step 1.
///  3. Wait for chunk k's copy (its event), then issue the tier write of the slot as
///     "<key>.<k>" and go on with chunk k + 1 at step 1, so the next copies run while the
///     write does.
///  4. Wait for every write (the first error is thrown), then erase "<key>.<count>",
///     "<key>.<count + 1>", ... while they exist.
template <class Tier>
void stage_from_device(Tier& tier, std::string_view key, const void* device_src, std::size_t nbytes,
                       cudaStream_t stream, staging_ring& ring) {
    static_assert(storage_tier<Tier>, "stage_from_device: Tier must model storage_tier");
    validate_key(key, "stage_from_device: key");
    const std::size_t chunk = ring.chunk_bytes(), count = chunk_count(nbytes, chunk),
                      slots = ring.slots();
    validate_key(chunk_key(key, count), "stage_from_device: chunk key");  // the longest key used
    const auto* src = static_cast<const std::byte*>(device_src);
    auto& ss = ring.slots_;
    std::size_t next_copy = 0;
    auto enqueue_copy = [&](std::size_t j, const std::string& what) {
        auto& s = ss[j % slots];
        if (s.io.valid()) s.io.wait();  // the previous write's error surfaces here
        check_cuda(cudaStreamWaitEvent(stream, s.copied.get(), 0), "cudaStreamWaitEvent", what);
        check_cuda(
            cudaMemcpyAsync(s.memory.data(), src + j * chunk,
                            detail::chunk_length(j, nbytes, chunk), cudaMemcpyDeviceToHost, stream),
            "cudaMemcpyAsync", what);
        check_cuda(cudaEventRecord(s.copied.get(), stream), "cudaEventRecord", what);
        ++next_copy;
    };
    try {
        for (std::size_t k = 0; k < count; ++k) {
            const std::string what = detail::staged_context("stage_from_device", key, nbytes, k);
            while (next_copy < count && next_copy < k + slots &&  // 1.
                   (!ss[next_copy % slots].io.valid() || ss[next_copy % slots].io.ready()))
                enqueue_copy(next_copy, what);
            if (next_copy == k) enqueue_copy(k, what);  // 2.
            auto& s = ss[k % slots];                    // 3.
            check_cuda(cudaEventSynchronize(s.copied.get()), "cudaEventSynchronize", what);
            s.io = tier.write(chunk_key(key, k),
                              std::span<const std::byte>(s.memory.data(),
                                                         detail::chunk_length(k, nbytes, chunk)));
        }
        for (auto& s : ss)  // 4.
            if (s.io.valid()) s.io.wait();
    } catch (...) {
        detail::drain_quietly(ss);
        throw;
    }
    detail::erase_chunks_from(tier, key, count);
}

/// Copies pageable host memory `host_src` to device memory at device_dst through `ring`,
/// so that the host copy into one slot overlaps the PCIe copy out of the other. Returns when
/// every chunk has left `host_src` (the caller may reuse it at once) and its copy is
/// enqueued on `stream`. Throws std::system_error (cuda_category()) naming the chunk.
///
/// Protocol (chunk k uses slot k % S): 1. wait for the slot's previous copy (its event);
/// 2. memcpy chunk k into the slot; 3. enqueue its copy on `stream` and record the event.
inline void copy_to_device(void* device_dst, std::span<const std::byte> host_src,
                           cudaStream_t stream, staging_ring& ring) {
    const std::size_t chunk = ring.chunk_bytes(), n = host_src.size(),
                      count = chunk_count(n, chunk);
    auto* dst = static_cast<std::byte*>(device_dst);
    for (std::size_t k = 0; k < count; ++k) {
        auto& s = ring.slots_[k % ring.slots()];
        const std::size_t len = detail::chunk_length(k, n, chunk);
        const std::string what =
            "copy_to_device of " + bytes_str(n) + ", chunk " + std::to_string(k);
        check_cuda(cudaEventSynchronize(s.copied.get()), "cudaEventSynchronize", what);  // 1.
        std::memcpy(s.memory.data(), host_src.data() + k * chunk, len);                  // 2.
        check_cuda(cudaMemcpyAsync(dst + k * chunk, s.memory.data(), len, cudaMemcpyHostToDevice,
                                   stream),  // 3.
                   "cudaMemcpyAsync", what);
        check_cuda(cudaEventRecord(s.copied.get(), stream), "cudaEventRecord", what);
    }
}

/// Copies device memory at device_src into pageable host memory `host_dst` through `ring`:
/// the PCIe copy into one slot overlaps the host copy out of the other. The copies are
/// enqueued on `stream` (after the work that produced the bytes). Returns when `host_dst`
/// holds every byte. Throws std::system_error (cuda_category()) naming the chunk; on an
/// error every copy already enqueued is waited for.
///
/// Protocol (chunk k uses slot k % S): 1. enqueue the copies of the first S chunks, each
/// ordered after its slot's event (cudaStreamWaitEvent: an earlier call's host-to-device
/// copy out of the slot, maybe on another stream) and followed by a new record of it;
/// 2. for each chunk k: wait for its event, memcpy the slot into host_dst, then enqueue the
/// copy of chunk k + S into the slot just emptied, as in step 1.
inline void copy_from_device(std::span<std::byte> host_dst, const void* device_src,
                             cudaStream_t stream, staging_ring& ring) {
    const std::size_t chunk = ring.chunk_bytes(), n = host_dst.size(),
                      count = chunk_count(n, chunk);
    const std::size_t slots = ring.slots();
    const auto* src = static_cast<const std::byte*>(device_src);
    auto enqueue = [&](std::size_t j) {
        auto& s = ring.slots_[j % slots];
        const std::string what =
            "copy_from_device of " + bytes_str(n) + ", chunk " + std::to_string(j);
        check_cuda(cudaStreamWaitEvent(stream, s.copied.get(), 0), "cudaStreamWaitEvent", what);
        check_cuda(
            cudaMemcpyAsync(s.memory.data(), src + j * chunk, detail::chunk_length(j, n, chunk),
                            cudaMemcpyDeviceToHost, stream),
            "cudaMemcpyAsync", what);
        check_cuda(cudaEventRecord(s.copied.get(), stream), "cudaEventRecord", what);
    };
    try {
        for (std::size_t j = 0; j < count && j < slots; ++j) enqueue(j);  // 1.
        for (std::size_t k = 0; k < count; ++k) {                         // 2.
            auto& s = ring.slots_[k % slots];
            check_cuda(cudaEventSynchronize(s.copied.get()), "cudaEventSynchronize",
                       "copy_from_device of " + bytes_str(n) + ", chunk " + std::to_string(k));
            std::memcpy(host_dst.data() + k * chunk, s.memory.data(),
                        detail::chunk_length(k, n, chunk));
            if (k + slots < count) enqueue(k + slots);
        }
    } catch (...) {
        detail::drain_quietly(ring.slots_);
        throw;
    }
}

/// Erases every chunk of the staged blob `key`; returns how many there were.
template <class Tier>
std::size_t erase_staged(Tier& tier, std::string_view key) {
    return detail::erase_chunks_from(tier, key, 0);
}

}  // namespace spillway::cuda
