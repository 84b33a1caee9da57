// SPDX-License-Identifier: Apache-2.0
// spillway/cuda/device_tier.hpp: a storage tier in GPU memory.
//
// Guarantees:
// - Blobs live in device memory from the tier's own stream-ordered pool (memory_pools.hpp:
//   tier_pool, release threshold 0: the memory of a freed blob goes back to the driver at
//   the next synchronisation, never kept from the trainer; not the device's default pool,
//   whose threshold stays the caller's). All
//   work runs on one non-blocking stream owned by the tier, so operations execute in the
//   order they were issued; a completion is signalled by a stream callback enqueued after
//   the copy (cudaStreamAddCallback).
// - With pinned caller buffers (cuda::pinned_buffer, cuda::registered_buffer, or memory
//   registered by cuda::host_registration) write() and read() never wait for the GPU:
//   they enqueue and return.
// - Pageable caller buffers (a std::vector, plain new) work too, but the CUDA runtime
//   stages them through its own pinned memory, and then the call blocks: write() waits
//   for the tier stream's earlier work (the backlog) and for the bytes to be staged; read()
//   waits for the backlog and for the copy to land in the buffer. Only the calling thread
//   waits: the copy runs without the tier's mutex, so other calls on the tier go on
//   meanwhile. Use pinned buffers wherever the caller itself must not stall behind the GPU.
// - Pageable copies outside the mutex (buffers cudaPointerGetAttributes calls
//   cudaMemoryTypeUnregistered; pinned buffers keep the simpler path under the mutex):
//   Read:  1. under the mutex, check the key and size and count the read on the blob (its
//             pageable readers); 2. copy without the mutex, enqueue the completion;
//          3. under the mutex, uncount it; a blob rewritten or erased meanwhile was kept
//             aside (retired) and is freed (step 3 of the rewrite protocol) by its last
//             reader, after that reader's copy in stream order.
//   Write: 1. under the mutex, check the capacity counting the bytes of the writes in
//             flight (reserved), allocate, and take a ticket for the key; 2. copy without
//             the mutex; 3. under the mutex, release the reservation; if no write or erase
//             of the key was issued after this one, swap the blob in as in the rewrite
//             protocol, else free it after its copy (the later call's result stands, as if
//             the calls had run in the order they were issued). Either way the write
//             succeeded and its completion says so.
// - A completion never hangs: the callback runs even when the stream or the context has
//   failed (cudaLaunchHostFunc's host function would not, and the handle would wait
//   forever), and then fails the operation with std::system_error in cuda_category()
//   naming the key and size; a callback that cannot be enqueued fails the operation at once.
//   The callback makes no CUDA call (CUDA forbids them there): the constructor builds
//   cuda_category()'s message table before any callback can run.
// - A failure thrown for a CUDA error clears the thread's last error (see cuda_error.hpp),
//   so a later Thrust launch does not report it as its own.
// - The storage_tier contract holds: a missing key is std::system_error(ENOENT) naming the
//   key; a wrong buffer size std::invalid_argument naming both sizes; a write past
//   capacity() or one the GPU cannot allocate fails with ENOSPC naming the key, the size
//   and (for an allocation failure) the CUDA error, and leaves the previous blob intact;
//   other CUDA failures are std::system_error in cuda_category() naming the key and size.
// - Rewrite and erase protocol (stream order makes it safe without waiting):
//   1. allocate the new blob and enqueue the host-to-device copy on the tier's stream;
//   2. swap the new blob into the index at once, so later reads enqueue after the copy;
//   3. free the old blob (free_blob): for each reader stream registered on it by
//      device_pointer(key, reader), record an event on that stream and make the tier's
//      stream wait for it; then enqueue cudaFreeAsync on the tier's stream. The free thus
//      runs after every read already enqueued on the tier's stream and after all work the
//      readers enqueued before the rewrite or erase call. Without that wait the pool hands
//      the range to the next allocation on the tier's stream at once, and the next write's
//      copy would overwrite bytes a kernel on another stream still reads.
// - Readers on other streams (device_pointer): a kernel that reads a blob in place runs on
//   a stream of the tier's device, ordered after the tier's stream (an event recorded on
//   stream()), and passes that stream to device_pointer(key, reader) before it enqueues
//   the kernel. The blob's memory then outlives every piece of work enqueued on `reader`
//   before the key is rewritten or erased, or the tier destroyed. The one-argument
//   device_pointer(key) registers no reader: its caller finishes with the blob (e.g.
//   synchronises) before the key is rewritten or erased.
// - A completion that cannot be enqueued (cudaStreamAddCallback fails after the copy was
//   enqueued) is reported only once the tier's stream has drained: the copy no longer
//   reads or writes the caller's buffer when the failure reaches the caller.
// - Destruction synchronises the stream (every callback has then run), frees every
//   blob and destroys the stream. Requires the CUDA runtime; the device must outlive it.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <unordered_map>
#include <vector>

#include <cuda_runtime_api.h>

#include "spillway/cuda/cuda_error.hpp"
#include "spillway/cuda/memory_pools.hpp"
#include "spillway/error.hpp"
#include "spillway/tier/storage_tier.hpp"

namespace spillway::cuda {

/// How a device_tier is set up.
struct device_tier_options {
    /// The CUDA device (ordinal) that holds the blobs.
    int device = 0;
    /// The most bytes of blobs held at once (unbounded by default: the GPU's memory limits).
    std::size_t capacity = std::numeric_limits<std::size_t>::max();
    /// The tier's name in messages and reports.
    std::string name = "device";
};

namespace detail {
/// Makes `device` current for a scope and restores the previous device after.
class device_guard {
public:
    explicit device_guard(int device) {
        check_cuda(cudaGetDevice(&previous_), "cudaGetDevice", "device_guard");
        if (previous_ != device)
            check_cuda(cudaSetDevice(device), "cudaSetDevice", "device " + std::to_string(device));
    }
    device_guard(const device_guard&) = delete;
    device_guard& operator=(const device_guard&) = delete;
    ~device_guard() { cudaSetDevice(previous_); }

private:
    int previous_ = 0;
};
}  // namespace detail

/// A storage tier in GPU memory; see the header comment.
class device_tier {
public:
    /// Not persistent, no O_DIRECT, blobs not host-accessible.
    static constexpr tier_properties properties{
        .persistent = false, .direct_io = false, .host_accessible = false};

    /// Creates the tier's stream on options.device. Throws std::system_error (cuda_category())
    /// when the device cannot be used.
    explicit device_tier(device_tier_options options = {})
        : device_(options.device), capacity_(options.capacity), name_(std::move(options.name)) {
        (void)cuda_category();  // builds the message table on_done reads: no CUDA call there
        detail::device_guard guard(device_);
        check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                   "cudaStreamCreateWithFlags",
                   name_ + ": stream on device " + std::to_string(device_));
        try {
            pool_ = tier_pool(device_);
        } catch (...) {
            cudaStreamDestroy(stream_);
            throw;
        }
    }
    device_tier(const device_tier&) = delete;
    device_tier& operator=(const device_tier&) = delete;
    /// Waits for every copy and completion, frees every blob, destroys the stream.
    ~device_tier() {
        int previous = device_;
        cudaGetDevice(&previous);
        cudaSetDevice(device_);
        cudaStreamSynchronize(stream_);  // every copy done, every host function run
        for (auto& [key, b] : blobs_) free_blob(b);
        for (auto& b : retired_) free_blob(b);
        cudaStreamSynchronize(stream_);
        cudaStreamDestroy(stream_);
        cudaSetDevice(previous);
    }

    /// Stores a copy of `bytes` under `key` in device memory (see the rewrite protocol).
    /// From pinned memory it returns at once; from pageable memory it first waits, holding
    /// the tier's mutex, for the tier stream's earlier work and for the bytes to be staged
    /// (see the header comment). The caller keeps `bytes` alive and unchanged until the
    /// completion is ready. Errors (capacity, allocation, CUDA) are thrown by the
    /// completion's wait().
    io_completion write(std::string_view key, std::span<const std::byte> bytes) {
        check_key(key);
        const std::size_t n = bytes.size();
        if (n > 0 && is_pageable(bytes.data())) return write_pageable(key, bytes);
        stats_.begin(io_direction::write);
        std::unique_lock lock(mutex_);
        auto [it, inserted] =
            blobs_.try_emplace(std::string(key));  // the only step that allocates host memory
        void* ptr = nullptr;
        try {
            detail::device_guard guard(device_);
            std::size_t old = it->second.nbytes;
            // 1. allocate and enqueue the copy, then the completion
            ptr = allocate(key, n, old);
            if (n > 0)
                check_cuda(cudaMemcpyAsync(ptr, bytes.data(), n, cudaMemcpyHostToDevice, stream_),
                           "cudaMemcpyAsync", describe("write", key, n));
            auto handle = enqueue_completion(io_direction::write, n, key);
            // 2. swap the new blob in; 3. free the old one in stream order (nothing here throws)
            supersede_writes(key);
            install(it->second, ptr, n);
            return handle;
        } catch (...) {
            if (ptr) cudaFreeAsync(ptr, stream_);
            if (inserted) blobs_.erase(it);
            lock.unlock();
            stats_.end(io_direction::write, n, false);
            return io_completion::failed(std::current_exception());
        }
    }

    /// Copies the blob of `key` into `bytes` (exactly its size). Into pinned memory it
    /// returns at once; into pageable memory it returns only once the copy is done, having
    /// waited, holding the tier's mutex, for the tier stream's earlier work (see the header
    /// comment). A missing key (ENOENT) or a wrong size (std::invalid_argument) is thrown by
    /// wait().
    io_completion read(std::string_view key, std::span<std::byte> bytes) {
        check_key(key);
        const std::size_t n = bytes.size();
        if (n > 0 && is_pageable(bytes.data())) return read_pageable(key, bytes);
        stats_.begin(io_direction::read);
        try {
            std::lock_guard lock(mutex_);
            auto it = find_for_read(key, n);
            detail::device_guard guard(device_);
            if (n > 0)
                check_cuda(cudaMemcpyAsync(bytes.data(), it->second.ptr, n, cudaMemcpyDeviceToHost,
                                           stream_),
                           "cudaMemcpyAsync", describe("read", key, n));
            return enqueue_completion(io_direction::read, n, key);
        } catch (...) {
            stats_.end(io_direction::read, n, false);
            return io_completion::failed(std::current_exception());
        }
    }

    /// Removes the blob (freed in stream order, after the reads already enqueued); false
    /// when there was none.
    bool erase(std::string_view key) {
        check_key(key);
        std::lock_guard lock(mutex_);
        auto it = blobs_.find(std::string(key));
        if (it == blobs_.end()) return false;
        {
            detail::device_guard guard(device_);
            used_ -= it->second.nbytes;
            supersede_writes(key);
            retire(it->second);  // after every read already enqueued (the protocol's step 3)
        }
        blobs_.erase(it);
        return true;
    }
    /// True when `key` has a blob.
    [[nodiscard]] bool contains(std::string_view key) const {
        std::lock_guard lock(mutex_);
        return blobs_.contains(std::string(key));
    }
    /// The blob's size, or nullopt when `key` has none.
    [[nodiscard]] std::optional<std::size_t> size_of(std::string_view key) const {
        std::lock_guard lock(mutex_);
        auto it = blobs_.find(std::string(key));
        if (it == blobs_.end()) return std::nullopt;
        return it->second.nbytes;
    }
    /// The most bytes of blobs held at once.
    [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
    /// Bytes of blobs held now.
    [[nodiscard]] std::size_t used() const {
        std::lock_guard lock(mutex_);
        return used_;
    }
    /// Transfer statistics since construction.
    [[nodiscard]] tier_stats stats() const { return stats_.snapshot(); }
    /// The tier's name in messages.
    [[nodiscard]] const std::string& name() const noexcept { return name_; }
    /// The CUDA device holding the blobs.
    [[nodiscard]] int device() const noexcept { return device_; }
    /// The tier's stream: work on device_pointer() blobs is ordered after it.
    [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }

    /// The device address of a blob (valid until the key is rewritten or erased; work on it
    /// must be ordered after the tier's stream, and must have finished before the key is
    /// rewritten or erased), or nullptr when the key is absent.
    [[nodiscard]] const void* device_pointer(std::string_view key) const {
        std::lock_guard lock(mutex_);
        auto it = blobs_.find(std::string(key));
        return it == blobs_.end() ? nullptr : it->second.ptr;
    }
    /// The device address of a blob for work on `reader` (a stream of the tier's device),
    /// or nullptr when the key is absent. The blob's memory is freed (by a rewrite, an erase
    /// or the tier's destruction) only after the work enqueued on `reader` before that call:
    /// see "Readers on other streams" in the header comment. Work on it must be ordered after
    /// the tier's stream. `reader` must outlive the blob's registration (until the key is
    /// rewritten or erased).
    [[nodiscard]] const void* device_pointer(std::string_view key, cudaStream_t reader) {
        std::lock_guard lock(mutex_);
        auto it = blobs_.find(std::string(key));
        if (it == blobs_.end()) return nullptr;
        auto& readers = it->second.readers;
        if (reader != stream_ && std::find(readers.begin(), readers.end(), reader) == readers.end())
            readers.push_back(reader);  // the only step that allocates
        return it->second.ptr;
    }

private:
    struct blob {
        void* ptr = nullptr;
        std::size_t nbytes = 0;
        std::vector<cudaStream_t> readers;  // streams registered by device_pointer(key, reader)
        std::uint64_t id = 0;               // names the blob to its pageable readers
        std::size_t pageable_readers = 0;   // reads copying it without the mutex
    };
    // The pageable writes of one key in flight, and the newest call that changed the key.
    struct key_writes {
        std::uint64_t latest = 0;
        std::size_t in_flight = 0;
    };

    // True for memory the runtime has to stage (not page-locked, not device memory).
    static bool is_pageable(const void* p) noexcept {
        cudaPointerAttributes attr{};
        if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
            cudaGetLastError();  // an unknown pointer: pageable
            return true;
        }
        return attr.type == cudaMemoryTypeUnregistered;
    }

    // With mutex_ held and the device current: n bytes from the tier's pool after the
    // capacity check (the key's current blob of `old` bytes will be replaced, the bytes of
    // pageable writes in flight are reserved); nullptr for n = 0. Throws ENOSPC naming the
    // key and size, or the CUDA error.
    void* allocate(std::string_view key, std::size_t n, std::size_t old) {
        if (used_ + reserved_ - old + n > capacity_)
            throw std::system_error(ENOSPC, std::generic_category(),
                                    describe("write", key, n) + " exceeds the capacity of " +
                                        bytes_str(capacity_) + " (" + bytes_str(used_ + reserved_) +
                                        " used)");
        if (n == 0) return nullptr;
        void* ptr = nullptr;
        cudaError_t err = cudaMallocFromPoolAsync(&ptr, n, pool_.get(), stream_);
        if (err == cudaErrorMemoryAllocation) {
            cudaGetLastError();  // clear the (non-sticky) allocation error
            throw std::system_error(ENOSPC, std::generic_category(),
                                    describe("write", key, n) +
                                        ": cudaMallocFromPoolAsync failed (" +
                                        cuda_category().message(err) + ")");
        }
        check_cuda(err, "cudaMallocFromPoolAsync", describe("write", key, n));
        return ptr;
    }

    // With mutex_ held: the blob of `key`, checked to hold n bytes (ENOENT, or
    // std::invalid_argument naming both sizes).
    std::unordered_map<std::string, blob>::iterator find_for_read(std::string_view key,
                                                                  std::size_t n) {
        auto it = blobs_.find(std::string(key));
        if (it == blobs_.end())
            throw std::system_error(
                ENOENT, std::generic_category(),
                name_ + ": read of key " + spillway::quoted(key) + ": no such key");
        if (it->second.nbytes != n)
            throw std::invalid_argument(name_ + ": read of key " + spillway::quoted(key) +
                                        " into a buffer of " + bytes_str(n) +
                                        ", but the blob has " + bytes_str(it->second.nbytes));
        return it;
    }

    // With mutex_ held: a write or erase of `key` was issued; pageable writes of it in
    // flight lose (they were issued before it).
    void supersede_writes(std::string_view key) {
        if (auto w = writes_.find(std::string(key)); w != writes_.end())
            w->second.latest = ++next_ticket_;
    }

    // With mutex_ held and the device current: the old blob in `slot` is retired and the new
    // one (ptr, n) takes its place.
    void install(blob& slot, void* ptr, std::size_t n) {
        used_ = used_ - slot.nbytes + n;
        retire(slot);
        slot = blob{ptr, n, {}, ++next_blob_id_, 0};
    }

    // With mutex_ held and the device current: frees the blob (free_blob), or, while
    // pageable reads still copy it, keeps it aside for the last of them to free.
    void retire(blob& b) {
        if (b.pageable_readers == 0) {
            free_blob(b);
            return;
        }
        retired_.push_back(std::move(b));
        b = blob{};
    }

    // Pageable write: the protocol in the header comment ("Write").
    io_completion write_pageable(std::string_view key, std::span<const std::byte> bytes) {
        const std::size_t n = bytes.size();
        stats_.begin(io_direction::write);
        std::unique_lock lock(mutex_);
        void* ptr = nullptr;
        std::uint64_t ticket = 0;
        try {  // 1.
            detail::device_guard guard(device_);
            auto it = blobs_.find(std::string(key));
            ptr = allocate(key, n, it == blobs_.end() ? 0 : it->second.nbytes);
            auto& w = writes_[std::string(key)];
            ticket = w.latest = ++next_ticket_;
            ++w.in_flight;
            reserved_ += n;
        } catch (...) {
            if (ptr) cudaFreeAsync(ptr, stream_);
            lock.unlock();
            stats_.end(io_direction::write, n, false);
            return io_completion::failed(std::current_exception());
        }
        lock.unlock();
        std::exception_ptr error;
        try {  // 2.
            detail::device_guard guard(device_);
            check_cuda(cudaMemcpyAsync(ptr, bytes.data(), n, cudaMemcpyHostToDevice, stream_),
                       "cudaMemcpyAsync", describe("write", key, n));
        } catch (...) {
            error = std::current_exception();
        }
        lock.lock();  // 3.
        detail::device_guard guard(device_);
        reserved_ -= n;
        auto w = writes_.find(std::string(key));
        const bool newest = w->second.latest == ticket;
        if (--w->second.in_flight == 0) writes_.erase(w);
        try {
            if (error) std::rethrow_exception(error);
            auto handle = enqueue_completion(io_direction::write, n, key);
            if (newest) {
                auto [it, inserted] = blobs_.try_emplace(std::string(key));
                install(it->second, ptr, n);
            } else {
                cudaFreeAsync(ptr, stream_);  // a later write or erase of the key stands
            }
            return handle;
        } catch (...) {
            cudaFreeAsync(ptr, stream_);
            lock.unlock();
            stats_.end(io_direction::write, n, false);
            return io_completion::failed(std::current_exception());
        }
    }

    // Pageable read: the protocol in the header comment ("Read").
    io_completion read_pageable(std::string_view key, std::span<std::byte> bytes) {
        const std::size_t n = bytes.size();
        stats_.begin(io_direction::read);
        const void* src = nullptr;
        std::uint64_t id = 0;
        try {  // 1.
            std::lock_guard lock(mutex_);
            auto it = find_for_read(key, n);
            ++it->second.pageable_readers;
            src = it->second.ptr;
            id = it->second.id;
        } catch (...) {
            stats_.end(io_direction::read, n, false);
            return io_completion::failed(std::current_exception());
        }
        std::exception_ptr error;
        io_completion handle;
        try {  // 2.
            detail::device_guard guard(device_);
            check_cuda(cudaMemcpyAsync(bytes.data(), src, n, cudaMemcpyDeviceToHost, stream_),
                       "cudaMemcpyAsync", describe("read", key, n));
            handle = enqueue_completion(io_direction::read, n, key);
        } catch (...) {
            error = std::current_exception();
        }
        {  // 3.
            std::lock_guard lock(mutex_);
            detail::device_guard guard(device_);
            if (auto it = blobs_.find(std::string(key));
                it != blobs_.end() && it->second.id == id) {
                --it->second.pageable_readers;
            } else {
                auto r = std::find_if(retired_.begin(), retired_.end(),
                                      [&](const blob& b) { return b.id == id; });
                if (--r->pageable_readers == 0) {
                    free_blob(*r);  // after this read's copy, in stream order
                    retired_.erase(r);
                }
            }
        }
        if (!error) return handle;
        stats_.end(io_direction::read, n, false);
        return io_completion::failed(error);
    }

    // The protocol's step 3, with the tier's device current and mutex_ held. Never throws:
    // where an event cannot order the free after a reader, the host waits for the reader
    // (a failed context runs nothing any more, so then nothing waits).
    void free_blob(blob& b) noexcept {
        for (cudaStream_t reader : b.readers) {
            cudaEvent_t done = nullptr;
            if (cudaEventCreateWithFlags(&done, cudaEventDisableTiming) == cudaSuccess &&
                cudaEventRecord(done, reader) == cudaSuccess &&
                cudaStreamWaitEvent(stream_, done, 0) == cudaSuccess) {
                cudaEventDestroy(done);  // deferred by CUDA until the wait is done
                continue;
            }
            cudaGetLastError();
            if (done) cudaEventDestroy(done);
            if (cudaStreamSynchronize(reader) != cudaSuccess) cudaGetLastError();
        }
        b.readers.clear();
        if (b.ptr && cudaFreeAsync(b.ptr, stream_) != cudaSuccess) cudaGetLastError();
        b.ptr = nullptr;
    }
    // What the callback finishes; owned by the callback once enqueued.
    struct pending {
        completion_source source;
        stats_recorder* stats;
        io_direction dir;
        std::size_t nbytes;
        std::string what;  // names the operation, the key and the size in an error
    };
    // Called once per enqueued callback, with the stream's error (if any): never left
    // uncalled, so the handle never waits forever. No CUDA call at all (CUDA forbids them
    // here): make_cuda_error reads the message table the constructor built, and leaves the
    // thread's last error alone.
    static void CUDART_CB on_done(cudaStream_t, cudaError_t status, void* p) {
        std::unique_ptr<pending> op(static_cast<pending*>(p));
        if (status == cudaSuccess) {
            op->stats->end(op->dir, op->nbytes, true);
            op->source.succeed(op->nbytes);
            return;
        }
        op->stats->end(op->dir, op->nbytes, false);
        std::exception_ptr error;
        try {
            error = std::make_exception_ptr(
                make_cuda_error(status, "a copy on the tier's stream", op->what));
        } catch (...) {  // out of memory building the message
            error = std::current_exception();
        }
        op->source.fail(std::move(error));
    }

    io_completion enqueue_completion(io_direction dir, std::size_t n, std::string_view key) {
        std::string what = describe(dir == io_direction::read ? "read" : "write", key, n);
        io_completion handle;  // declared before op: if the enqueue throws, op's source is gone
                               // (failing the operation) before the handle's destructor waits
        auto op = std::make_unique<pending>(
            pending{completion_source{}, &stats_, dir, n, std::move(what)});
        handle = op->source.handle();
        if (cudaError_t err = cudaStreamAddCallback(stream_, &device_tier::on_done, op.get(), 0);
            err != cudaSuccess) {
            cudaStreamSynchronize(
                stream_);  // the copy before it stops using the caller's buffer first
            throw_cuda_error(err, "cudaStreamAddCallback", op->what);
        }
        op.release();  // the callback owns it now
        return handle;
    }

    // validate_key() with the tier's name in front of its message (the storage_tier contract).
    void check_key(std::string_view key) const {
        try {
            validate_key(key);
        } catch (const std::invalid_argument& e) {
            throw std::invalid_argument(name_ + ": " + e.what());
        }
    }

    [[nodiscard]] std::string describe(std::string_view op, std::string_view key,
                                       std::size_t n) const {
        return name_ + ": " + std::string(op) + " of key " + spillway::quoted(key) + " (" +
               bytes_str(n) + ")";
    }

    int device_;
    std::size_t capacity_;
    std::string name_;
    cudaStream_t stream_ = nullptr;
    memory_pool pool_;  // destroyed after the destructor's body freed every blob
    mutable std::mutex mutex_;
    std::unordered_map<std::string, blob> blobs_;
    std::vector<blob> retired_;  // rewritten or erased while pageable reads copy them
    std::unordered_map<std::string, key_writes> writes_;  // keys with pageable writes in flight
    std::uint64_t next_ticket_ = 0;
    std::uint64_t next_blob_id_ = 0;
    std::size_t used_ = 0;
    std::size_t reserved_ = 0;  // bytes of pageable writes in flight
    stats_recorder stats_;
};

#if defined(__CUDACC__)
static_assert(storage_tier<device_tier>);
#endif

}  // namespace spillway::cuda
