// SPDX-License-Identifier: Apache-2.0
// spillway/optim/detail/pipeline_manifest.hpp: the text format of an update_pipeline save's
// manifest.txt (not public): its writer and its parser, pure functions over text.
//
// A save is a directory of "subgroup-<i>.bin" files (params | m | v of subgroup i, fp32) and
// one manifest.txt (format 2):
//
//   spillway-optimizer-state 2
//   param_count <n>
//   subgroup_size <n>
//   subgroups <n>
//   step <completed Adam steps>
//   iteration <successful update calls: the alternating order's parity>
//   subgroup <i> <bytes of its file> <CRC-32C of its file>     (one line per subgroup)
//   manifest_crc <CRC-32C of every byte before this line>
//   end
//
// Guarantees:
// - parse_manifest(manifest_text(m), ...) gives back m, field for field.
// - parse_manifest refuses a text that is not a save (format 1 or 2), a format-2 text whose
//   bytes do not match manifest_crc, a missing, malformed or out-of-range field, a shape
//   that differs from the config's, and a truncated text; each with a message naming the
//   field and the path. Format 1 (no manifest_crc) is still accepted.
// - No I/O except read_manifest_text(), and no tier: the pipeline's save() and restore() do
//   the file and tier work around these functions.
// - read_manifest_text() opens through open_regular_file() (io/durable_file.hpp): a FIFO,
//   device, directory or symbolic link named manifest.txt is refused at once, naming the
//   path and what it is, and a missing one is reported as a missing manifest.
#pragma once

#include <cerrno>
#include <cinttypes>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include <unistd.h>

#include "spillway/error.hpp"
#include "spillway/io/durable_file.hpp"
#include "spillway/optim/pipeline_config.hpp"

namespace spillway::detail {

/// What a manifest records.
struct pipeline_manifest {
    /// One subgroup's file.
    struct entry {
        std::size_t nbytes = 0;  ///< bytes of subgroup-<i>.bin (12 per parameter)
        std::uint32_t crc = 0;   ///< CRC-32C of those bytes
    };
    std::size_t param_count = 0;
    std::size_t subgroup_size = 0;
    std::int64_t step = 0;         ///< completed Adam steps
    std::uint64_t iteration = 0;   ///< successful update calls (the order's parity)
    std::vector<entry> subgroups;  ///< one per subgroup, in order
};

/// Bytes of subgroup s's file in a save: params, m and v, whatever the pipeline's mode.
[[nodiscard]] inline std::size_t saved_blob_bytes(const pipeline_config& config, std::size_t s) {
    return 3 * sizeof(float) * config.subgroup_elements(s);
}

/// The file name of subgroup s in a save: "subgroup-000003.bin".
[[nodiscard]] inline std::string subgroup_file_name(std::size_t s) {
    char buf[48];  // "subgroup-" + up to 20 digits + ".bin" + NUL
    std::snprintf(buf, sizeof buf, "subgroup-%06zu.bin", s);
    return buf;
}

/// The text of manifest.txt (format 2) for `m`, its own checksum included.
[[nodiscard]] inline std::string manifest_text(const pipeline_manifest& m) {
    std::ostringstream out;
    out << "spillway-optimizer-state 2\n"
        << "param_count " << m.param_count << "\n"
        << "subgroup_size " << m.subgroup_size << "\n"
        << "subgroups " << m.subgroups.size() << "\n"
        << "step " << m.step << "\n"
        << "iteration " << m.iteration << "\n";
    for (std::size_t s = 0; s < m.subgroups.size(); ++s)
        out << "subgroup " << s << " " << m.subgroups[s].nbytes << " " << m.subgroups[s].crc
            << "\n";
    const std::uint32_t manifest_crc = crc32c(std::as_bytes(std::span(out.view())));
    out << "manifest_crc " << manifest_crc << "\nend\n";
    return out.str();
}

/// Parses the text of `dir`/manifest.txt for a pipeline built with `config`.
/// @param text   the file's whole text
/// @param config the shape the save must have (param_count and subgroup_size)
/// @param dir    the save's directory, for the messages only
/// @throws std::invalid_argument when the save's param_count or subgroup_size differs from
///         the config's; std::runtime_error for every other refusal (see the file comment)
[[nodiscard]] inline pipeline_manifest parse_manifest(const std::string& text,
                                                      const pipeline_config& config,
                                                      const std::filesystem::path& dir) {
    const std::string path = (dir / "manifest.txt").string();
    std::istringstream in(text);
    std::string magic;
    int format = 0;
    in >> magic >> format;
    if (magic != "spillway-optimizer-state" || (format != 1 && format != 2))
        throw std::runtime_error("update_pipeline::restore: " + path +
                                 " is not a spillway optimizer save (format 1 or 2)");
    if (format == 2) {
        // "manifest_crc <CRC-32C of every byte before that line>" then "end".
        const auto at = text.rfind("\nmanifest_crc ");
        std::uint64_t want = 0;
        const bool found = at != std::string::npos &&
                           std::sscanf(text.c_str() + at + 1, "manifest_crc %" SCNu64, &want) == 1;
        if (!found || want != crc32c(std::as_bytes(std::span(text.data(), at + 1))))
            throw std::runtime_error(
                "update_pipeline::restore: " + path +
                " is corrupted: its text does not match its checksum (manifest_crc)");
    }
    auto field = [&](const char* name) {
        std::string k;
        std::int64_t v = -1;
        in >> k >> v;
        if (!in || k != name || v < 0)
            throw std::runtime_error("update_pipeline::restore: manifest field '" +
                                     std::string(name) + "' is missing or malformed in " +
                                     dir.string());
        return v;
    };
    pipeline_manifest m;
    m.param_count = static_cast<std::size_t>(field("param_count"));
    m.subgroup_size = static_cast<std::size_t>(field("subgroup_size"));
    const auto subgroups = static_cast<std::size_t>(field("subgroups"));
    m.step = field("step");
    if (m.step == std::numeric_limits<std::int64_t>::max())
        throw std::runtime_error(
            "update_pipeline::restore: manifest field 'step' is out of range in " + dir.string());
    m.iteration = static_cast<std::uint64_t>(field("iteration"));
    expect_argument(m.param_count == config.param_count,
                    "update_pipeline::restore: the save has param_count " +
                        std::to_string(m.param_count) + ", the config " +
                        std::to_string(config.param_count));
    expect_argument(m.subgroup_size == config.subgroup_size,
                    "update_pipeline::restore: the save has subgroup_size " +
                        std::to_string(m.subgroup_size) + ", the config " +
                        std::to_string(config.subgroup_size));
    const std::size_t n = config.subgroup_count();
    if (subgroups != n)
        throw std::runtime_error("update_pipeline::restore: the manifest lists " +
                                 std::to_string(subgroups) + " subgroups, the shape implies " +
                                 std::to_string(n));
    m.subgroups.resize(n);
    for (std::size_t s = 0; s < n; ++s) {
        std::string k;
        std::size_t id = 0, nbytes = 0;
        std::uint64_t crc = 0;
        in >> k >> id >> nbytes >> crc;
        if (!in || k != "subgroup" || id != s || nbytes != saved_blob_bytes(config, s) ||
            crc > 0xffffffffu)
            throw std::runtime_error("update_pipeline::restore: manifest entry of subgroup " +
                                     std::to_string(s) + " is missing or malformed in " +
                                     dir.string());
        m.subgroups[s] = {nbytes, static_cast<std::uint32_t>(crc)};
    }
    std::string end;
    in >> end;
    if (format == 2 && end == "manifest_crc") {  // (checked above)
        std::uint64_t crc = 0;
        in >> crc >> end;
    }
    if (end != "end")
        throw std::runtime_error("update_pipeline::restore: manifest in " + dir.string() +
                                 " is truncated");
    return m;
}

/// The whole text of `dir`/manifest.txt, opened by open_regular_file(): a FIFO, a device, a
/// directory or a symbolic link in its place is refused at once instead of blocking the
/// restore or being read.
/// @throws std::system_error naming the path: ENOENT "the manifest ... is missing" when
///         there is no such file; EINVAL, EISDIR or ELOOP saying what is there instead; the
///         errno of open or read otherwise
[[nodiscard]] inline std::string read_manifest_text(const std::filesystem::path& dir) {
    const auto path = dir / "manifest.txt";
    const std::string what = "update_pipeline::restore of the manifest";
    unique_fd fd;
    try {
        fd = open_regular_file(path, what);
    } catch (const std::system_error& e) {
        if (e.code() != std::errc::no_such_file_or_directory) throw;
        throw std::system_error(e.code(), "update_pipeline::restore: the manifest " +
                                              path.string() +
                                              " is missing (not an optimizer save, or an "
                                              "incomplete one)");
    }
    std::string text;
    char chunk[4096];
    for (;;) {
        const ssize_t n = ::read(fd.get(), chunk, sizeof chunk);
        if (n < 0) {
            if (errno == EINTR) continue;
            throw_system_error(errno, "read", what + ": " + path.string());
        }
        if (n == 0) return text;
        text.append(chunk, static_cast<std::size_t>(n));
    }
}

}  // namespace spillway::detail
