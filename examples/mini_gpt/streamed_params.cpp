// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/streamed_params.cpp: the parameter store of --offload params
// (streamed_params.hpp).
#include "streamed_params.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>
#include <system_error>

#include <fcntl.h>
#include <unistd.h>

#include "dist.hpp"
#include "llmc_format.hpp"
#include "spillway/io/durable_file.hpp"
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

constexpr char moments_magic[8] = {'M', 'G', 'P', 'T', 'M', 'O', 'M', '1'};
constexpr std::size_t moments_header = 32;  // magic, L, n, e

/// A file of a save written at offsets (created anew, mode 0600, fsynced by finish()).
class out_file {
public:
    explicit out_file(const std::filesystem::path& path) : path_(path) {
        fd_ = spillway::unique_fd(
            ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
        if (fd_.get() < 0) fail("cannot create it");
    }
    void write(std::size_t offset, const void* data, std::size_t nbytes) {
        const auto* p = static_cast<const char*>(data);
        while (nbytes > 0) {
            const ssize_t n = ::pwrite(fd_.get(), p, nbytes, static_cast<off_t>(offset));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) fail("write failed");
            p += n;
            offset += static_cast<std::size_t>(n);
            nbytes -= static_cast<std::size_t>(n);
        }
    }
    void finish() {
        if (::fsync(fd_.get()) != 0) fail("fsync failed");
        fd_.reset();
    }

private:
    [[noreturn]] void fail(const char* what) const {
        throw input_error(path_.string() + ": " + what + ": " + std::strerror(errno));
    }
    std::filesystem::path path_;
    spillway::unique_fd fd_;
};

/// A file of a save read at offsets; its size is checked on opening.
class in_file {
public:
    in_file(const std::filesystem::path& path, std::size_t want) : path_(path) {
        try {
            fd_ = spillway::open_regular_file(path, "");
        } catch (const std::system_error& e) {
            throw input_error(e.what());
        }
        const off_t size = ::lseek(fd_.get(), 0, SEEK_END);
        if (size < 0 || static_cast<std::size_t>(size) != want)
            throw input_error(path.string() + ": " + std::to_string(size) +
                              " bytes, this run's model needs " + std::to_string(want));
    }
    void read(std::size_t offset, void* data, std::size_t nbytes) {
        auto* p = static_cast<char*>(data);
        while (nbytes > 0) {
            const ssize_t n = ::pread(fd_.get(), p, nbytes, static_cast<off_t>(offset));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0)
                throw input_error(path_.string() + ": read failed: " +
                                  (n == 0 ? std::string("short file") : std::strerror(errno)));
            p += n;
            offset += static_cast<std::size_t>(n);
            nbytes -= static_cast<std::size_t>(n);
        }
    }

private:
    std::filesystem::path path_;
    spillway::unique_fd fd_;
};

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
    init_gpt2_layer(config_, seed, -1, std::span<float>(ends_p_).first(emb), s_.pool);
    init_gpt2_layer(config_, seed, L, std::span<float>(ends_p_).subspan(emb), s_.pool);
    const std::size_t total = params_->total_bytes() + state_->total_bytes();
    auto report = [&] {
        if (!progress) return;
        const auto a = params_->progress(), b = state_->progress();
        progress(a.bytes_stored + b.bytes_stored, total);
    };
    for (int l = 0; l < L; ++l) {
        const auto at = static_cast<std::size_t>(l);
        params_->fill(at, [&](spillway::layer_update_view v) {
            init_gpt2_layer(config_, seed, l, v.as<float>(), s_.pool);
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
    for (int l = 0; l < config_.num_layers; ++l) {
        const auto at = static_cast<std::size_t>(l);
        const auto v = params_->acquire(at).as<float>();
        for_each_tensor(l, put(v.data()));
        params_->release(at);
    }
    out.finish();
}

void streamed_params::write_moments(const std::filesystem::path& file) {
    out_file out(file);
    const std::uint64_t head[4] = {0, static_cast<std::uint64_t>(config_.num_layers),
                                   layer_g_.size(), ends_m_.size()};
    out.write(0, head, sizeof head);
    out.write(0, moments_magic, sizeof moments_magic);
    std::size_t at = moments_header;
    for (int l = 0; l < config_.num_layers; ++l) {
        const auto layer = static_cast<std::size_t>(l);
        const auto v = state_->acquire(layer).bytes();
        out.write(at, v.data(), v.size());
        at += v.size();
        state_->release(layer);
    }
    out.write(at, ends_m_.data(), ends_m_.size() * sizeof(float));
    at += ends_m_.size() * sizeof(float);
    out.write(at, ends_v_.data(), ends_v_.size() * sizeof(float));
    out.finish();
}

void streamed_params::load(const std::filesystem::path& model_file,
                           const std::filesystem::path& moments_file) {
    const std::size_t L = static_cast<std::size_t>(config_.num_layers), n = layer_g_.size(),
                      e = ends_m_.size();
    // 1. Both files' headers and sizes, before any layer is filled.
    const auto want = llmc_header(config_);
    in_file model(model_file, sizeof want + layout_.total * sizeof(float));
    std::array<std::int32_t, header_ints> header{};
    model.read(0, header.data(), sizeof header);
    if (header != want)
        throw input_error(model_file.string() +
                          ": not a checkpoint of this run's model (its header's magic, version "
                          "or config differs)");
    in_file moments(moments_file, moments_header + (2 * n * L + 2 * e) * sizeof(float));
    std::uint64_t head[4] = {};
    moments.read(0, head, sizeof head);
    if (std::memcmp(head, moments_magic, sizeof moments_magic) != 0 || head[1] != L ||
        head[2] != n || head[3] != e)
        throw input_error(moments_file.string() +
                          ": not the AdamW moments of this run's model (its header differs)");
    // 2. The ends, then each layer's params and m|v into the streams.
    constexpr std::size_t base = sizeof header;
    auto get = [&](float* run) {
        return [&model, run](std::size_t llmc, std::size_t in_run, std::size_t count) {
            model.read(base + llmc * sizeof(float), run + in_run, count * sizeof(float));
        };
    };
    for_each_tensor(-1, get(ends_p_.data()));
    std::size_t at = moments_header;
    for (int l = 0; l < config_.num_layers; ++l) {
        const auto layer = static_cast<std::size_t>(l);
        params_->fill(layer, [&](spillway::layer_update_view v) {
            for_each_tensor(l, get(v.as<float>().data()));
        });
        state_->fill(layer, [&](spillway::layer_update_view v) {
            moments.read(at, v.bytes().data(), v.size());
        });
        at += 2 * n * sizeof(float);
    }
    moments.read(at, ends_m_.data(), e * sizeof(float));
    moments.read(at + e * sizeof(float), ends_v_.data(), e * sizeof(float));
    params_->flush();
    state_->flush();
}

stream_traffic streamed_params::traffic() const {
    const auto p = params_->stats(), s = state_->stats();
    return {p.bytes_read, p.bytes_written, s.bytes_read, s.bytes_written};
}

}  // namespace mini_gpt
