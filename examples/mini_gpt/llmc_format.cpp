// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/llmc_format.cpp: reading and writing llm.c checkpoints and token files.
#include "llmc_format.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "spillway/io/durable_file.hpp"

namespace mini_gpt {

namespace {

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& problem) {
    throw input_error(path.string() + ": " + problem);
}

std::string errno_text(int err) {
    return std::strerror(err);
}

std::int32_t header_field(std::span<const std::byte> file, std::size_t i) {
    std::int32_t v;
    std::memcpy(&v, file.data() + i * sizeof(std::int32_t), sizeof v);
    return v;
}

}  // namespace

std::vector<std::byte> read_file(const std::filesystem::path& path) {
    // Opened through Spillway's one helper: O_NONBLOCK|O_NOFOLLOW, then fstat on the
    // descriptor, so a FIFO, a device, a directory or a symbolic link under the name is refused
    // at once, named, instead of blocking the open or the read.
    spillway::unique_fd fd;
    try {
        fd = spillway::open_regular_file(path, "");
    } catch (const std::system_error& e) {
        std::string what = e.what();
        // "<path> is a FIFO, not a regular file: Invalid argument": the errno text adds nothing.
        const std::string tail = ": " + e.code().message();
        if (what.find(", not a regular file") != std::string::npos && what.ends_with(tail))
            what.resize(what.size() - tail.size());
        throw input_error(what);
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) fail(path, "cannot stat: " + errno_text(errno));
    std::vector<std::byte> out(static_cast<std::size_t>(st.st_size));
    std::size_t done = 0;
    while (done < out.size()) {
        ssize_t n = ::read(fd.get(), out.data() + done, out.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) fail(path, "read failed: " + errno_text(errno));
        if (n == 0) break;
        done += static_cast<std::size_t>(n);
    }
    out.resize(done);
    return out;
}

void create_private_dirs(const std::filesystem::path& dir, std::error_code& ec) {
    ec.clear();
    std::vector<std::filesystem::path> missing;  // leaf first
    for (auto p = dir; !p.empty() && !std::filesystem::exists(p, ec); p = p.parent_path()) {
        if (ec) return;
        missing.push_back(p);
        if (p == p.parent_path()) break;
    }
    if (ec) return;
    for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
        if (::mkdir(it->c_str(), 0700) != 0 && errno != EEXIST) {
            ec.assign(errno, std::generic_category());
            return;
        }
    }
}

void write_file_atomic(const std::filesystem::path& path, std::span<const std::byte> bytes) {
    std::filesystem::path tmp = path;
    tmp += ".tmp";
    // The temporary file is always a new one (spillway::write_file: O_CREAT|O_EXCL|O_NOFOLLOW):
    // a stale path.tmp, left by a killed run or planted as a hard or symbolic link to a file
    // elsewhere, is unlinked (its name only) and never written through.
    if (::unlink(tmp.c_str()) != 0 && errno != ENOENT)
        fail(path, "cannot remove the stale " + tmp.string() + ": " + errno_text(errno));
    try {
        spillway::write_file(tmp, bytes, "write");
    } catch (const std::system_error& e) {
        ::unlink(tmp.c_str());
        fail(path, std::string("cannot write ") + e.what());
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        int err = errno;
        ::unlink(tmp.c_str());
        fail(path, "rename from " + tmp.string() + " failed: " + errno_text(err));
    }
}

checkpoint read_checkpoint(const std::filesystem::path& path) {
    return parse_checkpoint(read_file(path), path);
}

namespace {

/// The config in a checkpoint's header (`head`: its first bytes, as many as there are up to
/// the header's size), checked, with the file's size `file_size` checked against it.
gpt2_config checkpoint_config(std::span<const std::byte> head, std::size_t file_size,
                              const std::filesystem::path& path) {
    const std::size_t header_bytes = header_ints * sizeof(std::int32_t);
    if (file_size < header_bytes)
        fail(path, "truncated checkpoint: " + std::to_string(file_size) +
                       " bytes, shorter than the " + std::to_string(header_bytes) + "-byte header");
    if (header_field(head, 0) != checkpoint_magic)
        fail(path, "bad magic " + std::to_string(header_field(head, 0)) +
                       " (an llm.c checkpoint has " + std::to_string(checkpoint_magic) + ")");
    if (header_field(head, 1) != checkpoint_version)
        fail(path, "unsupported checkpoint version " + std::to_string(header_field(head, 1)) +
                       " (only version 3, fp32, is read)");
    gpt2_config config;
    config.max_seq_len = header_field(head, 2);
    config.vocab_size = header_field(head, 3);
    config.num_layers = header_field(head, 4);
    config.num_heads = header_field(head, 5);
    config.channels = header_field(head, 6);
    config.padded_vocab_size = header_field(head, 7);
    try {
        config.validate();
    } catch (const std::invalid_argument& e) {
        fail(path, std::string("bad model config in header: ") + e.what());
    }
    param_layout layout(config);
    std::size_t want = header_bytes + layout.total * sizeof(float);
    if (file_size != want)
        fail(path, std::string(file_size < want ? "truncated checkpoint"
                                                : "checkpoint has trailing bytes") +
                       ": " + std::to_string(file_size) + " bytes, the header's config needs " +
                       std::to_string(want));
    return config;
}

}  // namespace

checkpoint parse_checkpoint(std::span<const std::byte> file, const std::filesystem::path& path) {
    const std::size_t header_bytes = header_ints * sizeof(std::int32_t);
    checkpoint ck;
    ck.config =
        checkpoint_config(file.first(std::min(file.size(), header_bytes)), file.size(), path);
    param_layout layout(ck.config);
    ck.params.resize(layout.total);
    std::memcpy(ck.params.data(), file.data() + header_bytes, layout.total * sizeof(float));
    // A NaN or inf parameter makes every loss NaN and every step skip: refused here, named.
    check_finite_params(ck.params, 0, layout, path);
    return ck;
}

gpt2_config read_checkpoint_config(const std::filesystem::path& path) {
    spillway::unique_fd fd;
    try {
        fd = spillway::open_regular_file(path, "");
    } catch (const std::system_error& e) {
        throw input_error(e.what());
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) fail(path, "cannot stat: " + errno_text(errno));
    std::array<std::byte, header_ints * sizeof(std::int32_t)> head{};
    std::size_t done = 0;
    while (done < head.size()) {
        const ssize_t n =
            ::pread(fd.get(), head.data() + done, head.size() - done, static_cast<off_t>(done));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) fail(path, "read failed: " + errno_text(errno));
        if (n == 0) break;
        done += static_cast<std::size_t>(n);
    }
    return checkpoint_config(std::span<const std::byte>(head.data(), done),
                             static_cast<std::size_t>(st.st_size), path);
}

void check_finite_params(std::span<const float> params, std::size_t llmc_offset,
                         const param_layout& layout, const std::filesystem::path& path) {
    for (std::size_t j = 0; j < params.size(); ++j)
        if (!std::isfinite(params[j])) {
            const std::size_t i = llmc_offset + j;
            int kind = 0;
            while (kind + 1 < num_param_tensors &&
                   layout.llmc_offsets[static_cast<std::size_t>(kind) + 1] <= i)
                ++kind;
            fail(path, "parameter " + std::to_string(i) + " (in " +
                           param_names[static_cast<std::size_t>(kind)] + ") is " +
                           (std::isnan(params[j]) ? "NaN" : "infinite"));
        }
}

std::array<std::int32_t, header_ints> llmc_header(const gpt2_config& c) {
    std::array<std::int32_t, header_ints> h{};
    h[0] = checkpoint_magic;
    h[1] = checkpoint_version;
    h[2] = c.max_seq_len;
    h[3] = c.vocab_size;
    h[4] = c.num_layers;
    h[5] = c.num_heads;
    h[6] = c.channels;
    h[7] = c.padded_vocab_size;
    return h;
}

void write_checkpoint(const std::filesystem::path& path, const gpt2_config& config,
                      std::span<const float> params) {
    param_layout layout(config);
    if (params.size() != layout.total)
        throw std::invalid_argument("write_checkpoint: " + std::to_string(params.size()) +
                                    " params for a config of " + std::to_string(layout.total));
    const auto header = llmc_header(config);
    std::vector<std::byte> file(header_ints * sizeof(std::int32_t) + params.size_bytes());
    std::memcpy(file.data(), header.data(), header_ints * sizeof(std::int32_t));
    std::memcpy(file.data() + header_ints * sizeof(std::int32_t), params.data(),
                params.size_bytes());
    write_file_atomic(path, file);
}

std::vector<std::uint16_t> read_tokens(const std::filesystem::path& path) {
    std::vector<std::byte> file = read_file(path);
    const std::size_t header_bytes = header_ints * sizeof(std::int32_t);
    if (file.size() < header_bytes)
        fail(path, "truncated token file: " + std::to_string(file.size()) +
                       " bytes, shorter than the " + std::to_string(header_bytes) + "-byte header");
    if (header_field(file, 0) != tokens_magic)
        fail(path, "bad magic " + std::to_string(header_field(file, 0)) +
                       " (an llm.c token file has " + std::to_string(tokens_magic) + ")");
    if (header_field(file, 1) != tokens_version)
        fail(path, "unsupported token file version " + std::to_string(header_field(file, 1)) +
                       " (expected 1)");
    std::int32_t count = header_field(file, 2);
    if (count < 0) fail(path, "negative token count " + std::to_string(count));
    std::size_t want = header_bytes + static_cast<std::size_t>(count) * sizeof(std::uint16_t);
    if (file.size() != want)
        fail(path, std::string(file.size() < want ? "truncated token file"
                                                  : "token file has trailing bytes") +
                       ": " + std::to_string(file.size()) + " bytes, the header's count of " +
                       std::to_string(count) + " tokens needs " + std::to_string(want));
    std::vector<std::uint16_t> tokens(static_cast<std::size_t>(count));
    std::memcpy(tokens.data(), file.data() + header_bytes, tokens.size() * sizeof(std::uint16_t));
    return tokens;
}

void write_tokens(const std::filesystem::path& path, std::span<const std::uint16_t> tokens) {
    std::vector<std::int32_t> header(header_ints, 0);
    header[0] = tokens_magic;
    header[1] = tokens_version;
    header[2] = static_cast<std::int32_t>(tokens.size());
    std::vector<std::byte> file(header_ints * sizeof(std::int32_t) + tokens.size_bytes());
    std::memcpy(file.data(), header.data(), header_ints * sizeof(std::int32_t));
    std::memcpy(file.data() + header_ints * sizeof(std::int32_t), tokens.data(),
                tokens.size_bytes());
    write_file_atomic(path, file);
}

}  // namespace mini_gpt
