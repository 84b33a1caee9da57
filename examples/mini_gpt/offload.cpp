// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/offload.cpp: the two offloading back ends, assembled from Spillway's
// primitives the way a trainer would use them.
//
// Optimizer (--offload optimizer|all): m and v live on a virtual tier over one file tier
// per --path (a directory "mini_gpt-optimizer" under each), with node_lock so that the ranks
// of one node take turns on each path; the update pipeline runs AdamW over subgroups in
// alternating order with a resident set, widening the fp16/bf16 gradients lazily. The model
// computes in fp32, so its parameters are the master copy (pipeline_options::master_params):
// the pipeline updates them in place and the tier holds no second copy (8 bytes per
// parameter each way per step instead of 12).
//
// Activations (--offload activations|all): a spillway::layer_stash declares a layer's
// tensors once (layer_acts' names and sizes) over an activation stash on a file tier under
// the first --path. Each layer is computed into buffers from the stash's pool, handed over
// once the next layer has read them (no copy; the buffer of the layer written before comes
// back for the next layer to compute into), written while compute goes on, and loaded back
// in reverse order for backward. The tensors are saved the way a framework's ops save them,
// so the attention probabilities are saved twice (by the softmax, as its output, and by the
// att @ v product, as its input) and the stash stores them once (dedup). Small tensors
// (LayerNorm statistics) are kept. What is cheaper to compute again than to move is not
// stored at all (store_settings::recompute, --act-recompute): the two LayerNorm outputs, the
// GELU output and the attention's probabilities and output (7 of a layer's 16 (B,T,C) floats
// per position, and NH x T more) are recomputed in backward (layer_saved::recompute) into
// buffers that wait for the next step's forward anyway. Tensors under 2 MiB live on
// huge-page slabs shared by many tensors (stash_options::huge_page_arena) when a layer is
// large enough for the slabs to fill.
#include <algorithm>
#include <functional>
#include <optional>
#include <sstream>
#include <system_error>
#include <tuple>
#include <utility>
#include <unistd.h>

#include "llmc_format.hpp"
#include "memory_plan.hpp"
#include "optimizer.hpp"
#include "spillway/lock/node_lock.hpp"
#include "spillway/optim/update_pipeline.hpp"
#include "spillway/stash/activation_stash.hpp"
#include "spillway/stash/layer_stash.hpp"
#include "spillway/stash/stash_budget.hpp"
#include "spillway/tier/file_tier.hpp"
#include "spillway/tier/path_folders.hpp"
#include "spillway/tier/virtual_tier.hpp"

namespace mini_gpt {

namespace {

/// This process's folder on each of `paths` under `subdir` (spillway::path_folders): what a
/// killed or aborted rank left there (its optimizer state or activations: MPI_Abort runs no
/// destructor) is removed by the next run that uses the directory; the folders of processes
/// still running are left alone. Errors become input_error naming the path.
spillway::path_folders process_folders(std::span<const std::filesystem::path> paths,
                                       const char* subdir) {
    try {
        return spillway::path_folders::create(paths, subdir, "mini_gpt-");
    } catch (const std::system_error& e) {
        throw input_error(std::string("cannot create this process's folder for ") + subdir + ": " +
                          e.what());
    }
}

// ---- The offloaded optimizer ------------------------------------------------------------------

using optimizer_tier =
    spillway::virtual_tier<spillway::node_lock, std::vector<spillway::file_tier<>>>;

template <class Grad>
class offloaded_optimizer final : public optimizer {
    using pipeline = spillway::update_pipeline<optimizer_tier, Grad, float>;

public:
    offloaded_optimizer(const optimizer_settings& s, std::size_t count) : s_(s), count_(count) {
        // 1. This process's folder on each path; processes of a node that share a path share
        //    its locks, so the lock name is derived from the directory, not from the process.
        folders_.emplace(process_folders(s.paths, "mini_gpt-optimizer"));
        spillway::virtual_tier_options vo;
        vo.name = "optimizer";
        vo.locks.directory = s.lock_directory;
        vo.lock_names = folders_->lock_names();
        // 2. The virtual tier: one file tier per path, in this process's folder there, named
        //    by its --path (the summary reports each path on its own line), placement by
        //    measured bandwidth.
        const auto children = folders_->file_tier_args();
        try {
            tier_ = std::make_unique<optimizer_tier>(vo, children);
        } catch (const std::system_error& e) {
            throw input_error(std::string("--path: cannot use the optimizer paths: ") + e.what());
        }
    }
    ~offloaded_optimizer() override {
        pipe_.reset();  // erases its blobs
        tier_.reset();
        folders_.reset();  // (this process's folders, and the roots left empty)
    }

    void init(std::span<float> params) override {
        pipe_ = std::make_unique<pipeline>(*tier_, config(), params, options(params));
    }
    void load(const std::filesystem::path& dir, std::span<float> params) override {
        auto saved = dir / "optimizer";
        std::error_code ec;
        if (!std::filesystem::exists(std::filesystem::symlink_status(saved, ec)))
            throw input_error(
                saved.string() + ": missing (" +
                (std::filesystem::exists(std::filesystem::symlink_status(dir / "moments.bin", ec))
                     ? "this save was made with --offload none|activations; resume with the "
                       "same mode)"
                     : "the save has no optimizer state for this rank)"));
        // The folder is there and its manifest is not: an incomplete or damaged save, not
        // another mode's (restore() names a manifest that is there but unreadable).
        if (!std::filesystem::exists(std::filesystem::symlink_status(saved / "manifest.txt", ec)))
            throw input_error((saved / "manifest.txt").string() +
                              ": missing (the optimizer's manifest; its subgroup files cannot "
                              "be checked or restored without it)");
        try {
            pipe_.reset(new pipeline(pipeline::restore(saved, *tier_, config(), options(params))));
        } catch (const std::invalid_argument& e) {
            throw input_error(saved.string() + ": " + e.what());
        } catch (const std::runtime_error& e) {
            throw input_error(saved.string() + ": " + e.what());
        }
    }
    double check(float grad_scale, const grad_span& grads) override {
        // The pipeline's own gradient check: the update() that follows with the same span and
        // scale uses its result instead of reading the gradients again.
        spillway::update_args args;
        args.grad_scale = grad_scale;
        return pipe_->hand_over_gradients(std::get<std::span<const Grad>>(grads), args);
    }
    void step(std::int64_t t, const spillway::step_hparams& h, float grad_scale,
              const grad_span& grads, std::span<float> params) override {
        spillway::update_args args;
        args.grad_scale = grad_scale;
        args.hparams = h;
        run_step(t, std::get<std::span<const Grad>>(grads), params, args);
    }
    [[nodiscard]] bool next_step_under_backward() const override {
        return std::is_same_v<Grad, float> &&
               pipe_->next_order().walk() == spillway::direction::descending;
    }
    void step_under_backward(std::int64_t t, const spillway::step_hparams& h,
                             std::span<const float> grads, std::span<float> params,
                             spillway::gradient_gate gate) override {
        if constexpr (std::is_same_v<Grad, float>) {
            if (!next_step_under_backward())
                throw std::logic_error("offloaded optimizer: step " + std::to_string(t) +
                                       " walks upwards: not under backward");
            spillway::update_args args;
            args.gradients_final = std::move(gate);
            args.hparams = h;
            run_step(t, grads, params, args);
        } else {
            optimizer::step_under_backward(t, h, grads, params, std::move(gate));
        }
    }
    void run_step(std::int64_t t, std::span<const Grad> grads, std::span<float> params,
                  const spillway::update_args& args) {
        if (pipe_->steps() + 1 != t)
            throw std::logic_error("offloaded optimizer: step " + std::to_string(t) +
                                   " but the pipeline is at step " +
                                   std::to_string(pipe_->steps()));
        next_order_was_ascending_ = next_step_ascending();
        pipe_->update(grads, params, args);
        const auto& st = pipe_->last_stats();
        last_wait_ms_ = (st.read_wait_seconds + st.write_wait_seconds) * 1e3;
        ++calls_;
        update_seconds_ += st.seconds;
        read_ += st.bytes_read;
        written_ += st.bytes_written;
        resident_hits_ += st.served_from_resident;
        prefetch_hits_ += st.served_from_prefetch;
        subgroups_ += pipe_->subgroup_count();
        for (const auto& c : st.children) {
            auto it = std::find_if(children_.begin(), children_.end(),
                                   [&](const auto& x) { return x.name == c.name; });
            if (it == children_.end())
                children_.push_back(c);
            else {
                it->bytes_read += c.bytes_read;
                it->bytes_written += c.bytes_written;
                it->read_busy_seconds += c.read_busy_seconds;
                it->write_busy_seconds += c.write_busy_seconds;
            }
        }
    }
    void prefetch() override { prefetched_ += pipe_->begin_prefetch(); }
    [[nodiscard]] bool next_step_ascending() const override {
        return pipe_->next_order().walk() == spillway::direction::ascending;
    }
    void on_progress(std::function<void(std::size_t)> callback) override {
        progress_ = std::move(callback);
    }
    void save(const std::filesystem::path& dir) override { pipe_->save(dir / "optimizer"); }
    [[nodiscard]] double last_io_wait_ms() const override { return last_wait_ms_; }
    [[nodiscard]] std::string report() const override {
        std::ostringstream o;
        o << "  optimizer       update pipeline over " << folders_->size() << " path(s), "
          << pipe_->subgroup_count() << " subgroups of " << s_.subgroup << " params, " << s_.buffers
          << " host buffers\n";
        o << "                  read " << human_bytes(static_cast<double>(read_)) << ", wrote "
          << human_bytes(static_cast<double>(written_)) << "; of " << subgroups_
          << " subgroup visits " << resident_hits_ << " were served from the resident set and "
          << prefetch_hits_ << " by the " << prefetched_
          << " reads started during forward and backward\n";
        // Bytes from the tier's own counters (the update calls' and the reads begun during
        // forward and backward); the busy share from the update calls alone.
        for (const auto& c : tier_->report()) {
            const std::string name(c.name);
            auto during_updates = std::find_if(children_.begin(), children_.end(),
                                               [&](const auto& x) { return x.name == name; });
            o << "                  tier " << name << ": read "
              << human_bytes(static_cast<double>(c.moved.bytes_read)) << ", wrote "
              << human_bytes(static_cast<double>(c.moved.bytes_written)) << "; busy "
              << (during_updates == children_.end()
                      ? 0
                      : static_cast<int>(100 * during_updates->busy_fraction(update_seconds_) +
                                         0.5))
              << "% of the update time\n";
        }
        return o.str();
    }

private:
    spillway::pipeline_config config() const {
        spillway::pipeline_config c;
        c.param_count = count_;
        c.subgroup_size = std::min(s_.subgroup, count_);
        c.host_buffers = static_cast<std::size_t>(s_.buffers);
        c.adam = {s_.adam.lr, s_.adam.beta1, s_.adam.beta2, s_.adam.eps, s_.adam.weight_decay};
        return c;
    }
    // `params`: the trainer's fp32 params of this process, the master copy (the tier then
    // holds only m and v).
    spillway::pipeline_options options(std::span<float> params) const {
        spillway::pipeline_options o;
        o.master_params = params;
        o.order = s_.order;
        o.key_prefix = s_.key_prefix;
        o.pool = s_.pool;
        o.recorder = s_.recorder;
        // An ascending call finishes subgroup s after every one before it: params [0, end of
        // s) are final (next_step_ascending, on_progress).
        o.on_subgroup_updated = [this](std::size_t s) {
            if (progress_ && next_order_was_ascending_)
                progress_(std::min(count_, (s + 1) * s_.subgroup));
        };
        return o;
    }

    optimizer_settings s_;
    std::size_t count_;
    std::optional<spillway::path_folders> folders_;  // <path>/mini_gpt-optimizer/proc-*
    std::unique_ptr<optimizer_tier> tier_;
    std::unique_ptr<pipeline> pipe_;
    double last_wait_ms_ = 0;
    std::uint64_t calls_ = 0, read_ = 0, written_ = 0, resident_hits_ = 0, subgroups_ = 0;
    double update_seconds_ = 0;  // summed over update() calls: the base of each path's busy share
    std::uint64_t prefetched_ = 0,
                  prefetch_hits_ = 0;  // reads begin_prefetch() started; visits they served
    std::vector<spillway::child_io> children_;
    std::function<void(std::size_t)> progress_;  // on_progress()
    bool next_order_was_ascending_ = false;      // the running step walks upwards
};

// ---- The offloading activation store ----------------------------------------------------------

/// The activation stash as stash_store configures it: the layer's tensors (layer_acts' names
/// and sizes), how it uses them, and the stash's options.
struct stash_setup {
    std::vector<spillway::layer_tensor> tensors;
    spillway::layer_stash_use use;
    spillway::stash_options options;
};

stash_setup setup_stash(const gpt2_config& c, int B, int T, const store_settings& s) {
    stash_setup r;
    const auto sizes = layer_acts::tensor_floats(c, B, T);
    for (int i = 0; i < layer_acts::num_tensors; ++i) {
        const std::string name = layer_acts::names[static_cast<std::size_t>(i)];
        r.tensors.push_back({name, sizes[static_cast<std::size_t>(i)]});
        if (s.recompute && layer_acts::recomputable(i)) r.use.recomputed.push_back(name);
    }
    // A layer's input is the previous layer's output, saved in this layer's scope (ln1's
    // backward reads it).
    r.use.carried.push_back(layer_acts::names[layer_acts::residual3_i]);
    spillway::stash_options& o = r.options;
    o.keep_below_bytes = 64 << 10;  // LayerNorm statistics stay; everything else may go
    // The budget is what makes offloading lower the peak whatever the disk's speed: a save
    // that finds it full waits for writes. Default: the stash's smallest (the largest layer
    // scope backward loads at once, the last layer's, plus every layer's kept statistics;
    // spillway::smallest_stash_budget), exactly, so that any batch fits. Forward then holds
    // at most two layers (the one it computes and the one being written); backward gives
    // each tensor back after its last use (done_with), and the room it frees is where layer
    // l-1 is prefetched.
    const std::size_t least = spillway::smallest_stash_budget(
        r.tensors, static_cast<std::size_t>(c.num_layers), r.use, o);
    if (s.memory_budget > 0 && s.memory_budget < least)
        throw input_error("--act-budget: " + human_bytes(static_cast<double>(s.memory_budget)) +
                          " is below the " + human_bytes(static_cast<double>(least)) +
                          " the last layer's backward loads at once (its input, tensors and "
                          "output, with every layer's LayerNorm statistics) at this batch and "
                          "sequence length");
    o.memory_budget = s.memory_budget > 0 ? s.memory_budget : least;
    if (s.first_kept_layer < 0) {
        o.split = spillway::split_mode::adaptive;
    } else if (s.first_kept_layer >= c.num_layers) {
        o.split = spillway::split_mode::offload_all;
    } else {
        o.split = spillway::split_mode::fixed;
        o.first_kept_layer = static_cast<std::size_t>(s.first_kept_layer);
    }
    // Tensors under 2 MiB from huge-page slabs (stash_options::huge_page_arena) once a layer
    // fills two slabs: below that the slabs' slack (free pieces, about a slab, which counts
    // in the peak) would lift the peak more than the faster transfers are worth.
    const std::size_t layer_bytes = spillway::layer_buffer_bytes(r.tensors);
    o.huge_page_arena = s.huge_page_arena && layer_bytes >= 2 * spillway::huge_page_bytes;
    o.prefetch_layers = 1;
    o.write_threads = o.read_threads = s.io_threads;
    o.pool_limit = layer_bytes;  // one layer of free buffers for the next layer to reuse
    o.key_prefix = s.key_prefix;
    return r;
}

class stash_store final : public activation_store {
    using tier_type = spillway::file_tier<>;
    using ti = layer_acts::tensor_index;
    static const char* name(int i) { return layer_acts::names[static_cast<std::size_t>(i)]; }
    static std::size_t at(int layer) { return static_cast<std::size_t>(layer); }

public:
    stash_store(const gpt2_config& c, int B, int T, const store_settings& s)
        : config_(c),
          dir_(s.path / "mini_gpt-activations"),
          recorder_(s.recorder),
          recompute_(s.recompute) {
        folder_.emplace(process_folders(std::span(&s.path, 1), "mini_gpt-activations"));
        try {
            tier_ = std::make_unique<tier_type>(folder_->folder(0));
        } catch (const std::system_error& e) {
            throw input_error(dir_.string() + ": cannot use it for activations: " + e.what());
        }
        stash_setup setup = setup_stash(c, B, T, s);
        // The stash's warning (it offloaded nothing, or held as much as it saved) goes into
        // the summary.
        setup.options.on_warning = [this](const std::string& w) { warning_ = w; };
        const spillway::stash_options& o = setup.options;
        stash_ = std::make_unique<spillway::activation_stash<tier_type>>(*tier_, o);
        layers_.emplace(*stash_, std::move(setup.tensors), at(c.num_layers));
        inputs_.resize(at(c.num_layers));
        loaded_.resize(at(c.num_layers));
        if (recorder_) {
            fwd_track_ = recorder_->track("activations: save");
            bwd_track_ = recorder_->track("activations: load wait");
        }
    }
    ~stash_store() override {
        layers_.reset();  // releases what is still saved
        stash_.reset();
        tier_.reset();
        folder_.reset();  // (this process's folder, and the root if left empty)
    }

    layer_acts acquire(int layer, const float* inp) override {
        if (layer == 0) layers_->begin_step();
        if (layer > 0)
            layers_->release(at(layer - 1),
                             name(ti::residual3_i));  // (a step that failed half-way)
        loaded_[at(layer)].reset();
        layers_->acquire(at(layer));
        layer_acts a;
        a.inp = inputs_[at(layer)] = inp;
        auto ptrs = a.tensors();
        for (int i = 0; i < layer_acts::num_tensors; ++i)
            *ptrs[static_cast<std::size_t>(i)] = layers_->output<float>(at(layer), name(i)).data();
        sample();
        return a;
    }

    void forward_done(int layer) override {
        spillway::trace::scoped_event ev(recorder_, fwd_track_,
                                         "save layer " + std::to_string(layer));
        const std::size_t l = at(layer);
        // The previous layer's output is this layer's input (ln1's backward reads it); this
        // layer has read it, so it goes to the stash now, in this layer's scope.
        if (layer > 0) layers_->save(l - 1, name(ti::residual3_i), l);
        for (int i = 0; i < layer_acts::num_tensors; ++i) {
            if (i == ti::residual3_i) continue;  // the next layer reads it first
            if (!stored(i)) {
                layers_->recycle(l, name(i));  // recomputed in backward
                continue;
            }
            layers_->save(l, name(i));
            // att @ v saves its input: the same tensor the softmax saved (the stash stores it
            // once).
            if (i == ti::att_i) layers_->share(l, name(i), "att (att @ v input)");
        }
        sample();
    }

    void forward_end() override {
        // The final LayerNorm has read the last layer's output; its backward reads it again.
        layers_->save(at(config_.num_layers - 1), name(ti::residual3_i));
        sample();
    }

    layer_saved need(int layer) override {
        const std::size_t l = at(layer);
        if (loaded_[l]) return *loaded_[l];  // (backward asks for the last layer twice)
        auto t0 = spillway::trace::clock::now();
        // The loads in saving order: the input, the layer's stored tensors, the last output.
        auto load = [&](std::size_t owner, int i) {
            return layers_->load<float>(owner, name(i)).data();
        };
        layer_saved a;
        a.inp = layer > 0 ? load(l - 1, ti::residual3_i) : inputs_[l];
        const std::array<const float**, layer_acts::num_tensors> fields = {
            &a.ln1, &a.ln1_mean, &a.ln1_rstd, &a.qkv, &a.att,      &a.atty,     &a.residual2,
            &a.ln2, &a.ln2_mean, &a.ln2_rstd, &a.fch, &a.fch_gelu, &a.residual3};
        for (int i = 0; i < ti::residual3_i; ++i)
            if (stored(i)) *fields[static_cast<std::size_t>(i)] = load(l, i);
        if (layer == config_.num_layers - 1) a.residual3 = load(l, ti::residual3_i);
        if (recorder_)
            recorder_->complete(bwd_track_, "load layer " + std::to_string(layer), t0,
                                spillway::trace::clock::now());
        if (recompute_) {
            // Backward recomputes into the buffers that wait for the next step's layer 0 (the
            // spares of ln1, att, atty and fch_gelu): idle until then, so the recompute costs
            // no memory of its own. ln1 and ln2 share one.
            a.recompute = true;
            a.scratch = {layers_->spare<float>(name(ti::ln1_i)).data(),
                         layers_->spare<float>(name(ti::att_i)).data(),
                         layers_->spare<float>(name(ti::atty_i)).data(),
                         layers_->spare<float>(name(ti::fch_gelu_i)).data()};
            a.ln1 = a.ln2 = a.scratch.ln;
            a.att = a.scratch.att;
            a.atty = a.scratch.atty;
            a.fch_gelu = a.scratch.fch_gelu;
        }
        loaded_[l] = a;
        sample();
        return a;
    }

    void done_with(int layer, layer_acts::tensor_index tensor) override {
        layers_->release(at(layer), name(tensor));
        sample();
    }

    void backward_done(int layer) override {
        loaded_[at(layer)].reset();
        if (layer > 0) layers_->release(at(layer - 1), name(ti::residual3_i));  // its input
        layers_->release_layer(at(layer));
        sample();
    }

    [[nodiscard]] std::size_t peak_bytes() const override { return peak_; }
    void reset_peak() override {
        peak_ = 0;
        sample();
    }
    [[nodiscard]] io_bytes traffic() const override {
        const auto s = stash_->stats();
        return {s.bytes_loaded, s.bytes_offloaded};
    }
    [[nodiscard]] std::string report() const override {
        auto s = stash_->stats();
        auto plan = stash_->plan();
        std::ostringstream o;
        // Recomputed, the attention probabilities (which the softmax and att @ v both save: the
        // stash's dedup stores them once) are not saved at all.
        o << "  stash           saved " << human_bytes(static_cast<double>(s.bytes_saved))
          << " (dedup " << human_bytes(static_cast<double>(s.bytes_deduplicated))
          << (recompute_ ? ": the attention probabilities, saved twice otherwise, are recomputed"
                         : "")
          << "), offloaded " << human_bytes(static_cast<double>(s.bytes_offloaded)) << ", kept "
          << human_bytes(static_cast<double>(s.bytes_kept)) << ", forwarded "
          << human_bytes(static_cast<double>(s.bytes_forwarded)) << ", loaded "
          << human_bytes(static_cast<double>(s.bytes_loaded)) << "\n";
        o << "                  write skips " << s.write_skips << ", load wait "
          << s.load_wait_seconds * 1e3 << " ms, budget wait " << s.budget_wait_seconds * 1e3
          << " ms; "
          << (stash_->options().huge_page_arena ? "tensors under 2 MiB on huge-page slabs; " : "")
          << "adaptive split: ";
        if (stash_->options().split == spillway::split_mode::offload_all)
            o << "off (--act-split offload)\n";
        else if (stash_->options().split == spillway::split_mode::fixed)
            o << "fixed, layers " << stash_->options().first_kept_layer << "+ kept in memory\n";
        else if (!plan.planned)
            o << "not planned yet\n";
        else if (plan.first_kept_layer >= static_cast<std::size_t>(config_.num_layers))
            o << "every layer offloaded\n";
        else
            o << "layers " << plan.first_kept_layer << "+ kept in memory\n";
        if (!warning_.empty()) o << "                  warning: " << warning_ << "\n";
        return o.str();
    }

private:
    // Resident: the stash's buffers (and its arena's slack) and the ones held for compute.
    void sample() {
        auto s = stash_->stats();
        peak_ = std::max(peak_, s.resident_bytes + s.arena_slack_bytes + layers_->held_bytes());
    }
    /// Whether tensor i of a layer goes to the stash (else backward recomputes it).
    bool stored(int i) const { return !(recompute_ && layer_acts::recomputable(i)); }

    gpt2_config config_;
    std::filesystem::path dir_;                     // <path>/mini_gpt-activations, shared
    std::optional<spillway::path_folders> folder_;  // this process's folder in it
    spillway::trace::recorder* recorder_;
    spillway::trace::track_id fwd_track_{}, bwd_track_{};
    std::unique_ptr<tier_type> tier_;
    std::unique_ptr<spillway::activation_stash<tier_type>> stash_;
    std::optional<spillway::layer_stash<tier_type>> layers_;
    std::vector<const float*>
        inputs_;  // each layer's input, as forward gave it (layer 0's is the model's)
    std::vector<std::optional<layer_saved>> loaded_;  // need()'s answer, until backward_done
    bool recompute_;
    std::string warning_;  // the stash's warning (stash_options::on_warning), if it gave one
    std::size_t peak_ = 0;
};

}  // namespace

std::unique_ptr<optimizer> make_offloaded_optimizer(const optimizer_settings& s,
                                                    std::size_t count) {
    switch (s.grads) {
        case grad_dtype::fp32:
            return std::make_unique<offloaded_optimizer<float>>(s, count);
        case grad_dtype::bf16:
            return std::make_unique<offloaded_optimizer<spillway::bfloat16>>(s, count);
        case grad_dtype::fp16:
            return std::make_unique<offloaded_optimizer<spillway::float16>>(s, count);
    }
    throw std::logic_error("make_offloaded_optimizer: unknown grad dtype");
}

std::unique_ptr<activation_store> make_offloading_store(const gpt2_config& config, int B, int T,
                                                        const store_settings& settings) {
    return std::make_unique<stash_store>(config, B, T, settings);
}

std::size_t offloading_store_footprint(const gpt2_config& config, int B, int T,
                                       const store_settings& settings) {
    const stash_setup setup = setup_stash(config, B, T, settings);
    return spillway::stash_footprint(setup.tensors, setup.options);
}

}  // namespace mini_gpt
