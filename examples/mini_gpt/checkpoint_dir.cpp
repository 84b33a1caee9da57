// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/checkpoint_dir.cpp: the resumable save directory (checkpoint_dir.hpp).
#include "checkpoint_dir.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <optional>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>

#include <unistd.h>

#include "dist.hpp"
#include "llmc_format.hpp"
#include "spillway/io/durable_file.hpp"
#include "spillway/lock/lock_name.hpp"

namespace mini_gpt {

namespace {

/// The save's own manifest (see checkpoint_dir.hpp).
constexpr const char* manifest_file = "save.manifest";

constexpr std::uint64_t state_magic_v1 = 0x4d475054'53544154ull;  // "MGPTSTAT"
constexpr std::uint64_t state_magic_v2 = 0x4d475054'53544132ull;  // "MGPTSTA2"
constexpr std::uint64_t state_magic_v3 = 0x4d475054'53544133ull;  // "MGPTSTA3"
constexpr std::uint64_t state_magic = 0x4d475054'53544134ull;     // "MGPTSTA4"

// The fields in order, each as its bytes (little-endian on every machine this runs on);
// formats 2 and 3 have the same fields; format 4 adds the schedule's after them.
template <class Fn>
void state_fields(train_state& s, bool v2, bool v4, Fn&& field) {
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
    if (!v4) return;
    field(s.schedule.decay);  // (an int: lr_decay's underlying type)
    field(s.schedule.lr);
    field(s.schedule.lr_min);
    field(s.schedule.warmup_steps);
    field(s.schedule.total_steps);
}
std::size_t state_bytes(bool v2, bool v4) {
    std::size_t n = 0;
    train_state probe;
    state_fields(probe, v2, v4, [&](auto& f) { n += sizeof f; });
    return n;
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

/// One file of a save as save.manifest records it.
struct manifest_entry {
    std::string name;  // relative to the save folder: "model.bin", "shard-0-of-1/moments.bin"
    std::size_t nbytes = 0;
    std::uint32_t crc = 0;
};

/// `v` as 8 lowercase hex digits, as save.manifest writes a CRC.
std::string hex32(std::uint32_t v) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%08x", v);
    return buf;
}

/// The size and CRC-32C of a file, read in 1 MiB pieces (the optimizer's moments need not fit
/// twice in memory); opened by read_file's rules (a FIFO or a directory is refused, named).
std::pair<std::size_t, std::uint32_t> file_crc(const std::filesystem::path& path) {
    spillway::unique_fd fd;
    try {
        fd = spillway::open_regular_file(path, "");
    } catch (const std::system_error& e) {
        throw input_error(e.what());
    }
    std::vector<std::byte> buf(std::size_t{1} << 20);
    std::size_t nbytes = 0;
    std::uint32_t crc = 0;
    for (;;) {
        const ssize_t n = ::read(fd.get(), buf.data(), buf.size());
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw input_error(path.string() + ": read failed: " + std::strerror(errno));
        if (n == 0) break;
        crc = spillway::crc32c(std::span(buf.data(), static_cast<std::size_t>(n)), crc);
        nbytes += static_cast<std::size_t>(n);
    }
    return {nbytes, crc};
}

/// Whether save.manifest covers the file at `rel` (a path relative to the save folder): every
/// file but the optimizer's subgroup files under shard-*/optimizer/, which that folder's own
/// manifest.txt lists with their CRCs (save.manifest covers that manifest.txt).
bool covered(const std::filesystem::path& rel) {
    auto it = rel.begin();
    if (it == rel.end() || it->string().rfind("shard-", 0) != 0) return true;
    if (++it == rel.end() || *it != "optimizer") return true;
    return ++it != rel.end() && *it == "manifest.txt" && std::next(it) == rel.end();
}

/// The entries of every covered file under `dir`, sorted by name.
std::vector<manifest_entry> list_save_files(const std::filesystem::path& dir) {
    std::vector<manifest_entry> entries;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
        if (e.symlink_status().type() == std::filesystem::file_type::directory) continue;
        const auto rel = e.path().lexically_relative(dir);
        if (!covered(rel)) continue;
        const auto [nbytes, crc] = file_crc(e.path());
        entries.push_back({rel.generic_string(), nbytes, crc});
    }
    std::sort(entries.begin(), entries.end(),
              [](const auto& a, const auto& b) { return a.name < b.name; });
    return entries;
}

/// The text of save.manifest:
///   mini_gpt-save 1
///   file <bytes> <CRC-32C, 8 hex digits> <name>     (one line per covered file)
///   manifest_crc <CRC-32C of every byte before this line>
///   end
std::string manifest_text(const std::vector<manifest_entry>& entries) {
    std::string text = "mini_gpt-save 1\n";
    for (const auto& e : entries)
        text += "file " + std::to_string(e.nbytes) + " " + hex32(e.crc) + " " + e.name + "\n";
    const std::uint32_t crc = spillway::crc32c(std::as_bytes(std::span(text.data(), text.size())));
    return text + "manifest_crc " + hex32(crc) + "\nend\n";
}

/// Parses save.manifest's text; throws input_error naming `path` when it is damaged.
std::vector<manifest_entry> parse_manifest(std::string_view text,
                                           const std::filesystem::path& path) {
    auto bad = [&](const std::string& what) {
        throw input_error(path.string() + ": damaged save manifest: " + what);
    };
    const std::string_view head = "mini_gpt-save 1\n";
    if (!text.starts_with(head)) bad("no \"mini_gpt-save 1\" header");
    const auto crc_at = text.rfind("manifest_crc ");
    if (crc_at == std::string_view::npos || crc_at == 0 || text[crc_at - 1] != '\n')
        bad("no manifest_crc line");
    const std::string tail(text.substr(crc_at));
    unsigned recorded = 0;
    char end[8] = {};
    int used = 0;
    if (std::sscanf(tail.c_str(), "manifest_crc %8x\n%3s\n%n", &recorded, end, &used) != 2 ||
        std::string_view(end) != "end" || static_cast<std::size_t>(used) != tail.size())
        bad("malformed or truncated manifest_crc line");
    const std::uint32_t crc = spillway::crc32c(std::as_bytes(std::span(text.data(), crc_at)));
    if (crc != recorded)
        bad("its CRC-32C is " + hex32(crc) + ", its manifest_crc line says " + hex32(recorded));
    std::vector<manifest_entry> entries;
    std::size_t at = head.size();
    while (at < crc_at) {
        const auto eol = text.find('\n', at);
        const std::string line(text.substr(at, eol - at));
        at = eol + 1;
        unsigned long long nbytes = 0;
        unsigned crc_field = 0;
        int name_at = 0;
        if (std::sscanf(line.c_str(), "file %llu %8x %n", &nbytes, &crc_field, &name_at) != 2 ||
            name_at == 0 || static_cast<std::size_t>(name_at) >= line.size())
            bad("malformed line \"" + line + "\"");
        const std::filesystem::path name = line.substr(static_cast<std::size_t>(name_at));
        for (const auto& part : name)
            if (part == ".." || part == "." || part.empty())
                bad("file name \"" + name.string() + "\"");
        if (name.is_absolute()) bad("file name \"" + name.string() + "\"");
        entries.push_back({name.generic_string(), static_cast<std::size_t>(nbytes), crc_field});
    }
    return entries;
}

/// The entries of the save `dir`'s manifest, or none for a save made before manifests (see
/// resume_checkpoint for how the two are told apart).
std::optional<std::vector<manifest_entry>> read_manifest(const std::filesystem::path& dir) {
    const auto path = dir / manifest_file;
    std::error_code ec;
    if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec))) return std::nullopt;
    const auto bytes = read_file(path);
    return parse_manifest(
        std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path);
}

/// Refuses `path` (as `name` in the manifest of its save) unless its size and CRC are the ones
/// recorded.
void check_entry(const std::vector<manifest_entry>& manifest, const std::filesystem::path& dir,
                 const std::string& name, std::size_t nbytes, std::uint32_t crc) {
    const auto path = dir / name;
    const auto it = std::find_if(manifest.begin(), manifest.end(),
                                 [&](const auto& e) { return e.name == name; });
    if (it == manifest.end())
        throw input_error(path.string() + ": not listed in " + (dir / manifest_file).string() +
                          " (not a file of this save)");
    if (nbytes != it->nbytes)
        throw input_error(path.string() + ": " + std::to_string(nbytes) + " bytes, " +
                          manifest_file + " records " + std::to_string(it->nbytes) +
                          " (truncated or replaced since the save)");
    if (crc != it->crc)
        throw input_error(path.string() + ": corrupted: its CRC-32C is 0x" + hex32(crc) + ", " +
                          manifest_file + " records 0x" + hex32(it->crc));
}

/// Reads the file `name` of the save `dir`, checked against its manifest when it has one.
std::vector<std::byte> read_checked(const std::optional<std::vector<manifest_entry>>& manifest,
                                    const std::filesystem::path& dir, const std::string& name) {
    auto bytes = read_file(dir / name);
    if (manifest) check_entry(*manifest, dir, name, bytes.size(), spillway::crc32c(bytes));
    return bytes;
}

/// Checks every file of the folder `shard` (relative to `dir`) that the manifest lists; a file
/// it lists that is gone is refused by name.
void check_shard_files(const std::vector<manifest_entry>& manifest,
                       const std::filesystem::path& dir, const std::string& shard) {
    for (const auto& e : manifest) {
        if (e.name.rfind(shard + "/", 0) != 0) continue;
        const auto path = dir / e.name;
        std::error_code ec;
        if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec)))
            throw input_error(path.string() + ": missing (" + manifest_file + " lists it)");
        const auto [nbytes, crc] = file_crc(path);
        check_entry(manifest, dir, e.name, nbytes, crc);
    }
}

/// The flags that give schedule `s` (cli.cpp's lr_schedule_of), as a refusal names them:
/// each number in the shortest text that reads back as the same float.
std::string schedule_flags(const spillway::lr_schedule& s) {
    auto num = [](float x) {
        char buf[32];
        return std::string(buf, std::to_chars(buf, buf + sizeof buf, x).ptr);
    };
    const bool cosine = s.decay == spillway::lr_decay::cosine;
    std::string out = std::string("--lr-schedule ") + (cosine ? "cosine" : "constant") + " --lr " +
                      num(s.lr);
    if (cosine) out += " --lr-min " + num(s.lr_min);
    out += " --warmup-steps " + std::to_string(s.warmup_steps);
    if (cosine) out += " --steps " + std::to_string(s.total_steps);
    return out;
}

}  // namespace

std::uint64_t tokens_hash(const std::vector<std::uint16_t>& tokens) {
    return spillway::fnv1a_64(std::as_bytes(std::span(tokens)));
}

void write_state(const std::filesystem::path& path, train_state s) {
    std::vector<std::byte> b(sizeof state_magic);
    std::memcpy(b.data(), &state_magic, sizeof state_magic);
    state_fields(s, true, true, [&](auto& f) {
        const std::size_t at = b.size();
        b.resize(at + sizeof f);
        std::memcpy(b.data() + at, &f, sizeof f);
    });
    write_file_atomic(path, b);
}

train_state read_state(const std::filesystem::path& path) {
    return parse_state(read_file(path), path);
}

train_state parse_state(std::span<const std::byte> b, const std::filesystem::path& path) {
    std::uint64_t magic = 0;
    if (b.size() < sizeof magic) throw input_error(path.string() + ": truncated state");
    std::memcpy(&magic, b.data(), sizeof magic);
    if (magic != state_magic && magic != state_magic_v3 && magic != state_magic_v2 &&
        magic != state_magic_v1)
        throw input_error(path.string() + ": bad magic (not a mini_gpt train.state)");
    const bool v2 = magic != state_magic_v1, v4 = magic == state_magic;
    // Format 1 wrote the struct of its four fields with its padding: 32 bytes.
    if (b.size() != sizeof magic + (v2 ? state_bytes(true, v4) : 32))
        throw input_error(path.string() + ": truncated state");
    train_state s;
    std::size_t at = sizeof magic;
    state_fields(s, v2, v4, [&](auto& f) {
        using field_t = std::remove_reference_t<decltype(f)>;
        if (!v2)
            at = (at + alignof(field_t) - 1) / alignof(field_t) *
                 alignof(field_t);  // format 1's padding
        std::memcpy(&f, b.data() + at, sizeof f);
        at += sizeof f;
    });
    s.has_run_shape = v2;
    s.has_schedule = v4;
    s.format = v4 ? 4 : magic == state_magic_v3 ? 3 : v2 ? 2 : 1;
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
    if (v4) {
        try {
            spillway::validate(s.schedule);
        } catch (const std::invalid_argument& e) {
            bad(e.what());
        }
    }
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
                     const gpt2& model, optimizer& optim, const train_state& state,
                     streamed_params* streamed) {
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
    if (!streamed) {
        make_save_dir(tmp / shard);
        optim.save(tmp / shard);
    }
    dist::barrier();
    if (rank == 0) {
        if (streamed) {  // layer by layer from the streams, no model-sized buffer
            streamed->write_llmc(tmp / "model.bin");
            streamed->write_moments(tmp / streamed_moments_file);
        } else {
            write_checkpoint(tmp / "model.bin", model.config(), model.llmc_params());
        }
        write_state(tmp / "train.state", state);
        const std::string text = manifest_text(list_save_files(tmp));  // last: every file is in
        spillway::write_file(tmp / manifest_file,
                             std::as_bytes(std::span(text.data(), text.size())), "save manifest");
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
                              std::span<float> shard, const train_state& state,
                              streamed_params* streamed) {
    const auto dir = latest_save(resume_dir);
    const auto manifest = read_manifest(dir);
    train_state saved_state =
        parse_state(read_checked(manifest, dir, "train.state"), dir / "train.state");
    // A save without a manifest was made before manifests (train.state format 1 or 2) and is
    // resumed unchecked; format 3 is only ever written beside one, so its manifest was lost.
    if (!manifest && saved_state.format >= 3)
        throw input_error((dir / manifest_file).string() +
                          ": missing (the save's train.state is format " +
                          std::to_string(saved_state.format) +
                          ", written beside its manifest; without it the files cannot be checked)");
    std::error_code ec;
    const bool saved_streamed =
        std::filesystem::exists(std::filesystem::symlink_status(dir / streamed_moments_file, ec));
    if (streamed && !saved_streamed)
        throw input_error((dir / streamed_moments_file).string() +
                          ": missing (the save was made without --offload params; resume it "
                          "with the --offload it was made with)");
    if (!streamed && saved_streamed)
        throw input_error(dir.string() +
                          ": a save made with --offload params (its AdamW moments are in " +
                          streamed_moments_file + "); resume it with --offload params");
    if (!streamed) {
        checkpoint ck =
            parse_checkpoint(read_checked(manifest, dir, "model.bin"), dir / "model.bin");
        if (!(ck.config == model.config()))
            throw input_error((dir / "model.bin").string() +
                              ": the saved model's config differs from this run's");
        model.load_llmc_params(ck.params);
    } else if (manifest) {  // checked in pieces: neither file is held whole
        for (const char* name : {"model.bin", streamed_moments_file}) {
            const auto [nbytes, crc] = file_crc(dir / name);
            check_entry(*manifest, dir, name, nbytes, crc);
        }
    }
    const train_state::run_shape run = state.shape;
    if (saved_state.has_run_shape) {
        const auto& saved = saved_state.shape;
        const std::string file = (dir / "train.state").string();
        if (saved.grads != run.grads)
            throw input_error("--grad-dtype " +
                              std::string(dtype_name(static_cast<grad_dtype>(run.grads))) +
                              ": the save " + file + " was made with " +
                              dtype_name(static_cast<grad_dtype>(saved.grads)) +
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
    if (saved_state.has_schedule && saved_state.schedule != state.schedule)
        throw input_error(schedule_flags(state.schedule) + ": the save " +
                          (dir / "train.state").string() + " was made with " +
                          schedule_flags(saved_state.schedule) +
                          "; resume with its schedule (another would not give the same steps)");
    saved_state.has_run_shape = true;  // the next save records this run's (format 4)
    saved_state.shape = run;
    saved_state.has_schedule = true;
    saved_state.schedule = state.schedule;
    if (saved_state.next_step > opt.steps)
        throw input_error("--steps " + std::to_string(opt.steps) + ": the save " + dir.string() +
                          " is already at step " + std::to_string(saved_state.next_step) +
                          "; ask for more steps");
    if (streamed) {
        streamed->load(dir / "model.bin", dir / streamed_moments_file);
        return saved_state;
    }
    const auto shard_dir = dir / shard_folder(dist::rank(), dist::size());
    if (!std::filesystem::is_directory(shard_dir))
        throw input_error(shard_dir.string() +
                          ": missing (was the save made with another number of ranks?)");
    if (manifest) check_shard_files(*manifest, dir, shard_folder(dist::rank(), dist::size()));
    optim.load(shard_dir, shard);
    return saved_state;
}

}  // namespace mini_gpt
