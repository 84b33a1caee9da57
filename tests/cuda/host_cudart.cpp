// SPDX-License-Identifier: Apache-2.0
// tests/cuda/host_cudart.cpp: a strict host emulation of the CUDA runtime API calls that
// spillway/cuda/ (device_tier, staged_copy, device_stash, pinned_buffer, host_registration,
// memory_pools, cuda_error) makes. A test built by the host compiler and linked with this
// file instead of libcudart runs those headers' logic on a machine without a GPU or a
// driver. The functions have the signatures of <cuda_runtime_api.h> and, declared there,
// C linkage. Where CUDA leaves a behaviour open, the emulation takes the one that breaks a
// caller relying on luck.
//
// Modelled:
//  1. Streams: each stream is a FIFO of work items run in order by one worker thread of its
//     own (real asynchrony: ThreadSanitizer sees the library's use of streams).
//     cudaMemcpyAsync, cudaMemsetAsync, cudaEventRecord, cudaStreamWaitEvent, cudaFreeAsync
//     and callbacks enqueue; cudaStreamSynchronize waits until the FIFO has drained;
//     cudaStreamQuery answers without waiting. cudaStreamDestroy drains the stream first.
//  2. The legacy default stream (0) synchronises with blocking streams (cudaStreamCreate,
//     or flags cudaStreamDefault): its work starts after all work enqueued before it on
//     every blocking stream, and work enqueued on a blocking stream after it starts after
//     it. Non-blocking streams (cudaStreamNonBlocking) have no ordering with it.
//  3. Events: cudaEventRecord enqueues a marker completing the event's newest record;
//     cudaEventQuery/cudaEventSynchronize look at / wait for the newest record (an
//     unrecorded event is complete); cudaStreamWaitEvent blocks the stream until the record
//     the event held at call time completes. An event belongs to the device current when it
//     was created, and recording it on a stream of another device fails
//     (cudaErrorInvalidResourceHandle), as on CUDA.
//  4. The last error: per thread; every failing call sets it, a not-ready answer of
//     cudaEventQuery/cudaStreamQuery too (cudaErrorNotReady, as the runtime does);
//     cudaGetLastError clears it, cudaPeekAtLastError does not. Sticky errors: after
//     make_sticky(err) every call fails with err and cudaGetLastError cannot clear it.
//  5. Stream callbacks (cudaStreamAddCallback) run on the stream's thread with cudaSuccess
//     or a scripted status; any CUDA call made inside one fails with cudaErrorNotPermitted
//     and is counted (calls_in_callbacks()). cudaStreamAddCallback itself can be scripted to
//     fail after the copies before it were enqueued.
//  6. Pageable host memory (cudaPointerGetAttributes: cudaMemoryTypeUnregistered; memory
//     from cudaHostAlloc or cudaHostRegister is cudaMemoryTypeHost, device allocations
//     cudaMemoryTypeDevice): a cudaMemcpyAsync between device memory and host memory that
//     is neither from cudaHostAlloc nor registered by cudaHostRegister blocks the calling
//     thread until the copy has run in stream order (the stream's backlog included): the
//     worst case CUDA allows for staged copies. Host-to-host and device-to-device copies
//     only enqueue.
//  7. Stream-ordered allocation: cudaMallocAsync and cudaMallocFromPoolAsync take memory
//     from a pool (each device's default pool, or one from cudaMemPoolCreate). A range freed
//     by cudaFreeAsync is handed again at once to an allocation on the same stream, and to
//     any stream once the free has run in stream order: a use on another stream that the
//     free was not ordered after reads the next owner's bytes. At every synchronisation
//     (stream, event) a pool gives freed ranges back to the system down to its release
//     threshold (cudaMemPoolAttrReleaseThreshold, 0 by default); reserved_bytes() shows
//     what it keeps.
//  8. Devices: device_count() devices (1 unless set_device_count() says otherwise).
//     Streams, events and allocations belong to the current device; cudaMallocAsync on a
//     stream of a device that is not current is refused (cudaErrorInvalidValue; stricter
//     than CUDA, which would allocate on the stream's device).
//  9. cudaHostAlloc/cudaFreeHost: page-aligned host memory, pinned (a size over 1 TiB
//     fails with cudaErrorMemoryAllocation). cudaHostRegister with its flags (portable,
//     mapped, I/O memory, read-only: unknown bits are cudaErrorInvalidValue, read-only where
//     cudaDevAttrHostRegisterReadOnlySupported is 0 is cudaErrorNotSupported, an overlap
//     cudaErrorHostMemoryAlreadyRegistered); cudaHostUnregister of an address that does
//     not start a registration is cudaErrorHostMemoryNotRegistered.
// 10. Scripted failures (host_cudart.hpp): cudaMallocAsync, callback status,
//     cudaStreamAddCallback, sticky errors; host work on a stream stands in for a kernel.
// Not modelled: kernels, copy engines running concurrently within one stream, timing
// events, graphs and capture, peer access, stream priorities, managed memory, cudaFree's
// implicit device synchronisation, cudaGetErrorName/String inside callbacks (they return
// text and cannot fail), per-thread default streams.
#include "cuda/host_cudart.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

struct CUmemPoolHandle_st;

namespace {

constexpr int max_devices = 8;
thread_local cudaError_t last_error = cudaSuccess;
thread_local int current_device = 0;
thread_local bool in_callback = false;
std::atomic<int> device_count{1};
std::atomic<cudaError_t> sticky_error{cudaSuccess};
std::atomic<int> callback_calls{0};
std::atomic<int> read_only_supported{1};
std::atomic<int> malloc_async_failures{0};
std::atomic<int> add_callback_failures{0};
std::atomic<cudaError_t> callback_status{cudaSuccess};

cudaError_t fail(cudaError_t err) {
    last_error = err;
    return err;
}
// The check at the start of every call: no call inside a callback, a sticky error wins.
cudaError_t enter() {
    if (in_callback) {
        callback_calls.fetch_add(1);
        return fail(cudaErrorNotPermitted);
    }
    if (auto s = sticky_error.load(); s != cudaSuccess) return fail(s);
    return cudaSuccess;
}
#define EMU_ENTER()                                                 \
    do {                                                            \
        if (cudaError_t e_ = enter(); e_ != cudaSuccess) return e_; \
    } while (0)

// Takes one scripted failure from `counter`; true when one was armed.
bool take_failure(std::atomic<int>& counter) {
    int left = counter.load();
    while (left > 0 && !counter.compare_exchange_weak(left, left - 1)) {
    }
    return left > 0;
}

}  // namespace

// An event record set: records are numbered 1, 2, ...; `pending` holds those not completed.
struct event_state {
    std::mutex mutex;
    std::condition_variable cv;
    std::uint64_t newest = 0;  // 0: never recorded
    std::set<std::uint64_t> pending;
    std::uint64_t add() {
        std::lock_guard lock(mutex);
        pending.insert(++newest);
        return newest;
    }
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
    int device = 0;
};

// A stream: a FIFO of work items and the thread that runs them in order.
struct CUstream_st {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<std::function<void()>> work;
    bool running = false;  // the worker runs an item (outside the lock)
    bool stopping = false;
    bool blocking = false;  // synchronises with the legacy default stream
    int device = 0;
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
    bool idle() {
        std::lock_guard lock(mutex);
        return work.empty() && !running;
    }
    // Enqueues the completion of a new record of `state`; returns the record.
    std::uint64_t mark(const std::shared_ptr<event_state>& state) {
        std::uint64_t record = state->add();
        push([state, record] { state->complete(record); });
        return record;
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

// A memory pool: freed ranges kept for reuse, down to the release threshold at syncs.
struct CUmemPoolHandle_st {
    struct free_range {
        void* ptr;
        std::size_t capacity;
        CUstream_st* stream;  // freed on (reusable there at once)
        std::uint64_t id;
        bool done;  // the free ran in stream order: reusable on any stream
    };
    int device = 0;
    std::uint64_t threshold = 0;
    std::size_t reserved = 0;  // bytes taken from the system and not given back
    std::vector<free_range> free;
};

namespace {

// Every allocation and registration, under one mutex.
struct device_alloc_info {
    std::size_t size;
    std::size_t capacity;
    int device;
    CUmemPoolHandle_st* pool;  // nullptr: cudaMalloc
};
struct host_range_info {
    std::size_t size;
    unsigned flags;
    bool registered;  // cudaHostRegister (else cudaHostAlloc)
};
std::mutex alloc_mutex;
std::map<std::uintptr_t, device_alloc_info> device_allocs;
std::map<std::uintptr_t, host_range_info> host_ranges;
std::size_t device_bytes = 0;
std::uint64_t next_free_id = 1;
std::set<CUmemPoolHandle_st*> all_pools;
CUmemPoolHandle_st* make_default_pools() {
    static CUmemPoolHandle_st pools[max_devices];
    for (int d = 0; d < max_devices; ++d) pools[d].device = d;
    return pools;
}
CUmemPoolHandle_st* const default_pools = make_default_pools();

template <class Map>
auto find_containing(Map& map, const void* p) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = map.upper_bound(a);
    if (it == map.begin()) return map.end();
    --it;
    return a < it->first + std::max<std::size_t>(it->second.size, 1) ? it : map.end();
}
bool is_device(const void* p) {
    std::lock_guard lock(alloc_mutex);
    return find_containing(device_allocs, p) != device_allocs.end();
}
bool is_pinned(const void* p) {
    std::lock_guard lock(alloc_mutex);
    return find_containing(host_ranges, p) != host_ranges.end();
}

std::size_t rounded(std::size_t n) {
    return n == 0 ? 256 : (n + 255) / 256 * 256;
}

cudaError_t plain_alloc(void** p, std::size_t n) {
    void* mem = std::aligned_alloc(256, rounded(n));
    if (!mem) return fail(cudaErrorMemoryAllocation);
    std::lock_guard lock(alloc_mutex);
    device_allocs.emplace(reinterpret_cast<std::uintptr_t>(mem),
                          device_alloc_info{n, rounded(n), current_device, nullptr});
    device_bytes += n;
    *p = mem;
    return cudaSuccess;
}

cudaError_t pool_alloc(CUmemPoolHandle_st& pool, void** p, std::size_t n, CUstream_st* stream) {
    const std::size_t cap = rounded(n);
    std::lock_guard lock(alloc_mutex);
    void* mem = nullptr;
    // Newest first: a range this stream freed last is reused before any other.
    for (auto it = pool.free.rbegin(); it != pool.free.rend(); ++it) {
        if (it->capacity == cap && (it->done || it->stream == stream)) {
            mem = it->ptr;
            pool.free.erase(std::next(it).base());
            break;
        }
    }
    if (!mem) {
        mem = std::aligned_alloc(256, cap);
        if (!mem) return fail(cudaErrorMemoryAllocation);
        pool.reserved += cap;
    }
    device_allocs.emplace(reinterpret_cast<std::uintptr_t>(mem),
                          device_alloc_info{n, cap, pool.device, &pool});
    device_bytes += n;
    *p = mem;
    return cudaSuccess;
}

// At a synchronisation: every pool gives completed free ranges back down to its threshold.
void trim_pools() {
    std::lock_guard lock(alloc_mutex);
    auto trim = [](CUmemPoolHandle_st& pool) {
        for (auto it = pool.free.begin();
             it != pool.free.end() && pool.reserved > pool.threshold;) {
            if (!it->done) {
                ++it;
                continue;
            }
            std::free(it->ptr);
            pool.reserved -= it->capacity;
            it = pool.free.erase(it);
        }
    };
    for (int d = 0; d < max_devices; ++d) trim(default_pools[d]);
    for (auto* pool : all_pools) trim(*pool);
}

CUstream_st& legacy_stream() {
    static CUstream_st legacy;
    return legacy;
}
CUstream_st& stream_of(cudaStream_t s) {
    return s ? *s : legacy_stream();
}
int device_of(cudaStream_t s) {
    return s ? s->device : current_device;
}

// The legacy stream's synchronisation with blocking streams (model item 2).
std::mutex legacy_mutex;
std::set<CUstream_st*> blocking_streams;
const std::shared_ptr<event_state> legacy_marks = std::make_shared<event_state>();
std::uint64_t legacy_last = 0;  // the legacy stream's newest mark

// Enqueues `item` on `s` with the legacy stream's ordering.
void push(cudaStream_t s, std::function<void()> item) {
    if (s && !s->blocking) {
        s->push(std::move(item));
        return;
    }
    std::lock_guard lock(legacy_mutex);
    if (s) {  // a blocking stream: after the legacy stream's work so far
        if (legacy_last != 0) s->push([record = legacy_last] { legacy_marks->wait(record); });
        s->push(std::move(item));
        return;
    }
    std::vector<std::pair<std::shared_ptr<event_state>, std::uint64_t>> waits;
    for (auto* b : blocking_streams) {
        auto state = std::make_shared<event_state>();
        waits.emplace_back(state, b->mark(state));
    }
    legacy_stream().push([waits = std::move(waits), item = std::move(item)] {
        for (auto& [state, record] : waits) state->wait(record);
        item();
    });
    legacy_last = legacy_stream().mark(legacy_marks);
}

// Runs `item` on `s` in stream order and waits for it (a pageable copy).
void run_blocking(cudaStream_t s, std::function<void()> item) {
    auto done = std::make_shared<std::promise<void>>();
    auto finished = done->get_future();
    push(s, [item = std::move(item), done] {
        item();
        done->set_value();
    });
    finished.wait();
}

void synchronised() {
    trim_pools();
}

}  // namespace

namespace spillway::test::host_cudart {
void fail_malloc_async(int count) {
    malloc_async_failures.store(count);
}
void set_callback_status(cudaError_t status) {
    callback_status.store(status);
}
void fail_stream_add_callback(int count) {
    add_callback_failures.store(count);
}
cudaError_t enqueue(cudaStream_t stream, std::function<void()> work) {
    push(stream, std::move(work));
    return cudaSuccess;
}
std::size_t device_bytes_in_use() {
    std::lock_guard lock(alloc_mutex);
    return device_bytes;
}
void make_sticky(cudaError_t err) {
    sticky_error.store(err);
}
int calls_in_callbacks() {
    return callback_calls.load();
}
void set_device_count(int count) {
    device_count.store(std::clamp(count, 1, max_devices));
}
void set_read_only_supported(bool supported) {
    read_only_supported.store(supported ? 1 : 0);
}
int registration_flags(const void* p) {
    std::lock_guard lock(alloc_mutex);
    auto it = host_ranges.find(reinterpret_cast<std::uintptr_t>(p));
    return it == host_ranges.end() || !it->second.registered ? -1
                                                             : static_cast<int>(it->second.flags);
}
std::size_t reserved_bytes(cudaMemPool_t pool) {
    std::lock_guard lock(alloc_mutex);
    return pool->reserved;
}
cudaMemPool_t pool_of(const void* p) {
    std::lock_guard lock(alloc_mutex);
    auto it = device_allocs.find(reinterpret_cast<std::uintptr_t>(p));
    return it == device_allocs.end() ? nullptr : it->second.pool;
}
int device_of_allocation(const void* p) {
    std::lock_guard lock(alloc_mutex);
    auto it = device_allocs.find(reinterpret_cast<std::uintptr_t>(p));
    return it == device_allocs.end() ? -1 : it->second.device;
}
}  // namespace spillway::test::host_cudart

// ---- Errors and devices -------------------------------------------------------------------

cudaError_t cudaGetLastError() {
    EMU_ENTER();
    return std::exchange(last_error, cudaSuccess);
}
cudaError_t cudaPeekAtLastError() {
    EMU_ENTER();
    return last_error;
}

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
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
     "an illegal memory access was encountered"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorHostMemoryAlreadyRegistered, "cudaErrorHostMemoryAlreadyRegistered",
     "part or all of the requested memory range is already mapped"},
    {cudaErrorHostMemoryNotRegistered, "cudaErrorHostMemoryNotRegistered",
     "pointer does not correspond to a registered memory region"},
    {cudaErrorNotPermitted, "cudaErrorNotPermitted", "operation not permitted"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
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
    EMU_ENTER();
    if (!count) return fail(cudaErrorInvalidValue);
    *count = device_count.load();
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
    EMU_ENTER();
    if (!device) return fail(cudaErrorInvalidValue);
    *device = current_device;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
    EMU_ENTER();
    if (device < 0 || device >= device_count.load()) return fail(cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
    EMU_ENTER();
    if (!value) return fail(cudaErrorInvalidValue);
    if (device < 0 || device >= device_count.load()) return fail(cudaErrorInvalidDevice);
    if (attr != cudaDevAttrHostRegisterReadOnlySupported) return fail(cudaErrorInvalidValue);
    *value = read_only_supported.load();
    return cudaSuccess;
}

// ---- Memory ------------------------------------------------------------------------------

cudaError_t cudaMalloc(void** devPtr, size_t size) {
    EMU_ENTER();
    if (!devPtr) return fail(cudaErrorInvalidValue);
    if (size > (std::size_t{1} << 40)) return fail(cudaErrorMemoryAllocation);
    return plain_alloc(devPtr, size);
}
cudaError_t cudaFree(void* devPtr) {
    EMU_ENTER();
    if (!devPtr) return cudaSuccess;
    {
        std::lock_guard lock(alloc_mutex);
        auto it = device_allocs.find(reinterpret_cast<std::uintptr_t>(devPtr));
        if (it == device_allocs.end() || it->second.pool) return fail(cudaErrorInvalidValue);
        device_bytes -= it->second.size;
        device_allocs.erase(it);
    }
    std::free(devPtr);
    return cudaSuccess;
}
cudaError_t cudaMallocFromPoolAsync(void** ptr, size_t size, cudaMemPool_t memPool,
                                    cudaStream_t stream) {
    EMU_ENTER();
    if (!ptr || !memPool) return fail(cudaErrorInvalidValue);
    if (take_failure(malloc_async_failures) || size > (std::size_t{1} << 40))
        return fail(cudaErrorMemoryAllocation);
    return pool_alloc(*memPool, ptr, size, stream ? stream : &legacy_stream());
}
cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t hStream) {
    EMU_ENTER();
    if (device_of(hStream) != current_device) return fail(cudaErrorInvalidValue);
    return cudaMallocFromPoolAsync(devPtr, size, &default_pools[current_device], hStream);
}
cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t hStream) {
    EMU_ENTER();
    if (!devPtr) return cudaSuccess;
    CUstream_st* stream = hStream ? hStream : &legacy_stream();
    std::uint64_t id = 0;
    CUmemPoolHandle_st* pool = nullptr;
    {
        std::lock_guard lock(alloc_mutex);
        auto it = device_allocs.find(reinterpret_cast<std::uintptr_t>(devPtr));
        if (it == device_allocs.end() || !it->second.pool)
            std::abort();  // a double or foreign free: a library bug
        pool = it->second.pool;
        id = next_free_id++;
        pool->free.push_back({devPtr, it->second.capacity, stream, id, false});
        device_bytes -= it->second.size;
        device_allocs.erase(it);
    }
    push(hStream, [pool, id] {
        std::lock_guard lock(alloc_mutex);
        for (auto& r : pool->free)
            if (r.id == id) r.done = true;
    });
    return cudaSuccess;
}
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* memPool, int device) {
    EMU_ENTER();
    if (!memPool) return fail(cudaErrorInvalidValue);
    if (device < 0 || device >= device_count.load()) return fail(cudaErrorInvalidDevice);
    *memPool = &default_pools[device];
    return cudaSuccess;
}
cudaError_t cudaMemPoolCreate(cudaMemPool_t* memPool, const struct cudaMemPoolProps* poolProps) {
    EMU_ENTER();
    if (!memPool || !poolProps || poolProps->allocType != cudaMemAllocationTypePinned ||
        poolProps->location.type != cudaMemLocationTypeDevice)
        return fail(cudaErrorInvalidValue);
    if (poolProps->location.id < 0 || poolProps->location.id >= device_count.load())
        return fail(cudaErrorInvalidDevice);
    auto* pool = new CUmemPoolHandle_st;
    pool->device = poolProps->location.id;
    std::lock_guard lock(alloc_mutex);
    all_pools.insert(pool);
    *memPool = pool;
    return cudaSuccess;
}
cudaError_t cudaMemPoolDestroy(cudaMemPool_t memPool) {
    EMU_ENTER();
    std::lock_guard lock(alloc_mutex);
    if (!all_pools.erase(memPool)) return fail(cudaErrorInvalidValue);
    for (auto& r : memPool->free)
        std::free(r.ptr);  // live allocations stay (CUDA defers the destroy)
    delete memPool;
    return cudaSuccess;
}
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void* value) {
    EMU_ENTER();
    if (!memPool || !value || attr != cudaMemPoolAttrReleaseThreshold)
        return fail(cudaErrorInvalidValue);
    std::lock_guard lock(alloc_mutex);
    memPool->threshold = *static_cast<std::uint64_t*>(value);
    return cudaSuccess;
}
cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void* value) {
    EMU_ENTER();
    if (!memPool || !value || attr != cudaMemPoolAttrReleaseThreshold)
        return fail(cudaErrorInvalidValue);
    std::lock_guard lock(alloc_mutex);
    *static_cast<std::uint64_t*>(value) = memPool->threshold;
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int flags) {
    EMU_ENTER();
    if (!pHost) return fail(cudaErrorInvalidValue);
    if (size == 0 || size > (std::size_t{1} << 40)) return fail(cudaErrorMemoryAllocation);
    void* mem = std::aligned_alloc(4096, (size + 4095) / 4096 * 4096);
    if (!mem) return fail(cudaErrorMemoryAllocation);
    std::lock_guard lock(alloc_mutex);
    host_ranges.emplace(reinterpret_cast<std::uintptr_t>(mem), host_range_info{size, flags, false});
    *pHost = mem;
    return cudaSuccess;
}
cudaError_t cudaFreeHost(void* ptr) {
    EMU_ENTER();
    if (!ptr) return cudaSuccess;
    {
        std::lock_guard lock(alloc_mutex);
        auto it = host_ranges.find(reinterpret_cast<std::uintptr_t>(ptr));
        if (it == host_ranges.end() || it->second.registered) return fail(cudaErrorInvalidValue);
        host_ranges.erase(it);
    }
    std::free(ptr);
    return cudaSuccess;
}
cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int flags) {
    EMU_ENTER();
    constexpr unsigned known = cudaHostRegisterPortable | cudaHostRegisterMapped |
                               cudaHostRegisterIoMemory | cudaHostRegisterReadOnly;
    if (!ptr || size == 0 || (flags & ~known) != 0) return fail(cudaErrorInvalidValue);
    if ((flags & cudaHostRegisterReadOnly) && !read_only_supported.load())
        return fail(cudaErrorNotSupported);
    const auto a = reinterpret_cast<std::uintptr_t>(ptr);
    std::lock_guard lock(alloc_mutex);
    auto next = host_ranges.lower_bound(a);
    if (next != host_ranges.end() && next->first < a + size)
        return fail(cudaErrorHostMemoryAlreadyRegistered);
    if (next != host_ranges.begin() && std::prev(next)->first + std::prev(next)->second.size > a)
        return fail(cudaErrorHostMemoryAlreadyRegistered);
    host_ranges.emplace(a, host_range_info{size, flags, true});
    return cudaSuccess;
}
cudaError_t cudaHostUnregister(void* ptr) {
    EMU_ENTER();
    std::lock_guard lock(alloc_mutex);
    auto it = host_ranges.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == host_ranges.end() || !it->second.registered)
        return fail(cudaErrorHostMemoryNotRegistered);
    host_ranges.erase(it);
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* attributes, const void* ptr) {
    EMU_ENTER();
    if (!attributes) return fail(cudaErrorInvalidValue);
    *attributes = cudaPointerAttributes{};
    attributes->device = current_device;
    if (is_device(ptr)) {
        attributes->type = cudaMemoryTypeDevice;
        attributes->devicePointer = const_cast<void*>(ptr);
    } else if (is_pinned(ptr)) {
        attributes->type = cudaMemoryTypeHost;
        attributes->hostPointer = const_cast<void*>(ptr);
    } else {
        attributes->type = cudaMemoryTypeUnregistered;
    }
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind) {
    EMU_ENTER();
    if (count > 0 && (!dst || !src)) return fail(cudaErrorInvalidValue);
    if (count > 0) run_blocking(nullptr, [dst, src, count] { std::memcpy(dst, src, count); });
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind,
                            cudaStream_t stream) {
    EMU_ENTER();
    if (count > 0 && (!dst || !src)) return fail(cudaErrorInvalidValue);
    if (count == 0) return cudaSuccess;
    const bool dst_device = is_device(dst), src_device = is_device(src);
    const bool pageable = (dst_device && !src_device && !is_pinned(src)) ||
                          (src_device && !dst_device && !is_pinned(dst));
    auto copy = [dst, src, count] { std::memcpy(dst, src, count); };
    if (pageable)
        run_blocking(stream, copy);
    else
        push(stream, copy);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
    EMU_ENTER();
    if (count > 0 && !devPtr) return fail(cudaErrorInvalidValue);
    if (count > 0) push(stream, [devPtr, value, count] { std::memset(devPtr, value, count); });
    return cudaSuccess;
}

// ---- Streams -----------------------------------------------------------------------------

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
    EMU_ENTER();
    if (!pStream || (flags & ~unsigned{cudaStreamNonBlocking}) != 0)
        return fail(cudaErrorInvalidValue);
    auto* s = new CUstream_st;
    s->device = current_device;
    s->blocking = (flags & cudaStreamNonBlocking) == 0;
    if (s->blocking) {
        std::lock_guard lock(legacy_mutex);
        blocking_streams.insert(s);
    }
    *pStream = s;
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* pStream) {
    return cudaStreamCreateWithFlags(pStream, cudaStreamDefault);
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    EMU_ENTER();
    if (!stream) return fail(cudaErrorInvalidResourceHandle);
    stream->drain();
    {
        std::lock_guard lock(legacy_mutex);
        blocking_streams.erase(stream);
    }
    delete stream;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    EMU_ENTER();
    stream_of(stream).drain();
    synchronised();
    return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t stream) {
    EMU_ENTER();
    return stream_of(stream).idle() ? cudaSuccess : fail(cudaErrorNotReady);
}
cudaError_t cudaStreamAddCallback(cudaStream_t stream, cudaStreamCallback_t callback,
                                  void* userData, unsigned int flags) {
    EMU_ENTER();
    if (!callback || flags != 0) return fail(cudaErrorInvalidValue);
    if (take_failure(add_callback_failures)) return fail(cudaErrorLaunchFailure);
    const cudaError_t status = callback_status.load();
    push(stream, [stream, callback, userData, status] {
        in_callback = true;
        callback(stream, status, userData);
        in_callback = false;
    });
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
    EMU_ENTER();
    if (!event) return fail(cudaErrorInvalidResourceHandle);
    std::uint64_t record = 0;
    {
        std::lock_guard lock(event->state->mutex);
        record = event->state->newest;
    }
    if (record != 0) push(stream, [state = event->state, record] { state->wait(record); });
    return cudaSuccess;
}

// ---- Events ------------------------------------------------------------------------------

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
    EMU_ENTER();
    if (!event) return fail(cudaErrorInvalidValue);
    *event = new CUevent_st;
    (*event)->device = current_device;
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* event) {
    return cudaEventCreateWithFlags(event, cudaEventDefault);
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
    EMU_ENTER();
    if (!event) return fail(cudaErrorInvalidResourceHandle);
    delete event;  // work items still using the state hold it
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    EMU_ENTER();
    if (!event || event->device != device_of(stream)) return fail(cudaErrorInvalidResourceHandle);
    const std::uint64_t record = event->state->add();
    push(stream, [state = event->state, record] { state->complete(record); });
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
    EMU_ENTER();
    if (!event) return fail(cudaErrorInvalidResourceHandle);
    bool pending = false;
    {
        std::lock_guard lock(event->state->mutex);
        pending = event->state->pending.contains(event->state->newest);
    }
    return pending ? fail(cudaErrorNotReady) : cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    EMU_ENTER();
    if (!event) return fail(cudaErrorInvalidResourceHandle);
    std::uint64_t record = 0;
    {
        std::lock_guard lock(event->state->mutex);
        record = event->state->newest;
    }
    if (record != 0) event->state->wait(record);
    synchronised();
    return cudaSuccess;
}
