// spillway/optim/update_pipeline.hpp: the offloaded optimizer's update phase.
//
// update_pipeline<Tier, Grad, ParamCopy> keeps the AdamW state of `param_count` parameters
// (fp32 master params, fp32 m and v) on a storage tier, split into subgroups of
// `subgroup_size` elements, one blob per subgroup (params | m | v, 12 bytes per element; m | v
// when the master params stay in the caller's fp32 memory, pipeline_options::master_params)
// stored as pieces of pipeline_config::piece_bytes under the keys "<prefix>-<i>",
// "<prefix>-<i>.1", ... The trainer keeps its gradients (Grad: float16, bfloat16 or float) and
// its compute copy of the params (ParamCopy: float16, bfloat16 or float) in host memory; one
// update() call runs AdamW over every subgroup with a fixed budget of host buffers and
// writes the updated compute copy into the trainer's buffer.
//
// Guarantees:
// - Results are bit-identical to adamw_step over the whole arrays held in memory, for every
//   order, resident-set size, gradient path and tier (adamw_step's results do not depend on
//   how the arrays are split).
// - Overflow: update() first sums the squares of every gradient (grad_sum_squares, which
//   also gives the global norm for clipping), unless hand_over_gradients() already did for
//   this step over the same span and scale (backward's hand-over, while the paths
//   prefetch). If any gradient is inf/NaN it returns
//   step_result::skipped_overflow before any I/O: nothing on the tier, in the buffers or in
//   the trainer's copy changes, and the step counter does not advance. A streamed update
//   (update_args::gradients_final: the call runs while backward still computes) checks each
//   subgroup as it takes it instead, so it cannot skip: an inf/NaN gradient throws
//   gradient_overflow_error naming the subgroup, the ones before it holding the new step.
// - Clipping: with max_grad_norm > 0 the gradients are scaled by clip_coefficient(total,
//   max_grad_norm) (torch's clip_grad_norm_ over all parameters), where total is the sum, in
//   subgroup order, of grad_sum_squares over each subgroup's span: an in-memory step that
//   sums the same way gets the same bits (one grad_sum_squares over the whole array adds in
//   another order and may differ in the last bit of the norm).
// - The overflow checks read the sums' bits, so they hold in code compiled with -ffast-math.
// - Faults: a tier error is rethrown as std::system_error (same errno; other exceptions as
//   std::runtime_error) whose message names the subgroup, its key and the tier. No state
//   is lost: every subgroup's newest state is either on the tier or in a host buffer, and
//   each location carries the step it holds; a subgroup whose write failed stays in its
//   buffer. Calling update() again with the same gradients (after the fault clears) applies
//   the step exactly once to each subgroup, so the result equals a run without faults.
// - I/O: with R = host_buffers - streaming_buffers resident buffers (resident_policy::keep_last_updated),
//   the last R subgroups updated by a call stay in host memory, unwritten, and the next call
//   serves them without a read; so every call after the first reads and writes
//   min(R, N) subgroups fewer than N. With the alternating order they are the first ones the
//   next call visits, so their buffers return to the pool at once.
// - Buffers: host_buffers aligned_buffers of 12 * subgroup_size bytes (16 with
//   gradient_path::fp32_on_tier; 4 fewer with master_params), allocated once, optionally
//   mlock()ed; nothing else of that size is allocated per call.
// - Master params in the caller's memory (pipeline_options::master_params, for an fp32
//   compute copy): the tier holds m and v only (8 bytes per parameter), the Adam step
//   updates the caller's params in place, and everything above holds with "the state"
//   meaning those params plus m and v. A save holds params, m and v either way, so a save
//   restores into a pipeline of either kind; a refused save leaves the caller's params as
//   they were (every file is checked before they change; a tier that fails while restore()
//   writes m and v to it may leave them partly restored: restore again once it works).
// - The pipeline holds the tier by reference (the caller keeps it alive and does not touch
//   the pipeline's keys); the destructor erases the pipeline's blobs.
// - Not thread-safe: one thread drives a pipeline; the tier and the thread pool may be shared.
//
// Buffer hand-off protocol of one update() call (each buffer is free, reading, ready,
// writing or resident; one thread runs the steps, the tier completes I/O asynchronously):
//  1. With lazy widening, first issue reads into the free buffers for the first positions
//     in order that are neither resident nor prefetched (as begin_prefetch() would: they do
//     not depend on the gradients, and the paths work while the check runs; a skipped step
//     keeps them for the next call). Check the gradients (sum of squares of all, polling the
//     I/O between subgroups; overflow returns here), unless hand_over_gradients() did for
//     this step over the same span and scale (a streamed update checks in step 4 instead),
//     and compute the clipping coefficient.
//     Make room: if more than R subgroups are resident (only after a failed
//     call), write out those visited last until the bound holds.
//  2. Walk the subgroups in this call's order (alternating_order(N, steps(), first) or
//     ascending). Reads begin_prefetch() started before the call (for the first
//     non-resident positions) are taken over as they are. At each position p, first issue
//     reads ahead: for the next positions in order whose subgroup is neither resident nor
//     being read, take a free buffer and issue its read, until no buffer is free (reads
//     run ahead as far as the budget allows).
//  3. Take the buffer of the subgroup at p: a resident buffer is used as is (no read; counted
//     as served from the resident set). Otherwise, if its read was never issued because no
//     buffer was free, wait for writes to finish (write-wait) and issue it; then wait for
//     the read (read-wait).
//  4. Compute. A streamed update first asks update_args::gradients_final whether the
//     subgroup's gradients are final, polling the I/O and issuing reads ahead (step 2) between
//     asks, then checks them (sum of squares; inf/NaN throws gradient_overflow_error after
//     the error handling of step 7). If the buffer holds the subgroup at step t-1, run adamw_step for step t with
//     the trainer's gradients of the subgroup (widened inside the step), writing the compute
//     copy to the trainer's buffer; if it already holds step t (a retried call), only write
//     the compute copy.
//  5. Hand the buffer on: at one of the last R positions it becomes resident (no write);
//     otherwise, if dirty, issue the write of the subgroup's blob and mark the buffer
//     writing; a clean one is freed at once.
//  6. A writing buffer becomes free when its write completed (checked at every position and
//     when a buffer is needed); the tier then holds step t for that subgroup.
//  7. After the last position wait for every write (write-wait), then advance the step
//     counter. On an error anywhere: wait for everything in flight, keep each buffer whose
//     newest state is not on the tier as resident, free the others, and throw the first
//     error, naming its subgroup.
//
// I/O: every state read and write is a job of pieces in a scheduler (optim/detail/
// pipeline_io.hpp) that keeps at most pipeline_config::pieces_in_flight pieces per
// direction in the tier (no limit for a virtual tier, which interleaves per child itself), reads and writes taking turns, so that an in-order tier (a file
// tier's ring) always holds both and the device works at its mixed bandwidth. The pipeline
// tops the windows up at every step above, between chunks of the Adam step (about one piece
// each) and while it waits (on the earliest-issued piece). A write commits its step only
// when every piece succeeded.
//
// The DeepSpeed-like baseline is the same engine with parts switched off (pipeline_options):
// subgroup_order::ascending, resident_policy::none, gradient_path::fp32_on_tier (the trainer
// calls hand_over_gradients() in backward, which widens the gradients to fp32 and writes them
// to the tier, and the update reads them back), and a tier with one path.
//
// Save and restore: save(dir) writes every subgroup's state as "subgroup-<i>.bin" plus a
// "manifest.txt" with the shape, the step, a CRC-32C per subgroup and one of the manifest's
// own text, all mode 0600, into a temporary directory that then replaces `dir` atomically (a
// crash never destroys the previous good save; the temporary directory of a save whose
// process died is an owned_directory, removed by the next save beside it). restore() builds a new pipeline over any tier
// from such a directory and refuses a truncated or corrupted subgroup file with an error
// naming the subgroup, and a manifest whose text does not match its checksum (a changed step
// would change every later update). Saves of format 1 (no manifest checksum) still restore.
#pragma once

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <ranges>
#include <utility>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

#include "spillway/error.hpp"
#include "spillway/io/aligned_buffer.hpp"
#include "spillway/io/buffer_arena.hpp"
#include "spillway/io/completion.hpp"
#include "spillway/lock/owned_directory.hpp"
#include "spillway/optim/adam.hpp"
#include "spillway/io/durable_file.hpp"
#include "spillway/optim/detail/pipeline_io.hpp"
#include "spillway/optim/half.hpp"
#include "spillway/schedule/alternating_order.hpp"
#include "spillway/thread_pool.hpp"
#include "spillway/tier/storage_tier.hpp"
#include "spillway/tier/tier_stats.hpp"
#include "spillway/trace/recorder.hpp"

namespace spillway {

/// The order in which one update call visits the subgroups.
enum class subgroup_order {
    alternating,  ///< 0..N-1, then N-1..0, ... (MLP-Offload)
    ascending,    ///< 0..N-1 every time (DeepSpeed)
};

/// What happens to the buffers of the last subgroups a call updates.
enum class resident_policy {
    keep_last_updated,  ///< the last host_buffers - streaming_buffers stay in memory for the next call
    none,               ///< every subgroup is written back (DeepSpeed)
};

/// How gradients reach the update.
enum class gradient_path {
    lazy_widening,  ///< stay fp16/bf16 in host memory, widened inside the Adam step
    fp32_on_tier,   ///< widened to fp32 and written to the tier in backward, read back (DeepSpeed)
};

/// The shape of the optimizer and the memory it may use.
struct pipeline_config {
    std::size_t param_count = 0;    ///< parameters in total (> 0)
    std::size_t subgroup_size = 0;  ///< parameters per subgroup (> 0; the last one may be smaller)
    std::size_t host_buffers = 3;   ///< subgroup buffers (>= streaming_buffers); the rest form the resident set
    /// Buffers that stream (read ahead, update, write behind); at least 3 and at most
    /// host_buffers. More of them keep more reads and writes queued for the tier (a virtual
    /// tier's slower path then idles less) at the price of a smaller resident set, that is
    /// more traffic per call; with resident_policy::none every buffer streams.
    std::size_t streaming_buffers = 3;
    memory_lock lock = memory_lock::unlocked;  ///< mlock() the buffers
    /// The buffers' pages: page_size::automatic (transparent huge pages, see aligned_buffer;
    /// buffers under 2 MiB, when not locked, share one huge-page slab of a buffer_arena, their
    /// total rounded up to 2 MiB) or page_size::base (e.g. to compare with a program that uses
    /// base pages).
    page_size pages = page_size::automatic;
    adamw_config adam{};  ///< AdamW hyper-parameters (lr, betas, eps, weight decay)
    double max_grad_norm = 0;  ///< global-norm clipping threshold; 0 turns clipping off
    /// Bytes of one piece (> 0, a multiple of 4096): a subgroup's blob is stored as
    /// ceil(12 * elements / piece_bytes) tier keys and moved piece by piece. The default is
    /// half of a file tier's default ring (32 x 1 MiB), which then holds a read and a write.
    std::size_t piece_bytes = std::size_t{16} << 20;
    /// Pieces each direction may have in the tier at once (> 0): reads and writes take turns
    /// within their own window, so the tier always holds some of both. A tier with children
    /// (a virtual tier) gets no window: it runs one read and one write per child at a time
    /// itself, and a window over children of different speeds would fill up with pieces of
    /// the slow one while the fast one idles.
    std::size_t pieces_in_flight = 2;
};

/// How the pipeline runs: the switches of the ablation, and hooks.
struct pipeline_options {
    /// Visiting order: alternating (0..N-1, then N-1..0) or always ascending (DeepSpeed).
    subgroup_order order = subgroup_order::alternating;
    direction first_direction = direction::ascending;  ///< the first call's direction
    /// Whether buffers beyond the streaming ones keep the last-updated subgroups between calls (the next,
    /// reversed, call then neither reads nor writes them) or are only used for read-ahead.
    resident_policy resident = resident_policy::keep_last_updated;
    /// How gradients reach the Adam step (see gradient_path).
    gradient_path gradients = gradient_path::lazy_widening;
    std::string key_prefix = "optim";        ///< tier keys are "<prefix>-<i>" (and "<prefix>-<i>.grad")
    /// Where the fp32 master params live. Empty (the default): on the tier with m and v (12
    /// bytes per parameter), and update() writes the compute copy into its copy_out. Set to
    /// the caller's param_count fp32 params (only with ParamCopy = float: a trainer whose
    /// compute copy is fp32 holds the master params in memory anyway): the tier holds m and v
    /// only (8 bytes per parameter, a third less traffic per update and smaller buffers),
    /// update() updates these params in place (its copy_out must be empty or this same
    /// span), save() takes them from here and restore() puts the saved ones here. The save
    /// format is the same either way. The caller keeps this memory alive and changes it only
    /// through the pipeline (as it would an in-memory optimizer's params).
    std::span<float> master_params{};
    thread_pool* pool = nullptr;     ///< Adam's threads; nullptr: the shared pool
    trace::recorder* recorder = nullptr;     ///< timeline (tracks "reads", "compute", "writes")
    /// Called by the thread that drives update(), once per subgroup in visiting order, as soon
    /// as subgroup s's new params are written (the master params' slice, or copy_out's) and
    /// before the call moves on; the call does not touch those params again. A trainer that
    /// runs update() on a thread of its own can let its next forward use each layer's params
    /// as they arrive, so that the rest of the update (its I/O above all) runs under the
    /// forward. Not called for a skipped step; a failed call has called it for the subgroups
    /// it finished, and a retried call calls it again for every subgroup. It must not throw.
    std::function<void(std::size_t subgroup)> on_subgroup_updated{};
};

/// Whether the gradients of parameters [begin, end) are final: returns true once they are,
/// waiting at most `wait_at_most` for them and returning false if they are not final by then
/// (see update_args::gradients_final).
using gradient_gate = std::function<bool(std::size_t begin, std::size_t end, std::chrono::microseconds wait_at_most)>;

/// Per-call arguments.
struct update_args {
    float grad_scale = 1.0f;  ///< the loss scale the gradients carry (divided out)
    /// A streamed update: set by a trainer that calls update() while its backward pass is
    /// still computing the gradients (on a thread of its own), so that the update's I/O and
    /// Adam steps run under backward. The call then reads ahead as usual, but before the Adam
    /// step of each subgroup it asks this gate until the subgroup's gradients are final,
    /// topping up the I/O (and the reads ahead) between asks; it reads no gradient before
    /// its gate says so. Backward finishes the gradients of the last layers first, so a
    /// descending walk (every other call of the alternating order) follows it.
    ///
    /// The gradients are then checked subgroup by subgroup, as each is taken, instead of all
    /// at once before the first update, so a streamed update cannot skip an overflow: an
    /// inf or NaN gradient throws gradient_overflow_error naming the subgroup, with the
    /// subgroups visited before it already holding the new step (no state is lost, as after
    /// a fault: update() again with finite gradients of this step finishes it exactly once).
    /// Use it where the step is not expected to overflow (fp32 or bf16 gradients without
    /// loss scaling); with fp16 loss scaling, whose overflows are routine, check first.
    /// Refused (std::invalid_argument) with clipping (max_grad_norm > 0: the norm needs every
    /// gradient first) and with gradient_path::fp32_on_tier (its hand-over checks first).
    gradient_gate gradients_final{};
};

/// Thrown by a streamed update (update_args::gradients_final) that finds an inf or NaN
/// gradient: the step is only partly applied (see update_args).
class gradient_overflow_error : public std::runtime_error {
public:
    /// `what`: the message; `subgroup`: the one with the inf/NaN; `updated`: how many already hold the step.
    gradient_overflow_error(const std::string& what, std::size_t subgroup, std::size_t updated)
        : std::runtime_error(what), subgroup_(subgroup), updated_(updated) {}
    /// The subgroup whose gradients are not finite.
    [[nodiscard]] std::size_t subgroup() const noexcept { return subgroup_; }
    /// Subgroups that already hold the new step.
    [[nodiscard]] std::size_t subgroups_updated() const noexcept { return updated_; }

private:
    std::size_t subgroup_, updated_;
};

/// Bytes a tier (or one child of a virtual tier) moved during a call, and how long it was
/// busy doing so: busy_fraction() near 1 means the path worked for the whole call, lower
/// means it idled for part of it (the start and end of a call, or waits on its lock).
/// Busy seconds come from the tier's own counters (tier_stats: wall time with at least one
/// operation of that direction in flight); for a virtual tier's child they count only the
/// transfers this tier made to it (another process under node_lock is not seen), and a
/// plain tier's count the operations of all its users during the call.
struct child_io {
    std::string name;                 ///< the tier's (or child's) name()
    std::uint64_t bytes_read = 0;     ///< bytes read from it during the call
    std::uint64_t bytes_written = 0;  ///< bytes written to it during the call
    double read_busy_seconds = 0;     ///< wall time with >= 1 read in flight to it during the call
    double write_busy_seconds = 0;    ///< wall time with >= 1 write in flight to it during the call

    /// Mean over the two directions of busy time / `call_seconds` (0 when call_seconds <= 0).
    [[nodiscard]] double busy_fraction(double call_seconds) const noexcept {
        return call_seconds > 0 ? (read_busy_seconds + write_busy_seconds) / (2 * call_seconds) : 0.0;
    }
};

/// What one update() (or hand_over_gradients()) call did.
struct update_stats {
    step_result result = step_result::applied;  ///< applied, or skipped on a gradient overflow
    std::int64_t step = 0;          ///< the Adam step applied (0 when skipped)
    double seconds = 0;             ///< wall time of the update call
    double read_wait_seconds = 0;   ///< blocked waiting for reads
    double compute_seconds = 0;     ///< in the Adam step (and the gradient check)
    double write_wait_seconds = 0;  ///< blocked waiting for writes
    double gradient_wait_seconds = 0;  ///< a streamed update: waiting for the gradients to be final
    double handover_seconds = 0;    ///< hand_over_gradients() for this step (0 when not called)
    std::size_t subgroups_read = 0;        ///< subgroups whose state was read from the tier
    std::size_t subgroups_written = 0;     ///< subgroups whose state was written to the tier
    std::size_t served_from_resident = 0;  ///< subgroups found in the resident set (no read)
    std::size_t served_from_prefetch = 0;  ///< subgroups whose read begin_prefetch() issued before the call
    std::uint64_t bytes_read = 0;     ///< state (and fp32 gradient) bytes the pipeline read
    std::uint64_t bytes_written = 0;  ///< state bytes the pipeline wrote
    std::uint64_t handover_bytes_written = 0;  ///< fp32 gradient bytes written by the hand-over (fp32_on_tier)
    std::vector<child_io> children;   ///< per tier child (one entry for a plain tier)
    double grad_norm = 0;             ///< global L2 norm of the unscaled gradients
    float clip_coef = 1.0f;           ///< factor applied to the gradients by clipping (1: not clipped)
};

/// A tier that reports per-child statistics (a virtual tier): report() returns a range of
/// entries with `name` and `moved` (the tier_stats of the transfers to and from that child).
/// Detected, not required.
template <class T>
concept tier_with_children =
    requires(const T& t) {
        { t.report() } -> std::ranges::range;
    } && requires(const std::ranges::range_value_t<decltype(std::declval<const T&>().report())>& c) {
        { c.name } -> std::convertible_to<std::string>;
        { c.moved } -> std::convertible_to<tier_stats>;
    };

/// The offloaded optimizer's update phase: AdamW over subgroups whose state (fp32 params,
/// m, v) lives on `Tier`, moved through a bounded set of host buffers.
///
/// Each update() visits the subgroups in alternating order, reading ahead while updating
/// one subgroup and writing back the previous ones; buffers beyond the streaming ones
/// (pipeline_config::streaming_buffers, 3 by default) keep the last-updated subgroups
/// resident for the next, reversed, call. Gradients (`Grad`: float, float16 or
/// bfloat16) stay in the trainer's memory and are widened inside the Adam step; the updated
/// parameters are written back to the trainer's `ParamCopy` buffer. Results are
/// bit-identical to the in-memory AdamW step over the same data, whatever the tier, order or
/// resident set. An I/O error names the subgroup, its key and the tier, and loses no state:
/// calling update() again with the same gradients completes the step exactly once.
/// Not thread-safe: one thread drives a pipeline.
/// @tparam Tier      any storage_tier (file, virtual, host, decorated)
/// @tparam Grad      the gradients' element type
/// @tparam ParamCopy the element type of the trainer's compute copy of the parameters
template <storage_tier Tier, class Grad, class ParamCopy = Grad>
class update_pipeline {
    static_assert(std::is_same_v<Grad, float> || is_half_v<Grad>, "update_pipeline: Grad must be float, float16 or bfloat16");
    static_assert(std::is_same_v<ParamCopy, float> || is_half_v<ParamCopy>,
                  "update_pipeline: ParamCopy must be float, float16 or bfloat16");

public:
    using tier_type = Tier;                   ///< the tier the state lives on
    using grad_type = Grad;                   ///< the gradients' element type
    using copy_type = ParamCopy;              ///< the compute copy's element type
    using clock = std::chrono::steady_clock;  ///< the clock of the stats and the trace

    /// Initialises the state on `tier` from the trainer's fp32 `initial_params` (m = v = 0).
    /// Throws std::invalid_argument for a bad config, options or size; std::system_error
    /// (naming the subgroup) when the tier fails, after erasing what it wrote.
    update_pipeline(Tier& tier, pipeline_config config, std::span<const float> initial_params,
                    pipeline_options options = {})
        : tier_(tier), cfg_(config), opts_(std::move(options)) {
        setup();
        expect_argument(initial_params.size() == cfg_.param_count,
                        "update_pipeline: initial_params has " + std::to_string(initial_params.size()) +
                            " elements but param_count is " + std::to_string(cfg_.param_count));
        try {
            initialise(initial_params);
        } catch (...) {
            quiesce_io();
            erase_all();
            throw;
        }
    }

    /// Builds a pipeline from a directory written by save(), over `tier` (any tier). The
    /// config must have the saved param_count and subgroup_size (std::invalid_argument
    /// naming the field otherwise); the buffers, Adam settings and options may differ.
    /// Throws std::runtime_error naming the subgroup for a missing, truncated or corrupted
    /// subgroup file (nothing is left on the tier then).
    static update_pipeline restore(const std::filesystem::path& dir, Tier& tier, pipeline_config config,
                                   pipeline_options options = {}) {
        return update_pipeline(restore_tag{}, dir, tier, config, std::move(options));
    }

    update_pipeline(const update_pipeline&) = delete;
    update_pipeline& operator=(const update_pipeline&) = delete;
    ~update_pipeline() {
        quiesce_io();
        erase_all();
    }

    // ---- The update phase -----------------------------------------------------------

    /// Backward's hand-over of this step's gradients; the time goes into
    /// last_stats().handover_seconds of the next update.
    ///  - gradient_path::fp32_on_tier (the DeepSpeed-like backward): checks `grads`, widens
    ///    each subgroup's gradients to fp32 and writes them to the tier ("<prefix>-<i>.grad"),
    ///    pipelined over the free host buffers. The next update(copy_out) uses them.
    ///  - gradient_path::lazy_widening: only the gradient check (sum of squares, overflow),
    ///    which update() then skips: a trainer calls it at the end of backward, e.g. while
    ///    begin_prefetch()'s reads run. Nothing is read or written. The next
    ///    update(grads, ...) uses the result when it gets the same span (data and size) and
    ///    grad_scale, and checks again otherwise; the gradients' values must not change in
    ///    between. One update consumes it (a skipped or failed update included).
    /// Returns the check's sum of squares (of each gradient divided by grad_scale, in double):
    /// +inf or NaN when a gradient is inf or NaN, and the next update is then skipped. A
    /// trainer that shards the parameters over ranks combines the ranks' verdicts from it.
    double hand_over_gradients(std::span<const Grad> grads, update_args args = {}) {
        check_grads_size(grads);
        check_grad_scale(args.grad_scale);
        auto t0 = clock::now();
        handover_ = handover_state{};
        handover_.sum_squares = sum_squares(grads, args.grad_scale);
        handover_.grad_scale = args.grad_scale;
        handover_.for_step = steps_ + 1;
        handover_.grads = grads.data();
        handover_.grad_count = grads.size();
        if (opts_.gradients == gradient_path::fp32_on_tier && detail::finite_bits(handover_.sum_squares)) write_fp32_grads(grads);
        handover_.valid = true;
        handover_.seconds = seconds_since(t0);
        return handover_.sum_squares;
    }

    /// Runs one AdamW step over every subgroup (see the protocol in the header comment).
    /// `grads` (param_count elements) are the trainer's gradients; with fp32_on_tier they are
    /// first handed over (as hand_over_gradients would in backward). `copy_out` receives the
    /// updated compute copy (param_count elements, or empty for none). Returns applied or
    /// skipped_overflow; stats in last_stats(). Throws as described in the header comment.
    step_result update(std::span<const Grad> grads, std::span<ParamCopy> copy_out, update_args args = {}) {
        check_grads_size(grads);
        expect_argument(!args.gradients_final || opts_.gradients != gradient_path::fp32_on_tier,
                        "update_pipeline: a streamed update (update_args::gradients_final) needs lazy widening: "
                        "gradient_path::fp32_on_tier hands every gradient over first");
        if (opts_.gradients == gradient_path::fp32_on_tier) {
            hand_over_gradients(grads, args);
            return run(std::span<const Grad>{}, copy_out);
        }
        check_copy_size(copy_out);  // bad arguments are refused before any I/O
        check_grad_scale(args.grad_scale);
        if (args.gradients_final) {
            expect_argument(cfg_.max_grad_norm == 0,
                            "update_pipeline: a streamed update (update_args::gradients_final) cannot clip: "
                            "max_grad_norm is " + std::to_string(cfg_.max_grad_norm) + " and the norm needs every gradient first");
            return run_streamed(grads, copy_out, args);
        }
        auto t0 = clock::now();
        auto children_before = child_snapshot();
        // The first reads go out before the gradient check: they do not depend on it, and
        // the paths would otherwise sit idle while the check reads every gradient (on a
        // 4 GiB state, about a tenth of the call). A skipped step keeps them for the next.
        own_prefetches_ += prefetch_reads(std::numeric_limits<std::size_t>::max());
        const bool handed_over = handover_.valid && handover_.for_step == steps_ + 1 && handover_.grads == grads.data() &&
                                 handover_.grad_count == grads.size() && handover_.grad_scale == args.grad_scale;
        double check_seconds = 0;
        if (!handed_over) {
            double total = sum_squares(grads, args.grad_scale, /*poll=*/true);
            handover_ = handover_state{};
            handover_.sum_squares = total;
            handover_.grad_scale = args.grad_scale;
            handover_.for_step = steps_ + 1;
            handover_.valid = true;
            check_seconds = seconds_since(t0);
        }
        // One update consumes the hand-over, whatever its outcome: a trainer that refills the
        // same gradient buffer for the next step without handing it over gets a fresh check.
        struct consume {
            handover_state& h;
            ~consume() { h.valid = false; }
        } consumed{handover_};
        auto r = run(grads, copy_out, t0, std::move(children_before));
        stats_.compute_seconds += check_seconds;
        return r;
    }

    /// gradient_path::fp32_on_tier: the update after hand_over_gradients() for this step.
    step_result update(std::span<ParamCopy> copy_out) {
        expect_argument(opts_.gradients == gradient_path::fp32_on_tier,
                        "update_pipeline::update(copy_out) needs gradient_path::fp32_on_tier; "
                        "pass the gradients with lazy widening");
        return run(std::span<const Grad>{}, copy_out);
    }

    /// Starts reading, into free host buffers, the first subgroups the next update() visits
    /// that are not resident, so that a trainer can overlap those reads with its backward
    /// pass; the next update() picks them up instead of reading them again (counted in
    /// update_stats::served_from_prefetch). Reads at most `max_subgroups` subgroups and
    /// never more than the free buffers (with gradient_path::fp32_on_tier one buffer stays
    /// free for the gradient hand-over, and only the state is prefetched). Calling it again
    /// extends the prefetch; results are bit-identical with or without it. A skipped
    /// (overflow) update keeps the prefetched buffers for the next one; save(),
    /// read_state() and the hand-over may take them back when they need a buffer. A read
    /// error surfaces in the update() that uses the subgroup, naming it. Returns the number
    /// of reads started.
    std::size_t begin_prefetch(std::size_t max_subgroups = std::numeric_limits<std::size_t>::max()) {
        const std::size_t started = prefetch_reads(max_subgroups);
        io_->issue_all();  // nobody polls until the next update(): no window
        return started;
    }

    /// Subgroups whose prefetched read waits for the next update() (see begin_prefetch).
    [[nodiscard]] std::size_t prefetched_count() const noexcept {
        return static_cast<std::size_t>(std::count_if(prefetch_of_.begin(), prefetch_of_.end(),
                                                      [](std::ptrdiff_t b) { return b >= 0; }));
    }

    /// Writes every dirty resident subgroup to the tier (they stay resident, now clean).
    void flush() {
        for (std::size_t b = 0; b < bufs_.size(); ++b) {
            auto& buf = bufs_[b];
            if (buf.use == use_state::resident && buf.dirty) write_now(b);
        }
    }

    // ---- Save and restore -----------------------------------------------------------

    /// Saves the whole state to `dir` (see the header comment). Throws std::logic_error if
    /// the last update() failed part-way (subgroups at different steps: run update() again
    /// first), std::system_error naming the path for file errors, std::invalid_argument if
    /// `dir` exists and is not a save (no manifest.txt) and not empty.
    void save(const std::filesystem::path& dir_given) {
        namespace fs = std::filesystem;
        // "ckpt/" names the directory ckpt: the temporary one goes beside it, not inside.
        fs::path dir = dir_given.lexically_normal();
        if (!dir.has_filename() && dir.has_parent_path() && dir != dir.root_path()) dir = dir.parent_path();
        for (std::size_t s = 0; s < n_; ++s)
            if (version_of(s) != steps_)
                throw std::logic_error("update_pipeline::save: subgroup " + std::to_string(s) + " holds step " +
                                       std::to_string(version_of(s)) + " but the pipeline is at step " +
                                       std::to_string(steps_) + " (an update failed part-way; run it again first)");
        std::error_code ec;
        if (fs::exists(dir, ec)) {
            expect_argument(fs::is_directory(dir, ec), "update_pipeline::save: " + dir.string() + " is not a directory");
            expect_argument(fs::exists(dir / "manifest.txt") || fs::is_empty(dir, ec),
                            "update_pipeline::save: " + dir.string() +
                                " exists and is not an optimizer save (no manifest.txt); refusing to replace it");
        }
        fs::path parent = dir.parent_path().empty() ? fs::path(".") : dir.parent_path();
        const std::string tmp_prefix = dir.filename().string() + ".tmp-";
        owned_directory::reclaim_abandoned(parent, tmp_prefix);  // saves whose process died
        auto owned = owned_directory::create(parent, tmp_prefix);
        fs::path tmp = owned.path();
        try {
            std::ostringstream manifest;
            manifest << "spillway-optimizer-state 2\n"
                     << "param_count " << cfg_.param_count << "\n"
                     << "subgroup_size " << cfg_.subgroup_size << "\n"
                     << "subgroups " << n_ << "\n"
                     << "step " << steps_ << "\n"
                     << "iteration " << iteration_ << "\n";
            std::size_t scratch = scratch_buffer();
            // With master_params a save still holds params, m and v: assembled here.
            aligned_buffer whole;
            if (master_in_caller()) whole = aligned_buffer(3 * sizeof(float) * subgroup_elements(0));
            for (std::size_t s = 0; s < n_; ++s) {
                std::span<const std::byte> bytes;
                if (resident_of_[s] >= 0) {
                    bytes = bufs_[static_cast<std::size_t>(resident_of_[s])].mem.bytes().first(blob_bytes(s));
                } else {
                    auto out = bufs_[scratch].mem.bytes().first(blob_bytes(s));
                    read_now(s, out);
                    bytes = out;
                }
                if (master_in_caller()) {
                    auto params = std::as_bytes(opts_.master_params.subspan(s * cfg_.subgroup_size, subgroup_elements(s)));
                    auto out = whole.bytes().first(saved_blob_bytes(s));
                    std::memcpy(out.data(), params.data(), params.size());
                    std::memcpy(out.data() + params.size(), bytes.data(), bytes.size());
                    bytes = out;
                }
                auto crc = crc32c(bytes);
                write_file(tmp / file_name(s), bytes, "update_pipeline::save of subgroup " + std::to_string(s));
                manifest << "subgroup " << s << " " << bytes.size() << " " << crc << "\n";
            }
            const std::uint32_t manifest_crc = crc32c(std::as_bytes(std::span(manifest.view())));
            manifest << "manifest_crc " << manifest_crc << "\nend\n";
            std::string text = manifest.str();
            write_file(tmp / "manifest.txt", std::as_bytes(std::span(text.data(), text.size())),
                               "update_pipeline::save manifest");
            owned.disown();  // from here on this call removes tmp itself on failure
            sync_directory(tmp);
            replace_directory(tmp, dir);
        } catch (...) {
            fs::remove_all(tmp, ec);
            throw;
        }
    }

    // ---- Inspection -----------------------------------------------------------------

    /// Completed Adam steps (the next update applies step steps() + 1).
    [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }
    /// Number of subgroups (ceil(param_count / subgroup_size)).
    [[nodiscard]] std::size_t subgroup_count() const noexcept { return n_; }
    /// Parameters in subgroup s.
    [[nodiscard]] std::size_t subgroup_elements(std::size_t s) const noexcept {
        return std::min(cfg_.subgroup_size, cfg_.param_count - s * cfg_.subgroup_size);
    }
    /// Bytes of subgroup s's state blob on the tier: 12 per parameter (params, m, v), 8 (m, v)
    /// with pipeline_options::master_params.
    [[nodiscard]] std::size_t blob_bytes(std::size_t s) const noexcept {
        return state_floats() * sizeof(float) * subgroup_elements(s);
    }
    /// Whether the master params live in the caller's memory (pipeline_options::master_params).
    [[nodiscard]] bool master_in_caller() const noexcept { return !opts_.master_params.empty(); }
    /// The most subgroups kept resident between calls.
    [[nodiscard]] std::size_t resident_capacity() const noexcept {
        return opts_.resident == resident_policy::keep_last_updated ? std::min(cfg_.host_buffers - cfg_.streaming_buffers, n_)
                                                                    : 0;
    }
    /// Subgroups now held in host buffers between calls.
    [[nodiscard]] std::vector<std::size_t> resident_subgroups() const {
        std::vector<std::size_t> out;
        for (std::size_t s = 0; s < n_; ++s)
            if (resident_of_[s] >= 0) out.push_back(s);
        return out;
    }
    /// Host bytes of the buffers.
    [[nodiscard]] std::size_t host_buffer_bytes() const noexcept {
        std::size_t t = 0;
        for (auto& b : bufs_) t += b.mem.capacity();
        return t;
    }
    /// The order the next update() visits the subgroups in.
    [[nodiscard]] alternating_order next_order() const noexcept {
        return opts_.order == subgroup_order::alternating ? alternating_order(n_, iteration_, opts_.first_direction)
                                                          : ascending_order(n_);
    }
    /// What the last update() (or hand_over_gradients()) call did.
    [[nodiscard]] const update_stats& last_stats() const noexcept { return stats_; }
    /// The configuration the pipeline was built with.
    [[nodiscard]] const pipeline_config& config() const noexcept { return cfg_; }
    /// The options the pipeline was built with.
    [[nodiscard]] const pipeline_options& options() const noexcept { return opts_; }
    /// The tier key of subgroup s's state (of its first piece; piece j > 0 is "<key>.<j>").
    [[nodiscard]] const std::string& key(std::size_t s) const { return keys_.at(s); }
    /// Pieces (tier keys) of subgroup s's state.
    [[nodiscard]] std::size_t piece_count(std::size_t s) const { return piece_keys_.at(s).size(); }

    /// Copies subgroup s's current fp32 params, m and v (from its buffer or the tier) into
    /// the spans (each subgroup_elements(s) long; empty spans are skipped). Uses a free buffer.
    void read_state(std::size_t s, std::span<float> params, std::span<float> m, std::span<float> v) {
        expect_argument(s < n_, "update_pipeline::read_state: subgroup " + std::to_string(s) + " out of range (" +
                                    std::to_string(n_) + " subgroups)");
        const std::size_t c = subgroup_elements(s);
        const float* src = nullptr;
        if (master_in_caller() && m.empty() && v.empty()) {
            // Only the params, which are the caller's: no read.
        } else if (resident_of_[s] >= 0) {
            src = bufs_[static_cast<std::size_t>(resident_of_[s])].mem.template as<float>().data();
        } else {
            std::size_t b = scratch_buffer();
            read_now(s, bufs_[b].mem.bytes().first(blob_bytes(s)));
            src = bufs_[b].mem.template as<float>().data();
        }
        auto put = [&](std::span<float> out, const float* from, const char* what) {
            if (out.empty()) return;
            expect_argument(out.size() == c, std::string("update_pipeline::read_state: ") + what + " has " +
                                                 std::to_string(out.size()) + " elements, subgroup " + std::to_string(s) +
                                                 " has " + std::to_string(c));
            std::memcpy(out.data(), from, c * sizeof(float));
        };
        if (master_in_caller()) {
            put(params, opts_.master_params.data() + s * cfg_.subgroup_size, "params");
            put(m, src, "m");
            put(v, src + c, "v");
        } else {
            put(params, src, "params");
            put(m, src + c, "m");
            put(v, src + 2 * c, "v");
        }
    }
    /// All fp32 master params (param_count elements).
    void read_params(std::span<float> out) {
        expect_argument(out.size() == cfg_.param_count, "update_pipeline::read_params: output has " +
                                                            std::to_string(out.size()) + " elements, expected " +
                                                            std::to_string(cfg_.param_count));
        for (std::size_t s = 0; s < n_; ++s)
            read_state(s, out.subspan(s * cfg_.subgroup_size, subgroup_elements(s)), {}, {});
    }

private:
    struct restore_tag {};
    enum class use_state { free, reading, ready, writing, resident };
    struct buffer {
        aligned_buffer mem;
        std::ptrdiff_t sg = -1;      // subgroup held
        std::int64_t version = 0;    // step of the state held
        bool dirty = false;          // newer than the tier's copy
        use_state use = use_state::free;  // reading / writing: its job in io_ is active
        io_completion gop;           // fp32 gradient read in flight
        clock::time_point issued{};
    };
    struct handover_state {
        bool valid = false;
        std::int64_t for_step = 0;
        double sum_squares = 0;
        float grad_scale = 1;
        double seconds = 0;
        std::uint64_t bytes = 0;
        const Grad* grads = nullptr;  // the span checked (lazy widening: update() compares)
        std::size_t grad_count = 0;
    };
    struct call_error {
        std::exception_ptr error;
        std::size_t subgroup = 0;
        const char* what = "";
    };

    update_pipeline(restore_tag, const std::filesystem::path& dir, Tier& tier, pipeline_config config,
                    pipeline_options options)
        : tier_(tier), cfg_(config), opts_(std::move(options)) {
        setup();
        try {
            load(dir);
        } catch (...) {
            quiesce_io();
            erase_all();
            throw;
        }
    }

    // ---- Set-up ---------------------------------------------------------------------

    void setup() {
        expect_argument(cfg_.param_count > 0, "update_pipeline: param_count must be > 0");
        expect_argument(cfg_.subgroup_size > 0, "update_pipeline: subgroup_size must be > 0");
        expect_argument(cfg_.host_buffers >= 3, "update_pipeline: host_buffers is " + std::to_string(cfg_.host_buffers) +
                                                    "; the pipeline needs at least 3 (read, update, write)");
        expect_argument(cfg_.streaming_buffers >= 3 && cfg_.streaming_buffers <= cfg_.host_buffers,
                        "update_pipeline: streaming_buffers is " + std::to_string(cfg_.streaming_buffers) +
                            "; it must be at least 3 (read, update, write) and at most host_buffers (" +
                            std::to_string(cfg_.host_buffers) + ")");
        expect_argument(std::isfinite(cfg_.max_grad_norm) && cfg_.max_grad_norm >= 0,
                        "update_pipeline: max_grad_norm must be finite and >= 0 (0: no clipping), got " +
                            std::to_string(cfg_.max_grad_norm));
        validate(cfg_.adam);
        validate_key(opts_.key_prefix, "update_pipeline key_prefix");
        expect_argument(opts_.key_prefix.size() <= 200, "update_pipeline: key_prefix is longer than 200 bytes");
        expect_argument(cfg_.piece_bytes > 0 && cfg_.piece_bytes % 4096 == 0,
                        "update_pipeline: piece_bytes is " + std::to_string(cfg_.piece_bytes) +
                            "; it must be a positive multiple of 4096");
        expect_argument(cfg_.pieces_in_flight > 0, "update_pipeline: pieces_in_flight must be > 0");
        if (master_in_caller()) {
            expect_argument(std::is_same_v<ParamCopy, float>,
                            "update_pipeline: master_params needs an fp32 compute copy (ParamCopy = float); with a "
                            "16-bit copy the master params must live on the tier");
            expect_argument(opts_.master_params.size() == cfg_.param_count,
                            "update_pipeline: master_params has " + std::to_string(opts_.master_params.size()) +
                                " elements but param_count is " + std::to_string(cfg_.param_count));
        }
        // (Sizes below are in bytes of the largest subgroup, at most param_count elements: a
        // subgroup_size above param_count means one subgroup, and cannot overflow them.)
        expect_argument(cfg_.param_count <= std::numeric_limits<std::size_t>::max() / 64,
                        "update_pipeline: param_count " + std::to_string(cfg_.param_count) +
                            " is too large (its byte sizes would overflow)");
        n_ = cfg_.param_count / cfg_.subgroup_size + (cfg_.param_count % cfg_.subgroup_size != 0 ? 1 : 0);
        keys_.reserve(n_);
        piece_keys_.resize(n_);
        for (std::size_t s = 0; s < n_; ++s) {
            keys_.push_back(opts_.key_prefix + "-" + std::to_string(s));
            const std::size_t pieces = (blob_bytes(s) + cfg_.piece_bytes - 1) / cfg_.piece_bytes;
            for (std::size_t j = 0; j < pieces; ++j)
                piece_keys_[s].push_back(j == 0 ? keys_[s] : keys_[s] + "." + std::to_string(j));
            if (opts_.gradients == gradient_path::fp32_on_tier) grad_keys_.push_back(keys_.back() + ".grad");
        }
        for (const auto& pieces : piece_keys_)
            for (const auto& k : pieces)
                expect_argument(!tier_.contains(k), "update_pipeline: the tier '" + std::string(tier_.name()) +
                                                        "' already holds key " + spillway::quoted(k) +
                                                        " (another pipeline with the same key_prefix?)");
        std::size_t nbytes = state_floats() * sizeof(float) * subgroup_elements(0);
        if (opts_.gradients == gradient_path::fp32_on_tier) nbytes += sizeof(float) * subgroup_elements(0);
        bufs_.resize(cfg_.host_buffers);
        if (cfg_.pages == page_size::automatic && cfg_.lock == memory_lock::unlocked && align_up(nbytes) < huge_page_bytes) {
            // Buffers under 2 MiB would come from malloc's scattered pages: carve them all out of
            // one huge-page slab instead (the set rounded up to 2 MiB), as large ones get their own.
            buffer_arena arena(cfg_.host_buffers * align_up(nbytes));
            for (auto& b : bufs_) b.mem = arena.allocate(nbytes);
        } else {
            for (auto& b : bufs_) b.mem = aligned_buffer(nbytes, cfg_.lock, default_alignment, buffer_fill::zeroed, cfg_.pages);
        }
        const std::size_t window =
            tier_with_children<Tier> ? std::numeric_limits<std::size_t>::max() : cfg_.pieces_in_flight;
        io_ = std::make_unique<detail::piece_io<Tier>>(tier_, bufs_.size(), window);
        tier_version_.assign(n_, 0);
        resident_of_.assign(n_, -1);
        prefetch_of_.assign(n_, -1);
        if (opts_.recorder) {
            tr_reads_ = opts_.recorder->track("reads");
            tr_compute_ = opts_.recorder->track("compute");
            tr_writes_ = opts_.recorder->track("writes");
        }
    }

    void initialise(std::span<const float> params) {
        if (master_in_caller() && params.data() != opts_.master_params.data())
            std::copy(params.begin(), params.end(), opts_.master_params.begin());
        // Pipelined: fill a free buffer, issue its write; wait for the oldest when none is free.
        for (std::size_t s = 0; s < n_; ++s) {
            std::size_t b = take_free_buffer(nullptr);
            auto& buf = bufs_[b];
            const std::size_t c = subgroup_elements(s);
            float* f = buf.mem.template as<float>().data();
            float* mv = f;  // m and v: after the params, or the whole blob
            if (!master_in_caller()) {
                std::memcpy(f, params.data() + s * cfg_.subgroup_size, c * sizeof(float));
                mv = f + c;
            }
            std::memset(mv, 0, 2 * c * sizeof(float));
            buf.sg = static_cast<std::ptrdiff_t>(s);
            buf.version = 0;
            buf.dirty = true;
            issue_write(b);
        }
        wait_all_writes(nullptr);
        rethrow_pending();
    }

    void load(const std::filesystem::path& dir) {
        // Manifest first: its own checksum (format 2), the shape and the subgroups' checksums.
        std::string text;
        {
            std::ifstream file(dir / "manifest.txt", std::ios::binary);
            if (!file)
                throw_system_error(errno ? errno : ENOENT, "open", "update_pipeline::restore: " + (dir / "manifest.txt").string());
            text.assign(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
        }
        std::istringstream in(text);
        std::string magic;
        int format = 0;
        in >> magic >> format;
        if (magic != "spillway-optimizer-state" || (format != 1 && format != 2))
            throw std::runtime_error("update_pipeline::restore: " + (dir / "manifest.txt").string() +
                                     " is not a spillway optimizer save (format 1 or 2)");
        if (format == 2) {
            // "manifest_crc <CRC-32C of every byte before that line>" then "end".
            const auto at = text.rfind("\nmanifest_crc ");
            std::uint64_t want = 0;
            const bool found = at != std::string::npos &&
                               std::sscanf(text.c_str() + at + 1, "manifest_crc %" SCNu64, &want) == 1;
            if (!found || want != crc32c(std::as_bytes(std::span(text.data(), at + 1))))
                throw std::runtime_error("update_pipeline::restore: " + (dir / "manifest.txt").string() +
                                         " is corrupted: its text does not match its checksum (manifest_crc)");
        }
        auto field = [&](const char* name) {
            std::string k;
            std::int64_t v = -1;
            in >> k >> v;
            if (!in || k != name || v < 0)
                throw std::runtime_error("update_pipeline::restore: manifest field '" + std::string(name) +
                                         "' is missing or malformed in " + dir.string());
            return v;
        };
        auto param_count = static_cast<std::size_t>(field("param_count"));
        auto subgroup_size = static_cast<std::size_t>(field("subgroup_size"));
        auto subgroups = static_cast<std::size_t>(field("subgroups"));
        auto step = field("step");
        if (step == std::numeric_limits<std::int64_t>::max())
            throw std::runtime_error("update_pipeline::restore: manifest field 'step' is out of range in " + dir.string());
        auto iteration = static_cast<std::uint64_t>(field("iteration"));
        expect_argument(param_count == cfg_.param_count, "update_pipeline::restore: the save has param_count " +
                                                             std::to_string(param_count) + ", the config " +
                                                             std::to_string(cfg_.param_count));
        expect_argument(subgroup_size == cfg_.subgroup_size, "update_pipeline::restore: the save has subgroup_size " +
                                                                 std::to_string(subgroup_size) + ", the config " +
                                                                 std::to_string(cfg_.subgroup_size));
        if (subgroups != n_)
            throw std::runtime_error("update_pipeline::restore: the manifest lists " + std::to_string(subgroups) +
                                     " subgroups, the shape implies " + std::to_string(n_));
        std::vector<std::uint32_t> crcs(n_);
        for (std::size_t s = 0; s < n_; ++s) {
            std::string k;
            std::size_t id = 0, nbytes = 0;
            std::uint64_t crc = 0;
            in >> k >> id >> nbytes >> crc;
            if (!in || k != "subgroup" || id != s || nbytes != saved_blob_bytes(s) || crc > 0xffffffffu)
                throw std::runtime_error("update_pipeline::restore: manifest entry of subgroup " + std::to_string(s) +
                                         " is missing or malformed in " + dir.string());
            crcs[s] = static_cast<std::uint32_t>(crc);
        }
        std::string end;
        in >> end;
        if (format == 2 && end == "manifest_crc") {  // (checked above)
            std::uint64_t crc = 0;
            in >> crc >> end;
        }
        if (end != "end") throw std::runtime_error("update_pipeline::restore: manifest in " + dir.string() + " is truncated");
        // Then each subgroup: size, checksum, write to the tier. With master_params a first
        // pass checks every file before the caller's params change (a refused save leaves
        // them as they were); the second puts the params there and m and v on the tier.
        aligned_buffer whole;
        auto read_checked = [&](std::size_t s, std::span<std::byte> bytes) {
            auto path = dir / file_name(s);
            std::size_t got = read_file(path, bytes, "update_pipeline::restore of subgroup " + std::to_string(s));
            if (got != bytes.size())
                throw std::runtime_error("update_pipeline::restore: subgroup " + std::to_string(s) + " is truncated: " +
                                         path.string() + " has " + bytes_str(got) + ", the manifest says " +
                                         bytes_str(bytes.size()));
            if (crc32c(bytes) != crcs[s])
                throw std::runtime_error("update_pipeline::restore: subgroup " + std::to_string(s) +
                                         " is corrupted: the CRC-32C of " + path.string() +
                                         " does not match the manifest");
        };
        if (master_in_caller()) {
            whole = aligned_buffer(3 * sizeof(float) * subgroup_elements(0));
            for (std::size_t s = 0; s < n_; ++s) read_checked(s, whole.bytes().first(saved_blob_bytes(s)));
        }
        for (std::size_t s = 0; s < n_; ++s) {
            std::size_t b = take_free_buffer(nullptr);
            auto& buf = bufs_[b];
            if (master_in_caller()) {
                auto bytes = whole.bytes().first(saved_blob_bytes(s));
                read_checked(s, bytes);
                const std::size_t params = sizeof(float) * subgroup_elements(s);
                std::memcpy(opts_.master_params.data() + s * cfg_.subgroup_size, bytes.data(), params);
                std::memcpy(buf.mem.data(), bytes.data() + params, blob_bytes(s));
            } else {
                read_checked(s, buf.mem.bytes().first(blob_bytes(s)));
            }
            buf.sg = static_cast<std::ptrdiff_t>(s);
            buf.version = step;
            buf.dirty = true;
            issue_write(b);
        }
        wait_all_writes(nullptr);
        rethrow_pending();
        steps_ = step;
        iteration_ = iteration;
        tier_version_.assign(n_, step);
    }

    // ---- The phase ------------------------------------------------------------------

    // `started` and `children_before`: the call's start and per-child counters, when update()
    // did I/O before calling run().
    // A streamed update (update_args::gradients_final): nothing is checked up front; run()
    // checks each subgroup's gradients once its gate opens.
    step_result run_streamed(std::span<const Grad> grads, std::span<ParamCopy> copy_out, const update_args& args) {
        auto t0 = clock::now();
        auto children_before = child_snapshot();
        handover_ = handover_state{};
        handover_.grad_scale = args.grad_scale;
        handover_.for_step = steps_ + 1;
        handover_.valid = true;
        struct consume {
            handover_state& h;
            ~consume() { h.valid = false; }
        } consumed{handover_};
        return run(grads, copy_out, t0, std::move(children_before), &args.gradients_final);
    }

    step_result run(std::span<const Grad> grads, std::span<ParamCopy> copy_out,
                    std::optional<clock::time_point> started = std::nullopt,
                    std::optional<std::vector<child_io>> children_before = std::nullopt,
                    const gradient_gate* gate = nullptr) {
        auto t0 = started.value_or(clock::now());
        check_copy_size(copy_out);
        expect_argument(handover_.valid && handover_.for_step == steps_ + 1,
                        "update_pipeline::update: the gradients of step " + std::to_string(steps_ + 1) +
                            " were not handed over (call hand_over_gradients first)");
        const std::int64_t target = steps_ + 1;
        stats_ = update_stats{};
        stats_.handover_seconds = handover_.seconds;  // 0 when update() checked the gradients itself
        stats_.handover_bytes_written = handover_.bytes;
        stats_.grad_norm = std::sqrt(handover_.sum_squares);
        if (!detail::finite_bits(handover_.sum_squares)) {
            stats_.result = step_result::skipped_overflow;
            stats_.seconds = seconds_since(t0);
            return step_result::skipped_overflow;  // step 1: nothing touched
        }
        float clip = 1.0f;
        if (cfg_.max_grad_norm > 0) clip = clip_coefficient(handover_.sum_squares, cfg_.max_grad_norm);
        stats_.clip_coef = clip;
        adamw_step_args args;
        args.step = target;
        args.grad_scale = handover_.grad_scale;
        args.clip_coef = clip;
        args.check = grad_check::caller_verified;

        auto before = children_before ? std::move(*children_before) : child_snapshot();
        make_room();  // step 1, second half
        const auto order = next_order();
        const std::size_t keep = resident_capacity();
        std::vector<std::ptrdiff_t> read_buf(n_, -1);
        for (std::size_t p = 0; p < n_; ++p) {  // reads begin_prefetch() started
            read_buf[p] = std::exchange(prefetch_of_[order[p]], -1);
            stats_.served_from_prefetch += read_buf[p] >= 0;
        }
        // served_from_prefetch counts the trainer's begin_prefetch() calls, not update()'s own.
        stats_.served_from_prefetch -= std::exchange(own_prefetches_, 0);
        std::size_t next = 0;
        // Step 2: reads ahead of position p.
        auto read_ahead = [&](std::size_t p) {
            next = std::max(next, p);
            while (next < n_) {
                std::size_t s2 = order[next];
                const std::ptrdiff_t held = resident_of_[s2] >= 0 ? resident_of_[s2] : read_buf[next];
                if (held >= 0) {  // resident, or prefetched
                    if (opts_.gradients == gradient_path::fp32_on_tier) issue_grad_read(static_cast<std::size_t>(held), s2);
                    ++next;
                    continue;
                }
                auto b = find_free();
                if (!b) break;
                issue_read(*b, s2);
                read_buf[next] = static_cast<std::ptrdiff_t>(*b);
                ++next;
            }
        };
        std::vector<double> squares(gate ? n_ : 0);  // a streamed update's check, per subgroup
        try {
            for (std::size_t p = 0; p < n_; ++p) {
                const std::size_t s = order[p];
                poll_io();
                rethrow_pending();
                read_ahead(p);
                // Step 3: the buffer of subgroup s.
                std::size_t b;
                if (resident_of_[s] >= 0) {
                    b = static_cast<std::size_t>(resident_of_[s]);
                    resident_of_[s] = -1;
                    bufs_[b].use = use_state::ready;
                    ++stats_.served_from_resident;
                } else {
                    if (read_buf[p] < 0) {
                        std::size_t fb = take_free_buffer(&stats_.write_wait_seconds);
                        issue_read(fb, s);
                        read_buf[p] = static_cast<std::ptrdiff_t>(fb);
                        if (next <= p) next = p + 1;
                    }
                    b = static_cast<std::size_t>(read_buf[p]);
                    wait_read(b);
                }
                if (opts_.gradients == gradient_path::fp32_on_tier) wait_grad_read(b, s);
                // Step 4: compute (a streamed update first waits for and checks the gradients).
                if (gate) squares[s] = await_gradients(*gate, s, p, grads, [&] { read_ahead(p + 1); });
                compute(b, s, target, args, grads, copy_out);
                if (opts_.on_subgroup_updated) opts_.on_subgroup_updated(s);
                // Step 5: hand the buffer on.
                if (p + keep >= n_) {
                    bufs_[b].use = use_state::resident;
                    resident_of_[s] = static_cast<std::ptrdiff_t>(b);
                } else if (bufs_[b].dirty) {
                    issue_write(b);
                } else {
                    release(b);
                }
            }
            // Step 7.
            wait_all_writes(&stats_.write_wait_seconds);
            rethrow_pending();
        } catch (...) {
            recover();
            fill_children(before);
            stats_.seconds = seconds_since(t0);
            throw;
        }
        steps_ = target;
        ++iteration_;
        stats_.step = target;
        stats_.result = step_result::applied;
        if (gate) {  // summed in subgroup order, as the up-front check sums
            double total = 0;
            for (double x : squares) total += x;
            stats_.grad_norm = std::sqrt(total);
        }
        fill_children(before);
        stats_.seconds = seconds_since(t0);
        return step_result::applied;
    }

    // A streamed update, before the Adam step of subgroup s (position p of the walk): asks
    // the gate until the subgroup's gradients are final, keeping the I/O going in between
    // (`keep_busy` issues reads ahead), then checks them. Returns their sum of squares;
    // throws gradient_overflow_error when one is inf or NaN.
    template <class KeepBusy>
    double await_gradients(const gradient_gate& gate, std::size_t s, std::size_t p, std::span<const Grad> grads,
                           KeepBusy&& keep_busy) {
        const std::size_t begin = s * cfg_.subgroup_size, count = subgroup_elements(s);
        auto t0 = clock::now();
        // Short asks while transfers are in flight (their completions free buffers for the
        // reads ahead and keep the windows full); long ones once the paths have nothing to do.
        constexpr std::chrono::microseconds busy_wait{500}, idle_wait{20000};
        while (!gate(begin, begin + count, io_->idle() ? idle_wait : busy_wait)) {
            poll_io();
            rethrow_pending();
            keep_busy();
        }
        stats_.gradient_wait_seconds += seconds_since(t0);
        auto t1 = clock::now();
        const double squares = grad_sum_squares<Grad>(grads.subspan(begin, count), handover_.grad_scale, opts_.pool);
        stats_.compute_seconds += seconds_since(t1);
        if (!detail::finite_bits(squares))
            throw gradient_overflow_error("update_pipeline: a gradient of subgroup " + std::to_string(s) + " (params [" +
                                              std::to_string(begin) + ", " + std::to_string(begin + count) +
                                              ")) is inf or NaN in a streamed update of step " +
                                              std::to_string(steps_ + 1) + ": " + std::to_string(p) + " of " +
                                              std::to_string(n_) +
                                              " subgroups already hold that step (a streamed update cannot skip; call "
                                              "update() again with finite gradients of this step to finish it)",
                                          s, p);
        return squares;
    }

    void compute(std::size_t b, std::size_t s, std::int64_t target, const adamw_step_args& args,
                 std::span<const Grad> grads, std::span<ParamCopy> copy_out) {
        auto& buf = bufs_[b];
        const std::size_t c = subgroup_elements(s);
        const std::size_t off = s * cfg_.subgroup_size;
        auto f = buf.mem.template as<float>();
        const std::size_t m_at = master_in_caller() ? 0 : c;  // where m starts in the blob
        std::span<float> p = master_in_caller() ? opts_.master_params.subspan(off, c) : f.subspan(0, c);
        std::span<float> m = f.subspan(m_at, c), v = f.subspan(m_at + c, c);
        std::span<ParamCopy> out = copy_out.empty() ? std::span<ParamCopy>{} : copy_out.subspan(off, c);
        if (static_cast<const void*>(out.data()) == static_cast<const void*>(p.data())) out = {};  // in place
        std::optional<trace::scoped_event> ev;
        if (opts_.recorder && opts_.recorder->enabled())
            ev.emplace(opts_.recorder, tr_compute_, "adam " + std::to_string(s), "compute");
        auto t0 = clock::now();
        if (buf.version == target - 1) {
            step_result r;
            std::span<ParamCopy> adam_out = out;
            if constexpr (std::is_same_v<ParamCopy, float>) adam_out = {};
            // In chunks of about one piece, polling the I/O in between so that the windows
            // stay full while Adam runs (AdamW is elementwise: chunks give the same bits).
            const std::size_t chunk = std::max<std::size_t>(4096, cfg_.piece_bytes / (3 * sizeof(float)));
            for (std::size_t lo = 0; lo < c; lo += chunk) {
                const std::size_t k = std::min(chunk, c - lo);
                auto pc = p.subspan(lo, k), mc = m.subspan(lo, k), vc = v.subspan(lo, k);
                auto oc = adam_out.empty() ? adam_out : adam_out.subspan(lo, k);
                if (opts_.gradients == gradient_path::fp32_on_tier) {
                    std::span<const float> g = f.subspan(state_floats() * c + lo, k);
                    if constexpr (std::is_same_v<ParamCopy, float>)
                        r = adamw_step<float>(cfg_.adam, args, pc, mc, vc, g, std::span<float16>{}, opts_.pool);
                    else
                        r = adamw_step<float, ParamCopy>(cfg_.adam, args, pc, mc, vc, g, oc, opts_.pool);
                } else {
                    std::span<const Grad> g = grads.subspan(off + lo, k);
                    if constexpr (std::is_same_v<ParamCopy, float>)
                        r = adamw_step<Grad>(cfg_.adam, args, pc, mc, vc, g, std::span<float16>{}, opts_.pool);
                    else
                        r = adamw_step<Grad, ParamCopy>(cfg_.adam, args, pc, mc, vc, g, oc, opts_.pool);
                }
                (void)r;  // caller_verified: always applied
                poll_io();
            }
            buf.version = target;
            buf.dirty = true;
            if constexpr (std::is_same_v<ParamCopy, float>)
                if (!out.empty()) std::memcpy(out.data(), p.data(), c * sizeof(float));
        } else if (buf.version == target) {
            // A retried call: this subgroup was updated before the fault; only the copy.
            if (!out.empty()) {
                if constexpr (std::is_same_v<ParamCopy, float>) std::memcpy(out.data(), p.data(), c * sizeof(float));
                else narrow(std::span<const float>(p), out);
            }
        } else {
            throw std::logic_error("update_pipeline: subgroup " + std::to_string(s) + " holds step " +
                                   std::to_string(buf.version) + " while step " + std::to_string(target) +
                                   " is being applied");
        }
        stats_.compute_seconds += seconds_since(t0);
    }

    // Step 1: at most host_buffers - streaming_buffers resident subgroups; write out those visited last.
    void make_room() {
        const std::size_t bound = resident_capacity();
        auto order = next_order();
        std::size_t count = 0;
        for (auto r : resident_of_) count += r >= 0;
        for (std::size_t p = n_; p-- > 0 && count > bound;) {
            std::size_t s = order[p];
            if (resident_of_[s] < 0) continue;
            auto b = static_cast<std::size_t>(resident_of_[s]);
            if (bufs_[b].dirty) write_now(b);
            resident_of_[s] = -1;
            release(b);
            --count;
        }
    }

    // ---- Buffers and I/O ------------------------------------------------------------
    // Reads and writes of state blobs go through io_ (piece by piece, within the windows);
    // a buffer is `reading` or `writing` while its job there is active. Every call into io_
    // may finish writes; settle_writes() then commits them (step 6).

    // Completes the pieces that finished, tops the windows up and commits finished writes.
    void poll_io() {
        io_->poll();
        settle_writes();
    }

    void settle_writes() {
        for (std::size_t b = 0; b < bufs_.size(); ++b)
            if (bufs_[b].use == use_state::writing && io_->finished(b)) finish_write(b);
    }

    std::optional<std::size_t> find_free() {
        poll_io();
        for (std::size_t b = 0; b < bufs_.size(); ++b)
            if (bufs_[b].use == use_state::free) return b;
        return std::nullopt;
    }

    // A free buffer, waiting for the oldest piece in flight while none is (the wait is added
    // to *wait).
    std::size_t take_free_buffer(double* wait) {
        for (;;) {
            if (auto b = find_free()) return *b;
            if (std::none_of(bufs_.begin(), bufs_.end(), [](const buffer& x) { return x.use == use_state::writing; })) {
                rethrow_pending();
                throw std::logic_error("update_pipeline: no host buffer is free or being written");
            }
            auto t0 = clock::now();
            io_->wait_oldest();
            settle_writes();
            if (wait) *wait += seconds_since(t0);
            rethrow_pending();
        }
    }

    // A buffer for a one-off read (save, read_state): a free one, or any non-resident one
    // after the writes finish (only between calls).
    std::size_t scratch_buffer() {
        wait_all_writes(nullptr);
        rethrow_pending();
        if (auto b = find_free()) return *b;
        if (cancel_prefetch()) return scratch_buffer();
        // Every buffer is resident: write the last one out to borrow it.
        for (std::size_t b = bufs_.size(); b-- > 0;) {
            if (bufs_[b].use == use_state::resident) {
                if (bufs_[b].dirty) write_now(b);
                resident_of_[static_cast<std::size_t>(bufs_[b].sg)] = -1;
                release(b);
                return b;
            }
        }
        throw std::logic_error("update_pipeline: no buffer available");
    }

    void issue_read(std::size_t b, std::size_t s, bool with_grads = true) {
        auto& buf = bufs_[b];
        buf.sg = static_cast<std::ptrdiff_t>(s);
        buf.version = tier_version_[s];
        buf.dirty = false;
        buf.use = use_state::reading;
        buf.issued = clock::now();
        io_->start(b, io_direction::read, piece_keys_[s], buf.mem.bytes().first(blob_bytes(s)), cfg_.piece_bytes);
        if (with_grads && opts_.gradients == gradient_path::fp32_on_tier) issue_grad_read(b, s);
    }

    void issue_grad_read(std::size_t b, std::size_t s) {
        auto& buf = bufs_[b];
        const std::size_t c = subgroup_elements(s);
        if (buf.gop.valid()) return;
        buf.gop = tier_.read(grad_keys_[s], buf.mem.bytes().subspan(state_floats() * c * sizeof(float), c * sizeof(float)));
    }

    void wait_read(std::size_t b) {
        auto& buf = bufs_[b];
        auto s = static_cast<std::size_t>(buf.sg);
        auto t0 = clock::now();
        while (!io_->finished(b)) io_->wait_oldest();
        stats_.read_wait_seconds += seconds_since(t0);
        settle_writes();
        if (auto error = io_->take(b)) {
            buf.use = use_state::free;  // the tier still holds the subgroup
            buf.sg = -1;
            rethrow_named(error, s, "reading");
        }
        trace_io(tr_reads_, "read ", s, buf.issued, blob_bytes(s));
        buf.use = use_state::ready;
        ++stats_.subgroups_read;
        stats_.bytes_read += blob_bytes(s);
    }

    void wait_grad_read(std::size_t b, std::size_t s) {
        auto& buf = bufs_[b];
        if (!buf.gop.valid()) issue_grad_read(b, s);
        auto t0 = clock::now();
        try {
            buf.gop.wait();
        } catch (...) {
            stats_.read_wait_seconds += seconds_since(t0);
            if (!buf.dirty) release(b);
            else { buf.use = use_state::resident; resident_of_[s] = static_cast<std::ptrdiff_t>(b); }
            rethrow_named(std::current_exception(), s, "reading the fp32 gradients of");
        }
        stats_.read_wait_seconds += seconds_since(t0);
        stats_.bytes_read += sizeof(float) * subgroup_elements(s);
    }

    void issue_write(std::size_t b) {
        auto& buf = bufs_[b];
        auto s = static_cast<std::size_t>(buf.sg);
        buf.use = use_state::writing;
        buf.issued = clock::now();
        io_->start(b, io_direction::write, piece_keys_[s], buf.mem.bytes().first(blob_bytes(s)), cfg_.piece_bytes);
    }

    // Completes a finished write: success commits the step to the tier and frees the buffer;
    // failure keeps the buffer (its state is the newest) as resident and records the error.
    void finish_write(std::size_t b) {
        auto& buf = bufs_[b];
        auto s = static_cast<std::size_t>(buf.sg);
        if (auto error = io_->take(b)) {
            buf.use = use_state::resident;
            resident_of_[s] = static_cast<std::ptrdiff_t>(b);
            if (!pending_.error) {
                pending_.error = error;
                pending_.subgroup = s;
                pending_.what = "writing";
            }
            return;
        }
        trace_io(tr_writes_, "write ", s, buf.issued, blob_bytes(s));
        tier_version_[s] = buf.version;
        ++stats_.subgroups_written;
        stats_.bytes_written += blob_bytes(s);
        release(b);
    }

    void wait_all_writes(double* wait) {
        auto t0 = clock::now();
        for (;;) {
            settle_writes();
            if (std::none_of(bufs_.begin(), bufs_.end(), [](const buffer& x) { return x.use == use_state::writing; }))
                break;
            io_->wait_oldest();
        }
        if (wait) *wait += seconds_since(t0);
    }

    // Moves subgroup s's whole blob at once, outside the windows (make_room, flush, save,
    // read_state: between calls), and throws the first error, naming the subgroup.
    void transfer_now(io_direction dir, std::size_t s, std::span<std::byte> bytes) {
        std::vector<io_completion> ops;
        std::exception_ptr error;
        for (std::size_t j = 0; j < piece_keys_[s].size(); ++j) {
            const std::size_t begin = j * cfg_.piece_bytes;
            auto piece = bytes.subspan(begin, std::min(cfg_.piece_bytes, bytes.size() - begin));
            try {
                if (dir == io_direction::read) ops.push_back(tier_.read(piece_keys_[s][j], piece));
                else ops.push_back(tier_.write(piece_keys_[s][j], std::span<const std::byte>(piece)));
            } catch (...) {
                error = std::current_exception();
                break;
            }
        }
        for (auto& op : ops) {
            try {
                op.wait();
            } catch (...) {
                if (!error) error = std::current_exception();
            }
        }
        if (error) rethrow_named(error, s, dir == io_direction::read ? "reading" : "writing");
    }

    // Synchronous write of a resident buffer (make_room, flush, scratch): throws on failure,
    // the buffer stays resident and dirty.
    void write_now(std::size_t b) {
        auto& buf = bufs_[b];
        auto s = static_cast<std::size_t>(buf.sg);
        transfer_now(io_direction::write, s, buf.mem.bytes().first(blob_bytes(s)));
        tier_version_[s] = buf.version;
        buf.dirty = false;
    }

    void read_now(std::size_t s, std::span<std::byte> out) { transfer_now(io_direction::read, s, out); }

    // Issues reads (registered with io_, within its windows) of the first subgroups the next
    // update() visits that are neither resident nor prefetched, into free buffers (one kept
    // free for the fp32 hand-over); returns how many it started.
    std::size_t prefetch_reads(std::size_t max_subgroups) {
        std::size_t free = 0;
        for (auto& b : bufs_) free += b.use == use_state::free;
        if (opts_.gradients == gradient_path::fp32_on_tier && free > 0) --free;
        std::size_t started = 0;
        const auto order = next_order();
        for (std::size_t p = 0; p < n_ && started < std::min(free, max_subgroups); ++p) {
            const std::size_t s = order[p];
            if (resident_of_[s] >= 0 || prefetch_of_[s] >= 0) continue;
            auto b = find_free();
            if (!b) break;
            issue_read(*b, s, /*with_grads=*/false);
            prefetch_of_[s] = static_cast<std::ptrdiff_t>(*b);
            ++started;
        }
        return started;
    }

    // Takes back the buffers of begin_prefetch(): waits for their reads and frees them.
    // Returns whether there were any.
    bool cancel_prefetch() noexcept {
        bool any = false;
        for (auto& b : prefetch_of_) {
            if (b < 0) continue;
            const auto pb = static_cast<std::size_t>(b);
            io_->drain();
            (void)io_->take(pb);  // the tier still holds the subgroup
            release(pb);
            b = -1;
            any = true;
        }
        own_prefetches_ = 0;
        return any;
    }

    void release(std::size_t b) {
        auto& buf = bufs_[b];
        buf.use = use_state::free;
        buf.sg = -1;
        buf.dirty = false;
    }

    // Step 7's error path: settle every buffer so that no newest state is dropped.
    void recover() noexcept {
        io_->drain();  // every piece issued and completed: each job is finished
        for (std::size_t b = 0; b < bufs_.size(); ++b) {
            auto& buf = bufs_[b];
            if (buf.use == use_state::writing) finish_write(b);  // success frees, failure keeps it resident
            else if (io_->active(b)) (void)io_->take(b);         // a read: the tier still holds it
            drain_op(buf.gop);
            if (buf.use == use_state::resident) continue;
            if (buf.use == use_state::free) continue;
            // reading or ready (or a resident taken for compute): keep it only if newer.
            if (buf.dirty && buf.sg >= 0) {
                buf.use = use_state::resident;
                resident_of_[static_cast<std::size_t>(buf.sg)] = static_cast<std::ptrdiff_t>(b);
            } else {
                release(b);
            }
        }
        pending_ = call_error{};
    }

    void rethrow_pending() {
        if (pending_.error) {
            auto e = pending_;
            pending_ = call_error{};
            rethrow_named(e.error, e.subgroup, e.what);
        }
    }

    [[noreturn]] void rethrow_named(std::exception_ptr error, std::size_t s, const char* what) {
        std::string prefix = "update_pipeline: " + std::string(what) + " subgroup " + std::to_string(s) + " (key " +
                             spillway::quoted(keys_[s]) + ") on tier '" + std::string(tier_.name()) + "' failed";
        try {
            std::rethrow_exception(error);
        } catch (const std::system_error& e) {
            throw spillway::with_context(e, prefix);
        } catch (const std::exception& e) {
            throw std::runtime_error(prefix + ": " + e.what());
        }
    }

    void write_fp32_grads(std::span<const Grad> grads) {
        // Pipelined over the free buffers (resident ones keep their state): widen into a
        // buffer's gradient section, issue the write, reuse the oldest when none is free.
        std::vector<io_completion> ops(bufs_.size());
        std::vector<std::ptrdiff_t> holder(bufs_.size(), -1);
        std::vector<std::size_t> usable;
        if (std::none_of(bufs_.begin(), bufs_.end(), [](const buffer& b) { return b.use == use_state::free; }))
            cancel_prefetch();
        for (std::size_t b = 0; b < bufs_.size(); ++b)
            if (bufs_[b].use == use_state::free) usable.push_back(b);
        if (usable.empty()) throw std::logic_error("update_pipeline: no free buffer for the gradient hand-over");
        auto settle = [&](std::size_t b) {
            if (!ops[b].valid()) return;
            auto s = static_cast<std::size_t>(holder[b]);
            try {
                ops[b].wait();
            } catch (...) {
                for (auto& o : ops) drain_op(o);
                rethrow_named(std::current_exception(), s, "handing over the fp32 gradients of");
            }
            handover_.bytes += sizeof(float) * subgroup_elements(s);
        };
        for (std::size_t s = 0; s < n_; ++s) {
            std::size_t b = usable[s % usable.size()];
            settle(b);  // the write issued len(usable) subgroups ago
            const std::size_t c = subgroup_elements(s);
            auto g = grads.subspan(s * cfg_.subgroup_size, c);
            auto f = bufs_[b].mem.template as<float>().subspan(state_floats() * c, c);
            if constexpr (std::is_same_v<Grad, float>) std::memcpy(f.data(), g.data(), c * sizeof(float));
            else widen(g, f);
            holder[b] = static_cast<std::ptrdiff_t>(s);
            ops[b] = tier_.write(grad_keys_[s], std::as_bytes(std::span<const float>(f)));
        }
        for (std::size_t b : usable) settle(b);
    }

    static void drain_op(io_completion& o) noexcept {
        try {
            if (o.valid()) o.wait();
        } catch (...) {
        }
    }

    void check_copy_size(std::span<const ParamCopy> copy_out) const {
        expect_argument(copy_out.empty() || copy_out.size() == cfg_.param_count,
                        "update_pipeline::update: copy_out has " + std::to_string(copy_out.size()) +
                            " elements, expected param_count " + std::to_string(cfg_.param_count) + " (or none)");
        expect_argument(!master_in_caller() || copy_out.empty() ||
                            static_cast<const void*>(copy_out.data()) == static_cast<const void*>(opts_.master_params.data()),
                        "update_pipeline::update: copy_out is not master_params; with master_params the update "
                        "writes the params in place (pass master_params or nothing)");
    }

    // Floats per parameter in a state blob: params, m, v; or m, v with master_params.
    [[nodiscard]] std::size_t state_floats() const noexcept { return master_in_caller() ? 2 : 3; }
    // Bytes of subgroup s in a save (params, m, v, whatever the mode).
    [[nodiscard]] std::size_t saved_blob_bytes(std::size_t s) const noexcept { return 3 * sizeof(float) * subgroup_elements(s); }

    static void check_grad_scale(float grad_scale) {
        expect_argument(detail::usable_grad_scale(grad_scale), "update_pipeline: grad_scale " +
                                                                   std::string(detail::grad_scale_rule) + ", got " +
                                                                   detail::format_value(grad_scale));
    }

    // `poll`: top the I/O windows up between subgroups (reads started before the check).
    double sum_squares(std::span<const Grad> grads, float grad_scale, bool poll = false) {
        check_grad_scale(grad_scale);
        // Per subgroup, summed in subgroup order: the same total whatever the tier or order.
        double total = 0;
        for (std::size_t s = 0; s < n_; ++s) {
            total += grad_sum_squares<Grad>(grads.subspan(s * cfg_.subgroup_size, subgroup_elements(s)), grad_scale,
                                            opts_.pool);
            if (poll) poll_io();
        }
        return total;
    }

    void check_grads_size(std::span<const Grad> grads) const {
        expect_argument(grads.size() == cfg_.param_count, "update_pipeline: grads has " + std::to_string(grads.size()) +
                                                              " elements, expected param_count " +
                                                              std::to_string(cfg_.param_count));
    }

    std::int64_t version_of(std::size_t s) const {
        return resident_of_[s] >= 0 ? bufs_[static_cast<std::size_t>(resident_of_[s])].version : tier_version_[s];
    }

    // Waits for every transfer in flight: the tier's contract forbids erasing a key with an
    // operation in flight (a write finishing later would bring the key back).
    void quiesce_io() noexcept {
        if (io_) io_->drain();
        for (auto& b : bufs_) drain_op(b.gop);
    }

    void erase_all() noexcept {
        auto erase = [&](const std::string& k) {
            try {
                tier_.erase(k);
            } catch (...) {
            }
        };
        for (const auto& pieces : piece_keys_)
            for (const auto& k : pieces) erase(k);
        for (const auto& k : grad_keys_) erase(k);
    }

    void trace_io(trace::track_id track, const char* what, std::size_t s, clock::time_point begin, std::size_t nbytes) {
        if (!opts_.recorder || !opts_.recorder->enabled()) return;
        opts_.recorder->complete(track, what + std::to_string(s), begin, clock::now(), "io",
                                 {{"bytes", static_cast<double>(nbytes)}});
    }

    static child_io io_of(std::string name, const tier_stats& st) {
        child_io io;
        io.name = std::move(name);
        io.bytes_read = st.bytes_read;
        io.bytes_written = st.bytes_written;
        io.read_busy_seconds = st.read_busy_seconds;
        io.write_busy_seconds = st.write_busy_seconds;
        return io;
    }
    std::vector<child_io> child_snapshot() const {
        std::vector<child_io> out;
        if constexpr (tier_with_children<Tier>) {
            for (const auto& c : tier_.report()) out.push_back(io_of(std::string(c.name), c.moved));
        } else {
            out.push_back(io_of(std::string(tier_.name()), tier_.stats()));
        }
        return out;
    }
    void fill_children(const std::vector<child_io>& before) {
        auto after = child_snapshot();
        for (std::size_t i = 0; i < after.size() && i < before.size(); ++i) {
            after[i].bytes_read -= before[i].bytes_read;
            after[i].bytes_written -= before[i].bytes_written;
            after[i].read_busy_seconds -= before[i].read_busy_seconds;
            after[i].write_busy_seconds -= before[i].write_busy_seconds;
        }
        stats_.children = std::move(after);
    }

    static std::string file_name(std::size_t s) {
        char buf[48];  // "subgroup-" + up to 20 digits + ".bin" + NUL
        std::snprintf(buf, sizeof buf, "subgroup-%06zu.bin", s);
        return buf;
    }
    static double seconds_since(clock::time_point t0) {
        return std::chrono::duration<double>(clock::now() - t0).count();
    }

    Tier& tier_;
    pipeline_config cfg_;
    pipeline_options opts_;
    std::size_t n_ = 0;
    std::vector<std::string> keys_;                      // first piece of each subgroup
    std::vector<std::vector<std::string>> piece_keys_;   // every piece of each subgroup
    std::vector<std::string> grad_keys_;
    std::vector<buffer> bufs_;
    std::unique_ptr<detail::piece_io<Tier>> io_;         // after bufs_: destroyed (drained) first
    std::vector<std::int64_t> tier_version_;    // step held on the tier, per subgroup
    std::vector<std::ptrdiff_t> resident_of_;   // buffer holding the subgroup between calls, or -1
    std::vector<std::ptrdiff_t> prefetch_of_;   // buffer begin_prefetch() reads the subgroup into, or -1
    std::size_t own_prefetches_ = 0;            // of those, reads update() started before its gradient check
    std::int64_t steps_ = 0;
    std::uint64_t iteration_ = 0;                // successful update calls (the order's parity)
    handover_state handover_;
    update_stats stats_;
    call_error pending_;
    trace::track_id tr_reads_ = 0, tr_compute_ = 0, tr_writes_ = 0;
};

}  // namespace spillway
