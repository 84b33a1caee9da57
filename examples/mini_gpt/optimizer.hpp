// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/optimizer.hpp: the AdamW back ends behind --offload, and the offloading
// activation store.
//
// Both optimizer back ends apply Spillway's AdamW element formula (optim/adam_formula.hpp),
// which gives the same bits whatever the SIMD path, the thread split or the subgroup
// boundaries; so the in-memory optimizer and the update pipeline over storage tiers produce
// bit-identical parameters from the same gradients.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "gpt2.hpp"
#include "spillway/human_bytes.hpp"
#include "spillway/optim/half.hpp"
#include "spillway/optim/step_hparams.hpp"
#include "spillway/optim/update_pipeline.hpp"
#include "spillway/trace/recorder.hpp"

namespace mini_gpt {

enum class grad_dtype { fp32, bf16, fp16 };

/// "fp32", "bf16" or "fp16" (the --grad-dtype spelling); "?" for a value outside the enum.
const char* dtype_name(grad_dtype d) noexcept;

/// A byte count for people: "512 B", "1.5 MiB", "3.2 GiB" (powers of 1024, one decimal).
using spillway::human_bytes;

/// The gradients of one step in the --grad-dtype chosen, kept in host memory.
using grad_span = std::variant<std::span<const float>, std::span<const spillway::bfloat16>,
                               std::span<const spillway::float16>>;

/// AdamW's settings from the flags; lr and weight_decay are the defaults a step's
/// spillway::step_hparams replaces (the schedule's values).
struct adam_hparams {
    float lr = 1e-4f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
};

struct optimizer_settings {
    adam_hparams adam;
    std::size_t subgroup = 1 << 16;            // parameters per subgroup
    int buffers = 4;                           // host buffers of the update pipeline
    std::vector<std::filesystem::path> paths;  // storage paths (offloaded back end)
    std::filesystem::path
        lock_directory;  // node_lock files; empty: the library's default (/dev/shm)
    grad_dtype grads = grad_dtype::fp32;
    /// The offloaded back end's visiting order: alternating (MLP-Offload's; the default) or
    /// ascending every step (then every update, not every other, can run under the next
    /// forward; the resident set is the top subgroups, served at the end of each walk).
    spillway::subgroup_order order = spillway::subgroup_order::alternating;
    spillway::thread_pool* pool = nullptr;          // the Adam step's threads
    spillway::trace::recorder* recorder = nullptr;  // --trace (may be null)
    std::string key_prefix = "optim";               // distinct per process on shared paths
};

class optimizer {
public:
    virtual ~optimizer() = default;
    /// Starts from `params` with zero moments. `params` are this process's fp32 params (the
    /// same memory every step() gets): a back end may keep them as its master copy.
    virtual void init(std::span<float> params) = 0;
    /// Restores the state saved by save() into `dir`; `params` (as for init) hold the
    /// checkpoint's params, and a back end that saved its own copy puts it there.
    virtual void load(const std::filesystem::path& dir, std::span<float> params) = 0;
    /// The overflow check that comes before step(): the sum of squares of `grads` (each
    /// divided by grad_scale), in double; +inf or NaN when a gradient is inf or NaN. It reads
    /// every gradient once, before any subgroup is updated, so a skipped step changes
    /// nothing; step() with the same span and scale does not read them for the check again.
    virtual double check(float grad_scale, const grad_span& grads) = 0;
    /// AdamW step t (1-based) with this step's lr and weight decay `h` (the schedule's) and
    /// gradients scaled by grad_scale; writes the updated params.
    virtual void step(std::int64_t t, const spillway::step_hparams& h, float grad_scale,
                      const grad_span& grads, std::span<float> params) = 0;
    /// Starts reading the state the next step() needs, so that the reads overlap the forward
    /// and backward passes that come first (they need no gradients). Results do not change.
    virtual void prefetch() {}
    /// Whether the next step() updates the parameters from the first to the last, announcing
    /// its progress through the callback given to on_progress(): then the trainer may run that
    /// step on a thread of its own and start the next forward at once, each layer waiting
    /// only until its parameters are updated (the offloaded back end on its ascending
    /// iterations; the alternating order makes every other one ascending).
    [[nodiscard]] virtual bool next_step_ascending() const { return false; }
    /// The callback a step whose next_step_ascending() was true calls, on the thread that
    /// runs it, each time more parameters are final: `done` params from the start of the
    /// span step() got hold the new values and will not change again in that step.
    virtual void on_progress(std::function<void(std::size_t done)> callback) { (void)callback; }
    /// Whether the next step() could instead run under backward (step_under_backward): the
    /// offloaded back end on its descending walks, which visit the parameters from the last
    /// (whose gradients backward finishes first) to the first.
    [[nodiscard]] virtual bool next_step_under_backward() const { return false; }
    /// AdamW step t with fp32 gradients (unscaled) that backward is still computing, run on
    /// a thread of the trainer's while backward runs on another: before it reads the
    /// gradients of params [begin, end) it asks `gate` (spillway::update_args::gradients_final)
    /// until they are final. It checks each subgroup's gradients as it takes them, so it
    /// cannot skip an overflow: an inf or NaN gradient throws spillway::gradient_overflow_error
    /// with part of the parameters updated. Only when next_step_under_backward().
    virtual void step_under_backward(std::int64_t t, const spillway::step_hparams& h,
                                     std::span<const float> grads, std::span<float> params,
                                     spillway::gradient_gate gate) {
        (void)t, (void)h, (void)grads, (void)params, (void)gate;
        throw std::logic_error("optimizer: this back end cannot step under backward");
    }
    /// Saves the moments (and whatever else it needs) into `dir` (files fsynced).
    virtual void save(const std::filesystem::path& dir) = 0;
    /// Milliseconds the last step waited on storage.
    [[nodiscard]] virtual double last_io_wait_ms() const { return 0; }
    /// Lines for the summary table.
    [[nodiscard]] virtual std::string report() const { return {}; }
};

/// m and v in host memory.
std::unique_ptr<optimizer> make_memory_optimizer(const optimizer_settings& s, std::size_t count);

/// m and v on a virtual tier over the settings' paths (node_lock), driven by the update
/// pipeline: alternating order, a resident set, lazy widening of the gradients. The fp32
/// master params are the trainer's own (pipeline_options::master_params): the model computes
/// in fp32, so the params need no second copy on the tier and each step moves 8 bytes per
/// parameter each way instead of 12.
std::unique_ptr<optimizer> make_offloaded_optimizer(const optimizer_settings& s, std::size_t count);

/// Layer blocks from a pool; finished blocks go to Spillway's activation stash over a file
/// tier under paths[0] and come back in reverse order for backward.
struct store_settings {
    std::filesystem::path path;                     // where the activation files go
    std::string key_prefix = "act";                 // distinct per process on shared paths
    spillway::trace::recorder* recorder = nullptr;  // --trace (may be null)
    int first_kept_layer = -1;  // -1: adaptive (TBA's rule); >= L: offload every layer; else fixed
    std::size_t memory_budget =
        0;  // most bytes the stash holds at once; 0: the least it needs (about one layer)
    bool recompute = true;  // ln1, ln2, att, atty and fch_gelu are recomputed in backward, not
                            // stored (layer_acts::recompute)
    // The stash's writer and reader threads each. Each thread has one tensor in flight and a
    // layer's tensors are small (one or two 1 MiB pieces at the default config), so two
    // threads keep a queue of several requests at the device.
    std::size_t io_threads = 2;
    // Tensors under 2 MiB come from huge-page slabs shared by many tensors when a layer's
    // buffers fill at least two slabs (below that the slabs' slack would lift the peak more
    // than the speed is worth).
    bool huge_page_arena = true;
};
std::unique_ptr<activation_store> make_offloading_store(const gpt2_config& config, int B, int T,
                                                        const store_settings& settings);

/// Reads/writes the moments file shared by the back ends: magic, count, m, v.
void write_moments(const std::filesystem::path& path, std::span<const float> m,
                   std::span<const float> v);
void read_moments(const std::filesystem::path& path, std::span<float> m, std::span<float> v);

}  // namespace mini_gpt
