// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/streamed_params.cpp: the parameter store of --offload params
// (streamed_params.hpp).
#include "streamed_params.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>

#include <fcntl.h>
#include <unistd.h>

#include "dist.hpp"
#include "llmc_format.hpp"
#include "spillway/error.hpp"
#include "spillway/io/durable_file.hpp"
#include "spillway/optim/adam.hpp"
#include "spillway/optim/half.hpp"

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

/// The params stream's options, or with `moments` the m|v stream's: updated only in
/// backward's (or, for fp16, the next forward's) walk, which its layer numbering makes
/// descending (visit_pattern::backward_only), and prefetched one layer ahead, so Belady's
/// rule keeps the rest of its window across steps (fewer bytes than reading further ahead,
/// which gives up layers the next step needs: measured slower at 350M under 2 GiB).
spillway::param_stream_options stream_options(std::size_t window, const char* prefix,
                                              bool moments = false) {
    spillway::param_stream_options o;
    o.memory_budget = window;
    o.held_layers = 1;  // backward holds the layer it computes and updates, nothing more
    o.key_prefix = prefix;
    if (moments) {
        o.pattern = spillway::visit_pattern::backward_only;
        o.prefetch_depth = 1;
    }
    return o;
}

std::vector<std::size_t> layer_sizes(const gpt2_config& c, std::size_t per_float) {
    return spillway::uniform_layers(static_cast<std::size_t>(c.num_layers),
                                    layer_floats(c) * per_float);
}

spillway::adamw_config adam_config(const adam_hparams& h) {
    return {h.lr, h.beta1, h.beta2, h.eps, h.weight_decay};
}

[[noreturn]] void cannot_skip(std::int64_t t, const std::string& what) {
    throw std::runtime_error(
        "step " + std::to_string(t) + ": an inf or NaN gradient in " + what +
        ": --offload params updates each layer as soon as backward finishes it, so it cannot "
        "skip the step (the layers above are already updated)");
}

/// One AdamW step over `params` as the in-memory optimizer runs it (optimizer.cpp), but
/// scanning the gradients first: an inf or NaN cannot skip a step that is already partly
/// applied, so it stops the run.
void adam_step(const adam_hparams& h, std::int64_t t, std::span<float> params, std::span<float> m,
               std::span<float> v, std::span<const float> grads, spillway::thread_pool* pool,
               const std::string& what) {
    spillway::adamw_step_args args;
    args.step = t;
    args.grad_scale = 1.0f;
    args.check = spillway::grad_check::scan;
    if (spillway::adamw_step<float>(adam_config(h), args, params, m, v, grads, {}, pool) ==
        spillway::step_result::skipped_overflow)
        cannot_skip(t, what);
}

/// Floats of gradients narrowed at once (the narrowing buffer: 2 MiB of bf16/fp16).
constexpr std::size_t narrow_piece = std::size_t{1} << 20;

/// The sum of squares of `grads` narrowed to Half and divided by `scale` (step.cpp's check,
/// optimizer::check), piece by piece through `buf`: +inf or NaN when a narrowed gradient is
/// inf or NaN.
template <class Half>
double narrowed_sum_squares(std::span<const float> grads, float scale, std::vector<Half>& buf,
                            spillway::thread_pool* pool) {
    double sum = 0;
    for (std::size_t at = 0; at < grads.size(); at += buf.size()) {
        const std::size_t n = std::min(buf.size(), grads.size() - at);
        spillway::narrow(grads.subspan(at, n), std::span<Half>(buf).first(n));
        sum += spillway::grad_sum_squares(std::span<const Half>(buf).first(n), scale, pool);
    }
    return sum;
}

/// AdamW step t over `params` with `grads` narrowed to Half (as step.cpp narrows the whole
/// model's) and divided by `scale`, piece by piece through `buf`: the bits of
/// adamw_step<Half> over the whole span. `check`: grad_check::scan (an inf or NaN stops the
/// run, see adam_step) or caller_verified (the verdict came first).
template <class Half>
void narrowed_step(const adam_hparams& h, std::int64_t t, float scale, spillway::grad_check check,
                   std::span<float> params, std::span<float> m, std::span<float> v,
                   std::span<const float> grads, std::vector<Half>& buf,
                   spillway::thread_pool* pool, const std::string& what) {
    spillway::adamw_step_args args;
    args.step = t;
    args.grad_scale = scale;
    args.check = check;
    for (std::size_t at = 0; at < grads.size(); at += buf.size()) {
        const std::size_t n = std::min(buf.size(), grads.size() - at);
        spillway::narrow(grads.subspan(at, n), std::span<Half>(buf).first(n));
        if (spillway::adamw_step<Half>(adam_config(h), args, params.subspan(at, n),
                                       m.subspan(at, n), v.subspan(at, n),
                                       std::span<const Half>(buf).first(n), {},
                                       pool) == spillway::step_result::skipped_overflow)
            cannot_skip(t, what);
    }
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

/// The fp16 gradients of one step on their way from backward, which puts layers L-1..0, to
/// the update in the next forward, which takes them 0..L-1 (last in, first out), through
/// `slots` layer buffers over the streams' tier (keys "grads-<layer>"):
/// - put(l) fills a free buffer; when none is free, the buffer of the highest layer (taken
///   last) gives way: its write, issued when the previous put filled the last free buffer,
///   has had a layer's backward to finish. The last `slots` layers put are never written.
/// - take(l) returns l's bytes: in memory, or read (prefetched: each done() starts the read
///   of the next layer on the tier into the buffer it frees); done(l) drops them.
/// - discard() drops a step's gradients (a skipped step).
/// Buffers are allocated once (slots * charge_of(layer bytes): the memory plan's grads
/// window). Tier errors are rethrown naming the layer, its key and the tier; a failed write
/// loses the step's gradients, so it stops the run. Not thread-safe (the trainer's thread).
class grad_spill {
public:
    grad_spill(streamed_params::tier_type& tier, std::size_t layers, std::size_t nbytes,
               std::size_t slots)
        : tier_(tier), nbytes_(nbytes), where_(layers, at::none), written_(layers, false) {
        bufs_.resize(std::clamp<std::size_t>(slots, 1, layers));
        for (auto& b : bufs_)
            b.mem = spillway::aligned_buffer(nbytes, spillway::memory_lock::unlocked,
                                             spillway::default_alignment,
                                             spillway::buffer_fill::uninitialized);
    }
    ~grad_spill() {
        for (auto& b : bufs_) b.io = spillway::io_completion{};  // (waits)
        for (std::size_t l = 0; l < where_.size(); ++l) {
            try {
                if (written_[l] && tier_.contains(key(l))) tier_.erase(key(l));
            } catch (...) {  // a destructor reports nothing
            }
        }
    }
    grad_spill(const grad_spill&) = delete;
    grad_spill& operator=(const grad_spill&) = delete;

    /// Layer l's gradients: `fill(std::span<std::byte>)` writes all nbytes of them.
    template <class Fill>
    void put(std::size_t l, Fill&& fill) {
        if (where_.at(l) != at::none)
            throw std::logic_error("grad_spill: layer " + std::to_string(l) +
                                   " put twice (its gradients were not taken)");
        buffer& b = buffer_for_put();
        fill(std::span<std::byte>(b.mem.data(), nbytes_));
        b.layer = l;
        b.st = state::dirty;
        where_[l] = at::memory;
        if (l > 0 && !free_buffer())  // write the next victim while backward goes on
            if (buffer* w = highest(state::dirty)) issue_write(*w);
    }

    /// Layer l's gradients (put this step), valid until done(l).
    std::span<const std::byte> take(std::size_t l) {
        if (where_.at(l) == at::none)
            throw std::logic_error("grad_spill: take of layer " + std::to_string(l) +
                                   ", which has no gradients");
        if (where_[l] == at::tier) issue_read(buffer_for_put(), l);  // (not prefetched)
        buffer& b = buffer_of(l);
        if (b.st == state::reading) finish(b);
        return {b.mem.data(), nbytes_};
    }

    /// Drops layer l's gradients (taken); starts reading the next layers on the tier into
    /// the buffers that are free.
    void done(std::size_t l) {
        buffer& b = buffer_of(l);
        if (b.st == state::writing) finish(b);
        b.st = state::free;
        where_[l] = at::none;
        for (std::size_t n = l + 1; n < where_.size(); ++n) {
            if (where_[n] != at::tier) continue;
            buffer* f = free_buffer();
            if (!f) break;
            issue_read(*f, n);
        }
    }

    /// Drops every layer's gradients (a skipped step).
    void discard() noexcept {
        for (auto& b : bufs_) {
            b.io = spillway::io_completion{};  // (waits; an error no longer matters)
            b.st = state::free;
        }
        std::fill(where_.begin(), where_.end(), at::none);
    }

    [[nodiscard]] std::uint64_t bytes_read() const noexcept { return read_; }
    [[nodiscard]] std::uint64_t bytes_written() const noexcept { return wrote_; }
    [[nodiscard]] std::size_t resident_bytes() const noexcept {
        return bufs_.size() * spillway::charge_of(nbytes_);
    }

private:
    enum class at { none, memory, tier };  // where a layer's gradients of this step are
    enum class state { free, dirty, writing, clean, reading };
    struct buffer {
        spillway::aligned_buffer mem;
        spillway::io_completion io;
        std::size_t layer = 0;
        state st = state::free;
    };

    static std::string key(std::size_t l) { return "grads-" + std::to_string(l); }

    buffer* free_buffer() noexcept {
        for (auto& b : bufs_)
            if (b.st == state::free) return &b;
        return nullptr;
    }
    buffer* highest(state st) noexcept {
        buffer* h = nullptr;
        for (auto& b : bufs_)
            if (b.st == st && (!h || b.layer > h->layer)) h = &b;
        return h;
    }
    buffer& buffer_of(std::size_t l) {
        for (auto& b : bufs_)
            if (b.st != state::free && b.layer == l) return b;
        throw std::logic_error("grad_spill: layer " + std::to_string(l) + " is not in memory");
    }
    // A buffer for a put (or a read): a free one, or the highest layer's after its write
    // (that layer is then on the tier only).
    buffer& buffer_for_put() {
        if (buffer* f = free_buffer()) return *f;
        buffer* v = nullptr;
        for (auto& b : bufs_)
            if (!v || b.layer > v->layer) v = &b;
        if (v->st == state::dirty) issue_write(*v);
        if (v->st == state::writing || v->st == state::reading) finish(*v);
        where_[v->layer] = at::tier;
        v->st = state::free;
        return *v;
    }
    void issue_write(buffer& b) {
        b.st = state::writing;
        written_[b.layer] = true;
        try {
            b.io = tier_.write(key(b.layer), std::span<const std::byte>(b.mem.data(), nbytes_));
        } catch (...) {
            b.io = spillway::io_completion::failed(std::current_exception());
        }
    }
    void issue_read(buffer& b, std::size_t l) {
        b.layer = l;
        b.st = state::reading;
        where_[l] = at::memory;
        try {
            b.io = tier_.read(key(l), std::span<std::byte>(b.mem.data(), nbytes_));
        } catch (...) {
            b.io = spillway::io_completion::failed(std::current_exception());
        }
    }
    // Waits for b's read or write; rethrows its error naming the layer, the key and the tier.
    void finish(buffer& b) {
        const bool reading = b.st == state::reading;
        try {
            b.io.wait();
        } catch (...) {
            b.st = state::free;
            where_[b.layer] = at::none;
            std::rethrow_exception(spillway::with_context(
                std::current_exception(),
                "grad_spill: " + std::string(reading ? "read" : "write") + " of layer " +
                    std::to_string(b.layer) + "'s gradients (key '" + key(b.layer) + "', " +
                    std::to_string(nbytes_) + " bytes) " + (reading ? "from" : "to") + " tier '" +
                    std::string(tier_.name()) + "'"));
        }
        (reading ? read_ : wrote_) += nbytes_;
        b.st = state::clean;
    }

    streamed_params::tier_type& tier_;
    std::size_t nbytes_;
    std::vector<buffer> bufs_;
    std::vector<at> where_;
    std::vector<bool> written_;  // a blob of the layer may be on the tier
    std::uint64_t read_ = 0, wrote_ = 0;
};

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
    return spillway::smallest_budget(layer_sizes(c, sizeof(float)), stream_options(1, "params"));
}
std::size_t streamed_params::smallest_state_window(const gpt2_config& c) {
    return spillway::smallest_budget(layer_sizes(c, 2 * sizeof(float)), stream_options(1, "adam"));
}
std::size_t streamed_params::smallest_grad_window(const gpt2_config& c) {
    return spillway::charge_of(layer_grad_bytes(c));  // (the spill's one buffer)
}
std::size_t streamed_params::resident_bytes(const gpt2_config& c, grad_dtype g) {
    const param_layout layout(c);
    const std::size_t ends = ends_floats(layout, c.num_layers);
    const std::size_t narrowing =
        g == grad_dtype::fp32 ? 0 : std::min(narrow_piece, std::max(ends, layer_floats(c))) * 2;
    return (4 * ends + layer_floats(c)) * sizeof(float) + narrowing;
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

// ---- striped_tier -------------------------------------------------------------------------

static_assert(spillway::storage_tier<striped_tier>);

striped_tier::striped_tier(std::vector<std::unique_ptr<child_type>> children)
    : children_(std::move(children)) {
    if (children_.empty()) throw std::invalid_argument("striped_tier: no path");
    for (const auto& c : children_) name_ += (name_.empty() ? "" : ", ") + c->name();
}

std::size_t striped_tier::child_of(std::string_view key) const {
    const auto dash = key.rfind('-');
    std::size_t layer = 0;
    const auto digits = key.substr(dash == std::string_view::npos ? key.size() : dash + 1);
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), layer);
    if (digits.empty() || ec != std::errc{} || end != digits.data() + digits.size())
        throw std::invalid_argument("striped_tier: key '" + std::string(key) +
                                    "' does not end in a layer number");
    return layer % children_.size();
}

std::size_t striped_tier::capacity() const noexcept {
    std::size_t sum = 0;
    for (const auto& c : children_) {
        if (c->capacity() == std::numeric_limits<std::size_t>::max()) return c->capacity();
        sum += c->capacity();
    }
    return sum;
}

std::size_t striped_tier::used() const {
    std::size_t sum = 0;
    for (const auto& c : children_) sum += c->used();
    return sum;
}

spillway::tier_stats striped_tier::stats() const {
    spillway::tier_stats t;
    for (const auto& c : children_) {
        const auto s = c->stats();
        t.bytes_read += s.bytes_read;
        t.bytes_written += s.bytes_written;
        t.reads += s.reads;
        t.writes += s.writes;
        t.failed_reads += s.failed_reads;
        t.failed_writes += s.failed_writes;
        t.read_busy_seconds += s.read_busy_seconds;
        t.write_busy_seconds += s.write_busy_seconds;
    }
    return t;
}

streamed_params::streamed_params(const gpt2_config& c, const streamed_params_settings& s)
    : config_(c), layout_(c), s_(s) {
    // 1. This process's folder under each path (what a killed run left there is removed),
    //    and a file tier in it, named by its path; the striped tier over them.
    if (s.paths.empty()) throw std::invalid_argument("streamed_params: no path");
    std::vector<std::unique_ptr<striped_tier::child_type>> children, state_children;
    for (const auto& path : s.paths) {
        const auto dir = path / "mini_gpt-params";
        std::error_code ec;
        create_private_dirs(dir, ec);
        if (ec) throw input_error(dir.string() + ": cannot create directory: " + ec.message());
        dirs_.push_back(dir);
        try {
            spillway::owned_directory::reclaim_abandoned(dir, "proc-");
            folders_.push_back(spillway::owned_directory::create(dir, "proc-"));
            spillway::file_tier_options fo;
            fo.name = path.string();
            // Two file tiers: params (and the fp16 spill), and m|v. Each has its own I/O
            // queue (a tier's queue is FIFO, so a demand read of params never waits behind
            // the m|v stream's transfers) and its own spare files, of its own blobs' size.
            for (const char* sub : {"params", "moments"}) {
                const auto at = folders_.back().path() / sub;
                std::filesystem::create_directory(at);
                std::filesystem::permissions(at, std::filesystem::perms::owner_all);
                (sub[0] == 'p' ? children : state_children)
                    .push_back(std::make_unique<striped_tier::child_type>(at, fo));
            }
        } catch (const std::system_error& e) {
            throw input_error(dir.string() + ": cannot use it for the parameters: " + e.what());
        }
    }
    tier_ = std::make_unique<tier_type>(std::move(children));
    state_tier_ = std::make_unique<tier_type>(std::move(state_children));
    // 2. The streams: params (4 B/param) and m|v (8 B/param), one blob per layer each; with
    //    fp16 the gradient spill (2 B/param).
    params_ = std::make_unique<stream_type>(*tier_, layer_sizes(c, sizeof(float)),
                                            stream_options(s.param_window, "params"));
    state_ = std::make_unique<stream_type>(*state_tier_, layer_sizes(c, 2 * sizeof(float)),
                                           stream_options(s.state_window, "adam", true));
    const auto L = static_cast<std::size_t>(c.num_layers);
    if (s.grads == grad_dtype::fp16) {
        const std::size_t least = smallest_grad_window(c);
        if (s.grad_window < least)
            throw std::invalid_argument(
                "streamed_params: grad_window of " + std::to_string(s.grad_window) +
                " bytes is under one layer's fp16 gradients (" + std::to_string(least) + " bytes)");
        spill_ =
            std::make_unique<grad_spill>(*tier_, L, layer_grad_bytes(c), s.grad_window / least);
    }
    // 3. The resident part.
    const std::size_t ends = ends_floats(layout_, c.num_layers);
    ends_p_.assign(ends, 0.0f);
    ends_g_.assign(ends, 0.0f);
    ends_m_.assign(ends, 0.0f);
    ends_v_.assign(ends, 0.0f);
    layer_g_.assign(layer_floats(c), 0.0f);
    const std::size_t piece = std::min(narrow_piece, std::max(ends, layer_floats(c)));
    if (s.grads == grad_dtype::bf16) narrow_bf16_.resize(piece);
    if (s.grads == grad_dtype::fp16) narrow_fp16_.resize(piece);
}

streamed_params::~streamed_params() {
    spill_.reset();  // (erase their blobs)
    state_.reset();
    params_.reset();
    state_tier_.reset();
    tier_.reset();
    folders_.clear();
    for (const auto& dir : dirs_) {
        std::error_code ec;
        if (std::filesystem::is_empty(dir, ec) && !ec) std::filesystem::remove(dir, ec);
    }
}

param_store::ends_t streamed_params::ends_of(float* base) const noexcept {
    const std::size_t emb = layout_.layer_range(-1).second;
    return {base, base + layout_.sizes[0], base + emb, base + emb + layout_.sizes[14]};
}

std::size_t streamed_params::state_layer(int layer) const noexcept {
    const auto l = static_cast<std::size_t>(layer);
    return s_.grads == grad_dtype::fp16 ? static_cast<std::size_t>(config_.num_layers) - 1 - l : l;
}

std::size_t streamed_params::grad_resident_bytes() const noexcept {
    return spill_ ? spill_->resident_bytes() : 0;
}

void streamed_params::init_gpt2(std::uint64_t seed, const progress_fn& progress) {
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
        state_->fill(state_layer(l), [](spillway::layer_update_view v) {
            std::memset(v.bytes().data(), 0, v.size());
        });
        report();
    }
    params_->flush();
    state_->flush();
    report();
}

layer_params streamed_params::forward_layer(int layer) {
    const auto at = static_cast<std::size_t>(layer);
    if (pending_.due) {  // fp16: this layer's update of the last step first
        held_ = params_->acquire_for_update(at);
        forward_updates_ = true;
        apply_pending(layer, held_.as<float>());
        return layer_params_at(layout_, layer, held_.as<float>().data());
    }
    const auto v = params_->acquire(at);
    // (forward only reads them: layer_params is the gradients' type too)
    return layer_params_at(layout_, layer, const_cast<float*>(v.as<float>().data()));
}

void streamed_params::forward_done(int layer) {
    const auto at = static_cast<std::size_t>(layer);
    if (!forward_updates_) {
        params_->release(at);
        return;
    }
    params_->release(at, spillway::layer_change::updated);
    held_ = {};
    forward_updates_ = false;
    if (layer == config_.num_layers - 1) pending_.due = false;  // every layer has it
}

void streamed_params::apply_pending(int layer, std::span<float> params) {
    const std::size_t n = layer_g_.size(), sl = state_layer(layer);
    auto mv = state_->acquire_for_update(sl).as<float>();
    const auto g = spill_->take(static_cast<std::size_t>(layer));
    spillway::adamw_step_args args;
    args.step = pending_.t;
    args.grad_scale = pending_.scale;
    args.check = spillway::grad_check::caller_verified;  // (end_step's verdict)
    spillway::adamw_step<spillway::float16>(
        adam_config(s_.adam), args, params, mv.first(n), mv.subspan(n),
        std::span<const spillway::float16>(reinterpret_cast<const spillway::float16*>(g.data()), n),
        {}, s_.pool);
    spill_->done(static_cast<std::size_t>(layer));
    state_->release(sl, spillway::layer_change::updated);
}

void streamed_params::settle() {
    if (!pending_.due) return;
    for (int l = 0; l < config_.num_layers; ++l) {
        const auto at = static_cast<std::size_t>(l);
        auto v = params_->acquire_for_update(at);
        apply_pending(l, v.as<float>());
        params_->release(at, spillway::layer_change::updated);
    }
    pending_.due = false;
}

layer_params streamed_params::backward_layer(int layer) {
    const auto at = static_cast<std::size_t>(layer);
    if (s_.grads == grad_dtype::fp16) {  // read only: the update waits for the verdict
        const auto v = params_->acquire(at);
        return layer_params_at(layout_, layer, const_cast<float*>(v.as<float>().data()));
    }
    held_ = params_->acquire_for_update(at);
    return layer_params_at(layout_, layer, held_.as<float>().data());
}

layer_params streamed_params::layer_grads(int layer) {
    return layer_params_at(layout_, layer, layer_g_.data());
}

void streamed_params::grads_done(int layer) {
    const auto at = static_cast<std::size_t>(layer);
    if (s_.reduce_gradients) dist::allreduce_sum(layer_g_);
    const std::string what = "layer " + std::to_string(layer);
    if (s_.grads == grad_dtype::fp16) {
        // Narrowed into the spill as step.cpp narrows them, checked as optimizer::check does.
        spill_->put(at, [&](std::span<std::byte> b) {
            const std::span<spillway::float16> h(reinterpret_cast<spillway::float16*>(b.data()),
                                                 layer_g_.size());
            spillway::narrow(std::span<const float>(layer_g_), h);
            sum_squares_ +=
                spillway::grad_sum_squares(std::span<const spillway::float16>(h), scale_, s_.pool);
        });
        params_->release(at);
        return;
    }
    const std::size_t sl = state_layer(layer);
    auto mv = state_->acquire_for_update(sl).as<float>();
    const std::size_t n = layer_g_.size();
    if (s_.grads == grad_dtype::bf16)
        narrowed_step(s_.adam, step_, 1.0f, spillway::grad_check::scan, held_.as<float>(),
                      mv.first(n), mv.subspan(n), layer_g_, narrow_bf16_, s_.pool, what);
    else
        adam_step(s_.adam, step_, held_.as<float>(), mv.first(n), mv.subspan(n), layer_g_, s_.pool,
                  what);
    state_->release(sl, spillway::layer_change::updated);
    params_->release(at, spillway::layer_change::updated);
    held_ = {};
}

bool streamed_params::end_step() {
    if (s_.reduce_gradients) dist::allreduce_sum(ends_g_);
    const std::string what = "the embeddings or the final LayerNorm";
    switch (s_.grads) {
        case grad_dtype::fp32:
            adam_step(s_.adam, step_, ends_p_, ends_m_, ends_v_, ends_g_, s_.pool, what);
            return true;
        case grad_dtype::bf16:
            narrowed_step(s_.adam, step_, 1.0f, spillway::grad_check::scan, ends_p_, ends_m_,
                          ends_v_, ends_g_, narrow_bf16_, s_.pool, what);
            return true;
        case grad_dtype::fp16:
            break;
    }
    // fp16: every gradient of the step checked before any parameter changes; after the
    // reduction every rank holds the same gradients, and the ranks agree all the same.
    const double sum = sum_squares_ + narrowed_sum_squares(std::span<const float>(ends_g_), scale_,
                                                           narrow_fp16_, s_.pool);
    sum_squares_ = 0;
    if (dist::any(!std::isfinite(sum))) {
        spill_->discard();
        return false;
    }
    narrowed_step(s_.adam, step_, scale_, spillway::grad_check::caller_verified, ends_p_, ends_m_,
                  ends_v_, ends_g_, narrow_fp16_, s_.pool, what);
    pending_ = {true, step_, scale_};
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
    for (int l = 0; l < config_.num_layers; ++l) {
        const auto at = static_cast<std::size_t>(l);
        const auto v = params_->acquire(at).as<float>();
        for_each_tensor(l, put(v.data()));
        params_->release(at);
    }
    out.finish();
}

void streamed_params::write_moments(const std::filesystem::path& file) {
    settle();
    out_file out(file);
    const std::uint64_t head[4] = {0, static_cast<std::uint64_t>(config_.num_layers),
                                   layer_g_.size(), ends_m_.size()};
    out.write(0, head, sizeof head);
    out.write(0, moments_magic, sizeof moments_magic);
    std::size_t at = moments_header;
    for (int l = 0; l < config_.num_layers; ++l) {
        const std::size_t sl = state_layer(l);
        const auto v = state_->acquire(sl).bytes();
        out.write(at, v.data(), v.size());
        at += v.size();
        state_->release(sl);
    }
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
    const std::size_t L = static_cast<std::size_t>(config_.num_layers), n = layer_g_.size(),
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
    const std::size_t total = params_->total_bytes() + state_->total_bytes();
    auto report = [&] {
        if (!progress) return;
        const auto a = params_->progress(), b = state_->progress();
        progress(a.bytes_stored + b.bytes_stored, total);
    };
    for_each_tensor(-1, get(ends_p_.data()));
    std::size_t at = moments_header;
    for (int l = 0; l < config_.num_layers; ++l) {
        const auto layer = static_cast<std::size_t>(l);
        params_->fill(layer, [&](spillway::layer_update_view v) {
            for_each_tensor(l, get(v.as<float>().data()));
        });
        state_->fill(state_layer(l), [&](spillway::layer_update_view v) {
            if (with_moments)
                moments->read(at, v.bytes().data(), v.size());
            else
                std::memset(v.bytes().data(), 0, v.size());
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
    params_->flush();
    state_->flush();
    report();
}

stream_traffic streamed_params::traffic() const {
    const auto p = params_->stats(), s = state_->stats();
    stream_traffic t{p.bytes_read,
                     p.bytes_written,
                     s.bytes_read,
                     s.bytes_written,
                     spill_ ? spill_->bytes_read() : 0,
                     spill_ ? spill_->bytes_written() : 0,
                     {}};
    for (std::size_t i = 0; i < tier_->child_count(); ++i) {
        const auto c = tier_->child(i).stats(), m = state_tier_->child(i).stats();
        t.paths.push_back({c.bytes_read + m.bytes_read, c.bytes_written + m.bytes_written});
    }
    return t;
}

}  // namespace mini_gpt
