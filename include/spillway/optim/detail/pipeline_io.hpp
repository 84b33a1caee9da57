// SPDX-License-Identifier: Apache-2.0
// spillway/optim/detail/pipeline_io.hpp: the update pipeline's I/O scheduler (not public).
//
// piece_io moves whole subgroup blobs ("jobs", one per host buffer) as pieces, one tier key
// per piece, and keeps at most `window` pieces per direction in the tier at once. Reads and
// writes each have their own window and are issued in turn, so the tier always holds some
// of both: a tier whose engine serves requests in order (a file tier's ring is FIFO) then
// reads and writes the device at the same time instead of in long phases of one kind,
// which is what a device's mixed bandwidth assumes. Neither direction starves the other.
//
// Guarantees:
// - The pieces of one job are issued in order; jobs of one direction start in the order
//   start() was called. A job is finished when every piece completed (successfully or not);
//   take() returns its first error and frees the job slot.
// - poll() never blocks; wait_oldest() blocks for the earliest-issued piece in flight (the
//   one an in-order tier completes first), then polls. Both top the windows up.
// - Not thread-safe: one thread (the pipeline's) drives it; the tier may complete pieces on
//   any thread. drain() issues everything left and waits for every piece, dropping nothing:
//   every started job ends finished.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <span>
#include <string>
#include <vector>

#include "spillway/io/completion.hpp"
#include "spillway/tier/tier_stats.hpp"

namespace spillway::detail {

template <class Tier>
class piece_io {
public:
    piece_io(Tier& tier, std::size_t jobs, std::size_t window)
        : tier_(tier), jobs_(jobs), window_(window) {}
    piece_io(const piece_io&) = delete;
    piece_io& operator=(const piece_io&) = delete;
    ~piece_io() { drain(); }

    /// Starts moving `bytes` as pieces of `piece_bytes` (piece k under keys[k]) in `dir`.
    /// The caller keeps `keys` and `bytes` alive until the job is taken.
    void start(std::size_t job, io_direction dir, std::span<const std::string> keys,
               std::span<std::byte> bytes, std::size_t piece_bytes) {
        auto& j = jobs_[job];
        j = job_state{};
        j.active = true;
        j.dir = dir;
        j.keys = keys;
        j.bytes = bytes;
        j.piece_bytes = piece_bytes;
        waiting_[index(dir)].push_back(job);
        pump(false);
    }

    /// Issues every piece still waiting, beyond the windows (before an idle period in which
    /// nobody polls, e.g. a prefetch that overlaps the trainer's backward pass).
    void issue_all() { pump(true); }

    [[nodiscard]] bool active(std::size_t job) const noexcept { return jobs_[job].active; }
    [[nodiscard]] bool finished(std::size_t job) const noexcept {
        const auto& j = jobs_[job];
        return j.active && j.done == j.keys.size();
    }
    [[nodiscard]] bool idle() const noexcept {
        return flying_.empty() && waiting_[0].empty() && waiting_[1].empty();
    }

    /// Ends a finished job (or one never started): returns its first error, if any.
    std::exception_ptr take(std::size_t job) noexcept {
        auto& j = jobs_[job];
        j.active = false;
        return std::move(j.error);
    }

    /// Completes the pieces that finished, then tops the windows up. Never blocks.
    void poll() {
        for (std::size_t i = 0; i < flying_.size();) {
            if (flying_[i].op.ready())
                complete(i);
            else
                ++i;
        }
        pump(false);
    }

    /// Waits for the earliest-issued piece in flight (if any), then polls.
    void wait_oldest() {
        if (flying_.empty()) pump(false);
        if (!flying_.empty()) {
            auto oldest =
                std::min_element(flying_.begin(), flying_.end(),
                                 [](const flight& a, const flight& b) { return a.seq < b.seq; });
            complete(static_cast<std::size_t>(oldest - flying_.begin()));
        }
        poll();
    }

    /// Issues every waiting piece and waits for all of them. Never throws (errors stay with
    /// their jobs).
    void drain() noexcept {
        while (!idle()) {
            pump(true);
            while (!flying_.empty()) complete(flying_.size() - 1);
        }
    }

private:
    struct job_state {
        bool active = false;
        io_direction dir = io_direction::read;
        std::span<const std::string> keys;
        std::span<std::byte> bytes;
        std::size_t piece_bytes = 0;
        std::size_t next = 0;  // next piece to issue
        std::size_t done = 0;  // pieces completed
        std::exception_ptr error;
    };
    struct flight {
        std::size_t job;
        std::uint64_t seq;
        io_completion op;
    };

    static std::size_t index(io_direction d) noexcept { return d == io_direction::read ? 0 : 1; }

    // Issues pieces in turn, reads first, while a direction has pieces waiting and room in
    // its window (or regardless of the windows when `unbounded`).
    void pump(bool unbounded) noexcept {
        for (bool issued = true; issued;) {
            issued = false;
            for (std::size_t d = 0; d < 2; ++d) {
                if (waiting_[d].empty() || (!unbounded && in_flight_[d] >= window_)) continue;
                issue_one(d);
                issued = true;
            }
        }
    }

    void issue_one(std::size_t d) noexcept {
        const std::size_t id = waiting_[d].front();
        auto& j = jobs_[id];
        const std::size_t k = j.next++;
        if (j.next == j.keys.size()) waiting_[d].pop_front();
        const std::size_t begin = k * j.piece_bytes;
        auto piece = j.bytes.subspan(begin, std::min(j.piece_bytes, j.bytes.size() - begin));
        io_completion op;
        try {
            if (j.dir == io_direction::read)
                op = tier_.read(j.keys[k], piece);
            else
                op = tier_.write(j.keys[k], std::span<const std::byte>(piece));
        } catch (...) {
            if (!j.error) j.error = std::current_exception();
            ++j.done;
            return;
        }
        ++in_flight_[d];
        flying_.push_back(flight{id, seq_++, std::move(op)});
    }

    void complete(std::size_t i) noexcept {
        flight f = std::move(flying_[i]);
        flying_.erase(flying_.begin() + static_cast<std::ptrdiff_t>(i));
        auto& j = jobs_[f.job];
        try {
            f.op.wait();
        } catch (...) {
            if (!j.error) j.error = std::current_exception();
        }
        --in_flight_[index(j.dir)];
        ++j.done;
    }

    Tier& tier_;
    std::vector<job_state> jobs_;
    std::size_t window_;
    std::deque<std::size_t> waiting_[2];  // jobs with pieces not issued yet: [reads, writes]
    std::size_t in_flight_[2] = {0, 0};
    std::vector<flight> flying_;
    std::uint64_t seq_ = 0;
};

}  // namespace spillway::detail
