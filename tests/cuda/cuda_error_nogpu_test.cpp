// SPDX-License-Identifier: Apache-2.0
// The CUDA error path on any machine with the CUDA runtime library, GPU or not (built by the
// host compiler, linked with cudart; no `gpu` label):
// - cuda_category()'s message table says what cudaGetErrorName and cudaGetErrorString say;
// - a failed pinned allocation is a std::system_error naming the call and the size;
// - every throw for a CUDA error clears the thread's last error, make_cuda_error (the stream
//   callback's path) makes no CUDA call, and registration_mode::read_only falls back to
//   portable where the device lacks it.
// The last three need a runtime whose last error can be cleared and a device that answers,
// which a machine without a driver lacks (its initialisation error is permanent), so they
// run against a scripted runtime: the link wraps the runtime calls the headers make
// (-Wl,--wrap, see tests/CMakeLists.txt) and, while a `scripted` scope is alive, answers
// them from the scope's script; outside one every call goes to the real runtime.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <system_error>
#include <vector>

#include <cuda_runtime_api.h>

#include <spillway/cuda/cuda_error.hpp>
#include <spillway/cuda/host_registration.hpp>
#include <spillway/cuda/pinned_buffer.hpp>

namespace {

// The scripted runtime: a per-thread last error as the real one keeps, and call counts.
struct script {
    cudaError_t alloc_result = cudaErrorMemoryAllocation;  // cudaHostAlloc and cudaHostRegister
    int read_only_supported = 0;                           // cudaDevAttrHostRegisterReadOnlySupported
    cudaError_t last_error = cudaSuccess;
    unsigned register_flags = ~0u;
    int calls = 0;  // every scripted call, error lookups included
};
thread_local script* active = nullptr;

cudaError_t fail_or_succeed(cudaError_t result) {
    if (result != cudaSuccess) active->last_error = result;
    return result;
}

// Scripts the wrapped runtime calls of this thread for its lifetime.
class scripted {
public:
    scripted() {
        (void)spillway::cuda::cuda_category();  // the table comes from the real runtime
        active = &script_;
    }
    scripted(const scripted&) = delete;
    scripted& operator=(const scripted&) = delete;
    ~scripted() { active = nullptr; }
    script* operator->() { return &script_; }

private:
    script script_;
};

bool has(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

}  // namespace

// The wrapped runtime calls (the names -Wl,--wrap gives them).
extern "C" {
cudaError_t __real_cudaHostAlloc(void**, std::size_t, unsigned);
cudaError_t __real_cudaFreeHost(void*);
cudaError_t __real_cudaHostRegister(void*, std::size_t, unsigned);
cudaError_t __real_cudaHostUnregister(void*);
cudaError_t __real_cudaGetLastError();
cudaError_t __real_cudaPeekAtLastError();
const char* __real_cudaGetErrorName(cudaError_t);
const char* __real_cudaGetErrorString(cudaError_t);
cudaError_t __real_cudaGetDevice(int*);
cudaError_t __real_cudaDeviceGetAttribute(int*, cudaDeviceAttr, int);

cudaError_t __wrap_cudaHostAlloc(void** p, std::size_t n, unsigned flags) {
    if (!active) return __real_cudaHostAlloc(p, n, flags);
    ++active->calls;
    return fail_or_succeed(active->alloc_result);
}
cudaError_t __wrap_cudaFreeHost(void* p) {
    if (!active) return __real_cudaFreeHost(p);
    ++active->calls;
    return cudaSuccess;
}
cudaError_t __wrap_cudaHostRegister(void* p, std::size_t n, unsigned flags) {
    if (!active) return __real_cudaHostRegister(p, n, flags);
    ++active->calls;
    active->register_flags = flags;
    return fail_or_succeed(active->alloc_result);
}
cudaError_t __wrap_cudaHostUnregister(void* p) {
    if (!active) return __real_cudaHostUnregister(p);
    ++active->calls;
    return cudaSuccess;
}
cudaError_t __wrap_cudaGetLastError() {
    if (!active) return __real_cudaGetLastError();
    ++active->calls;
    cudaError_t e = active->last_error;
    active->last_error = cudaSuccess;
    return e;
}
cudaError_t __wrap_cudaPeekAtLastError() {
    if (!active) return __real_cudaPeekAtLastError();
    ++active->calls;
    return active->last_error;
}
const char* __wrap_cudaGetErrorName(cudaError_t e) {
    if (active) ++active->calls;
    return __real_cudaGetErrorName(e);
}
const char* __wrap_cudaGetErrorString(cudaError_t e) {
    if (active) ++active->calls;
    return __real_cudaGetErrorString(e);
}
cudaError_t __wrap_cudaGetDevice(int* device) {
    if (!active) return __real_cudaGetDevice(device);
    ++active->calls;
    *device = 0;
    return cudaSuccess;
}
cudaError_t __wrap_cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
    if (!active) return __real_cudaDeviceGetAttribute(value, attr, device);
    ++active->calls;
    *value = attr == cudaDevAttrHostRegisterReadOnlySupported ? active->read_only_supported : 0;
    return cudaSuccess;
}
}

namespace sc = spillway::cuda;

TEST_CASE("cuda_category: the table says what cudaGetErrorName and cudaGetErrorString say, for every value") {
    const auto& cat = sc::cuda_category();
    CHECK(std::string(cat.name()) == "cuda");
    CHECK(cat.message(cudaErrorMemoryAllocation) == "cudaErrorMemoryAllocation: out of memory");
    CHECK(cat.message(cudaSuccess) == "cudaSuccess: no error");
    // (Values cast to cudaError_t stay inside the enumeration's range, 0 to 16383.)
    const std::string unknown_name = cudaGetErrorName(static_cast<cudaError_t>(12345));
    const std::string unknown_text = cudaGetErrorString(static_cast<cudaError_t>(12345));
    int known = 0;
    for (int v = 0; v <= 1100; ++v) {
        CAPTURE(v);
        const auto err = static_cast<cudaError_t>(v);
        const std::string name = cudaGetErrorName(err);
        if (name == unknown_name) {
            CHECK(cat.message(v) == "cudaError " + std::to_string(v) + ": " + cudaGetErrorString(err));
        } else {
            ++known;
            CHECK(cat.message(v) == name + ": " + cudaGetErrorString(err));
        }
    }
    CHECK(known > 50);  // the runtime knows about a hundred codes
    CHECK(cat.message(12345) == "cudaError 12345: " + unknown_text);
    CHECK(cat.message(-1) == "cudaError -1: " + unknown_text);
    // An error_code in the category reads the same.
    CHECK(std::error_code(cudaErrorInvalidValue, cat).message() == cat.message(cudaErrorInvalidValue));
}

TEST_CASE("pinned_buffer: a failed allocation names the call, the size and the flags") {
    void* probe = nullptr;
    const cudaError_t runtime_says = cudaHostAlloc(&probe, 4096, cudaHostAllocPortable);
    if (runtime_says == cudaSuccess) cudaFreeHost(probe);
    MESSAGE("cudaHostAlloc of 4096 bytes on this machine: " << sc::cuda_category().message(runtime_says));
    constexpr std::size_t huge = std::size_t{1} << 52;  // 4 PiB: fails with or without a GPU
    try {
        sc::pinned_buffer b(huge);
        FAIL("a 4 PiB pinned allocation succeeded");
    } catch (const std::system_error& e) {
        INFO("message: " << e.what());
        CHECK(&e.code().category() == &sc::cuda_category());
        CHECK(e.code().value() != cudaSuccess);
        if (runtime_says != cudaSuccess) CHECK(e.code().value() == runtime_says);  // no driver: the same failure
        CHECK(has(e.what(), "pinned_buffer of " + std::to_string(huge) + " bytes"));
        CHECK(has(e.what(), "cudaHostAlloc failed"));
        CHECK(has(e.what(), "(flags " + std::to_string(cudaHostAllocPortable) + ")"));
        CHECK(has(e.what(), sc::cuda_category().message(e.code().value())));
    }
    // With a working runtime the failure is cleared; without a driver the runtime's
    // initialisation error is permanent, and the scripted cases below check the clearing.
    const cudaError_t after = cudaPeekAtLastError();
    if (runtime_says == cudaSuccess)
        CHECK(after == cudaSuccess);
    else
        MESSAGE("the runtime cannot initialise here (" << sc::cuda_category().message(after)
                                                       << "): its last error is permanent");
}

TEST_CASE("a throw for a CUDA error clears the thread's last error (scripted runtime)") {
    scripted rt;
    SUBCASE("pinned_buffer") {
        CHECK_THROWS_AS(sc::pinned_buffer(1000), std::system_error);
    }
    SUBCASE("pinned_allocator") {
        using pinned_floats = std::vector<float, sc::pinned_allocator<float>>;
        CHECK_THROWS_AS(pinned_floats(1000), std::system_error);
    }
    SUBCASE("host_registration") {
        std::vector<std::byte> mem(8192);
        try {
            sc::host_registration r(mem);
            FAIL("the scripted registration succeeded");
        } catch (const std::system_error& e) {
            CHECK(e.code().value() == cudaErrorMemoryAllocation);
            CHECK(has(e.what(), "host_registration of 8192 bytes at 0x"));
            CHECK(has(e.what(), "cudaHostRegister failed"));
        }
    }
    SUBCASE("check_cuda") {
        rt->last_error = cudaErrorInvalidValue;
        CHECK_THROWS_AS(sc::check_cuda(cudaErrorInvalidValue, "cudaSomething", "a test"), std::system_error);
    }
    CHECK(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("make_cuda_error makes no CUDA call and leaves the last error (a stream callback's path)") {
    scripted rt;
    rt->last_error = cudaErrorLaunchFailure;
    const int before = rt->calls;
    auto e = sc::make_cuda_error(cudaErrorLaunchFailure, "a copy on the tier's stream", "device: read of key 'k' (5 bytes)");
    CHECK(rt->calls == before);
    CHECK(&e.code().category() == &sc::cuda_category());
    CHECK(e.code().value() == cudaErrorLaunchFailure);
    CHECK(std::string(e.what()) == "device: read of key 'k' (5 bytes): a copy on the tier's stream failed: " +
                                       sc::cuda_category().message(cudaErrorLaunchFailure));
    CHECK(rt->last_error == cudaErrorLaunchFailure);
    (void)e.code().message();  // a message asked for later is a table lookup too
    CHECK(rt->calls == before);
}

TEST_CASE("host_registration: read_only where the device supports it, else portable and why (scripted runtime)") {
    scripted rt;
    rt->alloc_result = cudaSuccess;
    std::vector<std::byte> mem(8192);
    SUBCASE("supported") {
        rt->read_only_supported = 1;
        sc::host_registration r(mem, sc::registration_mode::read_only);
        CHECK(r.active());
        CHECK(r.mode() == sc::registration_mode::read_only);
        CHECK(r.fallback_reason().empty());
        CHECK(rt->register_flags == static_cast<unsigned>(sc::registration_mode::read_only));
    }
    SUBCASE("unsupported") {
        rt->read_only_supported = 0;
        sc::host_registration r(mem, sc::registration_mode::read_only);
        CHECK(r.active());
        CHECK(r.mode() == sc::registration_mode::portable);
        CHECK(has(r.fallback_reason(), "cudaDevAttrHostRegisterReadOnlySupported is 0"));
        CHECK(has(r.fallback_reason(), "device 0"));
        CHECK(rt->register_flags == static_cast<unsigned>(sc::registration_mode::portable));
        sc::host_registration moved = std::move(r);
        CHECK(moved.mode() == sc::registration_mode::portable);
        CHECK_FALSE(moved.fallback_reason().empty());
        CHECK(r.fallback_reason().empty());  // NOLINT(bugprone-use-after-move): moved-from is empty
    }
    SUBCASE("other modes never ask the device") {
        sc::host_registration r(mem, sc::registration_mode::mapped);
        CHECK(r.mode() == sc::registration_mode::mapped);
        CHECK(rt->register_flags == static_cast<unsigned>(sc::registration_mode::mapped));
    }
}
