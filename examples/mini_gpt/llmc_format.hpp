// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/llmc_format.hpp: llm.c's checkpoint and token file formats.
//
// Checkpoint: 256 int32 header (magic 20240326, version 3 = fp32, max_seq_len, vocab_size,
// num_layers, num_heads, channels, padded_vocab_size), then the fp32 parameters in llm.c's
// order (see gpt2.hpp). Token file: 256 int32 header (magic 20240520, version 1, token
// count), then that many uint16 tokens. Both little-endian, as llm.c writes them.
//
// Guarantees: every reader checks magic, version, the header fields and the exact file size,
// and throws input_error whose message starts with the file's path and names the problem
// (never a crash, never a silently short read). Writers create files with mode 0600 through
// a temporary file in the same directory, fsync and rename, so a crash never leaves a torn
// file under the final name; failures throw input_error naming the path and errno text.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "gpt2.hpp"

namespace mini_gpt {

/// Bad input from the user (a file, a flag): the CLI prints the message and exits with 2.
class input_error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

inline constexpr std::int32_t checkpoint_magic = 20240326;
inline constexpr std::int32_t checkpoint_version = 3;
inline constexpr std::int32_t tokens_magic = 20240520;
inline constexpr std::int32_t tokens_version = 1;
inline constexpr std::size_t header_ints = 256;

/// The header of an llm.c fp32 checkpoint of `config` (magic, version, the shape; the rest 0).
std::array<std::int32_t, header_ints> llmc_header(const gpt2_config& config);

struct checkpoint {
    gpt2_config config;
    std::vector<float> params;  // param_layout(config).total floats
};

/// Reads an llm.c fp32 checkpoint. Throws input_error naming the path and the problem.
checkpoint read_checkpoint(const std::filesystem::path& path);
/// The same, from the file's bytes already read (`path` names them in messages).
checkpoint parse_checkpoint(std::span<const std::byte> file, const std::filesystem::path& path);

/// The config of an llm.c fp32 checkpoint, from its header, with the file's size checked
/// against it, without reading the parameters (--offload params reads them layer by layer,
/// checking each with check_finite_params). Throws input_error as read_checkpoint does.
gpt2_config read_checkpoint_config(const std::filesystem::path& path);
/// Throws input_error naming `path`, the parameter's index in llm.c's order and its tensor
/// when one of `params` (llm.c's floats from `llmc_offset` on) is NaN or infinite, as
/// read_checkpoint does.
void check_finite_params(std::span<const float> params, std::size_t llmc_offset,
                         const param_layout& layout, const std::filesystem::path& path);

/// Writes an llm.c fp32 checkpoint (mode 0600, atomically replaced).
void write_checkpoint(const std::filesystem::path& path, const gpt2_config& config,
                      std::span<const float> params);

/// Reads an llm.c token file. Throws input_error naming the path and the problem.
std::vector<std::uint16_t> read_tokens(const std::filesystem::path& path);

/// Writes an llm.c token file (mode 0600, atomically replaced).
void write_tokens(const std::filesystem::path& path, std::span<const std::uint16_t> tokens);

/// Writes `bytes` to `path` through path.tmp + fsync + rename, mode 0600. path.tmp is always
/// created anew (O_EXCL|O_NOFOLLOW; a stale one is unlinked first), so a hard or symbolic
/// link left under that name is never written through; the rename replaces a link at `path`
/// itself, never the file it points to.
void write_file_atomic(const std::filesystem::path& path, std::span<const std::byte> bytes);
/// Creates `dir` and its missing parents, each new one with mode 0700 (the user's alone, as
/// the files in it); directories that already exist keep their mode. Reports failure in `ec`.
void create_private_dirs(const std::filesystem::path& dir, std::error_code& ec);

/// Reads a whole file, opened by spillway::open_regular_file (never blocks on a FIFO or a
/// device); throws input_error naming the path and what is there ("is a FIFO, not a regular
/// file") or the errno text.
std::vector<std::byte> read_file(const std::filesystem::path& path);

}  // namespace mini_gpt
