// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/trace/recorder.hpp: a timeline recorder exported as Chrome trace JSON.
///
/// Components (the update pipeline, the activation stash, a trainer) record "complete"
/// events (a name, a begin and an end time) on named tracks; write_json() exports them in the
/// Chrome trace event format, which Perfetto (ui.perfetto.dev) and chrome://tracing open.
///
/// Guarantees:
/// - Thread-safe: any thread may add tracks and record events concurrently.
/// - Cheap when disabled: a disabled recorder costs one relaxed atomic load per call; a
///   scoped_event on a disabled (or null) recorder reads no clock and allocates nothing.
/// - Tracks are created on first use by name (track("reads") returns the same id every time)
///   and appear in the export in creation order.
/// - Events on one track may overlap (several reads in flight): the export splits such a
///   track into lanes ("reads", "reads #2", ...) so that every lane holds only properly
///   nested events, which Perfetto's JSON importer requires. Times are microseconds since
///   the recorder was created; pid is the process id, so traces of several processes can be
///   merged by concatenating their traceEvents arrays.
/// - save(path) writes the JSON to a new file of mode 0600 (replacing an existing one through
///   a temporary file and rename) and throws std::system_error naming the path on failure.
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <initializer_list>
#include <mutex>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "spillway/error.hpp"
#include "spillway/trace/json_string.hpp"

/// Timelines of what the primitives do, exported for Perfetto (trace/recorder.hpp).
namespace spillway::trace {

/// The clock of every event: monotonic, so intervals are never negative.
using clock = std::chrono::steady_clock;

/// Whether a recorder starts recording.
enum class recording {
    enabled,   ///< events are kept from the start
    disabled,  ///< calls are ignored until recorder::enable()
};

/// Identifies a track within one recorder.
using track_id = std::uint32_t;

/// One recorded interval.
struct event {
    track_id track = 0;         ///< the track it was recorded on (recorder::track())
    std::string name;           ///< what happened: the slice label in Perfetto
    std::string category;       ///< optional grouping ("cat" in the JSON); empty: none
    clock::time_point begin{};  ///< start of the interval
    clock::time_point end{};    ///< end of the interval, >= begin
    std::vector<std::pair<std::string, double>>
        args;  ///< named numbers, shown in Perfetto's details pane
};

class recorder;

/// Records one event on destruction, from its construction time. Movable, not copyable.
/// A scoped_event for a null or disabled recorder is inert. The recorder must outlive it.
class scoped_event {
public:
    /// An inert event: records nothing.
    scoped_event() = default;
    /// Starts an event on `track` of `rec` now (reads the clock only when `rec` is non-null
    /// and enabled; otherwise inert). recorder::scope() is the usual way to make one.
    scoped_event(recorder* rec, track_id track, std::string_view name,
                 std::string_view category = {});
    /// Takes over `o`'s pending event; `o` becomes inert.
    scoped_event(scoped_event&& o) noexcept
        : rec_(std::exchange(o.rec_, nullptr)),
          track_(o.track_),
          name_(std::move(o.name_)),
          category_(std::move(o.category_)),
          begin_(o.begin_) {}
    /// Not assignable: an event has one start.
    scoped_event& operator=(scoped_event&&) = delete;
    /// One interval is recorded once: not copyable.
    scoped_event(const scoped_event&) = delete;
    /// One interval is recorded once: not copyable.
    scoped_event& operator=(const scoped_event&) = delete;
    /// Records the event (ending now) unless finish() already did; never throws.
    ~scoped_event() { finish(); }
    /// Records the event now (instead of at destruction); later calls do nothing. Best
    /// effort: an event the recorder refuses (an unknown track) or cannot store is lost.
    void finish() noexcept;

private:
    recorder* rec_ = nullptr;
    track_id track_ = 0;
    std::string name_;
    std::string category_;
    clock::time_point begin_{};
};

/// Collects events on named tracks and exports them as Chrome trace JSON (guarantees in
/// the file comment). Thread-safe; not copyable, not movable (scoped_event points at it).
class recorder {
public:
    /// An empty recorder; the time origin of the export is now.
    /// @param mode         whether it records from the start
    /// @param process_name the process label in Perfetto (a rank number, a job name, ...)
    explicit recorder(recording mode = recording::enabled, std::string process_name = "spillway")
        : enabled_(mode == recording::enabled),
          process_name_(std::move(process_name)),
          origin_(clock::now()) {}
    /// Owns the events: not copyable.
    recorder(const recorder&) = delete;
    /// Owns the events: not copyable.
    recorder& operator=(const recorder&) = delete;

    /// True while events are being kept.
    [[nodiscard]] bool enabled() const noexcept { return enabled_.load(std::memory_order_relaxed); }
    /// Starts keeping events (from the next call; events already recorded stay).
    void enable() noexcept { enabled_.store(true, std::memory_order_relaxed); }
    /// Stops keeping events: complete() returns at once, new scoped_events are inert, and a
    /// scoped_event that ends while disabled is dropped (events already recorded stay).
    void disable() noexcept { enabled_.store(false, std::memory_order_relaxed); }

    /// The id of the track called `name`, created on first use.
    track_id track(std::string_view name) {
        std::lock_guard lock(mutex_);
        for (std::size_t i = 0; i < tracks_.size(); ++i)
            if (tracks_[i] == name) return static_cast<track_id>(i);
        tracks_.emplace_back(name);
        return static_cast<track_id>(tracks_.size() - 1);
    }

    /// Records [begin, end] on `track` (ignored when disabled). Throws std::invalid_argument
    /// for a track id this recorder did not hand out or for end < begin.
    void complete(track_id track, std::string_view name, clock::time_point begin,
                  clock::time_point end, std::string_view category = {},
                  std::initializer_list<std::pair<std::string_view, double>> args = {}) {
        if (!enabled()) return;
        expect_argument(end >= begin,
                        "trace::recorder: event " + quoted(name) + " ends before it begins");
        event e{track, std::string(name), std::string(category), begin, end, {}};
        e.args.reserve(args.size());
        for (auto& [k, v] : args) e.args.emplace_back(std::string(k), v);
        std::lock_guard lock(mutex_);
        expect_argument(track < tracks_.size(),
                        "trace::recorder: unknown track id " + std::to_string(track));
        events_.push_back(std::move(e));
    }

    /// An RAII event from now until the returned object is destroyed (or finish()ed).
    [[nodiscard]] scoped_event scope(track_id track, std::string_view name,
                                     std::string_view category = {}) {
        return scoped_event(this, track, name, category);
    }

    /// The number of events recorded (since construction or clear()).
    [[nodiscard]] std::size_t size() const {
        std::lock_guard lock(mutex_);
        return events_.size();
    }
    /// A copy of the recorded events, in recording order.
    [[nodiscard]] std::vector<event> events() const {
        std::lock_guard lock(mutex_);
        return events_;
    }
    /// The track names; a track's id is its index.
    [[nodiscard]] std::vector<std::string> tracks() const {
        std::lock_guard lock(mutex_);
        return tracks_;
    }
    /// Drops the recorded events (tracks stay).
    void clear() {
        std::lock_guard lock(mutex_);
        events_.clear();
    }

    /// Writes the Chrome trace JSON (`{"traceEvents": [...], "displayTimeUnit": "ms"}`) of a
    /// snapshot of the events: process and lane names as metadata events, then one "X"
    /// (complete) event per recorded event, times in microseconds since construction.
    void write_json(std::ostream& out) const {
        std::vector<event> evs;
        std::vector<std::string> names;
        {
            std::lock_guard lock(mutex_);
            evs = events_;
            names = tracks_;
        }
        const long pid = static_cast<long>(::getpid());
        // Lanes: per track, greedy interval partitioning so each lane nests properly.
        std::stable_sort(evs.begin(), evs.end(), [](const event& a, const event& b) {
            if (a.track != b.track) return a.track < b.track;
            if (a.begin != b.begin) return a.begin < b.begin;
            return a.end > b.end;  // the enclosing event first
        });
        struct lane {
            std::vector<clock::time_point> open;  // ends of the events still open, innermost last
        };
        std::vector<std::vector<lane>> lanes(names.size());
        std::vector<std::size_t> lane_of(evs.size(), 0);
        for (std::size_t i = 0; i < evs.size(); ++i) {
            auto& ls = lanes[evs[i].track];
            std::size_t chosen = ls.size();
            for (std::size_t l = 0; l < ls.size(); ++l) {
                auto& open = ls[l].open;
                while (!open.empty() && open.back() <= evs[i].begin) open.pop_back();
                if (open.empty() || evs[i].end <= open.back()) {  // nests inside, or lane idle
                    chosen = l;
                    break;
                }
            }
            if (chosen == ls.size()) ls.emplace_back();
            ls[chosen].open.push_back(evs[i].end);
            lane_of[i] = chosen;
        }
        // tid of (track, lane): tracks numbered in order, lanes after their track.
        std::vector<std::size_t> first_tid(names.size(), 0);
        std::size_t next = 1;
        for (std::size_t t = 0; t < names.size(); ++t) {
            first_tid[t] = next;
            next += std::max<std::size_t>(1, lanes[t].size());
        }
        out << "{\"traceEvents\":[\n";
        bool first = true;
        auto sep = [&] {
            if (!first) out << ",\n";
            first = false;
        };
        sep();
        out << R"({"name":"process_name","ph":"M","pid":)" << pid << R"(,"tid":0,"args":{"name":)";
        write_json_string(out, process_name_);
        out << "}}";
        for (std::size_t t = 0; t < names.size(); ++t) {
            std::size_t nlanes = std::max<std::size_t>(1, lanes[t].size());
            for (std::size_t l = 0; l < nlanes; ++l) {
                std::size_t tid = first_tid[t] + l;
                std::string label = names[t];
                if (l > 0) label += " #" + std::to_string(l + 1);
                sep();
                out << R"({"name":"thread_name","ph":"M","pid":)" << pid << ",\"tid\":" << tid
                    << R"(,"args":{"name":)";
                write_json_string(out, label);
                out << "}}";
                sep();
                out << R"({"name":"thread_sort_index","ph":"M","pid":)" << pid << ",\"tid\":" << tid
                    << R"(,"args":{"sort_index":)" << tid << "}}";
            }
        }
        for (std::size_t i = 0; i < evs.size(); ++i) {
            const auto& e = evs[i];
            sep();
            out << "{\"name\":";
            write_json_string(out, e.name);
            if (!e.category.empty()) {
                out << ",\"cat\":";
                write_json_string(out, e.category);
            }
            out << ",\"ph\":\"X\",\"ts\":";
            write_number(out, micros(e.begin - origin_));
            out << ",\"dur\":";
            write_number(out, micros(e.end - e.begin));
            out << ",\"pid\":" << pid << ",\"tid\":" << first_tid[e.track] + lane_of[i];
            if (!e.args.empty()) {
                out << ",\"args\":{";
                for (std::size_t a = 0; a < e.args.size(); ++a) {
                    if (a) out << ",";
                    write_json_string(out, e.args[a].first);
                    out << ":";
                    write_number(out, e.args[a].second);
                }
                out << "}";
            }
            out << "}";
        }
        out << "\n],\"displayTimeUnit\":\"ms\"}\n";
    }

    /// The JSON of write_json() as a string.
    [[nodiscard]] std::string json() const {
        std::ostringstream s;
        write_json(s);
        return s.str();
    }

    /// Writes the JSON to `path` (mode 0600, fsynced, replaced atomically through a temporary
    /// file `<path>.tmp-<pid>-<n>` of its own, created exclusively, removed again on failure;
    /// several threads may save at once). An existing file at `path` is never written in
    /// place: a hard link or a symbolic link there is replaced by the rename, and the file it
    /// shares its contents with (a snapshot, a file outside the directory) keeps them.
    /// @throws std::system_error naming the call (open, write, fsync, close, rename) and the path
    void save(const std::filesystem::path& path) const {
        static std::atomic<std::uint64_t> saves{0};
        std::string text = json();
        std::string tmp = path.string() + ".tmp-" + std::to_string(::getpid()) + "-" +
                          std::to_string(saves.fetch_add(1, std::memory_order_relaxed));
        int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0) throw_system_error(errno, "open", "trace::recorder::save to " + tmp);
        std::size_t done = 0;
        while (done < text.size()) {
            ssize_t n = ::write(fd, text.data() + done, text.size() - done);
            if (n < 0) {
                if (errno == EINTR) continue;
                int err = errno;
                ::close(fd);
                ::unlink(tmp.c_str());
                throw_system_error(
                    err, "write",
                    "trace::recorder::save to " + tmp + " (" + bytes_str(text.size()) + ")");
            }
            done += static_cast<std::size_t>(n);
        }
        if (::fsync(fd) != 0) {
            int err = errno;
            ::close(fd);
            ::unlink(tmp.c_str());
            throw_system_error(err, "fsync", "trace::recorder::save to " + tmp);
        }
        if (::close(fd) != 0) {
            int err = errno;
            ::unlink(tmp.c_str());
            throw_system_error(err, "close", "trace::recorder::save to " + tmp);
        }
        if (::rename(tmp.c_str(), path.c_str()) != 0) {
            int err = errno;
            ::unlink(tmp.c_str());
            throw_system_error(err, "rename", "trace::recorder::save to " + path.string());
        }
    }

private:
    static double micros(clock::duration d) {
        return std::chrono::duration<double, std::micro>(d).count();
    }
    static void write_number(std::ostream& out, double v) {
        if (!std::isfinite(v)) {
            out << "0";
            return;
        }
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.3f", v);
        out << buf;
    }

    std::atomic<bool> enabled_;
    std::string process_name_;
    clock::time_point origin_;
    mutable std::mutex mutex_;
    std::vector<std::string> tracks_;
    std::vector<event> events_;
};

inline scoped_event::scoped_event(recorder* rec, track_id track, std::string_view name,
                                  std::string_view category) {
    if (rec && rec->enabled()) {
        rec_ = rec;
        track_ = track;
        name_ = std::string(name);
        category_ = std::string(category);
        begin_ = clock::now();
    }
}

inline void scoped_event::finish() noexcept {
    if (!rec_) return;
    recorder* r = std::exchange(rec_, nullptr);
    try {
        r->complete(track_, name_, begin_, clock::now(), category_);
    } catch (...) {
        // Recording is best effort: a bad track id or an allocation failure loses the event.
    }
}

}  // namespace spillway::trace
