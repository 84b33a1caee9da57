// SPDX-License-Identifier: Apache-2.0
// spillway/io/uring_engine.hpp: file I/O through one io_uring ring per engine (liburing),
// and the run-time probe that says whether io_uring can be used here.
//
// uring_probe() works in every build (without liburing it reports "built without liburing");
// the uring_engine class exists only when SPILLWAY_HAS_LIBURING is 1.
//
// Guarantees of uring_engine (the shared contract is in io_engine.hpp):
// 1. One ring of config.queue_depth entries. A request is split into config.block_size
//    pieces; at most queue_depth pieces are in the ring at once, across all requests, FIFO.
// 2. One completion thread per engine reaps the ring. A short transfer or -EAGAIN/-EINTR
//    resubmits the rest of that piece; end of file during a read is ENODATA; any other
//    -errno ends the request: its pieces not yet submitted are dropped, those in flight are
//    awaited, then the callback gets one std::system_error (the -errno stays inside this
//    header and is converted once, in detail::make_io_error).
// 3. submit() never blocks on a full ring; it queues. Several threads may submit at once
//    (the queue and the submission ring are guarded by one mutex; reaping needs no lock on
//    the ring). The completion thread prepares and submits every piece, batched: submit()
//    only wakes it (with a NOP) when a slot is free, so the kernel finishes each piece in
//    the thread that waits for it and tops the ring up there, one submission per batch.
// 4. Registration (io_registration): `files` puts each request's fd into a sparse fixed
//    file table for the request's life (if the table is full the plain fd is used);
//    `buffers` lets register_buffers() pin caller buffers once, and pieces inside them use
//    READ_FIXED / WRITE_FIXED.
// 5. The destructor waits for every request, stops the completion thread, frees the ring;
//    it returns on a broken ring too (6).
// 6. A broken ring never aborts the process, and makes no caller wait longer than a working
//    ring would. The ring is broken when io_uring_submit or io_uring_wait_cqe fails with an
//    error other than EINTR, EAGAIN or EBUSY (EBADF, EFAULT, EOPNOTSUPP once the descriptor
//    is no ring ...), or when io_uring_submit keeps taking none of the pending entries (the
//    descriptor's number was closed and now names another ring). The first such error is
//    kept, nothing is submitted to the ring again, and every request not finished fails
//    with one std::system_error naming that call, the request and the errno (built in
//    detail::make_io_error like any other):
//    - requests queued and pieces prepared but never consumed by the kernel fail at once;
//    - pieces the kernel had consumed complete as usual when their completions appear in
//      the ring's memory, and never earlier, since the kernel may write a read's buffer
//      until then (a piece that never completes, a read from a pipe nobody writes, waits as
//      it would on a working ring);
//    - requests submitted later fail at once.
//    Every callback still runs on the completion thread, which sleeps (no spinning) until
//    the destructor. The destructor unmaps the ring but closes its descriptor only if the
//    error does not say that the number no longer refers to the ring (EBADF, EOPNOTSUPP).
//    The working ring pays for this with one idle POLL entry (re-armed if it ends without a
//    break; on kernels before 5.13, whose register_buffers() waits for every request in the
//    ring, register buffers through io_registration only where the kernel is newer).
//    Protocol:
//    1. At start the completion thread arms a POLL on the engine's eventfd in the ring.
//    2. Whichever thread sees the hard error records it under the mutex (break_locked) and
//       writes to the eventfd.
//    3. If the completion thread sleeps in io_uring_enter, the poll completes and wakes it:
//       a blocked io_uring_enter keeps the ring's file alive even after its descriptor was
//       closed or replaced, so nothing else would wake it (no NOP can be submitted to a
//       broken ring). If it is awake, it sees the error under the mutex, or its next wait
//       fails. A thread that went back into io_uring_enter on a number now naming another
//       ring wakes at its wait's one-second timeout (kernels 5.11+) and sees the error.
//    4. It fails the pieces whose entries the kernel never consumed (those between the SQ
//       ring's head and liburing's tail) and the queue.
//    5. It reaps the completions the kernel still writes into the ring's memory, without a
//       syscall on the ring, sleeping on a condition variable between looks (1 ms doubling
//       to 64 ms; a submit() wakes it), until no piece is in the kernel.
//    6. It sleeps on that condition variable, failing each request submit() queues, until the
//       destructor (which waited for every request) sets stopping_ and wakes it.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "spillway/config.hpp"
#include "spillway/io/detail/engine_common.hpp"

#if SPILLWAY_HAS_LIBURING
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <span>
#include <stdexcept>
#include <thread>
#include <vector>

#include <liburing.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include "spillway/detail/thread_name.hpp"
#include "spillway/io/completion.hpp"
#endif

namespace spillway {

/// The outcome of the io_uring probe: available, or why not.
struct uring_probe_result {
    /// True when io_uring can be used in this process.
    bool available = false;
    /// Why not, in words; empty when available.
    std::string reason;
};

namespace detail {

/// Runs the probe now (uring_probe() caches it). Steps:
/// 1. built with liburing? 2. SPILLWAY_DISABLE_IO_URING set (non-empty, not "0")?
/// 3. /proc/sys/kernel/io_uring_disabled == 2? 4. io_uring_queue_init (fails under seccomp,
/// on old kernels, or when disabled for this user) 5. the opcode probe: NOP, READ, WRITE,
/// READ_FIXED, WRITE_FIXED 6. one NOP round trip through the ring.
inline uring_probe_result probe_uring_uncached() {
#if !SPILLWAY_HAS_LIBURING
    return {false, "built without liburing (SPILLWAY_WITH_LIBURING=OFF or liburing not found)"};
#else
    if (const char* env = std::getenv("SPILLWAY_DISABLE_IO_URING"); env && *env && std::string(env) != "0")
        return {false, "disabled by the environment (SPILLWAY_DISABLE_IO_URING=" + std::string(env) + ")"};
    if (std::FILE* f = std::fopen("/proc/sys/kernel/io_uring_disabled", "re")) {
        int v = 0;
        const bool read = std::fscanf(f, "%d", &v) == 1;
        std::fclose(f);
        if (read && v == 2) return {false, "disabled by the kernel (kernel.io_uring_disabled=2)"};
    }
    io_uring ring;
    int ret = io_uring_queue_init(4, &ring, 0);
    if (ret < 0)
        return {false, std::string("io_uring_queue_init failed: ") + std::strerror(-ret) +
                           " (old kernel, seccomp filter, or kernel.io_uring_disabled)"};
    uring_probe_result result{true, {}};
    io_uring_probe* probe = io_uring_get_probe_ring(&ring);
    if (!probe) {
        result = {false, "io_uring_get_probe_ring failed (kernel older than 5.6)"};
    } else {
        const std::pair<int, const char*> needed[] = {{IORING_OP_NOP, "NOP"},
                                                      {IORING_OP_READ, "READ"},
                                                      {IORING_OP_WRITE, "WRITE"},
                                                      {IORING_OP_READ_FIXED, "READ_FIXED"},
                                                      {IORING_OP_WRITE_FIXED, "WRITE_FIXED"}};
        for (auto [op, name] : needed)
            if (!io_uring_opcode_supported(probe, op)) {
                result = {false, std::string("the kernel's io_uring lacks the ") + name + " opcode"};
                break;
            }
        io_uring_free_probe(probe);
    }
    if (result.available) {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring);
        io_uring_prep_nop(sqe);
        ret = io_uring_submit(&ring);
        io_uring_cqe* cqe = nullptr;
        if (ret >= 0) ret = io_uring_wait_cqe(&ring, &cqe);
        if (ret < 0) result = {false, std::string("io_uring NOP round trip failed: ") + std::strerror(-ret)};
        else io_uring_cqe_seen(&ring, cqe);
    }
    io_uring_queue_exit(&ring);
    return result;
#endif
}

}  // namespace detail

/// Whether io_uring works in this process; computed once, then cached.
inline const uring_probe_result& uring_probe() {
    static const uring_probe_result result = detail::probe_uring_uncached();
    return result;
}

#if SPILLWAY_HAS_LIBURING

/// File I/O through one io_uring ring and one completion thread; keeps the contract in
/// io_engine.hpp (see the guarantees above). Only when built with liburing.
class uring_engine {
public:
    /// Throws std::invalid_argument for a bad config, std::system_error when the ring cannot
    /// be set up (the message carries the probe's reason when the probe failed) or the
    /// eventfd of guarantee 6 cannot be made.
    explicit uring_engine(io_engine_config config = {}) : config_(std::move(config)) {
        config_.validate();
        int ret = io_uring_queue_init(config_.queue_depth, &ring_, 0);
        if (ret < 0) {
            const auto& probe = uring_probe();
            throw_system_error(-ret, "io_uring_queue_init",
                               "uring_engine with queue depth " + std::to_string(config_.queue_depth) +
                                   (probe.available ? std::string() : " (probe: " + probe.reason + ")"));
        }
        slots_.resize(config_.queue_depth);
        free_slots_.reserve(config_.queue_depth);
        for (unsigned i = config_.queue_depth; i-- > 0;) free_slots_.push_back(i);
        if (registers_files(config_.registration)) {
            unsigned n = std::max(64u, config_.queue_depth);
            ret = io_uring_register_files_sparse(&ring_, n);
            if (ret < 0) {
                io_uring_queue_exit(&ring_);
                throw_system_error(-ret, "io_uring_register_files_sparse",
                                   "uring_engine: a fixed file table of " + std::to_string(n) + " entries");
            }
            for (unsigned i = n; i-- > 0;) free_files_.push_back(static_cast<int>(i));
        }
        wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (wake_fd_ < 0) {
            int err = errno;
            io_uring_queue_exit(&ring_);
            throw_system_error(err, "eventfd", "uring_engine: the descriptor that wakes the completion thread");
        }
        try {
            reaper_ = std::thread([this] { reap(); });
            detail::name_thread(reaper_, "spw-uring");
        } catch (...) {
            io_uring_queue_exit(&ring_);
            ::close(wake_fd_);
            throw;
        }
    }
    uring_engine(const uring_engine&) = delete;
    uring_engine& operator=(const uring_engine&) = delete;

    /// Waits for every request in flight, stops the completion thread, frees the ring. Returns
    /// on a broken ring too (guarantee 6).
    ~uring_engine() {
        {
            std::unique_lock lock(mutex_);
            idle_cv_.wait(lock, [&] { return outstanding_ == 0; });
            stopping_ = true;
            if (io_uring_sqe* sqe = sqe_locked()) {  // null once broken
                io_uring_prep_nop(sqe);
                io_uring_sqe_set_data64(sqe, stop_tag);
                ++unsubmitted_;
                submit_locked();  // may break the ring: then the eventfd wakes the thread
            }
            broken_cv_.notify_all();  // (a broken engine's completion thread waits there)
        }
        reaper_.join();
        // A descriptor that no longer refers to the ring is not the engine's to close: its
        // number may belong to another of the process's files by now.
        if (broken_ == EBADF || broken_ == EOPNOTSUPP) ring_.ring_fd = -1;
        io_uring_queue_exit(&ring_);
        ::close(wake_fd_);
    }

    /// Always io_backend::io_uring.
    [[nodiscard]] static constexpr io_backend backend() noexcept { return io_backend::io_uring; }
    /// "io_uring".
    [[nodiscard]] static constexpr std::string_view backend_name() noexcept { return "io_uring"; }
    /// The validated settings the engine runs with.
    [[nodiscard]] const io_engine_config& config() const noexcept { return config_; }
    /// A snapshot of what the engine did so far (monotonic counters).
    [[nodiscard]] io_engine_counters counters() const noexcept { return counters_.snapshot(); }

    /// Registers `buffers` with the ring once (needs io_registration::buffers or
    /// files_and_buffers). Pieces that lie inside one of them then use the FIXED opcodes.
    /// The buffers must outlive the engine. Throws std::logic_error when registration was
    /// not configured or buffers were registered already, std::system_error when the
    /// kernel refuses (e.g. RLIMIT_MEMLOCK), naming the count and total size.
    void register_buffers(std::span<const std::span<std::byte>> buffers) {
        if (!registers_buffers(config_.registration))
            throw std::logic_error("uring_engine::register_buffers: the engine was configured without "
                                   "io_registration::buffers");
        std::lock_guard lock(mutex_);
        if (!buffers_.empty()) throw std::logic_error("uring_engine::register_buffers: buffers are registered already");
        std::vector<iovec> iovs;
        std::size_t total = 0;
        for (auto b : buffers) {
            iovs.push_back({b.data(), b.size()});
            total += b.size();
        }
        int ret = io_uring_register_buffers(&ring_, iovs.data(), static_cast<unsigned>(iovs.size()));
        if (ret < 0)
            throw_system_error(-ret, "io_uring_register_buffers",
                               "uring_engine: " + std::to_string(iovs.size()) + " buffers of " + bytes_str(total) +
                                   " in all");
        buffers_ = std::move(iovs);
    }

    /// Starts `req`; `callback` runs once when it finished, on the completion thread (or on
    /// the calling thread for an empty request). On a broken ring it fails at once (6).
    void submit(const io_request& req, io_callback callback) {
        auto state = detail::begin_request(req, callback, counters_);
        if (!state) return;
        std::lock_guard lock(mutex_);
        if (!free_files_.empty() && !broken_) {
            int file_slot = free_files_.back();
            int fd = req.fd;
            if (io_uring_register_files_update(&ring_, static_cast<unsigned>(file_slot), &fd, 1) == 1) {
                free_files_.pop_back();
                state->fixed_file = file_slot;
            }
        }
        ++outstanding_;
        queue_.push_back(std::move(state));
        wake_locked();
        if (broken_) broken_cv_.notify_all();
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
    using request_ptr = std::shared_ptr<detail::request_state>;

    static constexpr std::uint64_t stop_tag = ~std::uint64_t{0};
    static constexpr std::uint64_t wake_tag = stop_tag - 1;
    static constexpr std::uint64_t broken_tag = stop_tag - 2;  // the POLL on wake_fd_ (guarantee 6)

    static constexpr const char* broken_note = "the io_uring ring is broken";

    struct slot {
        std::shared_ptr<detail::request_state> req;
        std::size_t pos = 0;   // piece start within the request
        std::size_t len = 0;   // piece length
        std::size_t done = 0;  // bytes of the piece transferred so far
        int zero_writes = 0;
    };

    io_completion start(const io_request& req) { return detail::start_request(*this, req); }

    // A free submission entry; null once the ring is broken (then nothing is prepared any
    // more). Caller holds mutex_.
    io_uring_sqe* sqe_locked() {
        if (broken_) return nullptr;
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        if (!sqe) {  // cannot happen: at most queue_depth entries wait between flushes
            submit_locked();
            sqe = io_uring_get_sqe(&ring_);
            if (!sqe && !broken_) break_locked("io_uring_get_sqe", EBUSY);
        }
        return broken_ ? nullptr : sqe;
    }

    // Puts the rest of slot `i` into the submission queue; false once the ring is broken.
    // Caller holds mutex_.
    bool prep_locked(unsigned i) {
        io_uring_sqe* sqe = sqe_locked();
        if (!sqe) return false;
        slot& s = slots_[i];
        auto& r = *s.req;
        std::byte* p = r.data + s.pos + s.done;
        auto n = static_cast<unsigned>(s.len - s.done);
        std::uint64_t off = r.offset + s.pos + s.done;
        int fd = r.fixed_file >= 0 ? r.fixed_file : r.fd;
        int buf_index = -1;
        for (std::size_t b = 0; b < buffers_.size(); ++b) {
            auto* base = static_cast<std::byte*>(buffers_[b].iov_base);
            if (p >= base && p + n <= base + buffers_[b].iov_len) {
                buf_index = static_cast<int>(b);
                break;
            }
        }
        if (r.op == io_op::read) {
            if (buf_index >= 0) io_uring_prep_read_fixed(sqe, fd, p, n, off, buf_index);
            else io_uring_prep_read(sqe, fd, p, n, off);
        } else {
            if (buf_index >= 0) io_uring_prep_write_fixed(sqe, fd, p, n, off, buf_index);
            else io_uring_prep_write(sqe, fd, p, n, off);
        }
        if (r.fixed_file >= 0) sqe->flags |= IOSQE_FIXED_FILE;
        io_uring_sqe_set_data64(sqe, i);
        ++unsubmitted_;
        return true;
    }

    // Wakes the completion thread so that it hands the queued pieces to free slots: a NOP,
    // which completes at once, unless one is on its way already or every slot is busy (the
    // next completion tops the ring up then). Only the completion thread submits pieces, so
    // the kernel runs their completion work in the thread that waits for them (the task
    // that submits a request is otherwise woken once per piece just to post its completion).
    // Does nothing on a broken ring. Caller holds mutex_.
    void wake_locked() {
        if (wake_pending_ || free_slots_.empty()) return;
        io_uring_sqe* sqe = sqe_locked();
        if (!sqe) return;
        io_uring_prep_nop(sqe);
        io_uring_sqe_set_data64(sqe, wake_tag);
        ++unsubmitted_;
        submit_locked();
        wake_pending_ = true;
    }

    // Hands new pieces to free slots; a request that finished (only when the ring broke) goes
    // to `finished`. Caller holds mutex_.
    void fill_locked(std::vector<request_ptr>& finished) {
        while (!free_slots_.empty() && !broken_) {
            while (!queue_.empty() && !queue_.front()->has_piece()) queue_.pop_front();
            if (queue_.empty()) return;
            auto& r = queue_.front();
            unsigned i = free_slots_.back();
            free_slots_.pop_back();
            slot& s = slots_[i];
            s.req = r;
            s.pos = r->next;
            s.len = std::min(config_.block_size, r->nbytes - r->next);
            s.done = 0;
            s.zero_writes = 0;
            r->next += s.len;
            ++r->pieces_open;
            if (!r->has_piece()) queue_.pop_front();
            counters_.pieces.fetch_add(1, std::memory_order_relaxed);
            counters_.note_in_flight(config_.queue_depth - free_slots_.size());
            if (!prep_locked(i))
                if (auto f = fail_piece_locked(i, broken_note)) finished.push_back(std::move(f));
        }
    }

    // Submits prepared entries; a hard error breaks the ring (guarantee 6, step 2). Caller
    // holds mutex_.
    void submit_locked() {
        unsigned stalled = 0;
        while (unsubmitted_ > 0) {
            const unsigned pending = io_uring_sq_ready(&ring_);
            int ret = io_uring_submit(&ring_);
            if (ret >= 0) {
                // What is left is the kernel's word (its head of this ring's submission queue),
                // not `ret`: a call on a descriptor whose number now names another ring can
                // take that ring's entries and return their count. A working ring takes at
                // least one of ours per call, or says why not (EAGAIN, EBUSY); none taken,
                // again and again: the number is no longer this ring's (guarantee 6).
                unsubmitted_ = io_uring_sq_ready(&ring_);
                if (unsubmitted_ < pending) {
                    stalled = 0;
                } else if (++stalled > 64) {
                    break_locked("io_uring_submit", EBADF);
                } else {
                    std::this_thread::yield();
                }
                continue;
            }
            if (ret == -EINTR || ret == -EAGAIN || ret == -EBUSY) {
                std::this_thread::yield();
                continue;
            }
            break_locked("io_uring_submit", -ret);
        }
    }

    // Arms the POLL on wake_fd_ that wakes the completion thread when the ring breaks
    // (guarantee 6, step 1); nothing on a broken ring. Caller holds mutex_.
    void arm_wake_poll_locked() {
        if (io_uring_sqe* sqe = sqe_locked()) {
            io_uring_prep_poll_add(sqe, wake_fd_, POLLIN);
            io_uring_sqe_set_data64(sqe, broken_tag);
            ++unsubmitted_;
            submit_locked();
        }
    }

    // Records the first hard error of the ring and wakes the completion thread through the
    // eventfd its POLL watches (guarantee 6, step 2). Caller holds mutex_.
    void break_locked(const char* call, int err) noexcept {
        unsubmitted_ = 0;  // the kernel takes no more entries
        if (broken_) return;
        broken_ = err;
        broken_call_ = call;
        const std::uint64_t one = 1;
        [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);  // cannot fail: the counter is far from full
    }

    // The error of a request (or of one of its pieces) on the broken ring.
    [[nodiscard]] std::exception_ptr broken_error(const detail::request_state& r, std::size_t piece_bytes,
                                                  std::uint64_t piece_offset, const char* note) const noexcept {
        return detail::make_io_error(broken_, broken_call_, r.op, r.label, r.nbytes, r.offset, piece_bytes,
                                     piece_offset, note);
    }

    // Fails the piece in slot i with the broken ring's error (a request keeps its first
    // error) and frees the slot; returns the request if it just finished. Caller holds mutex_.
    request_ptr fail_piece_locked(unsigned i, const char* note) {
        slot& s = slots_[i];
        auto& r = *s.req;
        if (!r.error) r.error = broken_error(r, s.len, r.offset + s.pos, note);
        return release_locked(i);
    }

    // Fails every queued request on the broken ring; those with no piece open go to
    // `finished`, the others finish when their last piece does. Caller holds mutex_.
    void fail_queue_locked(std::vector<request_ptr>& finished) {
        for (auto& r : queue_) {
            // A request that failed earlier stays queued until fill_locked() passes it; once
            // retired (or with every piece handed out) it is no longer the queue's to finish.
            if (!r->has_piece()) continue;
            r->error = broken_error(*r, r->nbytes, r->offset, broken_note);
            if (r->finished()) finished.push_back(retire_locked(std::move(r)));
        }
        queue_.clear();
    }

    // Frees slot i; returns the request if it just finished. Caller holds mutex_.
    request_ptr release_locked(unsigned i) {
        slot& s = slots_[i];
        auto r = std::move(s.req);
        free_slots_.push_back(i);
        --r->pieces_open;
        if (!r->finished()) return nullptr;
        return retire_locked(std::move(r));
    }

    // Ends a finished request's bookkeeping; returns it, for finish(). Caller holds mutex_.
    request_ptr retire_locked(request_ptr r) {
        r->retire();
        if (r->fixed_file >= 0) {
            int minus_one = -1;
            if (!broken_) io_uring_register_files_update(&ring_, static_cast<unsigned>(r->fixed_file), &minus_one, 1);
            free_files_.push_back(r->fixed_file);
            r->fixed_file = -1;
        }
        return r;
    }

    // Resubmits the rest of slot i; on a broken ring the piece fails instead. Returns the
    // request if it just finished. Caller holds mutex_.
    request_ptr retry_locked(unsigned i) {
        if (prep_locked(i)) return nullptr;
        return fail_piece_locked(i, broken_note);
    }

    // Acts on one completion of slot i. Caller holds mutex_.
    request_ptr complete_locked(unsigned i, long res) {
        slot& s = slots_[i];
        auto& r = *s.req;
        std::size_t want = s.len - s.done;
        if (config_.result_filter) res = config_.result_filter(r.op, res, want);
        const char* extra = "";
        if (res == -EAGAIN || res == -EINTR) {
            counters_.again_retries.fetch_add(1, std::memory_order_relaxed);
            return retry_locked(i);
        }
        if (res == 0 && r.op == io_op::write && ++s.zero_writes <= 1000) return retry_locked(i);
        if (res == 0) {
            extra = r.op == io_op::read ? "end of file" : "no progress";
            res = r.op == io_op::read ? -ENODATA : -EIO;
        }
        if (res < 0) {
            if (!r.error)
                r.error = detail::make_io_error(static_cast<int>(-res), r.op == io_op::read ? "io_uring read" : "io_uring write",
                                                r.op, r.label, r.nbytes, r.offset, s.len, r.offset + s.pos, extra);
            return release_locked(i);
        }
        s.done += static_cast<std::size_t>(res);
        if (s.done < s.len) {
            counters_.short_retries.fetch_add(1, std::memory_order_relaxed);
            return retry_locked(i);
        }
        return release_locked(i);
    }

    void reap() {
        std::vector<std::pair<std::uint64_t, long>> batch;
        std::vector<request_ptr> finished;
        bool broken = false;
        {
            // Guarantee 6, step 1. A ring that broke before (or while) the poll was armed could
            // not wake this thread: it goes straight to run_broken().
            std::lock_guard lock(mutex_);
            arm_wake_poll_locked();
            broken = broken_ != 0;
        }
        // Where the kernel takes a timeout with the wait (5.11+, no submission entry needed),
        // the thread looks at broken_ every second: a descriptor closed and its number given
        // to another ring would otherwise let it sleep on that ring once a spurious wake-up
        // sent it back into io_uring_enter, where this ring's POLL cannot reach it.
        const bool timed = (ring_.features & IORING_FEAT_EXT_ARG) != 0;
        __kernel_timespec tick{};
        tick.tv_sec = 1;
        while (!broken) {
            io_uring_cqe* cqe = nullptr;
            int ret = timed ? io_uring_wait_cqe_timeout(&ring_, &cqe, &tick) : io_uring_wait_cqe(&ring_, &cqe);
            if (ret == -ETIME) {
                std::lock_guard lock(mutex_);
                broken = broken_ != 0;
                continue;
            }
            if (ret == -EINTR) continue;
            if (ret == -EAGAIN || ret == -EBUSY) {
                std::this_thread::yield();
                continue;
            }
            if (ret < 0) {
                std::lock_guard lock(mutex_);
                break_locked("io_uring_wait_cqe", -ret);
                break;
            }
            batch.clear();
            unsigned head = 0, count = 0;
            io_uring_for_each_cqe(&ring_, head, cqe) {
                batch.emplace_back(io_uring_cqe_get_data64(cqe), static_cast<long>(cqe->res));
                ++count;
            }
            io_uring_cq_advance(&ring_, count);
            bool stop = false;
            {
                std::lock_guard lock(mutex_);
                for (auto [tag, res] : batch) {
                    if (tag == stop_tag) {
                        stop = true;
                        continue;
                    }
                    if (tag == wake_tag) {
                        wake_pending_ = false;
                        continue;
                    }
                    // break_locked() woke us (broken_ is set), or the poll ended otherwise on a
                    // working ring (cancelled): then it is armed again, or no break could wake us.
                    if (tag == broken_tag) {
                        if (!broken_) arm_wake_poll_locked();
                        continue;
                    }
                    if (auto r = complete_locked(static_cast<unsigned>(tag), res)) finished.push_back(std::move(r));
                }
                fill_locked(finished);
                submit_locked();
                broken = broken_ != 0;
            }
            for (auto& r : finished) finish(*r);
            finished.clear();
            if (stop) return;
        }
        run_broken(finished);
    }

    // The completion thread once the ring broke: guarantee 6, steps 4 to 6.
    void run_broken(std::vector<request_ptr>& finished) {
        std::unique_lock lock(mutex_);
        // 4. Entries between the kernel's head and liburing's tail were never consumed.
        const unsigned unconsumed = io_uring_sq_ready(&ring_);
        for (unsigned k = 0; k < unconsumed; ++k) {
            // (*kring_mask, not ring_mask: the latter is new in liburing 2.3.)
            const io_uring_sqe& sqe = ring_.sq.sqes[(ring_.sq.sqe_tail - unconsumed + k) & *ring_.sq.kring_mask];
            const std::uint64_t tag = sqe.user_data;
            if (tag < slots_.size() && slots_[tag].req)
                if (auto r = fail_piece_locked(static_cast<unsigned>(tag), broken_note)) finished.push_back(std::move(r));
        }
        auto pause = std::chrono::milliseconds(1);
        for (;;) {
            // 5. What the kernel still posts lies in the ring's memory; no syscall on the ring.
            unsigned head = 0, count = 0;
            io_uring_cqe* cqe = nullptr;
            io_uring_for_each_cqe(&ring_, head, cqe) {
                const std::uint64_t tag = io_uring_cqe_get_data64(cqe);
                if (tag < slots_.size() && slots_[tag].req)
                    if (auto r = complete_locked(static_cast<unsigned>(tag), static_cast<long>(cqe->res)))
                        finished.push_back(std::move(r));
                ++count;
            }
            io_uring_cq_advance(&ring_, count);
            fail_queue_locked(finished);
            const bool busy = free_slots_.size() < slots_.size();
            if (!finished.empty()) {
                lock.unlock();
                for (auto& r : finished) finish(*r);
                finished.clear();
                lock.lock();
                continue;
            }
            // 5. Pieces in the kernel: look again after `pause`, or at once for a new request.
            // 6. None: wait for requests to fail, or for the destructor.
            auto woken = [&] { return stopping_ || !queue_.empty(); };
            if (busy) {
                broken_cv_.wait_for(lock, pause, woken);
                pause = std::min(pause * 2, std::chrono::milliseconds(64));
            } else if (stopping_ && queue_.empty()) {
                return;
            } else {
                broken_cv_.wait(lock, woken);
            }
        }
    }

    void finish(detail::request_state& r) {
        detail::deliver(r, counters_);
        std::lock_guard lock(mutex_);
        if (--outstanding_ == 0) idle_cv_.notify_all();
    }

    io_engine_config config_;
    io_uring ring_{};
    std::mutex mutex_;
    std::condition_variable idle_cv_;
    std::condition_variable broken_cv_;  // the completion thread of a broken ring waits here
    std::deque<std::shared_ptr<detail::request_state>> queue_;
    std::vector<slot> slots_;
    std::vector<unsigned> free_slots_;
    std::vector<int> free_files_;
    std::vector<iovec> buffers_;
    unsigned unsubmitted_ = 0;
    bool wake_pending_ = false;  // a wake-up NOP is in the ring
    bool stopping_ = false;      // the destructor waits for the completion thread
    int broken_ = 0;             // the errno that broke the ring; 0 while it works (guarantee 6)
    const char* broken_call_ = "";  // the call that failed: "io_uring_submit" or "io_uring_wait_cqe"
    int wake_fd_ = -1;           // eventfd watched by a POLL in the ring (guarantee 6)
    std::size_t outstanding_ = 0;
    detail::engine_counters counters_;
    std::thread reaper_;
};

#endif  // SPILLWAY_HAS_LIBURING

}  // namespace spillway
