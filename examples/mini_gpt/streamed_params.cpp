// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/streamed_params.cpp: the parameter store of --offload params
// (streamed_params.hpp).
#include "streamed_params.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>

#include "dist.hpp"
#include "llmc_format.hpp"
#include "spillway/error.hpp"
#include "spillway/optim/adam.hpp"
#include "spillway/optim/half.hpp"
#include "spillway/stream/detail/narrowed_step.hpp"
#include "spillway/stream/detail/offset_file.hpp"

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

std::vector<std::size_t> layer_sizes(const gpt2_config& c) {
    return std::vector<std::size_t>(static_cast<std::size_t>(c.num_layers), layer_floats(c));
}

spillway::grad_dtype library_dtype(grad_dtype g) {
    switch (g) {
        case grad_dtype::bf16:
            return spillway::grad_dtype::bf16;
        case grad_dtype::fp16:
            return spillway::grad_dtype::fp16;
        case grad_dtype::fp32:
            break;
    }
    return spillway::grad_dtype::fp32;
}

spillway::adamw_config adam_config(const adam_hparams& h, const spillway::step_hparams& s) {
    return {s.lr, h.beta1, h.beta2, h.eps, s.weight_decay};
}

/// Floats of the ends' gradients narrowed at once (the narrowing buffer: at most 2 MiB).
constexpr std::size_t narrow_piece = std::size_t{1} << 20;

std::size_t ends_piece(const param_layout& layout, int L) {
    return std::min(narrow_piece, ends_floats(layout, L));
}

constexpr char moments_magic[8] = {'M', 'G', 'P', 'T', 'M', 'O', 'M', '1'};
constexpr std::size_t moments_header = 32;  // magic, L, n, e

/// fn(), its std::system_error rethrown as input_error (the message names the file).
template <class Fn>
decltype(auto) as_input_error(Fn&& fn) {
    try {
        return fn();
    } catch (const std::system_error& e) {
        throw input_error(e.what());
    }
}

/// A file of a save written at offsets (created anew, mode 0600, fsynced by finish()).
class out_file {
public:
    explicit out_file(const std::filesystem::path& path)
        : f_(as_input_error([&] { return spillway::detail::offset_writer(path); })) {}
    void write(std::size_t offset, const void* data, std::size_t nbytes) {
        as_input_error([&] { f_.write(offset, data, nbytes); });
    }
    void finish() {
        as_input_error([&] { f_.finish(); });
    }

private:
    spillway::detail::offset_writer f_;
};

/// A file of a save read at offsets; its size is checked on opening.
class in_file {
public:
    in_file(const std::filesystem::path& path, std::size_t want)
        : f_(as_input_error([&] { return spillway::detail::offset_reader(path, ""); })) {
        if (f_.size() != want)
            throw input_error(path.string() + ": " + std::to_string(f_.size()) +
                              " bytes, this run's model needs " + std::to_string(want));
    }
    void read(std::size_t offset, void* data, std::size_t nbytes) {
        as_input_error([&] { f_.read(offset, data, nbytes); });
    }

private:
    spillway::detail::offset_reader f_;
};

}  // namespace

std::size_t streamed_params::layer_param_bytes(const gpt2_config& c) {
    return layer_floats(c) * sizeof(float);
}
std::size_t streamed_params::layer_state_bytes(const gpt2_config& c) {
    return 2 * layer_floats(c) * sizeof(float);
}
std::size_t streamed_params::layer_grad_bytes(const gpt2_config& c) {
    return layer_floats(c) * sizeof(spillway::float16);
}
std::size_t streamed_params::smallest_param_window(const gpt2_config& c) {
    return spillway::smallest_param_window(layer_sizes(c));
}
std::size_t streamed_params::smallest_state_window(const gpt2_config& c) {
    return spillway::smallest_state_window(layer_sizes(c));
}
std::size_t streamed_params::smallest_grad_window(const gpt2_config& c) {
    return spillway::smallest_spill_window(layer_sizes(c));
}
std::size_t streamed_params::resident_bytes(const gpt2_config& c, grad_dtype g) {
    const param_layout layout(c);
    const std::size_t ends = ends_floats(layout, c.num_layers);
    const std::size_t narrowing = g == grad_dtype::fp32 ? 0 : ends_piece(layout, c.num_layers) * 2;
    return 4 * ends * sizeof(float) + narrowing +
           spillway::layer_optimizer_resident_bytes(layer_sizes(c), library_dtype(g));
}
std::size_t streamed_params::stored_bytes(const gpt2_config& c, grad_dtype g) {
    return stored_bytes_on(c, g, 0, 1);
}
std::size_t streamed_params::stored_bytes_on(const gpt2_config& c, grad_dtype g, std::size_t path,
                                             std::size_t paths) {
    const std::size_t per_param = 3 * sizeof(float) + (g == grad_dtype::fp16 ? 2 : 0);
    const auto L = static_cast<std::size_t>(c.num_layers);
    const std::size_t layers = path < L ? (L - path + paths - 1) / paths : 0;  // l = path mod P
    return per_param * layer_floats(c) * layers;
}
std::size_t streamed_params::disk_bytes_on(const gpt2_config& c, grad_dtype g, std::size_t path,
                                           std::size_t paths, std::size_t param_window,
                                           std::size_t state_window, std::size_t grad_window) {
    spillway::layer_optimizer_options o;
    o.grads = library_dtype(g);
    o.param_window = param_window;
    o.state_window = state_window;
    o.spill_window = grad_window;
    spillway::disk_layout d;
    d.paths = paths;  // (two file tiers per path: params and the spill, m|v)
    return spillway::stored_bytes_on(layer_sizes(c), o, d, path);
}

streamed_params::streamed_params(const gpt2_config& c, const streamed_params_settings& s)
    : config_(c), layout_(c), s_(s) {
    // 1. This process's folder under each path (what a killed run left there is removed),
    //    and two file tiers in it, named by its path, each under a striped virtual tier:
    //    params (and the fp16 spill), and m|v. Each has its own I/O queue (a tier's queue is
    //    FIFO, so a demand read of params never waits behind the m|v stream's transfers) and
    //    its own spare files, of its own blobs' size.
    if (s.paths.empty()) throw std::invalid_argument("streamed_params: no path");
    spillway::virtual_tier_options vo;
    vo.placement = spillway::placement_mode::striped;
    vo.bandwidths.assign(s.paths.size(), 1.0);  // (no probe: striping needs no weights)
    try {
        folders_.emplace(spillway::path_folders::create(s.paths, "mini_gpt-params", "mini_gpt-"));
        vo.name = "params";
        tier_ = std::make_unique<tier_type>(vo, folders_->file_tier_args({}, "params"));
        vo.name = "moments";
        state_tier_ = std::make_unique<tier_type>(vo, folders_->file_tier_args({}, "moments"));
    } catch (const std::system_error& e) {
        throw input_error(std::string("--path: cannot use it for the parameters: ") + e.what());
    }
    // 2. The layers: params (4 B/param) and m|v (8 B/param), one blob per layer each; with
    //    fp16 the gradient spill (2 B/param); under mpirun each layer's gradients summed over
    //    the ranks, and the fp16 verdict agreed.
    spillway::layer_optimizer_options o;
    o.param_window = s.param_window;
    o.state_window = s.state_window;
    o.spill_window = s.grad_window;
    o.grads = library_dtype(s.grads);
    o.adam = adam_config(s.adam, {s.adam.lr, s.adam.weight_decay});
    o.pool = s.pool;
    if (s.reduce_gradients)
        o.reduce_grads = [](std::size_t, std::span<float> g) { dist::allreduce_sum(g); };
    o.agree_overflow = [](bool overflow) { return dist::any(overflow); };
    opt_ = std::make_unique<optimizer_type>(*tier_, *state_tier_, layer_sizes(c), o);
    hparams_ = {s.adam.lr, s.adam.weight_decay};
    // 3. The resident part.
    const std::size_t ends = ends_floats(layout_, c.num_layers);
    ends_p_.assign(ends, 0.0f);
    ends_g_.assign(ends, 0.0f);
    ends_m_.assign(ends, 0.0f);
    ends_v_.assign(ends, 0.0f);
    if (s.grads == grad_dtype::bf16) narrow_bf16_.resize(ends_piece(layout_, c.num_layers));
    if (s.grads == grad_dtype::fp16) narrow_fp16_.resize(ends_piece(layout_, c.num_layers));
}

streamed_params::~streamed_params() {
    opt_.reset();  // (erases the blobs)
    state_tier_.reset();
    tier_.reset();
    folders_.reset();  // (removes this process's folders, and the roots left empty)
}

param_store::ends_t streamed_params::ends_of(float* base) const noexcept {
    const std::size_t emb = layout_.layer_range(-1).second;
    return {base, base + layout_.sizes[0], base + emb, base + emb + layout_.sizes[14]};
}

void streamed_params::init_gpt2(std::uint64_t seed, const progress_fn& progress) {
    const int L = config_.num_layers;
    const std::size_t emb = layout_.layer_range(-1).second;
    init_gpt2_layer(config_, seed, -1, std::span<float>(ends_p_).first(emb), s_.pool);
    init_gpt2_layer(config_, seed, L, std::span<float>(ends_p_).subspan(emb), s_.pool);
    auto report = [&] {
        if (!progress) return;
        const auto p = opt_->progress();
        progress(p.bytes_stored, p.bytes_total);
    };
    for (int l = 0; l < L; ++l) {
        opt_->fill(static_cast<std::size_t>(l),
                   [&](std::span<float> p) { init_gpt2_layer(config_, seed, l, p, s_.pool); });
        report();
    }
    opt_->flush();
    report();
}

void streamed_params::begin_step(std::int64_t t, float loss_scale,
                                 const spillway::step_hparams& h) {
    step_ = t;
    scale_ = loss_scale;
    hparams_ = h;
    opt_->begin_step(t, loss_scale, h);
}

layer_params streamed_params::forward_layer(int layer) {
    const auto p = opt_->forward_layer(static_cast<std::size_t>(layer));
    // (forward only reads them: layer_params is the gradients' type too)
    return layer_params_at(layout_, layer, const_cast<float*>(p.data()));
}

void streamed_params::forward_done(int layer) {
    opt_->forward_done(static_cast<std::size_t>(layer));
}

layer_params streamed_params::backward_layer(int layer) {
    const auto [p, g] = opt_->backward_layer(static_cast<std::size_t>(layer));
    layer_g_ = g;
    return layer_params_at(layout_, layer, const_cast<float*>(p.data()));
}

layer_params streamed_params::layer_grads(int layer) {
    return layer_params_at(layout_, layer, layer_g_.data());
}

void streamed_params::grads_done(int layer) {
    opt_->grads_done(static_cast<std::size_t>(layer));
    layer_g_ = {};
}

bool streamed_params::end_step() {
    if (s_.reduce_gradients) dist::allreduce_sum(ends_g_);
    spillway::adamw_step_args args;
    args.step = step_;
    const auto cfg = adam_config(s_.adam, hparams_);
    auto step_ends = [&](auto buf) {
        if (spillway::detail::narrowed_step(cfg, args, std::span<float>(ends_p_),
                                            std::span<float>(ends_m_), std::span<float>(ends_v_),
                                            std::span<const float>(ends_g_), buf,
                                            s_.pool) == spillway::step_result::skipped_overflow)
            throw std::runtime_error(
                "step " + std::to_string(step_) +
                ": an inf or NaN gradient in the embeddings or the final LayerNorm: --offload "
                "params updates each layer as soon as backward finishes it, so it cannot skip "
                "the step (the layers are already updated)");
    };
    switch (s_.grads) {
        case grad_dtype::fp32:
            (void)opt_->end_step();
            step_ends(std::span<float>{});
            return true;
        case grad_dtype::bf16:
            (void)opt_->end_step();
            step_ends(std::span<spillway::bfloat16>(narrow_bf16_));
            return true;
        case grad_dtype::fp16:
            break;
    }
    // fp16: every gradient of the step checked before any parameter changes; after the
    // reduction every rank holds the same gradients, and the ranks agree all the same.
    const double ends =
        spillway::detail::narrowed_sum_squares(std::span<const float>(ends_g_), scale_,
                                               std::span<spillway::float16>(narrow_fp16_), s_.pool);
    if (opt_->end_step(ends) == spillway::step_result::skipped_overflow) return false;
    args.grad_scale = scale_;
    args.check = spillway::grad_check::caller_verified;
    step_ends(std::span<spillway::float16>(narrow_fp16_));
    return true;
}

template <class Fn>
void streamed_params::for_each_tensor(int layer, Fn&& fn) const {
    const int L = config_.num_layers;
    if (layer < 0) {  // wte, wpe | lnfw, lnfb
        const std::size_t emb = layout_.layer_range(-1).second, lnf = layout_.layer_range(L).first;
        for (int k : {0, 1, 14, 15}) {
            const auto ks = static_cast<std::size_t>(k);
            const std::size_t at = layout_.offset(k);
            fn(layout_.llmc_offsets[ks], k < 2 ? at : emb + (at - lnf), layout_.sizes[ks]);
        }
        return;
    }
    const std::size_t first = layout_.layer_range(layer).first;
    for (int k = 2; k < 14; ++k) {
        const auto ks = static_cast<std::size_t>(k);
        const std::size_t n = layout_.sizes[ks] / static_cast<std::size_t>(L);
        fn(layout_.llmc_offsets[ks] + static_cast<std::size_t>(layer) * n,
           layout_.offset(k, layer) - first, n);
    }
}

void streamed_params::write_llmc(const std::filesystem::path& file) {
    settle();
    out_file out(file);
    const auto header = llmc_header(config_);
    out.write(0, header.data(), sizeof header);
    constexpr std::size_t base = sizeof header;
    auto put = [&](const float* run) {
        return [&out, run](std::size_t llmc, std::size_t in_run, std::size_t n) {
            out.write(base + llmc * sizeof(float), run + in_run, n * sizeof(float));
        };
    };
    for_each_tensor(-1, put(ends_p_.data()));
    for (int l = 0; l < config_.num_layers; ++l)
        opt_->read_layer(static_cast<std::size_t>(l),
                         [&](std::span<const float> p, std::span<const float>,
                             std::span<const float>) { for_each_tensor(l, put(p.data())); });
    out.finish();
}

void streamed_params::write_moments(const std::filesystem::path& file) {
    settle();
    out_file out(file);
    const std::size_t n = layer_floats(config_);
    const std::uint64_t head[4] = {0, static_cast<std::uint64_t>(config_.num_layers), n,
                                   ends_m_.size()};
    out.write(0, head, sizeof head);
    out.write(0, moments_magic, sizeof moments_magic);
    std::size_t at = moments_header;
    for (int l = 0; l < config_.num_layers; ++l)
        opt_->read_layer(
            static_cast<std::size_t>(l),
            [&](std::span<const float>, std::span<const float> m, std::span<const float> v) {
                out.write(at, m.data(), m.size_bytes());
                out.write(at + m.size_bytes(), v.data(), v.size_bytes());
                at += m.size_bytes() + v.size_bytes();
            });
    out.write(at, ends_m_.data(), ends_m_.size() * sizeof(float));
    at += ends_m_.size() * sizeof(float);
    out.write(at, ends_v_.data(), ends_v_.size() * sizeof(float));
    out.finish();
}

void streamed_params::load(const std::filesystem::path& model_file,
                           const std::filesystem::path& moments_file) {
    fill_from(model_file, moments_file, {});
}

void streamed_params::load_model(const std::filesystem::path& model_file,
                                 const progress_fn& progress) {
    fill_from(model_file, {}, progress);
}

void streamed_params::fill_from(const std::filesystem::path& model_file,
                                const std::filesystem::path& moments_file,
                                const progress_fn& progress) {
    const std::size_t L = static_cast<std::size_t>(config_.num_layers), n = layer_floats(config_),
                      e = ends_m_.size();
    const bool with_moments = !moments_file.empty();
    // 1. Both files' headers and sizes, before any layer is filled.
    const auto want = llmc_header(config_);
    in_file model(model_file, sizeof want + layout_.total * sizeof(float));
    std::array<std::int32_t, header_ints> header{};
    model.read(0, header.data(), sizeof header);
    if (header != want)
        throw input_error(model_file.string() +
                          ": not a checkpoint of this run's model (its header's magic, version "
                          "or config differs)");
    std::optional<in_file> moments;
    if (with_moments) {
        moments.emplace(moments_file, moments_header + (2 * n * L + 2 * e) * sizeof(float));
        std::uint64_t head[4] = {};
        moments->read(0, head, sizeof head);
        if (std::memcmp(head, moments_magic, sizeof moments_magic) != 0 || head[1] != L ||
            head[2] != n || head[3] != e)
            throw input_error(moments_file.string() +
                              ": not the AdamW moments of this run's model (its header differs)");
    }
    // 2. The ends, then each layer's params and m|v into the streams; every parameter
    //    checked as read_checkpoint checks it (a NaN or inf is refused, named).
    constexpr std::size_t base = sizeof header;
    auto get = [&](float* run) {
        return [&, run](std::size_t llmc, std::size_t in_run, std::size_t count) {
            float* to = run + in_run;
            model.read(base + llmc * sizeof(float), to, count * sizeof(float));
            check_finite_params(std::span<const float>(to, count), llmc, layout_, model_file);
        };
    };
    auto report = [&] {
        if (!progress) return;
        const auto p = opt_->progress();
        progress(p.bytes_stored, p.bytes_total);
    };
    for_each_tensor(-1, get(ends_p_.data()));
    std::size_t at = moments_header;
    for (int l = 0; l < config_.num_layers; ++l) {
        opt_->fill(static_cast<std::size_t>(l),
                   [&](std::span<float> p, std::span<float> m, std::span<float> v) {
                       for_each_tensor(l, get(p.data()));
                       if (with_moments) {
                           moments->read(at, m.data(), m.size_bytes());
                           moments->read(at + m.size_bytes(), v.data(), v.size_bytes());
                       } else {
                           std::fill(m.begin(), m.end(), 0.0f);
                           std::fill(v.begin(), v.end(), 0.0f);
                       }
                   });
        at += 2 * n * sizeof(float);
        report();
    }
    if (with_moments) {
        moments->read(at, ends_m_.data(), e * sizeof(float));
        moments->read(at + e * sizeof(float), ends_v_.data(), e * sizeof(float));
    } else {
        std::fill(ends_m_.begin(), ends_m_.end(), 0.0f);
        std::fill(ends_v_.begin(), ends_v_.end(), 0.0f);
    }
    opt_->flush();
    report();
}

stream_traffic streamed_params::traffic() const {
    const auto st = opt_->stats();
    stream_traffic t{st.params.bytes_read,
                     st.params.bytes_written,
                     st.state.bytes_read,
                     st.state.bytes_written,
                     st.spill_read,
                     st.spill_written,
                     {}};
    const auto p = tier_->report(), m = state_tier_->report();
    for (std::size_t i = 0; i < p.size(); ++i)
        t.paths.push_back({p[i].moved.bytes_read + m[i].moved.bytes_read,
                           p[i].moved.bytes_written + m[i].moved.bytes_written});
    return t;
}

}  // namespace mini_gpt
