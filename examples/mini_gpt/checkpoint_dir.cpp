// examples/mini_gpt/checkpoint_dir.cpp: the resumable save directory (checkpoint_dir.hpp).
#include "checkpoint_dir.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <system_error>
#include <type_traits>

#include "dist.hpp"
#include "llmc_format.hpp"
#include "spillway/io/durable_file.hpp"
#include "spillway/lock/lock_name.hpp"

namespace mini_gpt {

namespace {

constexpr std::uint64_t state_magic_v1 = 0x4d475054'53544154ull;  // "MGPTSTAT"
constexpr std::uint64_t state_magic = 0x4d475054'53544132ull;     // "MGPTSTA2"

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

const char* dtype_name(std::int32_t d) {
    switch (static_cast<grad_dtype>(d)) {
        case grad_dtype::fp32:
            return "fp32";
        case grad_dtype::bf16:
            return "bf16";
        case grad_dtype::fp16:
            return "fp16";
    }
    return "?";
}

/// Creates a folder of a save (mode 0700, see create_private_dirs); throws
/// std::filesystem::filesystem_error naming it on failure.
void make_save_dir(const std::filesystem::path& dir) {
    std::error_code ec;
    create_private_dirs(dir, ec);
    if (ec) throw std::filesystem::filesystem_error("cannot create the save folder", dir, ec);
}

/// The save folder `latest` names in `dir`.
std::filesystem::path latest_save(const std::filesystem::path& dir) {
    auto latest_file = dir / "latest";
    auto latest = read_file(latest_file);
    std::string name(latest.size(), '\0');
    std::memcpy(name.data(), latest.data(), latest.size());
    while (!name.empty() && (name.back() == '\n' || name.back() == '\r'))
        name.pop_back();  // (edited by hand)
    if (name.rfind("step-", 0) != 0 || name.find('/') != std::string::npos ||
        name.find_first_of(std::string("\0\n", 2)) != std::string::npos)
        throw input_error(latest_file.string() + ": does not name a save folder");
    return dir / name;
}

}  // namespace

std::uint64_t tokens_hash(const std::vector<std::uint16_t>& tokens) {
    return spillway::fnv1a_64(std::as_bytes(std::span(tokens)));
}

void write_state(const std::filesystem::path& path, train_state s) {
    std::vector<std::byte> b(sizeof state_magic);
    std::memcpy(b.data(), &state_magic, sizeof state_magic);
    state_fields(s, true, [&](auto& f) {
        const std::size_t at = b.size();
        b.resize(at + sizeof f);
        std::memcpy(b.data() + at, &f, sizeof f);
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
    if (b.size() != sizeof magic + (v2 ? state_bytes(true) : 32))
        throw input_error(path.string() + ": truncated state");
    train_state s;
    std::size_t at = sizeof magic;
    state_fields(s, v2, [&](auto& f) {
        using field_t = std::remove_reference_t<decltype(f)>;
        if (!v2)
            at = (at + alignof(field_t) - 1) / alignof(field_t) *
                 alignof(field_t);  // format 1's padding
        std::memcpy(&f, b.data() + at, sizeof f);
        at += sizeof f;
    });
    s.has_run_shape = v2;
    // Every field in range, or the file is refused by name (a negative step would read the
    // corpus before its start; a loss scale of 0 would be divided by).
    auto bad = [&](const std::string& what) {
        throw input_error(path.string() + ": corrupted state: " + what);
    };
    if (s.next_step < 1)
        bad("next step " + std::to_string(s.next_step) + " (a save follows at least one step)");
    if (s.adam_steps < 0 || s.adam_steps > s.next_step)
        bad(std::to_string(s.adam_steps) + " AdamW steps after " + std::to_string(s.next_step) +
            " steps");
    if (!(std::isfinite(s.loss_scale) && s.loss_scale >= 1.0f))
        bad("loss scale " + std::to_string(s.loss_scale) + " (finite and at least 1)");
    if (s.good_steps < 0 || s.good_steps > s.next_step)
        bad("good-step count " + std::to_string(s.good_steps));
    if (v2 && (s.shape.grads < 0 || s.shape.grads > 2))
        bad("gradient type " + std::to_string(s.shape.grads));
    return s;
}

std::string step_folder(std::int64_t step) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
    return buf;
}

std::string shard_folder(int rank, int ranks) {
    return "shard-" + std::to_string(rank) + "-of-" + std::to_string(ranks);
}

void save_checkpoint(const std::filesystem::path& save_dir, std::int64_t steps_done,
                     const gpt2& model, optimizer& optim, const train_state& state) {
    const int rank = dist::rank();
    const std::string name = step_folder(steps_done);
    const std::string shard = shard_folder(rank, dist::size());
    const auto tmp = save_dir / (name + ".tmp");
    std::error_code ec;
    if (rank == 0) {  // 1.
        std::filesystem::remove_all(tmp, ec);
        make_save_dir(tmp);
    }
    dist::barrier();
    make_save_dir(tmp / shard);
    optim.save(tmp / shard);
    dist::barrier();
    if (rank == 0) {
        write_checkpoint(tmp / "model.bin", model.config(), model.llmc_params());
        write_state(tmp / "train.state", state);
        spillway::sync_directory(tmp);
        spillway::replace_directory(tmp, save_dir / name);  // 2.
        write_file_atomic(save_dir / "latest",
                          std::as_bytes(std::span<const char>(name.data(), name.size())));  // 3.
        for (const auto& e : std::filesystem::directory_iterator(save_dir)) {               // 4.
            auto fn = e.path().filename().string();
            if (fn.rfind("step-", 0) == 0 && fn != name) std::filesystem::remove_all(e.path(), ec);
        }
    }
    dist::barrier();
}

train_state resume_checkpoint(const std::filesystem::path& resume_dir, const options& opt,
                              const std::string& data_name, gpt2& model, optimizer& optim,
                              std::span<float> shard, const train_state& state) {
    const auto dir = latest_save(resume_dir);
    checkpoint ck = read_checkpoint(dir / "model.bin");
    if (!(ck.config == model.config()))
        throw input_error((dir / "model.bin").string() +
                          ": the saved model's config differs from this run's");
    model.load_llmc_params(ck.params);
    const train_state::run_shape run = state.shape;
    train_state saved_state = read_state(dir / "train.state");
    if (saved_state.has_run_shape) {
        const auto& saved = saved_state.shape;
        const std::string file = (dir / "train.state").string();
        if (saved.grads != run.grads)
            throw input_error("--grad-dtype " + std::string(dtype_name(run.grads)) + ": the save " +
                              file + " was made with " + dtype_name(saved.grads) +
                              " gradients (its loss scale belongs to them); resume with that type");
        if (saved.batch != run.batch || saved.seq != run.seq)
            throw input_error("--batch " + std::to_string(run.batch) + " --seq " +
                              std::to_string(run.seq) + ": the save " + file +
                              " was made with --batch " + std::to_string(saved.batch) + " --seq " +
                              std::to_string(saved.seq) + "; resuming replays the same batches");
        if (saved.tokens != run.tokens || saved.tokens_hash != run.tokens_hash)
            throw input_error(data_name + ": not the data the save " + file + " was made on (" +
                              std::to_string(saved.tokens) + " tokens there, " +
                              std::to_string(run.tokens) + " here" +
                              (saved.tokens == run.tokens ? ", other values" : "") + ")");
    }
    saved_state.has_run_shape = true;  // the next save records this run's (format 2)
    saved_state.shape = run;
    if (saved_state.next_step > opt.steps)
        throw input_error("--steps " + std::to_string(opt.steps) + ": the save " + dir.string() +
                          " is already at step " + std::to_string(saved_state.next_step) +
                          "; ask for more steps");
    const auto shard_dir = dir / shard_folder(dist::rank(), dist::size());
    if (!std::filesystem::is_directory(shard_dir))
        throw input_error(shard_dir.string() +
                          ": missing (was the save made with another number of ranks?)");
    optim.load(shard_dir, shard);
    return saved_state;
}

}  // namespace mini_gpt
