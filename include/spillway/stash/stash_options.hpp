// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/stash/stash_options.hpp: what an activation_stash is configured with
/// (split_mode, stash_options) and what it reports back (stash_stats, split_plan).
///
/// Guarantees: plain values with no behaviour of their own; a stash copies its options at
/// construction and never changes them. stash_stats::since() is the one way to turn two
/// stats() snapshots into what happened between them. The terms used here (resident bytes, the life
/// cycle's steps, forwarding) are defined in docs/design.md, section "The activation stash".
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "spillway/stash/split_rule.hpp"

namespace spillway {

/// How the stash chooses which layers stay in memory. In every mode tensors under
/// stash_options::keep_below_bytes stay in memory, and the memory budget may still force
/// writes of kept tensors (stash_stats::forced_writes).
enum class split_mode {
    /// The first step (and the one after replan()) profiles: it offloads every tensor at or
    /// above keep_below_bytes while recording layer start times and bytes; when its backward
    /// begins, tba_split() picks the first kept layer from the tier's bandwidth. Later steps
    /// re-plan from the bandwidth the tier delivered (see stash_options::tier_bandwidth).
    adaptive,
    /// Layers at forward positions from stash_options::first_kept_layer on are kept, those
    /// before it offloaded; no profiling, no probe.
    fixed,
    /// Every tensor at or above keep_below_bytes is offloaded, whatever its layer.
    offload_all,
    /// Nothing is offloaded unless the budget forces it: the baseline, or a switch to turn
    /// offloading off without changing the trainer.
    keep_all,
};

/// How an activation_stash behaves; fixed at construction (options() returns it).
/// Byte quantities are bytes, bandwidths bytes per second.
struct stash_options {
    /// Tensors of fewer bytes (extent_bytes()) stay in memory in every mode and never count
    /// in a layer's offloadable bytes (TBA keeps tensors under 8 Mi elements). Default 1 MiB.
    std::size_t keep_below_bytes = std::size_t{1} << 20;
    /// Most resident bytes at any time (buffers of tensors, of reads in flight and of the free
    /// pool); never exceeded. When nothing can make room, save() writes synchronously and
    /// load() throws std::length_error. Unbounded by default.
    std::size_t memory_budget = std::numeric_limits<std::size_t>::max();
    /// Which layers stay in memory (split_mode); adaptive by default.
    split_mode split = split_mode::adaptive;
    /// split_mode::fixed: forward position of the first layer kept (layers are numbered in
    /// the order they first appear in a step); SIZE_MAX keeps no layer.
    std::size_t first_kept_layer = std::numeric_limits<std::size_t>::max();
    /// Tier bandwidth in bytes per second for the adaptive rule. 0: measured with a probe
    /// blob of probe_bytes written and read back (best of three rounds, the slower
    /// direction) when the profiling step ends, then re-measured at every backward from what
    /// the tier delivered (its stats(): bytes over busy seconds), so the split follows a tier
    /// that slows down or speeds up. A stated bandwidth is used as is.
    /// Only split_mode::adaptive reads it; a negative value is std::invalid_argument at
    /// construction.
    double tier_bandwidth = 0;
    /// Size in bytes of the probe blob written and read back when tier_bandwidth is 0. Its
    /// buffer counts against memory_budget: at most the room the budget has left when the
    /// probe runs is used, and at most the profiling step's offloadable bytes (whole 4 KiB
    /// blocks; at least 4 KiB); a step that offloads nothing runs no probe (the split then
    /// keeps every layer anyway). The probe runs when a
    /// profiling step's backward begins, under the key "<key_prefix>-<stash serial>-probe",
    /// erased afterwards, also when it failed; a failed probe throws the tier's error naming
    /// the tier and the probe size. Default 16 MiB.
    std::size_t probe_bytes = std::size_t{16} << 20;
    /// Offloading layers ahead of the current backward layer that prefetch always brings
    /// back (more when memory the step already used is free).
    std::size_t prefetch_layers = 2;
    /// Writer threads (>= 1, else std::invalid_argument at construction); each runs one
    /// tier write (or blob erase) at a time, so this bounds the writes in flight.
    std::size_t write_threads = 1;
    /// Reader threads (>= 1, else std::invalid_argument at construction); each runs one
    /// tier read at a time, so this bounds the prefetch and load reads in flight.
    std::size_t read_threads = 1;
    /// Free buffers are kept for reuse (counted as resident) up to pool_limit bytes, and
    /// beyond that while resident bytes stay within the most the stash held in this step or
    /// the last: the pool never lifts the peak by more than pool_limit. SIZE_MAX is no limit:
    /// every free buffer is kept while the memory budget has room for it.
    std::size_t pool_limit = std::size_t{64} << 20;
    /// Buffers of less than 2 MiB that the stash allocates (allocate(), and the buffers loads
    /// read into) are carved from huge-page slabs shared by many tensors (buffer_arena), so
    /// that the disk moves them as it moves large buffers; false: each from malloc. The
    /// budget and the resident counts are buffer capacities; the memory the arena holds
    /// beyond them (free pieces of partly used slabs) is stash_stats::arena_slack_bytes.
    bool huge_page_arena = true;
    /// First part of every tier key ("<key_prefix>-<stash serial>-<n>"); must pass
    /// validate_key (std::invalid_argument naming it at construction). Each stash in a
    /// process has its own serial, so stashes sharing a tier and a prefix never collide;
    /// stashes of different processes sharing a tier need different prefixes.
    std::string key_prefix = "act";
    /// Called at most once for each way a stash can fail to save memory, when the step
    /// that shows it ends (at the next step's first save or begin_layer()): (1) the step
    /// saved tensors and offloaded none (all small, or all in kept layers); (2) the stash's
    /// resident bytes in the step reached the distinct bytes the step saved, so keeping
    /// everything would have taken no more memory (a budget too large, the probe, the
    /// pool). The text names the figures and what to change. Called with the stash's lock
    /// held, on the thread that starts the next step: it must not call the stash. Empty:
    /// nothing is called; stash_stats::warnings counts them either way.
    std::function<void(const std::string&)> on_warning;
};

/// What an activation_stash did, as returned by activation_stash::stats(): a consistent
/// snapshot taken under the stash's lock. Counters are cumulative since construction (reset()
/// does not clear them); the fields marked "now" are the state at the snapshot.
struct stash_stats {
    /// save() calls that returned a handle (duplicates included).
    std::uint64_t saves = 0;
    /// Distinct tensors stored (saves that were not deduplicated).
    std::uint64_t tensors = 0;
    /// Bytes handed to save(), duplicates included.
    std::uint64_t bytes_saved = 0;
    /// Of bytes_saved, those of saves that hit a live tensor (stored once).
    std::uint64_t bytes_deduplicated = 0;
    /// Distinct bytes kept in memory when saved (small or in a kept layer).
    std::uint64_t bytes_kept = 0;
    /// Bytes written to the tier by completed writes (synchronous ones included).
    std::uint64_t bytes_offloaded = 0;
    /// Bytes meant for offload but served from memory without a read (once per tensor).
    std::uint64_t bytes_forwarded = 0;
    /// Bytes read back from the tier by completed reads.
    std::uint64_t bytes_loaded = 0;
    /// Queued writes cancelled: backward took the tensor, or it was released.
    std::uint64_t write_skips = 0;
    /// Writes the budget forced: synchronous saves, or writes of kept tensors.
    std::uint64_t forced_writes = 0;
    /// Tier writes that threw (reported by the next save(), begin_layer() or flush(), and
    /// by every load() of that tensor).
    std::uint64_t failed_writes = 0;
    /// Tier reads that threw (reported by the load() that needed them).
    std::uint64_t failed_reads = 0;
    /// Now: capacities of buffers held by tensors and reads, plus the pool.
    std::size_t resident_bytes = 0;
    /// Now: capacities of free buffers kept for reuse (part of resident_bytes).
    std::size_t pooled_bytes = 0;
    /// Most resident_bytes since construction or reset_peak().
    std::size_t peak_resident_bytes = 0;
    /// Seconds load() blocked waiting for bytes, summed over calls and threads.
    double load_wait_seconds = 0;
    /// Seconds save() and load() blocked waiting for room under the budget.
    double budget_wait_seconds = 0;
    /// Warnings given (stash_options::on_warning): at most one for a step that offloaded
    /// nothing and one for a step whose resident peak reached what it saved.
    std::uint64_t warnings = 0;
    /// save() calls inside a no-grad scope (activation_stash::begin_no_grad): nothing stored.
    std::uint64_t no_grad_saves = 0;
    /// Now: memory the huge-page arena holds beyond its live buffers' capacities.
    std::size_t arena_slack_bytes = 0;

    /// What happened between two snapshots of one stash: `after.since(before)` subtracts every
    /// counter and waiting time (the one helper for it, as tier_stats::since is for a tier's);
    /// the fields marked "now" (resident, pooled and arena slack bytes) and peak_resident_bytes
    /// are `after`'s. Precondition: `before` was taken first (counters never decrease).
    [[nodiscard]] stash_stats since(const stash_stats& before) const noexcept {
        stash_stats d = *this;
        d.saves -= before.saves;
        d.tensors -= before.tensors;
        d.bytes_saved -= before.bytes_saved;
        d.bytes_deduplicated -= before.bytes_deduplicated;
        d.bytes_kept -= before.bytes_kept;
        d.bytes_offloaded -= before.bytes_offloaded;
        d.bytes_forwarded -= before.bytes_forwarded;
        d.bytes_loaded -= before.bytes_loaded;
        d.write_skips -= before.write_skips;
        d.forced_writes -= before.forced_writes;
        d.failed_writes -= before.failed_writes;
        d.failed_reads -= before.failed_reads;
        d.warnings -= before.warnings;
        d.no_grad_saves -= before.no_grad_saves;
        d.load_wait_seconds -= before.load_wait_seconds;
        d.budget_wait_seconds -= before.budget_wait_seconds;
        return d;
    }
};

/// The split the stash uses, and what it was planned from (activation_stash::plan()).
struct split_plan {
    /// True once split_mode::adaptive planned a split (the profiling step's backward began);
    /// false before, after replan() until the next plan, and always in the other modes.
    bool planned = false;
    /// Forward position of the first layer kept in memory; every layer from it on is kept.
    /// SIZE_MAX when no layer is kept (also when every layer can be offloaded). In
    /// split_mode::fixed it is stash_options::first_kept_layer.
    std::size_t first_kept_layer = std::numeric_limits<std::size_t>::max();
    /// Bytes per second the rule was applied with: stated, probed, or delivered by the tier
    /// in the last step (0 before the first plan).
    double tier_bandwidth = 0;
    /// Forward time in seconds the rule was applied with: the profiling step's, then the
    /// previous step's at each re-plan (0 before the first plan).
    double forward_seconds = 0;
    /// The layers the rule saw, in forward order (empty before the first plan).
    std::vector<layer_profile> layers;
};

}  // namespace spillway
