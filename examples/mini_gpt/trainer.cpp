// examples/mini_gpt/trainer.cpp: the training loop, the optimizer and activation back ends
// chosen by --offload, save/resume, and the reports.
#include "trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <iomanip>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <variant>

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include "blas_kernels.hpp"
#include "corpus.hpp"
#include "dist.hpp"
#include "gpt2.hpp"
#include "llmc_format.hpp"
#include "optimizer.hpp"
#include "spillway/lock/owned_directory.hpp"

namespace mini_gpt {

namespace {

using clock_type = std::chrono::steady_clock;
double ms_since(clock_type::time_point t0) {
    return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

/// An optimizer step that runs on a thread of its own while the next forward computes (the
/// offloaded optimizer's ascending iterations). Protocol:
///  1. start(fn): fn (the optimizer's step) runs on a new thread; the optimizer reports,
///     through progress(done), that params [0, done) hold their new values.
///  2. The next forward asks wait_for(end) before each layer: it returns once params
///     [0, end) are final, or once the step ended (an error is rethrown by finish()).
///  3. finish() joins the thread and rethrows what the step threw; it is called after that
///     forward (the final LayerNorm already waited for the last subgroup), before backward
///     overwrites the gradients the step reads, and before anything else touches the
///     optimizer. The destructor joins a step still running (an exception unwinding).
class deferred_update {
public:
    deferred_update() = default;
    deferred_update(const deferred_update&) = delete;
    deferred_update& operator=(const deferred_update&) = delete;
    ~deferred_update() {
        if (thread_.joinable()) thread_.join();
    }

    [[nodiscard]] bool running() const noexcept { return thread_.joinable(); }

    void start(std::function<void()> step) {
        done_ = 0;
        ended_ = false;
        error_ = nullptr;
        began_ = clock_type::now();
        thread_ = std::thread([this, step = std::move(step)] {
            std::exception_ptr error;
            try {
                step();
            } catch (...) {
                error = std::current_exception();
            }
            std::lock_guard lock(mutex_);
            ended_at_ = clock_type::now();
            error_ = error;
            ended_ = true;
            cv_.notify_all();
        });
    }

    /// The optimizer's progress callback (runs on the step's thread).
    void progress(std::size_t done) {
        std::lock_guard lock(mutex_);
        done_ = std::max(done_, done);
        cv_.notify_all();
    }

    void wait_for(std::size_t end) {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return done_ >= end || ended_; });
    }

    /// Joins; rethrows the step's error. Returns the step's start and end.
    std::pair<clock_type::time_point, clock_type::time_point> finish() {
        thread_.join();
        if (error_) std::rethrow_exception(error_);
        return {began_, ended_at_};
    }

    /// Joins, dropping the step's error (the trainer is already failing for another reason).
    void join_quietly() noexcept {
        if (thread_.joinable()) thread_.join();
    }

private:
    std::thread thread_;
    std::mutex mutex_;
    std::condition_variable cv_;
    std::size_t done_ = 0;
    bool ended_ = false;
    std::exception_ptr error_;
    clock_type::time_point began_, ended_at_;
};

/// How far backward has got, for an update that runs under it (the optimizer's
/// step_under_backward on the deferred_update thread): backward announces that the gradients
/// from a param index upward are final (gpt2::grads_final_fn); the update's gate waits for
/// its subgroup's range. If backward fails, abandon() makes the gate throw, so the update
/// stops instead of waiting for ever.
class backward_progress {
public:
    void advance(std::size_t from) {
        std::lock_guard lock(mutex_);
        final_from_ = std::min(final_from_, from);
        cv_.notify_all();
    }
    void abandon() {
        std::lock_guard lock(mutex_);
        abandoned_ = true;
        cv_.notify_all();
    }
    spillway::gradient_gate gate() {
        return [this](std::size_t begin, std::size_t, std::chrono::microseconds wait) {
            std::unique_lock lock(mutex_);
            const bool ready = cv_.wait_for(lock, wait, [&] { return final_from_ <= begin || abandoned_; });
            if (abandoned_) throw std::runtime_error("backward failed before the update under it could finish");
            return ready;
        };
    }

private:
    std::mutex mutex_;
    std::condition_variable cv_;
    std::size_t final_from_ = std::numeric_limits<std::size_t>::max();
    bool abandoned_ = false;
};

[[noreturn]] void bad_flag(const std::string& flag, const std::string& problem) {
    throw input_error(flag + ": " + problem);
}

bool on_off(const std::string& flag, const std::string& v) {
    if (v != "on" && v != "off") bad_flag(flag, "must be on or off, got '" + v + "'");
    return v == "on";
}

long long parse_int(const std::string& flag, const std::string& v, long long lo, long long hi) {
    try {
        std::size_t used = 0;
        long long x = std::stoll(v, &used);
        if (used != v.size()) throw std::invalid_argument("trailing");
        if (x < lo || x > hi)
            bad_flag(flag, "value " + v + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
        return x;
    } catch (const input_error&) {
        throw;
    } catch (const std::exception&) {
        bad_flag(flag, "expected an integer, got '" + v + "'");
    }
}

float parse_float(const std::string& flag, const std::string& v) {
    try {
        std::size_t used = 0;
        float x = std::stof(v, &used);
        if (used != v.size() || !std::isfinite(x) || x < 0) throw std::invalid_argument("bad");
        return x;
    } catch (const std::exception&) {
        bad_flag(flag, "expected a non-negative number, got '" + v + "'");
    }
}

const char* dtype_name(grad_dtype d) {
    switch (d) {
        case grad_dtype::fp32: return "fp32";
        case grad_dtype::bf16: return "bf16";
        case grad_dtype::fp16: return "fp16";
    }
    return "?";
}

std::string human_bytes(double b) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) {
        b /= 1024;
        ++u;
    }
    std::ostringstream s;
    s << std::fixed << std::setprecision(u == 0 ? 0 : 1) << b << " " << units[u];
    return s.str();
}

// ---- Save and resume ------------------------------------------------------------------------
// A save directory holds one folder per save (step-NNNNNNNN/: model.bin in llm.c's format,
// optimizer state, train.state) and a file `latest` naming the newest complete one; the
// folders the trainer creates are 0700 and its files 0600 (the user's alone). Protocol:
//  1. write everything into step-N.tmp/ (each file fsynced);
//  2. rename step-N.tmp/ to step-N/;
//  3. replace `latest` atomically (write latest.tmp, fsync, rename);
//  4. remove older step-* folders.
// A crash anywhere leaves `latest` naming a complete save.

struct train_state {
    std::int64_t next_step = 0;      // the step to run next
    std::int64_t adam_steps = 0;     // AdamW steps applied (skipped overflow steps excluded)
    float loss_scale = 1.0f;
    std::int64_t good_steps = 0;     // steps since the loss scale last changed
    // What the steps ran on (format 2; a format-1 file leaves has_run_shape false). Resuming
    // with another gradient type would keep a loss scale meant for it, and other data, batch
    // or sequence length would not replay the same batches: both are refused.
    bool has_run_shape = false;
    struct run_shape {
        std::int32_t grads = 0;         // grad_dtype
        std::int32_t batch = 0, seq = 0;
        std::uint64_t tokens = 0;       // tokens in the data
        std::uint64_t tokens_hash = 0;  // FNV-1a of the tokens
    } shape;
};
constexpr std::uint64_t state_magic_v1 = 0x4d475054'53544154ull;  // "MGPTSTAT"
constexpr std::uint64_t state_magic = 0x4d475054'53544132ull;     // "MGPTSTA2"

/// FNV-1a (64-bit) of some bytes.
std::uint64_t fnv1a(std::span<const std::byte> bytes) {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (std::byte b : bytes) h = (h ^ static_cast<std::uint64_t>(b)) * 0x100000001b3ull;
    return h;
}
/// Tells one token stream from another (on resume, and between ranks).
std::uint64_t tokens_hash(const std::vector<std::uint16_t>& tokens) { return fnv1a(std::as_bytes(std::span(tokens))); }

// The fields in order, each as its bytes (little-endian on every machine this runs on).
template <class Fn>
void state_fields(train_state& s, bool v2, Fn&& field) {
    field(s.next_step);
    field(s.adam_steps);
    field(s.loss_scale);
    field(s.good_steps);
    if (!v2) return;
    field(s.shape.grads);
    field(s.shape.batch);
    field(s.shape.seq);
    field(s.shape.tokens);
    field(s.shape.tokens_hash);
}
std::size_t state_bytes(bool v2) {
    std::size_t n = 0;
    train_state probe;
    state_fields(probe, v2, [&](auto& f) { n += sizeof f; });
    return n;
}

void write_state(const std::filesystem::path& path, train_state s) {
    std::vector<std::byte> b(sizeof state_magic);
    std::memcpy(b.data(), &state_magic, sizeof state_magic);
    state_fields(s, true, [&](auto& f) {
        const auto* p = reinterpret_cast<const std::byte*>(&f);
        b.insert(b.end(), p, p + sizeof f);
    });
    write_file_atomic(path, b);
}
train_state read_state(const std::filesystem::path& path) {
    auto b = read_file(path);
    std::uint64_t magic = 0;
    if (b.size() < sizeof magic) throw input_error(path.string() + ": truncated state");
    std::memcpy(&magic, b.data(), sizeof magic);
    if (magic != state_magic && magic != state_magic_v1)
        throw input_error(path.string() + ": bad magic (not a mini_gpt train.state)");
    const bool v2 = magic == state_magic;
    // Format 1 wrote the struct of its four fields with its padding: 32 bytes.
    if (b.size() != sizeof magic + (v2 ? state_bytes(true) : 32)) throw input_error(path.string() + ": truncated state");
    train_state s;
    std::size_t at = sizeof magic;
    state_fields(s, v2, [&](auto& f) {
        using field_t = std::remove_reference_t<decltype(f)>;
        if (!v2) at = (at + alignof(field_t) - 1) / alignof(field_t) * alignof(field_t);  // format 1's padding
        std::memcpy(&f, b.data() + at, sizeof f);
        at += sizeof f;
    });
    s.has_run_shape = v2;
    // Every field in range, or the file is refused by name (a negative step read the corpus
    // before its start; a loss scale of 0 divided by it).
    auto bad = [&](const std::string& what) { throw input_error(path.string() + ": corrupted state: " + what); };
    if (s.next_step < 1) bad("next step " + std::to_string(s.next_step) + " (a save follows at least one step)");
    if (s.adam_steps < 0 || s.adam_steps > s.next_step)
        bad(std::to_string(s.adam_steps) + " AdamW steps after " + std::to_string(s.next_step) + " steps");
    if (!(std::isfinite(s.loss_scale) && s.loss_scale >= 1.0f))
        bad("loss scale " + std::to_string(s.loss_scale) + " (finite and at least 1)");
    if (s.good_steps < 0 || s.good_steps > s.next_step) bad("good-step count " + std::to_string(s.good_steps));
    if (v2 && (s.shape.grads < 0 || s.shape.grads > 2)) bad("gradient type " + std::to_string(s.shape.grads));
    return s;
}

std::string step_folder(std::int64_t step) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
    return buf;
}

void fsync_dir(const std::filesystem::path& dir);

}  // namespace

// ---- Command line ---------------------------------------------------------------------------

const char* offload_name(offload_mode m) {
    switch (m) {
        case offload_mode::none: return "none";
        case offload_mode::optimizer: return "optimizer";
        case offload_mode::activations: return "activations";
        case offload_mode::all: return "all";
    }
    return "?";
}


std::string usage_text() {
    return R"(mini_gpt: train GPT-2 on the CPU with Spillway's offloading primitives.

Usage: mini_gpt [flags]
  --model FILE        start from an llm.c checkpoint (default: a small model, GPT-2 init)
  --data FILE         llm.c token file (default: the built-in corpus, byte tokens)
  --batch B           global batch size (default 16)
  --seq T             sequence length (default 64)
  --steps N           training steps (default 400)
  --lr X --beta1 X --beta2 X --eps X --wd X    AdamW (defaults 1e-4 0.9 0.999 1e-8 0)
  --seed N            initialisation seed (default 1337)
  --threads N         compute threads (default: every core)
  --grad-dtype D      fp32 | bf16 | fp16 (fp16 uses dynamic loss scaling)
  --offload M         none | optimizer | activations | all
  --path DIR          a storage path for offloaded state (repeatable; default: a temp dir)
  --lock-dir DIR      where the paths' node_lock files go (default: /dev/shm, or the temp
                      dir); every process that shares a --path must use the same one
  --act-split S       which layers' activations stay in memory: adaptive (TBA's rule from a
                      profiling step; default), offload (none stay), or K (layers K.. stay)
  --act-budget MiB    most bytes the activation stash holds (default and least: what the
                      last layer's backward loads at once, about one layer)
  --act-recompute on|off
                      recompute the LayerNorm, attention and GELU outputs in backward
                      instead of offloading them (default on: 7 of a layer's 16 (B,T,C)
                      floats per position and the attention probabilities; the same bits
                      either way)
  --subgroup N        parameters per optimizer subgroup (default 65536, at least 1024)
  --buffers N         host buffers of the update pipeline (default 6, at least 3)
  --update-under-forward on|off
                      run the offloaded optimizer's ascending updates under the next forward,
                      each layer waiting for its parameters (default on; one process)
  --update-under-backward on|off
                      run the offloaded optimizer's descending updates under backward, each
                      subgroup waiting for its gradients (default on; one process, fp32
                      gradients). Such an update cannot skip an overflow: an inf or NaN
                      gradient stops the run (exit 1); with off, the step is skipped
  --order O           the offloaded optimizer's subgroup order: alternating (default; every
                      other update is ascending) or ascending (every update)
  --save DIR          save a resumable checkpoint into DIR every --save-every K steps (default 50)
  --resume DIR        continue from the latest save in DIR
  --save-model FILE   write an llm.c checkpoint after the last step
  --json              one JSON object per step instead of the progress line
  --quiet             no per-step lines
  --trace FILE        write a Chrome trace (Perfetto) of compute and I/O; under mpirun rank 0
                      writes FILE and rank k writes FILE with ".rank<k>" before its extension
  Default model: --layers 4 --channels 128 --heads 4 --vocab 256 --max-seq 64
)";
}

options parse_options(const std::vector<std::string>& args) {
    options o;
    std::string shape_flag;  // the last of --layers, --channels, --heads, --vocab, --max-seq given
    for (std::size_t i = 0; i < args.size(); ++i) {
        const std::string& a = args[i];
        auto value = [&]() -> const std::string& {
            if (i + 1 >= args.size()) bad_flag(a, "needs a value");
            return args[++i];
        };
        // The model's shape comes from --model's header when one is given: a shape flag beside
        // it would be ignored, so it is refused (after the loop).
        if (a == "--layers" || a == "--channels" || a == "--heads" || a == "--vocab" || a == "--max-seq")
            shape_flag = a;
        // A flag that names a file or a directory: an empty value is refused (it would
        // silently mean "none").
        auto path_value = [&]() -> const std::string& {
            const std::string& v = value();
            if (v.empty()) bad_flag(a, "empty path");
            return v;
        };
        if (a == "--model") o.model = path_value();
        else if (a == "--data") o.data = path_value();
        else if (a == "--batch") o.batch = static_cast<int>(parse_int(a, value(), 1, 1 << 20));
        else if (a == "--seq") o.seq = static_cast<int>(parse_int(a, value(), 1, 1 << 20));
        else if (a == "--steps") o.steps = static_cast<int>(parse_int(a, value(), 0, 1 << 30));
        else if (a == "--lr") o.lr = parse_float(a, value());
        else if (a == "--beta1") o.beta1 = parse_float(a, value());
        else if (a == "--beta2") o.beta2 = parse_float(a, value());
        else if (a == "--eps") o.eps = parse_float(a, value());
        else if (a == "--wd") o.weight_decay = parse_float(a, value());
        else if (a == "--seed") o.seed = static_cast<std::uint64_t>(parse_int(a, value(), 0, INT64_MAX));
        else if (a == "--threads") o.threads = static_cast<int>(parse_int(a, value(), 1, 1024));
        else if (a == "--save-model") o.save_model = path_value();
        else if (a == "--grad-dtype") {
            const std::string& v = value();
            if (v == "fp32") o.grads = grad_dtype::fp32;
            else if (v == "bf16") o.grads = grad_dtype::bf16;
            else if (v == "fp16") o.grads = grad_dtype::fp16;
            else bad_flag(a, "expected fp32, bf16 or fp16, got '" + v + "'");
        } else if (a == "--offload") {
            const std::string& v = value();
            if (v == "none") o.offload = offload_mode::none;
            else if (v == "optimizer") o.offload = offload_mode::optimizer;
            else if (v == "activations") o.offload = offload_mode::activations;
            else if (v == "all") o.offload = offload_mode::all;
            else bad_flag(a, "expected none, optimizer, activations or all, got '" + v + "'");
        } else if (a == "--path") o.paths.emplace_back(path_value());
        else if (a == "--lock-dir") o.lock_dir = path_value();
        else if (a == "--act-budget")
            o.act_budget_mib = static_cast<std::size_t>(parse_int(a, value(), 0, std::int64_t{1} << 40));
        else if (a == "--act-split") {
            const std::string& v = value();
            if (v == "adaptive") o.act_split = -1;
            else if (v == "offload") o.act_split = 1 << 30;
            else o.act_split = static_cast<int>(parse_int(a, v, 0, 1 << 30));
        }
        else if (a == "--subgroup")  // (at least 1024: one file per subgroup on the paths)
            o.subgroup = static_cast<std::size_t>(parse_int(a, value(), 1024, std::int64_t{1} << 40));
        else if (a == "--buffers") o.buffers = static_cast<int>(parse_int(a, value(), 3, 4096));
        else if (a == "--order") {
            std::string v = value();
            if (v != "alternating" && v != "ascending") bad_flag(a, "must be alternating or ascending, got '" + v + "'");
            o.ascending_order = v == "ascending";
        } else if (a == "--update-under-forward") o.update_under_forward = on_off(a, value());
        else if (a == "--update-under-backward") o.update_under_backward = on_off(a, value());
        else if (a == "--act-recompute") o.act_recompute = on_off(a, value());
        else if (a == "--save") o.save_dir = path_value();
        else if (a == "--save-every") o.save_every = static_cast<int>(parse_int(a, value(), 1, 1 << 30));
        else if (a == "--resume") o.resume_dir = path_value();
        else if (a == "--json") o.json = true;
        else if (a == "--quiet") o.quiet = true;
        else if (a == "--trace") o.trace = path_value();
        else if (a == "--layers") o.layers = static_cast<int>(parse_int(a, value(), 1, 1024));
        else if (a == "--channels") o.channels = static_cast<int>(parse_int(a, value(), 1, 1 << 16));
        else if (a == "--heads") o.heads = static_cast<int>(parse_int(a, value(), 1, 1 << 16));
        else if (a == "--vocab") o.vocab = static_cast<int>(parse_int(a, value(), 1, 65536));
        else if (a == "--max-seq") o.max_seq = static_cast<int>(parse_int(a, value(), 1, 1 << 20));
        else if (a == "--corpus-bytes")
            o.corpus_bytes = static_cast<std::size_t>(parse_int(a, value(), 1024, INT64_MAX));
        else bad_flag(a, "unknown flag (see --help)");
    }
    if (!o.model.empty() && !shape_flag.empty())
        bad_flag(shape_flag, "the model's shape comes from --model " + o.model.string() + " (its header); drop " +
                                 shape_flag);
    if (o.model.empty() && o.channels % o.heads != 0)
        throw input_error("--channels " + std::to_string(o.channels) + " is not divisible by --heads " +
                          std::to_string(o.heads));
    // AdamW's settings, checked now rather than at the first update (which --steps 0 never
    // reaches): beta1 and beta2 below 1, eps above 0.
    if (!(o.beta1 < 1.0f)) bad_flag("--beta1", "must be below 1, got " + std::to_string(o.beta1));
    if (!(o.beta2 < 1.0f)) bad_flag("--beta2", "must be below 1, got " + std::to_string(o.beta2));
    if (!(o.eps > 0.0f)) bad_flag("--eps", "must be above 0, got " + std::to_string(o.eps));
    return o;
}

namespace {

void fsync_dir(const std::filesystem::path& dir) {
    // Makes the renames inside `dir` durable (best effort: an error here loses nothing).
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        ::fsync(fd);
        ::close(fd);
    }
}

/// Creates a folder of a save (mode 0700, see create_private_dirs); throws
/// std::filesystem::filesystem_error naming it on failure.
void make_save_dir(const std::filesystem::path& dir) {
    std::error_code ec;
    create_private_dirs(dir, ec);
    if (ec) throw std::filesystem::filesystem_error("cannot create the save folder", dir, ec);
}

/// Makes sure `dir` exists and is writable; throws input_error naming it otherwise.
void ensure_writable_dir(const std::filesystem::path& dir, const char* flag) {
    std::error_code ec;
    create_private_dirs(dir, ec);
    if (ec) throw input_error(dir.string() + ": cannot create " + flag + " directory: " + ec.message());
    if (!std::filesystem::is_directory(dir)) throw input_error(dir.string() + ": " + flag + " is not a directory");
    auto probe = dir / (".mini_gpt-probe-" + std::to_string(::getpid()));
    try {
        std::vector<std::byte> one(1);
        write_file_atomic(probe, one);
    } catch (const input_error& e) {
        throw input_error(dir.string() + ": " + flag + " directory is not writable (" + e.what() + ")");
    }
    std::filesystem::remove(probe, ec);
}

/// Checks that the file named by `path` can be created (its directory exists and takes files).
void ensure_writable_file(const std::filesystem::path& path, const char* flag) {
    auto dir = path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path();
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
        throw input_error(path.string() + ": " + flag + " names a directory; give a file name");
    if (!std::filesystem::is_directory(dir, ec))
        throw input_error(path.string() + ": " + flag + " cannot be written: " + dir.string() +
                          " is not a directory");
    auto probe = path;
    probe += ".probe-" + std::to_string(::getpid());
    try {
        std::vector<std::byte> one(1);
        write_file_atomic(probe, one);
    } catch (const input_error& e) {
        throw input_error(path.string() + ": " + flag + " cannot be written (" + e.what() + ")");
    }
    std::filesystem::remove(probe, ec);
}

/// The default --path: a scratch directory removed when the run ends. It is an
/// owned_directory, so the one a killed run left (SIGKILL, the OOM killer) is told from a
/// running one's: every abandoned "mini_gpt-*" directory of the user is removed first.
spillway::owned_directory make_temp_paths() {
    const auto root = std::filesystem::temp_directory_path();
    try {
        spillway::owned_directory::reclaim_abandoned(root, "mini_gpt-");
        return spillway::owned_directory::create(root, "mini_gpt-");
    } catch (const std::system_error& e) {
        throw input_error(root.string() + ": cannot create a temporary directory for the offloaded state (" +
                          e.what() + "); give one with --path");
    }
}

}  // namespace

std::filesystem::path trace_path(const std::filesystem::path& file, int rank) {
    if (rank == 0) return file;
    auto named = file;
    named.replace_filename(file.stem().string() + ".rank" + std::to_string(rank) + file.extension().string());
    return named;
}

void fill_batch(const std::vector<std::uint16_t>& tokens, std::int64_t k, int B, int T, int row0, int rows,
                std::vector<int>& inputs, std::vector<int>& targets) {
    std::size_t BT = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
    std::size_t nbatches = (tokens.size() - 1) / BT;
    std::size_t start = static_cast<std::size_t>(k % static_cast<std::int64_t>(nbatches)) * BT +
                        static_cast<std::size_t>(row0) * static_cast<std::size_t>(T);
    std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(T);
    inputs.resize(n);
    targets.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
        inputs[i] = tokens[start + i];
        targets[i] = tokens[start + i + 1];
    }
}

std::vector<float> train(const options& opt, std::ostream& rank0_out, run_report* report) {
    // 1. Ranks (dist.hpp) and threads: ours for every kernel, OpenBLAS single-threaded inside
    //    each slice; by default the node's cores are shared among its ranks.
    const int rank = dist::rank(), nranks = dist::size();
    std::ostringstream discard;
    std::ostream& out = rank == 0 ? rank0_out : discard;
    blas::single_threaded();
    int threads = opt.threads > 0 ? opt.threads
                                  : std::max(1, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) /
                                                    dist::local_size());
    // The compute threads poll 200 us for the next kernel before they sleep: a step calls
    // parallel_for hundreds of times, and waking a sleeping thread costs tens of microseconds on
    // a virtual machine (default config, `none`: 44.5 -> 39.5 ms per step, `all` 53.1 -> 49.3;
    // 50 us and 1 ms gave the same).
    spillway::thread_pool pool(static_cast<std::size_t>(threads - 1), "spw-compute", std::chrono::microseconds(200));

    // 2. The model.
    gpt2_config config;
    std::vector<float> init_params;
    if (!opt.model.empty()) {
        checkpoint ck = read_checkpoint(opt.model);
        config = ck.config;
        init_params = std::move(ck.params);
    } else {
        config.num_layers = opt.layers;
        config.channels = opt.channels;
        config.num_heads = opt.heads;
        config.vocab_size = opt.vocab;
        config.padded_vocab_size = (opt.vocab + 63) / 64 * 64;
        config.max_seq_len = opt.max_seq;
        try {
            config.validate();
        } catch (const std::invalid_argument& e) {
            throw input_error(std::string("default model: ") + e.what());
        }
    }
    if (opt.seq > config.max_seq_len)
        throw input_error("--seq " + std::to_string(opt.seq) + " exceeds the model's max_seq_len " +
                          std::to_string(config.max_seq_len));
    gpt2 model(config, pool);
    if (init_params.empty()) model.init_gpt2(opt.seed);
    else model.load_llmc_params(init_params);

    // 3. The tokens.
    std::vector<std::uint16_t> tokens;
    std::string data_name;
    if (!opt.data.empty()) {
        tokens = read_tokens(opt.data);
        data_name = opt.data.string();
    } else {
        tokens = builtin_tokens(opt.corpus_bytes);
        data_name = "built-in corpus";
    }
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        if (tokens[i] >= config.vocab_size)
            throw input_error(data_name + ": token " + std::to_string(tokens[i]) + " at position " +
                              std::to_string(i) + " is out of range for the model's vocabulary of " +
                              std::to_string(config.vocab_size));
    }
    const int B = opt.batch, T = opt.seq;
    std::size_t BT = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
    if (B < nranks)
        throw input_error("--batch " + std::to_string(B) + " is smaller than the number of ranks (" +
                          std::to_string(nranks) + "): every rank needs at least one row");
    // This rank's rows of every global batch.
    const int row0 = static_cast<int>(static_cast<long long>(B) * rank / nranks);
    const int rows = static_cast<int>(static_cast<long long>(B) * (rank + 1) / nranks) - row0;
    if (tokens.size() < BT + 1)
        throw input_error(data_name + ": " + std::to_string(tokens.size()) + " tokens, fewer than one batch needs (" +
                          std::to_string(BT + 1) + " for --batch " + std::to_string(B) + " --seq " +
                          std::to_string(T) + ")");

    // 4. Output paths are checked before any work is done.
    if (!opt.save_model.empty()) ensure_writable_file(opt.save_model, "--save-model");
    if (!opt.save_dir.empty()) ensure_writable_dir(opt.save_dir, "--save");
    for (const auto& p : opt.paths) ensure_writable_dir(p, "--path");
    if (!opt.lock_dir.empty()) ensure_writable_dir(opt.lock_dir, "--lock-dir");
    if (!opt.trace.empty()) ensure_writable_file(opt.trace, "--trace");
    std::optional<spillway::owned_directory> temp_paths;
    std::vector<std::filesystem::path> paths = opt.paths;
    bool offload_opt = opt.offload == offload_mode::optimizer || opt.offload == offload_mode::all;
    bool offload_act = opt.offload == offload_mode::activations || opt.offload == offload_mode::all;
    if (paths.empty() && (offload_opt || offload_act)) {
        temp_paths.emplace(make_temp_paths());
        paths.push_back(temp_paths->path());
    }

    // 5. Optimizer and activation store for the --offload mode.
    std::unique_ptr<spillway::trace::recorder> recorder;
    // Every rank records its own timeline; rank k > 0 writes it beside rank 0's (trace_path).
    const std::filesystem::path trace_file = opt.trace.empty() ? opt.trace : trace_path(opt.trace, rank);
    if (!opt.trace.empty())
        recorder = std::make_unique<spillway::trace::recorder>(
            spillway::trace::recording::enabled, nranks > 1 ? "mini_gpt rank " + std::to_string(rank) : "mini_gpt");
    const std::string process_tag = std::to_string(::getpid());
    optimizer_settings os;
    os.adam = {opt.lr, opt.beta1, opt.beta2, opt.eps, opt.weight_decay};
    os.subgroup = opt.subgroup;
    os.buffers = opt.buffers;
    os.paths = paths;
    // A temporary path is this process's alone: its locks live (and go) with it, instead of
    // leaving a lock file per run in /dev/shm.
    if (!opt.lock_dir.empty()) os.lock_directory = opt.lock_dir;
    else if (temp_paths) os.lock_directory = temp_paths->path();
    os.grads = opt.grads;
    os.order = opt.ascending_order ? spillway::subgroup_order::ascending : spillway::subgroup_order::alternating;
    os.pool = &pool;
    os.recorder = recorder.get();
    os.key_prefix = "optim-" + process_tag;
    // This rank's shard of the optimizer: a contiguous run of whole subgroups.
    const std::size_t nparams = model.params().size();
    const std::size_t nsub = (nparams + opt.subgroup - 1) / opt.subgroup;
    if (nsub < static_cast<std::size_t>(nranks))
        throw input_error("--subgroup " + std::to_string(opt.subgroup) + " gives " + std::to_string(nsub) +
                          " subgroups, fewer than the " + std::to_string(nranks) + " ranks that share them");
    std::vector<std::size_t> shard(static_cast<std::size_t>(nranks) + 1);
    for (int r = 0; r <= nranks; ++r)
        shard[static_cast<std::size_t>(r)] =
            std::min(nparams, nsub * static_cast<std::size_t>(r) / static_cast<std::size_t>(nranks) * opt.subgroup);
    const std::size_t lo = shard[static_cast<std::size_t>(rank)], hi = shard[static_cast<std::size_t>(rank) + 1];
    std::unique_ptr<optimizer> optim = offload_opt ? make_offloaded_optimizer(os, hi - lo) : make_memory_optimizer(os, hi - lo);
    std::size_t block_floats = layer_acts::floats(config, rows, T);
    std::unique_ptr<activation_store> store;
    if (offload_act) {
        store_settings ss{paths.front(), "act-" + process_tag, recorder.get(), opt.act_split, opt.act_budget_mib << 20,
                          opt.act_recompute};
        // Two stash threads each way, with ranks too: they mostly wait for the device, and
        // two ranks' forward waited on one writer each (default config, 2 ranks, `all`,
        // three rounds alternated: 58.9-64.7 ms per step with one, 53.4-60.5 with two).
        ss.io_threads = 2;
        store = make_offloading_store(config, rows, T, ss);
    }
    else store = std::make_unique<in_memory_store>(config, rows, T);
    const std::string shard_name = "shard-" + std::to_string(rank) + "-of-" + std::to_string(nranks);

    // 6. Resume.
    std::optional<std::uint64_t> data_hash_cache;  // (hashing a large token file takes a while)
    auto data_hash = [&] {
        if (!data_hash_cache) data_hash_cache = tokens_hash(tokens);
        return *data_hash_cache;
    };
    train_state state;
    state.loss_scale = opt.grads == grad_dtype::fp16 ? 32768.0f : 1.0f;
    if (!opt.resume_dir.empty() || !opt.save_dir.empty()) {  // what a save records of the run
        state.has_run_shape = true;
        state.shape = {static_cast<std::int32_t>(opt.grads), B, T, tokens.size(), data_hash()};
    }
    if (!opt.resume_dir.empty()) {
        auto latest_file = opt.resume_dir / "latest";
        auto latest = read_file(latest_file);
        std::string name(reinterpret_cast<const char*>(latest.data()), latest.size());
        while (!name.empty() && (name.back() == '\n' || name.back() == '\r')) name.pop_back();  // (edited by hand)
        if (name.rfind("step-", 0) != 0 || name.find('/') != std::string::npos ||
            name.find_first_of(std::string("\0\n", 2)) != std::string::npos)
            throw input_error(latest_file.string() + ": does not name a save folder");
        auto dir = opt.resume_dir / name;
        checkpoint ck = read_checkpoint(dir / "model.bin");
        if (!(ck.config == config))
            throw input_error((dir / "model.bin").string() + ": the saved model's config differs from this run's");
        model.load_llmc_params(ck.params);
        const train_state::run_shape run = state.shape;
        state = read_state(dir / "train.state");
        if (state.has_run_shape) {
            const auto& saved = state.shape;
            const std::string file = (dir / "train.state").string();
            if (saved.grads != run.grads)
                throw input_error("--grad-dtype " + std::string(dtype_name(opt.grads)) + ": the save " + file +
                                  " was made with " + dtype_name(static_cast<grad_dtype>(saved.grads)) +
                                  " gradients (its loss scale belongs to them); resume with that type");
            if (saved.batch != run.batch || saved.seq != run.seq)
                throw input_error("--batch " + std::to_string(B) + " --seq " + std::to_string(T) + ": the save " + file +
                                  " was made with --batch " + std::to_string(saved.batch) + " --seq " +
                                  std::to_string(saved.seq) + "; resuming replays the same batches");
            if (saved.tokens != run.tokens || saved.tokens_hash != run.tokens_hash)
                throw input_error(data_name + ": not the data the save " + file + " was made on (" +
                                  std::to_string(saved.tokens) + " tokens there, " + std::to_string(run.tokens) +
                                  " here" + (saved.tokens == run.tokens ? ", other values" : "") + ")");
        }
        state.has_run_shape = true;  // the next save records this run's (format 2)
        state.shape = run;
        if (state.next_step > opt.steps)
            throw input_error("--steps " + std::to_string(opt.steps) + ": the save " + dir.string() +
                              " is already at step " + std::to_string(state.next_step) + "; ask for more steps");
        if (!std::filesystem::is_directory(dir / shard_name))
            throw input_error((dir / shard_name).string() + ": missing (was the save made with another number of ranks?)");
        optim->load(dir / shard_name, model.params().subspan(lo, hi - lo));
    } else {
        optim->init(model.params().subspan(lo, hi - lo));
    }

    // 6b. Every rank must run the same steps on the same model, data and settings: a rank
    //     given other flags (an MPMD command line, a stale save on one node) would leave the
    //     others waiting in a collective for ever. The ranks compare a fingerprint once.
    if (nranks > 1) {
        std::ostringstream settings;
        settings << opt.steps << ' ' << state.next_step << ' ' << B << ' ' << T << ' ' << tokens.size() << ' '
                 << data_hash() << ' ' << model.params().size() << ' ' << static_cast<int>(opt.grads) << ' '
                 << static_cast<int>(opt.offload) << ' ' << opt.lr << ' ' << opt.beta1 << ' ' << opt.beta2 << ' '
                 << opt.eps << ' ' << opt.weight_decay << ' ' << opt.subgroup << ' ' << opt.buffers << ' '
                 << opt.ascending_order << ' ' << opt.save_dir.empty() << ' ' << opt.save_every << ' '
                 << opt.save_model.empty();
        const std::string text = settings.str();
        if (!dist::same_everywhere(fnv1a(std::as_bytes(std::span(text.data(), text.size())))))
            throw input_error("mpirun: the ranks were not given the same run (steps, start step, batch, sequence, data, "
                              "model, gradient type, offload mode, AdamW settings, subgroups, buffers, order or "
                              "saves differ); give every rank the same flags and files");
    }

    // 7. Train.
    std::vector<spillway::bfloat16> grads_bf16;
    std::vector<spillway::float16> grads_fp16;
    if (opt.grads == grad_dtype::bf16) grads_bf16.resize(model.params().size());
    if (opt.grads == grad_dtype::fp16) grads_fp16.resize(model.params().size());
    std::vector<int> inputs, targets;
    std::vector<float> losses;
    double flops_tok = flops_per_token(config, T);
    struct totals_t {
        double fwd = 0, bwd = 0, upd = 0, io = 0, total = 0, param_wait = 0;
        std::size_t act_peak = 0;        // after the first step (the stash profiles on it)
        std::size_t act_peak_first = 0;  // the first step
        int steps = 0, skipped = 0;
    } totals;
    float first_loss = NAN, last_loss = NAN;
    if (!opt.json && !opt.quiet) {
        out << "mini_gpt: L=" << config.num_layers << " C=" << config.channels << " NH=" << config.num_heads
            << " V=" << config.vocab_size << " (padded " << config.padded_vocab_size << ") maxT=" << config.max_seq_len
            << ", " << model.params().size() << " params; B=" << B << " T=" << T << ", " << nranks << " rank(s) x "
            << threads << " threads, grads " << dtype_name(opt.grads) << ", offload " << offload_name(opt.offload) << ", data "
            << data_name << " (" << tokens.size() << " tokens)\n";
    }
    spillway::trace::track_id compute_track = recorder ? recorder->track("trainer") : 0;
    auto process_cpu_ms = [] {
        timespec ts{};
        ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
        return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
    };
    const std::size_t layer_act_bytes = block_floats * sizeof(float) * static_cast<std::size_t>(config.num_layers);
    // What keeping every activation would hold: the layers plus the model's own buffers, which
    // the first forward allocates.
    auto all_kept_bytes = [&] { return layer_act_bytes + model.fixed_activation_bytes(); };
    // The offloaded optimizer's ascending steps run under the next forward (deferred_update),
    // in one process: with ranks, the parameter gather needs every shard's update first.
    deferred_update deferred;
    optim->on_progress([&deferred](std::size_t done) { deferred.progress(done); });
    int steps_deferred = 0, steps_under_backward = 0;
    for (std::int64_t step = state.next_step; step < opt.steps; ++step) {
        auto t0 = clock_type::now();
        const double cpu0 = process_cpu_ms();
        fill_batch(tokens, step, B, T, row0, rows, inputs, targets);
        store->reset_peak();
        // The optimizer state of the first subgroups the update visits does not depend on this
        // step's gradients: an offloaded optimizer reads it while forward and backward compute.
        // (With an update still running, the pipeline is that update's: prefetch after it.)
        if (!deferred.running()) optim->prefetch();
        auto tf = clock_type::now();
        gpt2::param_gate gate;
        if (deferred.running())
            gate = [&](int layer) { deferred.wait_for(model.layout().layer_range(layer).second); };
        float local_loss = model.forward(inputs.data(), targets.data(), rows, T, *store, gate);
        if (deferred.running()) {
            auto [u0, u1] = deferred.finish();
            if (recorder)
                recorder->complete(compute_track, "optimizer step (under forward " + std::to_string(step) + ")", u0, u1);
            optim->prefetch();  // the next update's first reads now run under backward
        }
        // The offloaded optimizer's descending steps run under backward (one process, fp32
        // gradients): the walk starts at the last layers, whose gradients backward finishes
        // first, and each subgroup waits for backward to announce its gradients final.
        const bool under_backward = opt.update_under_backward && nranks == 1 && opt.grads == grad_dtype::fp32 &&
                                    state.loss_scale == 1.0f &&  // (its gradients are taken as unscaled)
                                    optim->next_step_under_backward();
        backward_progress progress;
        if (under_backward) {
            deferred.start([o = optim.get(), t = state.adam_steps + 1, grads = std::span<const float>(model.grads()),
                            params = model.params(), gate = progress.gate()] { o->step_under_backward(t, grads, params, gate); });
            ++steps_under_backward;
        }
        auto tb = clock_type::now();
        // Each rank's loss is the mean over its rows: weighted by rows/B, the gradients summed
        // over the ranks are those of the global mean.
        try {
            gpt2::grads_final_fn announce;
            if (under_backward) announce = [&progress](std::size_t from) { progress.advance(from); };
            model.backward(state.loss_scale * static_cast<float>(rows) / static_cast<float>(B), *store, announce);
        } catch (...) {
            progress.abandon();
            deferred.join_quietly();
            throw;
        }
        auto ta = clock_type::now();
        dist::allreduce_sum(model.grads());
        float loss = static_cast<float>(dist::allreduce_sum(static_cast<double>(local_loss) * rows) / B);
        double comm_ms = ms_since(ta);
        if (recorder) {
            recorder->complete(compute_track, "forward " + std::to_string(step), tf, tb);
            recorder->complete(compute_track, "backward " + std::to_string(step), tb, ta);
            if (nranks > 1) recorder->complete(compute_track, "gradient exchange " + std::to_string(step), ta, clock_type::now());
        }

        // Narrow the gradients to the chosen dtype (kept in host memory; widened lazily
        // inside the AdamW step) and check for overflow over all of them.
        auto tu = clock_type::now();
        grad_span grads;
        if (opt.grads == grad_dtype::fp32) grads = std::span<const float>(model.grads());
        else if (opt.grads == grad_dtype::bf16) {
            spillway::narrow(std::span<const float>(model.grads()), std::span<spillway::bfloat16>(grads_bf16));
            grads = std::span<const spillway::bfloat16>(grads_bf16);
        } else {
            spillway::narrow(std::span<const float>(model.grads()), std::span<spillway::float16>(grads_fp16));
            grads = std::span<const spillway::float16>(grads_fp16);
        }
        // After the exchange every rank holds the same gradients: each checks its own shard
        // (the optimizer's check, which its step then reuses) and the ranks combine the verdicts.
        grad_span mine = std::visit([&](auto g) -> grad_span { return g.subspan(lo, hi - lo); }, grads);
        // (A step under backward checks each subgroup's gradients itself, as it takes them.)
        const double sum_squares = under_backward ? 0.0 : optim->check(state.loss_scale, mine);
        auto tv = clock_type::now();
        bool finite = !dist::any(!std::isfinite(sum_squares));
        auto tc = clock_type::now();
        if (recorder && !under_backward) {
            recorder->complete(compute_track, "gradient check", tu, tv);
            if (nranks > 1) recorder->complete(compute_track, "overflow verdict", tv, tc);
        }
        // I/O wait: activations in backward, and forward's waits for parameters still being
        // updated (a deferred step: its own waits ran under the forward).
        double io_wait = model.times().act_wait_ms + model.times().param_wait_ms;
        bool deferred_now = false;
        if (finite) {
            ++state.adam_steps;
            const bool save_due = !opt.save_dir.empty() && (step + 1) % opt.save_every == 0;
            deferred_now = !under_backward && opt.update_under_forward && nranks == 1 && step + 1 < opt.steps &&
                           !save_due && optim->next_step_ascending();
            if (under_backward) {
                try {
                    auto [u0, u1] = deferred.finish();
                    if (recorder)
                        recorder->complete(compute_track, "optimizer step (under backward " + std::to_string(step) + ")", u0, u1);
                } catch (const spillway::gradient_overflow_error& e) {
                    throw std::runtime_error("step " + std::to_string(step + 1) + ": " + e.what() +
                                             " (the update ran under backward; with --update-under-backward off an "
                                             "overflow skips the step)");
                }
            } else if (deferred_now) {
                deferred.start([o = optim.get(), t = state.adam_steps, scale = state.loss_scale, mine,
                                params = model.params().subspan(lo, hi - lo)] { o->step(t, scale, mine, params); });
                ++steps_deferred;
            } else {
                optim->step(state.adam_steps, state.loss_scale, mine, model.params().subspan(lo, hi - lo));
                io_wait += optim->last_io_wait_ms();
            }
            auto tg = clock_type::now();
            if (recorder && !deferred_now) recorder->complete(compute_track, "optimizer step", tc, tg);
            dist::allgather(model.params(), shard);
            comm_ms += ms_since(tg);
            if (recorder && nranks > 1) recorder->complete(compute_track, "parameter gather", tg, clock_type::now());
        }
        // Dynamic loss scaling (fp16 only): halve on overflow, double after 500 good steps.
        if (opt.grads == grad_dtype::fp16) {
            if (!finite) {
                state.loss_scale = std::max(1.0f, state.loss_scale / 2);
                state.good_steps = 0;
            } else if (++state.good_steps >= 500) {
                state.loss_scale *= 2;
                state.good_steps = 0;
            }
        }
        double upd_ms = ms_since(tu);
        if (recorder) recorder->complete(compute_track, "update " + std::to_string(step), tu, clock_type::now());
        double step_ms = ms_since(t0);
        state.next_step = step + 1;
        losses.push_back(loss);
        if (std::isnan(first_loss)) first_loss = loss;
        last_loss = loss;
        double tok_s = static_cast<double>(BT) / (step_ms / 1e3);
        std::size_t act_peak = store->peak_bytes() + model.fixed_activation_bytes();
        totals.fwd += model.times().forward_ms;
        totals.bwd += model.times().backward_ms;
        totals.upd += upd_ms;
        totals.io += io_wait;
        totals.param_wait += model.times().param_wait_ms;
        totals.total += step_ms;
        if (report) {
            report->step_ms.push_back(step_ms);
            report->cpu_ms.push_back(process_cpu_ms() - cpu0);
            report->param_wait_ms.push_back(model.times().param_wait_ms);
            report->update_deferred.push_back(deferred_now);
            report->update_under_backward.push_back(under_backward);
            report->forward_ms.push_back(model.times().forward_ms);
            report->backward_ms.push_back(model.times().backward_ms);
            report->update_ms.push_back(upd_ms);
            report->io_wait_ms.push_back(io_wait);
            report->act_peak_bytes.push_back(act_peak);
        }
        if (totals.steps == 0) totals.act_peak_first = act_peak;
        else totals.act_peak = std::max(totals.act_peak, act_peak);
        ++totals.steps;
        if (!finite) ++totals.skipped;
        if (opt.json) {
            // cpu_ms: this process's CPU time in the step, all threads; act_all_kept_bytes:
            // what keeping every layer's activations would hold (act_peak_bytes' reference);
            // param_wait_ms: forward waiting for the previous step's deferred update (part of
            // forward_ms and io_wait_ms); update_deferred: this step's update runs under the
            // next forward (update_ms is then only the gradient check); update_under_backward:
            // it ran under this step's backward (update_ms is then what was left after it).
            char buf[800];
            std::snprintf(buf, sizeof buf,
                          "{\"step\":%lld,\"loss\":%.9g,\"ms\":%.3f,\"tokens_per_s\":%.1f,\"act_peak_bytes\":%zu,"
                          "\"act_all_kept_bytes\":%zu,\"forward_ms\":%.3f,\"backward_ms\":%.3f,\"update_ms\":%.3f,"
                          "\"io_wait_ms\":%.3f,\"param_wait_ms\":%.3f,\"update_deferred\":%s,"
                          "\"update_under_backward\":%s,\"comm_ms\":%.3f,"
                          "\"cpu_ms\":%.3f,\"loss_scale\":%g,\"skipped\":%s}\n",
                          static_cast<long long>(step), static_cast<double>(loss), step_ms, tok_s, act_peak, all_kept_bytes(),
                          model.times().forward_ms, model.times().backward_ms, upd_ms, io_wait,
                          model.times().param_wait_ms, deferred_now ? "true" : "false",
                          under_backward ? "true" : "false", comm_ms,
                          process_cpu_ms() - cpu0, static_cast<double>(state.loss_scale), finite ? "false" : "true");
            out << buf << std::flush;
        } else if (!opt.quiet) {
            char buf[256];
            std::snprintf(buf, sizeof buf,
                          "step %5lld/%d | loss %.4f | %8.0f tok/s | fwd %7.1f bwd %7.1f upd %6.1f io-wait %6.1f%s ms%s\n",
                          static_cast<long long>(step + 1), opt.steps, static_cast<double>(loss), tok_s,
                          model.times().forward_ms, model.times().backward_ms, upd_ms, io_wait,
                          nranks > 1 ? (" comm " + std::to_string(comm_ms).substr(0, 6)).c_str() : "",
                          !finite          ? " (overflow: step skipped)"
                          : deferred_now   ? " (update under the next forward)"
                          : under_backward ? " (update under backward)"
                                           : "");
            out << buf << std::flush;
        }
        if (!opt.save_dir.empty() && (step + 1) % opt.save_every == 0) {
            // The save protocol above; every rank writes its own optimizer shard.
            auto name = step_folder(step + 1);
            auto tmp = opt.save_dir / (name + ".tmp");
            std::error_code ec;
            if (rank == 0) {
                std::filesystem::remove_all(tmp, ec);
                make_save_dir(tmp);
            }
            dist::barrier();
            make_save_dir(tmp / shard_name);
            optim->save(tmp / shard_name);
            dist::barrier();
            if (rank == 0) {
                write_checkpoint(tmp / "model.bin", config, model.llmc_params());
                write_state(tmp / "train.state", state);
                fsync_dir(tmp);
                std::filesystem::remove_all(opt.save_dir / name, ec);
                std::filesystem::rename(tmp, opt.save_dir / name);
                fsync_dir(opt.save_dir);
                write_file_atomic(opt.save_dir / "latest",
                                  std::as_bytes(std::span<const char>(name.data(), name.size())));
                for (const auto& e : std::filesystem::directory_iterator(opt.save_dir)) {
                    auto fn = e.path().filename().string();
                    if (fn.rfind("step-", 0) == 0 && fn != name) std::filesystem::remove_all(e.path(), ec);
                }
            }
            dist::barrier();
        }
    }

    // 8. The end: --save-model and the summary.
    if (report) {
        report->all_kept_bytes = all_kept_bytes();
        report->layer_act_bytes = layer_act_bytes;
        report->flops_per_step = flops_tok * static_cast<double>(BT);
        report->params = nparams;
    }
    if (!opt.save_model.empty() && rank == 0) write_checkpoint(opt.save_model, config, model.llmc_params());
    if (recorder) {
        try {
            recorder->save(trace_file);
        } catch (const std::system_error& e) {
            throw input_error(trace_file.string() + ": cannot write the trace: " + e.what());
        }
    }
    if (!opt.json && totals.steps > 0) {
        double n = totals.steps;
        double tok_s = static_cast<double>(BT) * n / (totals.total / 1e3);
        out << "\nsummary (" << totals.steps << " steps, " << totals.skipped << " skipped)\n";
        char buf[256];
        std::snprintf(buf, sizeof buf, "  loss            %.4f -> %.4f (%.1f%% lower)\n",
                      static_cast<double>(first_loss), static_cast<double>(last_loss),
                      100.0 * (1.0 - static_cast<double>(last_loss / first_loss)));
        out << buf;
        std::snprintf(buf, sizeof buf, "  throughput      %.0f tokens/s, %.2f GFLOP/s (model FLOPs)\n", tok_s,
                      tok_s * flops_tok / 1e9);
        out << buf;
        out << "  matmul          " << blas::describe() << "\n";
        std::snprintf(buf, sizeof buf,
                      "  ms per step     %.1f total: forward %.1f, backward %.1f, update %.1f, I/O wait %.1f\n",
                      totals.total / n, totals.fwd / n, totals.bwd / n, totals.upd / n, totals.io / n);
        out << buf;
        if (steps_deferred > 0) {
            std::snprintf(buf, sizeof buf,
                          "  deferred update %d of %d updates ran under the next forward; forward waited %.1f ms per "
                          "step for their parameters\n",
                          steps_deferred, totals.steps - totals.skipped, totals.param_wait / n);
            out << buf;
        }
        if (steps_under_backward > 0) {
            std::snprintf(buf, sizeof buf, "  under backward  %d of %d updates ran under their own backward\n",
                          steps_under_backward, totals.steps - totals.skipped);
            out << buf;
        }
        const double all_kept = static_cast<double>(all_kept_bytes());
        const double peak = static_cast<double>(totals.steps > 1 ? totals.act_peak : totals.act_peak_first);
        char line[256];
        std::snprintf(line, sizeof line, "  activations     peak resident %s, all layers kept %s (%.0f%% %s)%s\n",
                      human_bytes(peak).c_str(), human_bytes(all_kept).c_str(), 100.0 * std::abs(1.0 - peak / all_kept),
                      peak <= all_kept ? "lower" : "higher: buffer alignment and the stash's pool at this tiny size",
                      totals.steps > 1 ? "; after the first step" : "");
        out << line;
        out << store->report();
        out << optim->report();
    }
    return losses;
}

}  // namespace mini_gpt
