// examples/mini_gpt/streamed_params.cpp: the parameter store of --offload params
// (streamed_params.hpp).
#include "streamed_params.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <system_error>

#include "dist.hpp"
#include "llmc_format.hpp"
#include "spillway/optim/adam.hpp"

namespace mini_gpt {

namespace {

std::size_t layer_floats(const gpt2_config& c) {
    const param_layout layout(c);
    const auto [b, e] = layout.layer_range(0);
    return e - b;
}

std::size_t ends_floats(const param_layout& layout, int L) {
    const auto emb = layout.layer_range(-1), lnf = layout.layer_range(L);
    return (emb.second - emb.first) + (lnf.second - lnf.first);
}

spillway::param_stream_options stream_options(std::size_t window, const char* prefix) {
    spillway::param_stream_options o;
    o.memory_budget = window;
    o.held_layers = 1;  // backward holds the layer it computes and updates, nothing more
    o.key_prefix = prefix;
    return o;
}

std::vector<std::size_t> layer_sizes(const gpt2_config& c, std::size_t per_float) {
    return spillway::uniform_layers(static_cast<std::size_t>(c.num_layers),
                                    layer_floats(c) * per_float);
}

/// One AdamW step over `params` as the in-memory optimizer runs it (optimizer.cpp), but
/// scanning the gradients first: an inf or NaN cannot skip a step that is already partly
/// applied, so it stops the run.
void adam_step(const adam_hparams& h, std::int64_t t, std::span<float> params, std::span<float> m,
               std::span<float> v, std::span<const float> grads, spillway::thread_pool* pool,
               const std::string& what) {
    spillway::adamw_config cfg{h.lr, h.beta1, h.beta2, h.eps, h.weight_decay};
    spillway::adamw_step_args args;
    args.step = t;
    args.grad_scale = 1.0f;
    args.check = spillway::grad_check::scan;
    if (spillway::adamw_step<float>(cfg, args, params, m, v, grads, {}, pool) ==
        spillway::step_result::skipped_overflow)
        throw std::runtime_error(
            "step " + std::to_string(t) + ": an inf or NaN gradient in " + what +
            ": --offload params updates each layer as soon as backward finishes it, so it cannot "
            "skip the step (the layers above are already updated)");
}

}  // namespace

std::size_t streamed_params::layer_param_bytes(const gpt2_config& c) {
    return layer_floats(c) * sizeof(float);
}
std::size_t streamed_params::layer_state_bytes(const gpt2_config& c) {
    return 2 * layer_floats(c) * sizeof(float);
}
std::size_t streamed_params::smallest_param_window(const gpt2_config& c) {
    return spillway::smallest_budget(layer_sizes(c, sizeof(float)), stream_options(1, "params"));
}
std::size_t streamed_params::smallest_state_window(const gpt2_config& c) {
    return spillway::smallest_budget(layer_sizes(c, 2 * sizeof(float)), stream_options(1, "adam"));
}
std::size_t streamed_params::resident_bytes(const gpt2_config& c) {
    const param_layout layout(c);
    return (4 * ends_floats(layout, c.num_layers) + layer_floats(c)) * sizeof(float);
}
std::size_t streamed_params::stored_bytes(const gpt2_config& c) {
    return 3 * layer_floats(c) * sizeof(float) * static_cast<std::size_t>(c.num_layers);
}

streamed_params::streamed_params(const gpt2_config& c, const streamed_params_settings& s)
    : config_(c), layout_(c), s_(s), dir_(s.path / "mini_gpt-params") {
    // 1. This process's folder under the path (what a killed run left there is removed).
    std::error_code ec;
    create_private_dirs(dir_, ec);
    if (ec) throw input_error(dir_.string() + ": cannot create directory: " + ec.message());
    try {
        spillway::owned_directory::reclaim_abandoned(dir_, "proc-");
        folder_.emplace(spillway::owned_directory::create(dir_, "proc-"));
        spillway::file_tier_options fo;
        fo.name = s.path.string();
        tier_ = std::make_unique<tier_type>(folder_->path(), fo);
    } catch (const std::system_error& e) {
        throw input_error(dir_.string() + ": cannot use it for the parameters: " + e.what());
    }
    // 2. The streams: params (4 B/param) and m|v (8 B/param), one blob per layer each.
    params_ = std::make_unique<stream_type>(*tier_, layer_sizes(c, sizeof(float)),
                                            stream_options(s.param_window, "params"));
    state_ = std::make_unique<stream_type>(*tier_, layer_sizes(c, 2 * sizeof(float)),
                                           stream_options(s.state_window, "adam"));
    // 3. The resident part.
    const std::size_t ends = ends_floats(layout_, c.num_layers);
    ends_p_.assign(ends, 0.0f);
    ends_g_.assign(ends, 0.0f);
    ends_m_.assign(ends, 0.0f);
    ends_v_.assign(ends, 0.0f);
    layer_g_.assign(layer_floats(c), 0.0f);
}

streamed_params::~streamed_params() {
    state_.reset();  // (erase their blobs)
    params_.reset();
    tier_.reset();
    folder_.reset();
    std::error_code ec;
    if (std::filesystem::is_empty(dir_, ec) && !ec) std::filesystem::remove(dir_, ec);
}

param_store::ends_t streamed_params::ends_of(float* base) const noexcept {
    const std::size_t emb = layout_.layer_range(-1).second;
    return {base, base + layout_.sizes[0], base + emb, base + emb + layout_.sizes[14]};
}

void streamed_params::init_gpt2(std::uint64_t seed,
                                const std::function<void(std::size_t, std::size_t)>& progress) {
    const int L = config_.num_layers;
    const std::size_t emb = layout_.layer_range(-1).second;
    init_gpt2_layer(config_, seed, -1, std::span<float>(ends_p_).first(emb));
    init_gpt2_layer(config_, seed, L, std::span<float>(ends_p_).subspan(emb));
    const std::size_t total = params_->total_bytes() + state_->total_bytes();
    auto report = [&] {
        if (!progress) return;
        const auto a = params_->progress(), b = state_->progress();
        progress(a.bytes_stored + b.bytes_stored, total);
    };
    for (int l = 0; l < L; ++l) {
        const auto at = static_cast<std::size_t>(l);
        params_->fill(at, [&](spillway::layer_update_view v) {
            init_gpt2_layer(config_, seed, l, v.as<float>());
        });
        state_->fill(
            at, [](spillway::layer_update_view v) { std::memset(v.bytes().data(), 0, v.size()); });
        report();
    }
    params_->flush();
    state_->flush();
    report();
}

layer_params streamed_params::forward_layer(int layer) {
    const auto v = params_->acquire(static_cast<std::size_t>(layer));
    // (forward only reads them: layer_params is the gradients' type too)
    return layer_params_at(layout_, layer, const_cast<float*>(v.as<float>().data()));
}

void streamed_params::forward_done(int layer) {
    params_->release(static_cast<std::size_t>(layer));
}

layer_params streamed_params::backward_layer(int layer) {
    held_ = params_->acquire_for_update(static_cast<std::size_t>(layer));
    return layer_params_at(layout_, layer, held_.as<float>().data());
}

layer_params streamed_params::layer_grads(int layer) {
    return layer_params_at(layout_, layer, layer_g_.data());
}

void streamed_params::grads_done(int layer) {
    const auto at = static_cast<std::size_t>(layer);
    if (s_.reduce_gradients) dist::allreduce_sum(layer_g_);
    auto mv = state_->acquire_for_update(at).as<float>();
    const std::size_t n = layer_g_.size();
    adam_step(s_.adam, step_, held_.as<float>(), mv.first(n), mv.subspan(n), layer_g_, s_.pool,
              "layer " + std::to_string(layer));
    state_->release(at, spillway::layer_change::updated);
    params_->release(at, spillway::layer_change::updated);
    held_ = {};
}

void streamed_params::update_ends() {
    if (s_.reduce_gradients) dist::allreduce_sum(ends_g_);
    adam_step(s_.adam, step_, ends_p_, ends_m_, ends_v_, ends_g_, s_.pool,
              "the embeddings or the final LayerNorm");
}

std::vector<float> streamed_params::llmc_params() {
    std::vector<float> model(layout_.total), out(layout_.total);
    const auto emb = layout_.layer_range(-1), lnf = layout_.layer_range(config_.num_layers);
    std::copy_n(ends_p_.data(), emb.second, model.data());
    std::copy_n(ends_p_.data() + emb.second, lnf.second - lnf.first, model.data() + lnf.first);
    for (int l = 0; l < config_.num_layers; ++l) {
        const auto at = static_cast<std::size_t>(l);
        const auto v = params_->acquire(at).as<float>();
        std::copy(v.begin(), v.end(), model.data() + layout_.layer_range(l).first);
        params_->release(at);
    }
    layout_.to_llmc_order(model, out);
    return out;
}

stream_traffic streamed_params::traffic() const {
    const auto p = params_->stats(), s = state_->stats();
    return {p.bytes_read, p.bytes_written, s.bytes_read, s.bytes_written};
}

}  // namespace mini_gpt
