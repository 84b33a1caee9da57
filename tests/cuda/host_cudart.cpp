// SPDX-License-Identifier: Apache-2.0
// tests/cuda/host_cudart.cpp: a host emulation of the CUDA runtime API calls that
// spillway/cuda/ (device_tier, staged_copy, device_stash, pinned_buffer, cuda_error) makes.
// A test built by the host compiler and linked with this file instead of libcudart runs
// those headers' logic on a machine without a GPU or a driver. The functions have the
// signatures of <cuda_runtime_api.h> and, declared there, C linkage.
//
// Emulated:
// - Device memory is host memory: cudaMalloc/cudaMallocAsync allocate at once (256-byte
//   aligned), cudaFree frees at once, cudaFreeAsync frees in stream order.
//   cudaHostAlloc/cudaFreeHost are page-aligned host allocations; a size over 1 TiB fails
//   with cudaErrorMemoryAllocation.
// - A stream is a FIFO of work items run in order by one worker thread of its own (real
//   asynchrony: ThreadSanitizer sees the library's use of streams). cudaMemcpyAsync (any
//   kind: a plain memcpy) and cudaMemsetAsync enqueue; cudaStreamSynchronize waits until
//   the FIFO has drained; cudaStreamAddCallback enqueues a call of the callback on the
//   stream's thread with cudaSuccess or a scripted status. cudaStreamDestroy drains the
//   stream first (CUDA returns at once and finishes the work later). The legacy default
//   stream (0) is one more stream of its own: no implicit synchronisation with others.
// - Events: cudaEventRecord enqueues a marker completing the event's newest record;
//   cudaEventQuery/cudaEventSynchronize look at / wait for the newest record (an unrecorded
//   event is complete); cudaStreamWaitEvent enqueues an item that blocks the stream until
//   the record the event held at call time completes (none: no wait). cudaEventDestroy may
//   be called with work pending on the event (the state lives until that work is done).
// - A per-thread last error (cudaGetLastError clears it, cudaPeekAtLastError does not),
//   names and texts for the codes used (unknown codes read "unrecognized error code"), one
//   device (0): cudaGetDevice/cudaSetDevice/cudaGetDeviceCount.
// - Test hooks (host_cudart.hpp): failing cudaMallocAsync calls, callback status, host work
//   on a stream, and the device bytes in use.
// Not emulated: kernels, concurrency between copy engines of one stream, pageable copies
// that block the caller, sticky errors (a failed call never corrupts a "context"), timing
// events, graphs, peer devices, stream priorities, cudaStreamQuery.
#include "cuda/host_cudart.hpp"

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>
#include <utility>

namespace {

thread_local cudaError_t last_error = cudaSuccess;
thread_local int current_device = 0;

cudaError_t fail(cudaError_t err) {
    last_error = err;
    return err;
}

std::atomic<int> malloc_async_failures{0};
std::atomic<cudaError_t> callback_status{cudaSuccess};

// "Device" allocations and their sizes (for device_bytes_in_use and a check on free).
std::mutex alloc_mutex;
std::unordered_map<void*, std::size_t> device_allocs;
std::size_t device_bytes = 0;

cudaError_t device_alloc(void** p, std::size_t n) {
    if (!p) return fail(cudaErrorInvalidValue);
    if (n > (std::size_t{1} << 40)) return fail(cudaErrorMemoryAllocation);
    const std::size_t rounded = (n + 255) / 256 * 256;
    void* mem = std::aligned_alloc(256, rounded == 0 ? 256 : rounded);
    if (!mem) return fail(cudaErrorMemoryAllocation);
    std::lock_guard lock(alloc_mutex);
    device_allocs.emplace(mem, n);
    device_bytes += n;
    *p = mem;
    return cudaSuccess;
}
// False when p is not a live device allocation.
bool device_free(void* p) {
    {
        std::lock_guard lock(alloc_mutex);
        auto it = device_allocs.find(p);
        if (it == device_allocs.end()) return false;
        device_bytes -= it->second;
        device_allocs.erase(it);
    }
    std::free(p);
    return true;
}

}  // namespace

// An event: records are numbered 1, 2, ...; `pending` holds those not yet completed.
struct event_state {
    std::mutex mutex;
    std::condition_variable cv;
    std::uint64_t newest = 0;  // 0: never recorded
    std::set<std::uint64_t> pending;
    void complete(std::uint64_t record) {
        {
            std::lock_guard lock(mutex);
            pending.erase(record);
        }
        cv.notify_all();
    }
    void wait(std::uint64_t record) {
        std::unique_lock lock(mutex);
        cv.wait(lock, [&] { return !pending.contains(record); });
    }
};
struct CUevent_st {
    std::shared_ptr<event_state> state = std::make_shared<event_state>();
};

// A stream: a FIFO of work items and the thread that runs them in order.
struct CUstream_st {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<std::function<void()>> work;
    bool running = false;  // the worker runs an item (outside the lock)
    bool stopping = false;
    std::thread worker;

    CUstream_st() : worker([this] { run(); }) {}
    ~CUstream_st() {
        {
            std::lock_guard lock(mutex);
            stopping = true;
        }
        cv.notify_all();
        worker.join();
    }
    void push(std::function<void()> item) {
        {
            std::lock_guard lock(mutex);
            work.push_back(std::move(item));
        }
        cv.notify_all();
    }
    void drain() {
        std::unique_lock lock(mutex);
        cv.wait(lock, [&] { return work.empty() && !running; });
    }

private:
    void run() {
        std::unique_lock lock(mutex);
        for (;;) {
            cv.wait(lock, [&] { return stopping || !work.empty(); });
            if (work.empty()) return;  // stopping, and everything ran
            auto item = std::move(work.front());
            work.pop_front();
            running = true;
            lock.unlock();
            item();
            lock.lock();
            running = false;
            cv.notify_all();
        }
    }
};

namespace {
// The legacy default stream (0), made on first use and joined at exit.
CUstream_st& stream_of(cudaStream_t s) {
    if (s) return *s;
    static CUstream_st legacy;
    return legacy;
}
}  // namespace

namespace spillway::test::host_cudart {
void fail_malloc_async(int count) { malloc_async_failures.store(count); }
void set_callback_status(cudaError_t status) { callback_status.store(status); }
cudaError_t enqueue(cudaStream_t stream, std::function<void()> work) {
    stream_of(stream).push(std::move(work));
    return cudaSuccess;
}
std::size_t device_bytes_in_use() {
    std::lock_guard lock(alloc_mutex);
    return device_bytes;
}
}  // namespace spillway::test::host_cudart

// ---- Errors and devices -------------------------------------------------------------------

cudaError_t cudaGetLastError() { return std::exchange(last_error, cudaSuccess); }
cudaError_t cudaPeekAtLastError() { return last_error; }

namespace {
struct error_text {
    cudaError_t code;
    const char* name;
    const char* text;
};
constexpr error_text error_texts[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};
const error_text* find_text(cudaError_t err) {
    for (const auto& e : error_texts)
        if (e.code == err) return &e;
    return nullptr;
}
}  // namespace

const char* cudaGetErrorName(cudaError_t error) {
    const auto* e = find_text(error);
    return e ? e->name : "unrecognized error code";
}
const char* cudaGetErrorString(cudaError_t error) {
    const auto* e = find_text(error);
    return e ? e->text : "unrecognized error code";
}

cudaError_t cudaGetDeviceCount(int* count) {
    if (!count) return fail(cudaErrorInvalidValue);
    *count = 1;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
    if (!device) return fail(cudaErrorInvalidValue);
    *device = current_device;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
    if (device != 0) return fail(cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}

// ---- Memory ------------------------------------------------------------------------------

cudaError_t cudaMalloc(void** devPtr, size_t size) { return device_alloc(devPtr, size); }
cudaError_t cudaFree(void* devPtr) {
    if (!devPtr) return cudaSuccess;
    return device_free(devPtr) ? cudaSuccess : fail(cudaErrorInvalidValue);
}
cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t) {
    int left = malloc_async_failures.load();
    while (left > 0 && !malloc_async_failures.compare_exchange_weak(left, left - 1)) {
    }
    if (left > 0) return fail(cudaErrorMemoryAllocation);
    return device_alloc(devPtr, size);
}
cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t hStream) {
    if (!devPtr) return cudaSuccess;
    stream_of(hStream).push([devPtr] {
        if (!device_free(devPtr)) std::abort();  // a double or foreign free: a library bug
    });
    return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int) {
    if (!pHost) return fail(cudaErrorInvalidValue);
    if (size == 0 || size > (std::size_t{1} << 40)) return fail(cudaErrorMemoryAllocation);
    void* mem = std::aligned_alloc(4096, (size + 4095) / 4096 * 4096);
    if (!mem) return fail(cudaErrorMemoryAllocation);
    *pHost = mem;
    return cudaSuccess;
}
cudaError_t cudaFreeHost(void* ptr) {
    std::free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind) {
    if (count > 0 && (!dst || !src)) return fail(cudaErrorInvalidValue);
    if (count > 0) std::memcpy(dst, src, count);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind, cudaStream_t stream) {
    if (count > 0 && (!dst || !src)) return fail(cudaErrorInvalidValue);
    if (count > 0) stream_of(stream).push([dst, src, count] { std::memcpy(dst, src, count); });
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
    if (count > 0 && !devPtr) return fail(cudaErrorInvalidValue);
    if (count > 0) stream_of(stream).push([devPtr, value, count] { std::memset(devPtr, value, count); });
    return cudaSuccess;
}

// ---- Streams -----------------------------------------------------------------------------

cudaError_t cudaStreamCreate(cudaStream_t* pStream) {
    if (!pStream) return fail(cudaErrorInvalidValue);
    *pStream = new CUstream_st;
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int) { return cudaStreamCreate(pStream); }
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    if (!stream) return fail(cudaErrorInvalidResourceHandle);
    stream->drain();
    delete stream;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    stream_of(stream).drain();
    return cudaSuccess;
}
cudaError_t cudaStreamAddCallback(cudaStream_t stream, cudaStreamCallback_t callback, void* userData,
                                  unsigned int flags) {
    if (!callback || flags != 0) return fail(cudaErrorInvalidValue);
    const cudaError_t status = callback_status.load();
    stream_of(stream).push([stream, callback, userData, status] { callback(stream, status, userData); });
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
    if (!event) return fail(cudaErrorInvalidResourceHandle);
    std::uint64_t record = 0;
    {
        std::lock_guard lock(event->state->mutex);
        record = event->state->newest;
    }
    if (record != 0) stream_of(stream).push([state = event->state, record] { state->wait(record); });
    return cudaSuccess;
}

// ---- Events ------------------------------------------------------------------------------

cudaError_t cudaEventCreate(cudaEvent_t* event) {
    if (!event) return fail(cudaErrorInvalidValue);
    *event = new CUevent_st;
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) { return cudaEventCreate(event); }
cudaError_t cudaEventDestroy(cudaEvent_t event) {
    if (!event) return fail(cudaErrorInvalidResourceHandle);
    delete event;  // work items still using the state hold it
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    if (!event) return fail(cudaErrorInvalidResourceHandle);
    auto& state = *event->state;
    std::uint64_t record = 0;
    {
        std::lock_guard lock(state.mutex);
        record = ++state.newest;
        state.pending.insert(record);
    }
    stream_of(stream).push([state = event->state, record] { state->complete(record); });
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
    if (!event) return fail(cudaErrorInvalidResourceHandle);
    std::lock_guard lock(event->state->mutex);
    return event->state->pending.contains(event->state->newest) ? cudaErrorNotReady : cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    if (!event) return fail(cudaErrorInvalidResourceHandle);
    std::uint64_t record = 0;
    {
        std::lock_guard lock(event->state->mutex);
        record = event->state->newest;
    }
    if (record != 0) event->state->wait(record);
    return cudaSuccess;
}
