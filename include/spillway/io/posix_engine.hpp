// SPDX-License-Identifier: Apache-2.0
// spillway/io/posix_engine.hpp: file I/O with pread/pwrite on a small pool of threads.
//
// Guarantees (the same as uring_engine; see io_engine.hpp for the shared contract):
// 1. A request larger than config.block_size is split into block_size pieces; at most
//    config.posix_threads() pieces are in flight at once (one per worker thread).
// 2. Short transfers and EAGAIN/EINTR are retried inside until the piece is complete; end of
//    file during a read is an error (ENODATA), as is any other errno. The first error ends
//    the request: pieces not yet started are dropped, pieces in flight are awaited, then
//    the completion fails with one std::system_error naming the call, the label, the size,
//    the offset and the errno.
// 3. submit() never blocks on a full queue; it queues. Several threads may submit at once.
// 4. The destructor waits for every request, then joins the workers.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <poll.h>
#include <unistd.h>

#include "spillway/detail/thread_name.hpp"
#include "spillway/io/completion.hpp"
#include "spillway/io/detail/engine_common.hpp"

namespace spillway {

/// File I/O with pread/pwrite on a pool of config().posix_threads() worker threads; keeps
/// the contract in io_engine.hpp (see the guarantees above).
class posix_engine {
public:
    /// Throws std::invalid_argument for a bad config (see io_engine_config::validate).
    explicit posix_engine(io_engine_config config = {}) : config_(std::move(config)) {
        config_.validate();
        unsigned n = config_.posix_threads();
        workers_.reserve(n);
        try {
            for (unsigned i = 0; i < n; ++i) detail::name_thread(workers_.emplace_back([this] { work(); }), "spw-posix");
        } catch (...) {
            stop();
            throw;
        }
    }
    posix_engine(const posix_engine&) = delete;
    posix_engine& operator=(const posix_engine&) = delete;
    /// Waits for every request in flight, then stops the workers.
    ~posix_engine() { stop(); }

    /// Always io_backend::posix.
    [[nodiscard]] static constexpr io_backend backend() noexcept { return io_backend::posix; }
    /// "posix".
    [[nodiscard]] static constexpr std::string_view backend_name() noexcept { return "posix"; }
    /// The validated settings the engine runs with.
    [[nodiscard]] const io_engine_config& config() const noexcept { return config_; }
    /// A snapshot of what the engine did so far (monotonic counters).
    [[nodiscard]] io_engine_counters counters() const noexcept { return counters_.snapshot(); }

    /// Starts `req`; `callback` runs once when it finished, on a worker thread (or on the
    /// calling thread for an empty request). Throws std::invalid_argument for an offset
    /// range past the largest file offset.
    void submit(const io_request& req, io_callback callback) {
        auto state = detail::begin_request(req, callback, counters_);
        if (!state) return;
        const std::size_t pieces = (req.nbytes + config_.block_size - 1) / config_.block_size;
        {
            std::lock_guard lock(mutex_);
            ++outstanding_;
            queue_.push_back(std::move(state));
        }
        // Wake as many workers as the request has pieces (not every worker for a small one).
        if (pieces >= workers_.size()) work_cv_.notify_all();
        else
            for (std::size_t i = 0; i < pieces; ++i) work_cv_.notify_one();
    }

    /// Reads buf.size() bytes of `fd` at `offset` into `buf`. Keep `buf` alive until done.
    io_completion read(int fd, std::span<std::byte> buf, std::uint64_t offset, std::string_view label = {}) {
        return start({io_op::read, fd, buf.data(), buf.size(), offset, label});
    }
    /// Writes `buf` to `fd` at `offset`. Keep `buf` alive and unchanged until done.
    io_completion write(int fd, std::span<const std::byte> buf, std::uint64_t offset, std::string_view label = {}) {
        return start({io_op::write, fd, const_cast<std::byte*>(buf.data()), buf.size(), offset, label});
    }

private:
    io_completion start(const io_request& req) { return detail::start_request(*this, req); }

    void stop() noexcept {
        {
            std::unique_lock lock(mutex_);
            idle_cv_.wait(lock, [&] { return outstanding_ == 0; });
            stopping_ = true;
        }
        work_cv_.notify_all();
        for (auto& w : workers_)
            if (w.joinable()) w.join();
        workers_.clear();
    }

    // One piece: bytes [pos, pos + len) of the request. Returns 0 or -errno; sets `call` and
    // `extra` for the message.
    long transfer(const detail::request_state& r, std::size_t pos, std::size_t len, const char*& call,
                  const char*& extra) {
        constexpr int max_again = 100000;
        constexpr int max_zero_writes = 1000;
        std::size_t done = 0;
        int again = 0, zero = 0;
        call = r.op == io_op::read ? "pread" : "pwrite";
        while (done < len) {
            std::byte* p = r.data + pos + done;
            std::size_t want = len - done;
            auto off = static_cast<off_t>(r.offset + pos + done);
            long res = r.op == io_op::read ? static_cast<long>(::pread(r.fd, p, want, off))
                                           : static_cast<long>(::pwrite(r.fd, p, want, off));
            if (res < 0) res = -errno;
            if (config_.result_filter) res = config_.result_filter(r.op, res, want);
            if (res == -EAGAIN || res == -EINTR) {
                counters_.again_retries.fetch_add(1, std::memory_order_relaxed);
                if (++again > max_again) return -EAGAIN;
                pollfd pfd{r.fd, static_cast<short>(r.op == io_op::read ? POLLIN : POLLOUT), 0};
                ::poll(&pfd, 1, 1);
                continue;
            }
            if (res < 0) return res;
            if (res == 0) {
                if (r.op == io_op::read) {
                    extra = "end of file";
                    return -ENODATA;
                }
                if (++zero > max_zero_writes) {
                    extra = "no progress";
                    return -EIO;
                }
                continue;
            }
            again = 0;
            done += static_cast<std::size_t>(res);
            if (done < len) counters_.short_retries.fetch_add(1, std::memory_order_relaxed);
        }
        return 0;
    }

    void work() {
        for (;;) {
            std::shared_ptr<detail::request_state> r;
            std::size_t pos = 0, len = 0;
            {
                std::unique_lock lock(mutex_);
                work_cv_.wait(lock, [&] {
                    while (!queue_.empty() && !queue_.front()->has_piece()) queue_.pop_front();
                    return stopping_ || !queue_.empty();
                });
                if (queue_.empty()) return;  // stopping, nothing left
                r = queue_.front();
                pos = r->next;
                len = std::min(config_.block_size, r->nbytes - pos);
                r->next += len;
                ++r->pieces_open;
                if (!r->has_piece()) queue_.pop_front();
                counters_.note_in_flight(++in_flight_);
            }
            counters_.pieces.fetch_add(1, std::memory_order_relaxed);
            const char* call = "";
            const char* extra = "";
            long res = transfer(*r, pos, len, call, extra);
            bool finished = false;
            {
                std::lock_guard lock(mutex_);
                --in_flight_;
                --r->pieces_open;
                if (res < 0 && !r->error)
                    r->error = detail::make_io_error(static_cast<int>(-res), call, r->op, r->label, r->nbytes,
                                                     r->offset, len, r->offset + pos, extra);
                finished = r->finished();
                if (finished) r->retire();
            }
            if (finished) finish(*r);
        }
    }

    void finish(detail::request_state& r) {
        detail::deliver(r, counters_);
        std::lock_guard lock(mutex_);
        if (--outstanding_ == 0) idle_cv_.notify_all();
    }

    io_engine_config config_;
    std::mutex mutex_;
    std::condition_variable work_cv_, idle_cv_;
    std::deque<std::shared_ptr<detail::request_state>> queue_;
    std::size_t outstanding_ = 0;  // requests submitted and not yet called back
    std::uint64_t in_flight_ = 0;  // pieces being transferred
    bool stopping_ = false;
    detail::engine_counters counters_;
    std::vector<std::thread> workers_;
};

}  // namespace spillway
