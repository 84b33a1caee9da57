// SPDX-License-Identifier: Apache-2.0
// spillway/cuda/device_stash.hpp: the activation stash for tensors in GPU memory. A
// device_stash puts a host activation_stash (any storage tier behind it) under a GPU
// trainer: tensors leave device memory on a side stream while compute goes on, and come
// back to device memory ahead of backward.
//
// Guarantees:
// - Compute never waits: save() records an event on the compute stream and returns; the
//   copy out runs on the stash's side stream, ordered after that event by
//   cudaStreamWaitEvent, so the GPU orders it, not the host. load() makes the compute stream
//   wait for the copy in (cudaStreamWaitEvent) instead of the host; it blocks the host only
//   while the bytes are still on their way from the tier into host memory.
// - Round trips are exact, and everything the host stash guarantees holds (deduplication by
//   tensor identity, forwarding, adaptive keep, the memory budget, errors naming the tensor):
//   the device tensor's bytes are handed to activation_stash::save as a buffer of its pool.
// - Every call into the host stash (layer scopes, saves, start_backward, releases) runs in
//   the order of the device_stash calls, on one mover thread, so a save issued before
//   start_backward() belongs to the forward pass whatever the copies' timing.
// - A copy in never overtakes the compute work that still uses its destination:
//   prefetch(handle, dst, compute) records an event on `compute`, and the copies into dst
//   run on the side stream after it (cudaStreamWaitEvent), so the work enqueued on
//   `compute` before the call (the previous layer's backward still reading dst) is done
//   with dst first. load() that has to start the prefetch itself does the same.
// - The caller keeps a saved tensor's device memory unchanged until copied() is true (or
//   wait_copied() returned). A prefetch destination stays reserved (it may be written)
//   until the tensor's load() into it returned or the tensor is released: after either,
//   no prefetch of the tensor writes it any more (only the newest prefetch of a tensor
//   copies in and completes a load(); release() waits for copies in that no load() ordered
//   a stream after). load(handle, dst, stream) writes dst ahead of the work enqueued on
//   `stream` after the call. Misuse of a handle (empty, released) is
//   std::invalid_argument naming the tensor; a failed copy or tier error is rethrown by
//   wait_copied() and load() with the tensor named.
// - No exception leaves the mover thread. A job that fails for a tensor (its copy out or
//   in) keeps the error with the tensor, as above. A job that fails for the host stash as a
//   whole (a layer scope, start_backward, a release: the host stash reports a failed tier
//   write there, e.g. a full disk) keeps its error for the stash: the next wait_copied(),
//   prefetch(), load() or flush() throws it once, with the tensor it was called for (or
//   flush) and the job named in front; the stash and the tier go on working.
// - Copies in are enqueued, not waited for: the mover copies the tensor's host bytes into
//   a pinned arrival buffer of its own and enqueues one copy from it, recording the
//   buffer's event after it; a buffer is reused only once its event has completed (polled
//   with query_done, never waited for while another one fits). So load() blocks the host
//   while the bytes come from the tier and are copied on the host, never for the PCIe
//   transfer. The arrival buffers hold at most options.arrival_pinned_bytes; beyond that
//   the mover waits for the oldest buffer large enough, or replaces a completed one, and a
//   tensor larger than the bound gets a buffer of its own size.
// - Every event and stream of the stash belongs to options.device, whichever device is
//   current when a call is made; the compute streams passed in must belong to it too.
// - Thread-safe, like the host stash. The host stash must outlive the device_stash; it may
//   be used directly for host tensors at the same time.
//
// The life cycle of a device tensor:
//  1. save(desc, ptr, stream): record event `produced` on the compute stream; queue the
//     copy out; return the handle at once.
//  2. Mover thread: make the side stream wait for `produced`, take a buffer from the host
//     stash's pool, copy the device bytes into it through the pinned staging ring
//     (copy_from_device: chunked, double-buffered), hand it to activation_stash::save; the
//     tensor is now copied() and its device memory free for reuse.
//  3. prefetch(handle, dst, compute) ahead of backward: under the stash's lock, record
//     event `dst_free` on `compute` and queue the way back as the tensor's newest prefetch
//     (a generation count). The mover skips a prefetch that is no longer the newest or
//     whose tensor was released. Otherwise, still under the lock it checked that with (so
//     `dst_free` holds this prefetch's record, not a newer one's), it makes the side stream
//     wait for `dst_free`; then activation_stash::load (a tier read if the tensor was
//     offloaded), the copy into dst through an arrival buffer on the side stream (see
//     "Copies in"), and event `arrived` recorded
//     after it. The copies thus start once `compute` has passed the prefetch call (the
//     mover may wait on the host for a staging slot until then). A prefetch superseded
//     while it runs copies, but marks nothing arrived. A failed copy in waits for the
//     copies it enqueued before it reports.
//  4. load(handle, dst, compute): start the prefetch as in step 3 (recording `dst_free` on
//     `compute`) if it was not (or went elsewhere, or failed), wait on the host until the
//     newest prefetch's copies are enqueued, make `compute` wait for `arrived` (recorded
//     after every copy in queued before).
//  5. release(handle): mark the tensor released (its queued prefetches are skipped), wait
//     for a prefetch of it the mover is running, then, when copies in were enqueued that no
//     load() made a stream wait for, wait on the host for them (`arrived`, so also for the
//     compute work before their prefetch), so every prefetch destination is free when
//     release() returns; queue activation_stash::release after the tensor's other work.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "spillway/cuda/cuda_error.hpp"
#include "spillway/cuda/device_tier.hpp"
#include "spillway/cuda/staged_copy.hpp"
#include "spillway/detail/thread_name.hpp"
#include "spillway/error.hpp"
#include "spillway/stash/activation_stash.hpp"
#include "spillway/stash/tensor_desc.hpp"

namespace spillway::cuda {

/// How a device_stash moves bytes.
struct device_stash_options {
    /// The CUDA device of the tensors and of the side stream.
    int device = 0;
    /// Bytes per staging chunk (a positive multiple of 4096).
    std::size_t chunk_bytes = std::size_t{1} << 20;
    /// Pinned staging buffers (>= 2): copies of one chunk overlap host copies of another.
    std::size_t staging_slots = 2;
    /// Pinned memory the copies in may hold at once (see "Copies in" in the header).
    std::size_t arrival_pinned_bytes = std::size_t{256} << 20;
};

namespace detail {
/// The shared state of one saved device tensor (between its handle and the mover thread).
struct device_entry {
    tensor_desc desc;
    std::string label;
    std::size_t nbytes = 0;
    const void* source = nullptr;
    cudaEvent_t produced = nullptr;   // recorded on the compute stream by save()
    cudaEvent_t arrived = nullptr;    // recorded on the side stream after the copy in
    cudaEvent_t dst_free = nullptr;   // recorded on the compute stream by the newest prefetch
    stash_handle host;                // the host stash's handle, once copied
    bool copied = false;              // step 2 finished (or failed: error)
    std::exception_ptr error;         // why step 2 failed
    void* prefetch_target = nullptr;  // where the last prefetch copies to
    std::uint64_t prefetch_generation =
        0;                          // bumped by every prefetch: only the newest one's job acts
    bool arrival_enqueued = false;  // the newest prefetch's copies are on the side stream
    std::exception_ptr load_error;  // why the newest prefetch failed
    bool copying_in = false;        // the mover runs a prefetch of this tensor (step 3)
    bool copies_unwaited = false;   // copies in were enqueued that no load() made a stream wait for
    bool released = false;
    ~device_entry() {
        if (produced) cudaEventDestroy(produced);  // deferred by CUDA until pending waits end
        if (arrived) cudaEventDestroy(arrived);
        if (dst_free) cudaEventDestroy(dst_free);
    }
};
}  // namespace detail

/// A move-only reference to one device tensor saved in a device_stash.
class device_handle {
public:
    /// An empty handle.
    device_handle() = default;
    /// True while the handle refers to a tensor it has not released.
    [[nodiscard]] bool valid() const noexcept { return entry_ && !entry_->released; }
    /// The tensor's bytes (0 for an empty handle).
    [[nodiscard]] std::size_t nbytes() const noexcept { return entry_ ? entry_->nbytes : 0; }
    /// How messages name the tensor ("" for an empty handle).
    [[nodiscard]] std::string label() const { return entry_ ? entry_->label : std::string(); }

private:
    template <storage_tier>
    friend class device_stash;
    std::shared_ptr<detail::device_entry> entry_;
};

/// The activation stash for tensors in device memory; see the header comment.
template <storage_tier Tier>
class device_stash {
public:
    /// Puts the device stash over `host` (which must outlive it): creates the side stream
    /// and the staging ring on options.device and starts the mover thread. Throws
    /// std::invalid_argument for bad options, std::system_error (cuda_category()) when the
    /// device, the stream or pinned memory cannot be had.
    explicit device_stash(activation_stash<Tier>& host, device_stash_options options = {})
        : host_(host), options_(options), ring_(make_ring(options)) {
        spillway::cuda::detail::device_guard guard(options_.device);
        check_cuda(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking),
                   "cudaStreamCreateWithFlags",
                   "device_stash: side stream on device " + std::to_string(options_.device));
        mover_ = std::thread([this] { run_mover(); });
        spillway::detail::name_thread(mover_, "spw-device-move");
    }
    device_stash(const device_stash&) = delete;
    device_stash& operator=(const device_stash&) = delete;
    /// Finishes every queued job, stops the mover thread, destroys the side stream. Handles
    /// still live keep their host-stash tensors until the host stash is reset or destroyed.
    ~device_stash() {
        {
            std::lock_guard lock(mutex_);
            stopping_ = true;
        }
        cv_.notify_all();
        mover_.join();
        cudaStreamSynchronize(side_);
        cudaStreamDestroy(side_);
    }

    /// Opens layer scope `layer` in the host stash (in order with the saves queued before).
    void begin_layer(std::uint32_t layer) {
        enqueue([this, layer] { host_.begin_layer(layer); },
                "begin_layer(" + std::to_string(layer) + ")");
    }
    /// Closes the innermost layer scope (in order with the saves queued before).
    void end_layer() {
        enqueue([this] { host_.end_layer(); }, "end_layer");
    }

    /// Saves the device tensor at device_ptr (extent_bytes(desc) bytes) once the work queued
    /// on `compute` so far has produced it; returns at once (see the life cycle, step 1).
    /// The caller keeps the device bytes unchanged until copied(). Throws
    /// std::invalid_argument for a malformed description, std::system_error
    /// (cuda_category()) when the event cannot be recorded.
    [[nodiscard]] device_handle save(const tensor_desc& desc, const void* device_ptr,
                                     cudaStream_t compute) {
        auto e = std::make_shared<detail::device_entry>();
        e->nbytes = extent_bytes(desc);
        e->desc = desc;
        e->label = describe(desc);
        e->source = device_ptr;
        spillway::cuda::detail::device_guard guard(
            options_.device);  // the events belong to the tensors' device
        check_cuda(cudaEventCreateWithFlags(&e->produced, cudaEventDisableTiming),
                   "cudaEventCreateWithFlags", "device_stash::save of " + e->label);
        check_cuda(cudaEventCreateWithFlags(&e->arrived, cudaEventDisableTiming),
                   "cudaEventCreateWithFlags", "device_stash::save of " + e->label);
        check_cuda(cudaEventCreateWithFlags(&e->dst_free, cudaEventDisableTiming),
                   "cudaEventCreateWithFlags", "device_stash::save of " + e->label);
        check_cuda(cudaEventRecord(e->produced, compute), "cudaEventRecord",
                   "device_stash::save of " + e->label);
        enqueue([this, e] { copy_out(*e); });
        device_handle h;
        h.entry_ = std::move(e);
        return h;
    }

    /// True once the tensor's bytes have left device memory (or the copy failed: see
    /// wait_copied()). Never blocks. Throws std::invalid_argument on a misused handle.
    [[nodiscard]] bool copied(const device_handle& handle) const {
        auto& e = entry_of(handle, "copied");
        std::lock_guard lock(mutex_);
        return e.copied;
    }
    /// Blocks until the tensor's bytes have left device memory; rethrows the copy's error
    /// (naming the tensor). Throws std::invalid_argument on a misused handle.
    void wait_copied(const device_handle& handle) {
        auto& e = entry_of(handle, "wait_copied");
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return e.copied; });
        if (e.error) std::rethrow_exception(e.error);
        throw_mover_error("wait_copied of " + e.label);
    }

    /// Marks the start of backward in the host stash, after every save queued so far.
    void start_backward() {
        enqueue([this] { host_.start_backward(); }, "start_backward");
    }

    /// Starts bringing the tensor back into device memory at device_dst (extent_bytes
    /// bytes, kept by the caller) ahead of load(); returns at once (life cycle, step 3).
    /// The copies into device_dst run after the work enqueued on `compute` so far; from this
    /// call until the load() into device_dst returned or the tensor is released, the caller
    /// enqueues no work that uses device_dst (it is reserved: see the header). Throws
    /// std::invalid_argument on a misused handle, std::system_error (cuda_category()) when the
    /// event cannot be recorded on `compute`.
    void prefetch(const device_handle& handle, void* device_dst, cudaStream_t compute) {
        auto& e = entry_of(handle, "prefetch");
        std::lock_guard lock(mutex_);
        throw_mover_error("prefetch of " + e.label);
        start_prefetch(handle.entry_, e, device_dst, compute);
    }

    /// Makes `compute` wait for the tensor's bytes at device_dst: work enqueued on it
    /// afterwards sees them (life cycle, step 4). Without a prefetch into device_dst, the
    /// copies start now, after the work enqueued on `compute` so far. Blocks the host only
    /// until the copies are enqueued. Throws std::invalid_argument on a misused handle,
    /// std::system_error (cuda_category()) when an event cannot be recorded or waited for,
    /// and the error of the copy out, the host stash's load or the copy in, naming the
    /// tensor (a later load() retries).
    void load(const device_handle& handle, void* device_dst, cudaStream_t compute) {
        auto& e = entry_of(handle, "load");
        std::unique_lock lock(mutex_);
        throw_mover_error("load of " + e.label);
        if (e.prefetch_target != device_dst || e.load_error)
            start_prefetch(handle.entry_, e, device_dst, compute);
        const std::uint64_t generation = e.prefetch_generation;
        cv_.wait(lock, [&] { return e.arrival_enqueued || e.load_error; });
        if (e.load_error) std::rethrow_exception(e.load_error);
        lock.unlock();
        check_cuda(cudaStreamWaitEvent(compute, e.arrived, 0), "cudaStreamWaitEvent",
                   "device_stash::load of " + e.label);
        lock.lock();
        // `compute` now waits for every copy in enqueued so far (one side stream, `arrived`
        // recorded after the newest): release() need not wait for them on the host.
        if (e.prefetch_generation == generation) e.copies_unwaited = false;
    }

    /// Drops the handle's reference, after the tensor's queued work (life cycle, step 5).
    /// Blocks the host only while a prefetch of the tensor is running, or its copies into a
    /// destination no load() waited for are in flight: once it returns, no prefetch writes
    /// any destination of the tensor. Throws std::invalid_argument on a misused handle.
    void release(device_handle& handle) {
        auto& e = entry_of(handle, "release");
        bool wait_copies = false;
        {
            std::unique_lock lock(mutex_);
            e.released = true;  // queued prefetches of the tensor are skipped
            cv_.wait(lock, [&] { return !e.copying_in; });
            wait_copies = std::exchange(e.copies_unwaited, false);
        }
        // An error here is the context's (sticky): no copy runs any more, nothing to wait for.
        if (wait_copies) cudaEventSynchronize(e.arrived);
        enqueue(
            [this, entry = handle.entry_] {
                if (entry->host.valid()) host_.release(entry->host);
            },
            "release of " + e.label);
    }

    /// Waits until every queued job has run, then flushes the host stash (every write and
    /// erase done); throws an unreported error of a mover job (see the header), else the
    /// host stash's first unreported write failure.
    void flush() {
        {
            std::unique_lock lock(mutex_);
            cv_.wait(lock, [&] { return jobs_.empty() && !busy_; });
            throw_mover_error("flush");
        }
        host_.flush();
    }

    /// The host stash (statistics, plan, host tensors).
    [[nodiscard]] activation_stash<Tier>& host() noexcept { return host_; }
    /// The side stream the copies run on.
    [[nodiscard]] cudaStream_t side_stream() const noexcept { return side_; }

private:
    static staging_ring make_ring(const device_stash_options& o) {
        spillway::cuda::detail::device_guard guard(o.device);
        return staging_ring(o.chunk_bytes, o.staging_slots);
    }

    detail::device_entry& entry_of(const device_handle& h, const char* op) const {
        if (!h.entry_)
            throw std::invalid_argument(std::string("device_stash::") + op +
                                        ": empty or moved-from handle");
        if (h.entry_->released)
            throw std::invalid_argument(std::string("device_stash::") + op + ": handle of " +
                                        h.entry_->label + " was already released");
        return *h.entry_;
    }

    // Called with mutex_ held: throws the unreported error of a mover job once, with `op`
    // (the call reporting it, naming its tensor) in front.
    void throw_mover_error(const std::string& op) {
        if (!mover_error_) return;
        spillway::rethrow_with_context(std::exchange(mover_error_, nullptr), "device_stash::" + op);
    }

    // `job` runs on the mover thread; `what` names it in an error it throws (see the header).
    void enqueue(std::function<void()> job, std::string what) {
        enqueue([job = std::move(job), what = std::move(what), this] {
            try {
                job();
            } catch (...) {
                std::lock_guard lock(mutex_);
                if (!mover_error_)
                    mover_error_ = spillway::with_context(std::current_exception(), what);
            }
        });
    }

    void enqueue(std::function<void()> job) {
        {
            std::lock_guard lock(mutex_);
            jobs_.push_back(std::move(job));
        }
        cv_.notify_all();
    }

    // Called with mutex_ held. The job is the tensor's newest prefetch (life cycle, step 3).
    // `dst_free` is recorded under the lock, before the generation changes, so the mover,
    // which checks the generation under the same lock, waits for this record.
    void start_prefetch(const std::shared_ptr<detail::device_entry>& entry, detail::device_entry& e,
                        void* dst, cudaStream_t compute) {
        check_cuda(cudaEventRecord(e.dst_free, compute), "cudaEventRecord",
                   "device_stash: prefetch of " + e.label);
        e.prefetch_target = dst;
        e.arrival_enqueued = false;
        e.load_error = nullptr;
        const std::uint64_t generation = ++e.prefetch_generation;
        jobs_.push_back([this, entry, dst, generation] { copy_in(*entry, dst, generation); });
        cv_.notify_all();
    }

    void run_mover() {
        cudaSetDevice(options_.device);  // the constructor proved the device usable
        std::unique_lock lock(mutex_);
        for (;;) {
            cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
            if (jobs_.empty()) return;  // stopping, and everything ran
            auto job = std::move(jobs_.front());
            jobs_.pop_front();
            busy_ = true;
            lock.unlock();
            job();  // every job catches its own errors (copy_out, copy_in, or enqueue(job, what))
            lock.lock();
            busy_ = false;
            cv_.notify_all();
        }
    }

    // Life cycle, step 2.
    void copy_out(detail::device_entry& e) {
        std::exception_ptr error;
        const std::string what = "device_stash: copy out of " + e.label;
        try {
            check_cuda(cudaStreamWaitEvent(side_, e.produced, 0), "cudaStreamWaitEvent",
                       "the side stream");
            aligned_buffer buffer = host_.allocate(e.nbytes);
            copy_from_device(buffer.bytes(), e.source, side_, ring_);
            stash_handle h = host_.save(e.desc, std::move(buffer));
            std::lock_guard lock(mutex_);
            e.host = std::move(h);
        } catch (...) {
            error = spillway::with_context(std::current_exception(), what);  // names the tensor
        }
        std::lock_guard lock(mutex_);
        e.copied = true;
        e.error = error;
    }

    // Life cycle, step 3.
    void copy_in(detail::device_entry& e, void* dst, std::uint64_t generation) {
        std::exception_ptr error;
        bool copying = false;  // copies into dst may be enqueued
        try {
            {
                std::lock_guard lock(mutex_);
                if (e.released || e.prefetch_generation != generation)
                    return;           // superseded before it started
                e.copying_in = true;  // release() waits for the end of this job
                if (e.error) std::rethrow_exception(e.error);
                // Under the lock: `dst_free` still holds this prefetch's record, not a newer one's.
                check_cuda(cudaStreamWaitEvent(side_, e.dst_free, 0), "cudaStreamWaitEvent",
                           "device_stash: copy in of " + e.label);
            }
            auto bytes = host_.load(e.host);
            copying = true;
            arrival_buffer& a = arrival_for(bytes.size(), e.label);
            if (!bytes.empty()) {
                std::memcpy(a.memory.data(), bytes.data(), bytes.size());
                check_cuda(cudaMemcpyAsync(dst, a.memory.data(), bytes.size(),
                                           cudaMemcpyHostToDevice, side_),
                           "cudaMemcpyAsync", "device_stash: copy in of " + e.label);
            }
            check_cuda(cudaEventRecord(a.copied.get(), side_), "cudaEventRecord",
                       "device_stash: copy in of " + e.label);
            check_cuda(cudaEventRecord(e.arrived, side_), "cudaEventRecord",
                       "device_stash: copy in of " + e.label);
        } catch (...) {
            error = std::current_exception();
            if (copying)
                cudaStreamSynchronize(side_);  // the copies already enqueued end before it reports
        }
        {
            std::lock_guard lock(mutex_);
            e.copying_in = false;
            if (copying && !error) e.copies_unwaited = true;
            if (e.prefetch_generation ==
                generation) {  // else a newer prefetch (or load) owns the outcome
                e.arrival_enqueued = !error;
                e.load_error = error;
            }
        }
        cv_.notify_all();
    }

    // A pinned buffer a copy in goes through, and the event recorded after that copy.
    struct arrival_buffer {
        pinned_buffer memory;
        detail::event_owner copied;
    };
    // Mover thread only: an arrival buffer of at least n bytes whose last copy has finished
    // (see "Copies in" in the header comment).
    arrival_buffer& arrival_for(std::size_t n, const std::string& label) {
        const std::string what = "device_stash: copy in of " + label;
        arrival_buffer* oldest_fit = nullptr;
        for (auto& a : arrivals_) {
            if (a->memory.size() < n) continue;
            if (query_done(cudaEventQuery(a->copied.get()), "cudaEventQuery", what)) return *a;
            if (!oldest_fit) oldest_fit = a.get();
        }
        std::size_t held = 0;
        for (auto& a : arrivals_) held += a->memory.size();
        const std::size_t size = std::max<std::size_t>(n, 4096);
        if (held + size > options_.arrival_pinned_bytes) {
            if (oldest_fit) {
                check_cuda(cudaEventSynchronize(oldest_fit->copied.get()), "cudaEventSynchronize",
                           what);
                return *oldest_fit;
            }
            // Replace completed buffers too small for n, oldest first, while over the bound.
            for (auto it = arrivals_.begin();
                 it != arrivals_.end() && held + size > options_.arrival_pinned_bytes;) {
                if (query_done(cudaEventQuery((*it)->copied.get()), "cudaEventQuery", what)) {
                    held -= (*it)->memory.size();
                    it = arrivals_.erase(it);
                } else {
                    ++it;
                }
            }
        }
        spillway::cuda::detail::device_guard guard(options_.device);
        arrivals_.push_back(std::make_unique<arrival_buffer>(arrival_buffer{
            pinned_buffer(size), detail::event_owner("device_stash arrival buffer")}));
        return *arrivals_.back();
    }

    activation_stash<Tier>& host_;
    device_stash_options options_;
    staging_ring ring_;                                      // used by the mover thread only
    std::vector<std::unique_ptr<arrival_buffer>> arrivals_;  // used by the mover thread only
    cudaStream_t side_ = nullptr;
    mutable std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> jobs_;
    bool busy_ = false;
    bool stopping_ = false;
    std::exception_ptr mover_error_;  // the first unreported error of a job not of one tensor
    std::thread mover_;
};

}  // namespace spillway::cuda
