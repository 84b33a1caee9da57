// SPDX-License-Identifier: Apache-2.0
// tests/stash/stash_support.hpp: helpers for the activation stash tests.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <spillway/stash/activation_stash.hpp>
#include <spillway/tier/host_tier.hpp>

#include "support/host_tier_wrapper.hpp"

namespace spillway::test {

/// A host tier whose writes can be held at a gate (the writer thread blocks inside write()
/// until open_writes()), and which logs every read and write key in issue order.
class gated_tier : public host_tier_wrapper {
public:
    io_completion write(std::string_view key, std::span<const std::byte> bytes) {
        {
            std::unique_lock lock(mutex_);
            write_log_.emplace_back(key);
            ++writes_entered_;
            cv_.notify_all();
            cv_.wait(lock, [&] { return writes_open_; });
        }
        return inner.write(key, bytes);
    }
    io_completion read(std::string_view key, std::span<std::byte> bytes) {
        {
            std::lock_guard lock(mutex_);
            read_log_.emplace_back(key);
        }
        return inner.read(key, bytes);
    }
    [[nodiscard]] std::string name() const { return "gated"; }

    void close_writes() {
        std::lock_guard lock(mutex_);
        writes_open_ = false;
    }
    void open_writes() {
        {
            std::lock_guard lock(mutex_);
            writes_open_ = true;
        }
        cv_.notify_all();
    }
    /// Blocks until `n` writes have entered write() (held at the gate or passed).
    void wait_writes_entered(std::size_t n) {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return writes_entered_ >= n; });
    }
    std::vector<std::string> read_log() const {
        std::lock_guard lock(mutex_);
        return read_log_;
    }
    std::vector<std::string> write_log() const {
        std::lock_guard lock(mutex_);
        return write_log_;
    }
private:
    mutable std::mutex mutex_;
    std::condition_variable cv_;
    bool writes_open_ = true;
    std::size_t writes_entered_ = 0;
    std::vector<std::string> read_log_, write_log_;
};
static_assert(storage_tier<gated_tier>);

/// A contiguous tensor description.
inline tensor_desc make_desc(std::string name, std::uint64_t storage, std::vector<std::int64_t> shape,
                             dtype type = dtype::f32, std::uint32_t layer = current_layer) {
    tensor_desc d;
    d.name = std::move(name);
    d.storage_id = storage;
    d.type = type;
    d.shape = std::move(shape);
    d.layer = layer;
    return d;
}

/// Polls `pred` for up to `limit`; true when it held.
template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit = std::chrono::milliseconds(5000)) {
    auto end = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < end) {
        if (pred()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return pred();
}

}  // namespace spillway::test
