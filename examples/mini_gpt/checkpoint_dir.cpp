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
#include <ostream>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dist.hpp"
#include "llmc_format.hpp"
#include "spillway/error.hpp"
#include "spillway/io/durable_file.hpp"
#include "spillway/lock/lock_name.hpp"

namespace mini_gpt {

namespace {

/// The save's own manifest (see checkpoint_dir.hpp).
constexpr const char* manifest_file = "save.manifest";

// Formats 1 and 2, written before saves had manifests: recognised only to be refused by name.
constexpr std::uint64_t state_magic_v1 = 0x4d475054'53544154ull;  // "MGPTSTAT"
constexpr std::uint64_t state_magic_v2 = 0x4d475054'53544132ull;  // "MGPTSTA2"
constexpr std::uint64_t state_magic_v3 = 0x4d475054'53544133ull;  // "MGPTSTA3"
constexpr std::uint64_t state_magic = 0x4d475054'53544134ull;     // "MGPTSTA4"

// Format 3's fields in order, each as its bytes (little-endian on every machine this runs on);
// format 4 adds the schedule's after them.
template <class Fn>
void state_fields(train_state& s, bool v4, Fn&& field) {
    field(s.next_step);
    field(s.adam_steps);
    field(s.loss_scale);
    field(s.good_steps);
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
std::size_t state_bytes(bool v4) {
    std::size_t n = 0;
    train_state probe;
    state_fields(probe, v4, [&](auto& f) { n += sizeof f; });
    return n;
}

/// Creates a folder of a save (mode 0700, see create_private_dirs); throws
/// std::filesystem::filesystem_error naming it on failure.
void make_save_dir(const std::filesystem::path& dir) {
    std::error_code ec;
    create_private_dirs(dir, ec);
    if (ec) throw std::filesystem::filesystem_error("cannot create the save folder", dir, ec);
}

/// Whether `name` is one of the names step_folder writes: "step-" and the digits of a step of
/// at least 1, nothing more, nothing less ("step-00000007"; not "step-7", "step-notes").
bool save_folder_name(std::string_view name) {
    if (!name.starts_with("step-") || name.size() > 5 + 18) return false;
    std::int64_t step = 0;
    for (const char c : name.substr(5)) {
        if (c < '0' || c > '9') return false;
        step = step * 10 + (c - '0');
    }
    return step >= 1 && step_folder(step) == name;
}

/// The save folder `latest` names in `dir`; a name that is not a save folder's, or one that
/// is not there, is blamed on `latest` itself.
std::filesystem::path latest_save(const std::filesystem::path& dir) {
    auto latest_file = dir / "latest";
    auto latest = read_file(latest_file);
    std::string name(latest.size(), '\0');
    std::memcpy(name.data(), latest.data(), latest.size());
    while (!name.empty() && (name.back() == '\n' || name.back() == '\r'))
        name.pop_back();  // (edited by hand)
    const std::string blame =
        spillway::quoted(latest_file.string()) + ": names " + spillway::quoted(name) + ", ";
    if (!save_folder_name(name))
        throw input_error(blame + "not a save folder (step- and 8 digits)");
    std::error_code ec;
    if (std::filesystem::symlink_status(dir / name, ec).type() !=
        std::filesystem::file_type::directory)
        throw input_error(blame + "which is not a save folder in " +
                          spillway::quoted(dir.string()) + " (damaged, or edited since the save)");
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
    // The CRC covers every byte before its line, and nothing may follow that line but
    // "end\n": the text after the CRC must be exactly the one manifest_text writes for it, so
    // no byte of the file escapes the check.
    const std::string_view tail = text.substr(crc_at);
    unsigned recorded = 0;
    if (std::sscanf(std::string(tail.substr(0, 21)).c_str(), "manifest_crc %8x", &recorded) != 1 ||
        tail != "manifest_crc " + hex32(recorded) + "\nend\n")
        bad("its manifest_crc line is malformed or truncated, or bytes follow it");
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
            bad("malformed line " + spillway::quoted(line));
        const std::filesystem::path name = line.substr(static_cast<std::size_t>(name_at));
        for (const auto& part : name)
            if (part == ".." || part == "." || part.empty())
                bad("file name " + spillway::quoted(name.string()));
        if (name.is_absolute()) bad("file name " + spillway::quoted(name.string()));
        entries.push_back({name.generic_string(), static_cast<std::size_t>(nbytes), crc_field});
    }
    return entries;
}

/// The entries of the save `dir`'s manifest. A folder without one is not a save this version
/// reads, whatever its train.state says (see checkpoint_dir.hpp).
std::vector<manifest_entry> read_manifest(const std::filesystem::path& dir) {
    const auto path = dir / manifest_file;
    std::error_code ec;
    if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec)))
        throw input_error(spillway::quoted(path.string()) +
                          ": missing (every save has one; without it the save's files cannot be "
                          "checked, so the save is not read)");
    const auto bytes = read_file(path);
    return parse_manifest(
        std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path);
}

/// Whether the manifest lists the file `name`.
bool listed(const std::vector<manifest_entry>& manifest, const std::string& name) {
    return std::any_of(manifest.begin(), manifest.end(),
                       [&](const auto& e) { return e.name == name; });
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

/// Reads the file `name` of the save `dir`, checked against its manifest.
std::vector<std::byte> read_checked(const std::vector<manifest_entry>& manifest,
                                    const std::filesystem::path& dir, const std::string& name) {
    auto bytes = read_file(dir / name);
    check_entry(manifest, dir, name, bytes.size(), spillway::crc32c(bytes));
    return bytes;
}

/// Checks the file `name` of the save `dir` against its manifest, reading it in pieces; a
/// file the manifest lists that is gone is refused as missing, by name.
void check_listed_file(const std::vector<manifest_entry>& manifest,
                       const std::filesystem::path& dir, const std::string& name) {
    const auto path = dir / name;
    std::error_code ec;
    if (listed(manifest, name) &&
        !std::filesystem::exists(std::filesystem::symlink_status(path, ec)))
        throw input_error(path.string() + ": missing (" + manifest_file + " lists it)");
    const auto [nbytes, crc] = file_crc(path);
    check_entry(manifest, dir, name, nbytes, crc);
}

/// Checks every file of the folder `shard` (relative to `dir`) that the manifest lists.
void check_shard_files(const std::vector<manifest_entry>& manifest,
                       const std::filesystem::path& dir, const std::string& shard) {
    for (const auto& e : manifest)
        if (e.name.rfind(shard + "/", 0) == 0) check_listed_file(manifest, dir, e.name);
}

/// Whether `dir` is a save folder this program wrote (protocol step 5): a folder, not a link,
/// with a name step_folder writes, holding a save.manifest that parses with its CRC.
bool own_save(const std::filesystem::path& dir) {
    std::error_code ec;
    if (!save_folder_name(dir.filename().string()) ||
        std::filesystem::symlink_status(dir, ec).type() != std::filesystem::file_type::directory ||
        std::filesystem::symlink_status(dir / manifest_file, ec).type() !=
            std::filesystem::file_type::regular)
        return false;
    try {
        read_manifest(dir);
        return true;
    } catch (const input_error&) {
        return false;
    }
}

/// Whether `tmp` holds nothing but names a save writes (protocol step 1): the leftover of a
/// save that was killed, which may go.
bool only_save_files(const std::filesystem::path& tmp) {
    std::error_code ec;
    if (std::filesystem::symlink_status(tmp, ec).type() != std::filesystem::file_type::directory)
        return false;
    for (const auto& e : std::filesystem::directory_iterator(tmp, ec)) {
        std::string fn = e.path().filename().string();
        if (fn.ends_with(".tmp")) fn.resize(fn.size() - 4);  // write_file_atomic's
        const bool file = e.symlink_status().type() == std::filesystem::file_type::regular;
        const bool folder = e.symlink_status().type() == std::filesystem::file_type::directory;
        if (!(file && (fn == "model.bin" || fn == "train.state" || fn == manifest_file ||
                       fn == streamed_moments_file)) &&
            !(folder && fn.starts_with("shard-")))
            return false;
    }
    return !ec;
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
    state_fields(s, true, [&](auto& f) {
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
    if (magic == state_magic_v1 || magic == state_magic_v2)
        throw input_error(path.string() + ": train.state format " +
                          (magic == state_magic_v1 ? "1" : "2") +
                          ", of a save made before manifests, is not read (its files cannot be "
                          "checked); start from its model.bin with --model instead");
    if (magic != state_magic && magic != state_magic_v3)
        throw input_error(path.string() + ": bad magic (not a mini_gpt train.state)");
    const bool v4 = magic == state_magic;
    if (b.size() != sizeof magic + state_bytes(v4))
        throw input_error(path.string() + ": truncated state");
    train_state s;
    std::size_t at = sizeof magic;
    state_fields(s, v4, [&](auto& f) {
        std::memcpy(&f, b.data() + at, sizeof f);
        at += sizeof f;
    });
    s.has_run_shape = true;
    s.has_schedule = v4;
    s.format = v4 ? 4 : 3;
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
    if (s.shape.grads < 0 || s.shape.grads > 2)
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

save_directory::save_directory(std::filesystem::path dir, std::ostream& notes)
    : dir_(std::move(dir)), notes_(&notes) {
    if (dist::rank() != 0) return;
    const auto file = dir_ / "save.lock";
    const std::string named = "--save " + spillway::quoted(dir_.string());
    spillway::unique_fd fd(
        ::open(file.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600));
    struct stat st {};
    if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0)
        throw input_error(named + ": cannot open its lock " + spillway::quoted(file.string()) +
                          ": " + std::strerror(errno));
    if (!S_ISREG(st.st_mode))  // 1.
        throw input_error(named + ": its lock " + spillway::quoted(file.string()) + " is a " +
                          std::string(spillway::file_type_name(st.st_mode)) +
                          ", not a regular file");
    int rc;
    while ((rc = ::flock(fd.get(), LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
    }
    if (rc != 0) {  // 2.
        const int err = errno;
        if (err != EWOULDBLOCK)
            throw input_error(named + ": cannot lock " + spillway::quoted(file.string()) + ": " +
                              std::strerror(err));
        char buf[24] = {};
        const ssize_t n = ::pread(fd.get(), buf, sizeof buf - 1, 0);
        std::string pid(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
        while (!pid.empty() && pid.back() == '\n') pid.pop_back();
        const bool digits = !pid.empty() && pid.find_first_not_of("0123456789") == pid.npos;
        throw input_error(named + ": in use by another run (pid " +
                          (digits ? pid : std::string("not yet recorded")) + ", holding " +
                          spillway::quoted(file.string()) +
                          "); two runs on one save directory would overwrite each other's saves");
    }
    const std::string pid = std::to_string(::getpid()) + "\n";  // 3.
    if (::ftruncate(fd.get(), 0) != 0 ||
        ::pwrite(fd.get(), pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size()))
        throw input_error(named + ": cannot write its lock " + spillway::quoted(file.string()) +
                          ": " + std::strerror(errno));
    lock_ = std::move(fd);
}

void save_directory::note(const std::string& name) {
    if (!noted_.insert(name).second) return;
    *notes_ << "mini_gpt: note: --save " << spillway::quoted(dir_.string()) << ": left "
            << spillway::quoted((dir_ / name).string())
            << " in place (a save removes only the step-NNNNNNNN folders with a save.manifest "
               "that it wrote)\n";
}

void save_checkpoint(save_directory& save, std::int64_t steps_done, const gpt2& model,
                     optimizer& optim, const train_state& state, streamed_params* streamed) {
    const auto& save_dir = save.path();
    const int rank = dist::rank();
    const std::string name = step_folder(steps_done);
    const std::string shard = shard_folder(rank, dist::size());
    const auto tmp = save_dir / (name + ".tmp");
    std::error_code ec;
    try {
        if (rank == 0) {  // 1.
            if (std::filesystem::exists(std::filesystem::symlink_status(tmp, ec))) {
                if (!only_save_files(tmp))
                    throw input_error(spillway::quoted(tmp.string()) +
                                      " is in the way and holds what a save does not write; "
                                      "move it");
                std::filesystem::remove_all(tmp);
            }
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
            const std::string text = manifest_text(list_save_files(tmp));  // 2.: last
            spillway::write_file(tmp / manifest_file,
                                 std::as_bytes(std::span(text.data(), text.size())),
                                 "save manifest");
            spillway::sync_directory(tmp);
            spillway::replace_directory(tmp, save_dir / name);  // 3.
            write_file_atomic(save_dir / "latest",
                              std::as_bytes(std::span<const char>(name.data(), name.size())));
            for (const auto& e : std::filesystem::directory_iterator(save_dir)) {  // 5.
                const auto fn = e.path().filename().string();
                if (fn == name || !fn.starts_with("step-")) continue;
                if (own_save(e.path()))
                    std::filesystem::remove_all(e.path());
                else
                    save.note(fn);
            }
        }
    } catch (const std::bad_alloc&) {
        throw;
    } catch (const std::exception& e) {
        throw save_error("--save " + spillway::quoted(save_dir.string()) + ": the save of step " +
                         std::to_string(steps_done) + " failed: " + e.what());
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
    const bool saved_streamed = listed(manifest, streamed_moments_file);
    if (streamed && !saved_streamed)
        throw input_error((dir / streamed_moments_file).string() + ": not in the save (its " +
                          manifest_file +
                          " does not list it: the save was made without --offload params; "
                          "resume it with the --offload it was made with)");
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
    } else {  // checked in pieces: neither file is held whole
        for (const char* name : {"model.bin", streamed_moments_file})
            check_listed_file(manifest, dir, name);
    }
    const train_state::run_shape run = state.shape;
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
    if (saved_state.has_schedule && saved_state.schedule != state.schedule)
        throw input_error(schedule_flags(state.schedule) + ": the save " + file +
                          " was made with " + schedule_flags(saved_state.schedule) +
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
    check_shard_files(manifest, dir, shard_folder(dist::rank(), dist::size()));
    optim.load(shard_dir, shard);
    return saved_state;
}

}  // namespace mini_gpt
