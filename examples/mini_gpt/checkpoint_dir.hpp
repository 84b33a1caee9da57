// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/checkpoint_dir.hpp: the resumable save directory (--save, --resume).
//
// A save directory holds one folder per save (step-NNNNNNNN/: model.bin in llm.c's format,
// one optimizer shard folder per rank, train.state, save.manifest), a file `latest` naming
// the newest complete one, and save.lock; the folders the trainer creates are 0700 and its
// files 0600 (the user's alone). One run at a time holds the directory (save_directory).
// Saving, step by step:
//  1. write everything into step-N.tmp/ (each file fsynced; each rank its own shard); a
//     step-N.tmp/ already there is removed first only when it holds nothing but the names a
//     save writes (a killed save's), and otherwise the save fails naming it;
//  2. rank 0 writes save.manifest last: the size and CRC-32C of every file of the save but the
//     optimizer's subgroup files (shard-*/optimizer/manifest.txt lists those with their CRCs,
//     and save.manifest covers that manifest.txt), then a manifest_crc line of its own;
//  3. put step-N.tmp/ at step-N/ with spillway::replace_directory (atomic, durable);
//  4. replace `latest` atomically (write latest.tmp, fsync, rename);
//  5. remove the older saves: only the entries it can prove a save wrote, each a folder (not a
//     link) named "step-" and the digits step_folder writes, holding a save.manifest that
//     parses with its CRC. Every other entry is left alone; one whose name starts with "step-"
//     is mentioned once (save_directory::note).
// A crash anywhere leaves `latest` naming a complete save. On resume each rank checks
// model.bin, train.state and its own shard's files against save.manifest before using them;
// a file whose size or CRC differs, or a listed file that is gone, is refused by name. Every
// file of a save is opened by spillway::open_regular_file (a FIFO, a device or a directory in
// its place is refused at once, never waited on). What a save is follows from its files, not
// from a byte in one of them: a folder without save.manifest is refused whatever train.state
// says, and train.state formats 1 and 2 (of saves made before manifests) are not read. A save
// is written in format 4 (format 3's fields and the learning-rate schedule); format 3 (no
// schedule: a constant one) still resumes. Every name or value quoted from a save's files in a
// message goes through spillway::quoted (control bytes escaped).
#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "spillway/io/durable_file.hpp"

#include "gpt2.hpp"
#include "spillway/schedule/lr_schedule.hpp"
#include "optimizer.hpp"
#include "streamed_params.hpp"
#include "trainer.hpp"

namespace mini_gpt {

/// Where a run stands, as train.state records it.
struct train_state {
    std::int64_t next_step = 0;   // the step to run next
    std::int64_t adam_steps = 0;  // AdamW steps applied (skipped overflow steps excluded)
    float loss_scale = 1.0f;
    std::int64_t good_steps = 0;  // steps since the loss scale last changed
    // What the steps ran on (every train.state read records it; a fresh run without --save
    // leaves has_run_shape false). Resuming with another gradient type would keep a loss scale
    // meant for it, and other data, batch or sequence length would not replay the same
    // batches: both are refused.
    bool has_run_shape = false;
    struct run_shape {
        std::int32_t grads = 0;  // grad_dtype
        std::int32_t batch = 0, seq = 0;
        std::uint64_t tokens = 0;       // tokens in the data
        std::uint64_t tokens_hash = 0;  // FNV-1a of the tokens
    } shape;
    // The learning-rate schedule the steps ran with (format 4; has_schedule false for format
    // 3): a resume with another schedule would not give the same bits, so it is refused.
    bool has_schedule = false;
    spillway::lr_schedule schedule;
    int format = 4;  // of the train.state read: 3 or 4 (formats 1 and 2 are refused)
};

/// FNV-1a (64-bit) of the tokens' bytes: tells one token stream from another (on resume, and
/// between ranks).
std::uint64_t tokens_hash(const std::vector<std::uint16_t>& tokens);

/// Writes train.state (format 4: format 3's fields and the schedule's) atomically; reads
/// formats 3 and 4. read_state throws input_error naming the file when it is truncated, of
/// another format (1 and 2 named as such) or out of range; parse_state does the same from the
/// bytes.
void write_state(const std::filesystem::path& path, train_state s);
train_state read_state(const std::filesystem::path& path);
train_state parse_state(std::span<const std::byte> bytes, const std::filesystem::path& path);

/// The folder name of the save after `step` steps: "step-%08lld".
std::string step_folder(std::int64_t step);

/// The name of rank `rank`'s optimizer folder in a save: "shard-<rank>-of-<ranks>".
std::string shard_folder(int rank, int ranks);

/// The file of a save that holds the AdamW moments of --offload params
/// (streamed_params::write_moments); such a save has no optimizer shard folders.
inline constexpr const char* streamed_moments_file = "params-moments.bin";

/// A save that could not be written (a full disk, an I/O error, a file in the way): the run
/// failed (exit status 1), as opposed to bad input (input_error, exit status 2).
class save_error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// --save DIR, held by this run for its whole life. Rank 0 holds the lock; the other ranks of
/// the run hold nothing (rank 0 prunes and names the saves).
///
/// The lock, step by step:
///  1. open DIR/save.lock (O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK, mode 0600); anything
///     but a regular file there is refused, named;
///  2. flock(LOCK_EX | LOCK_NB): held by another process, the run is refused (input_error)
///     naming DIR and the pid that process wrote in the file;
///  3. write this process's pid into the file. The kernel drops the lock when the process
///     ends, even by SIGKILL, so the file left behind never blocks the next run.
class save_directory {
public:
    /// Takes the lock (on rank 0). `notes` receives the lines of note(); it must outlive this.
    /// @throws input_error naming the directory (and the holder's pid when another run holds it)
    save_directory(std::filesystem::path dir, std::ostream& notes);
    const std::filesystem::path& path() const noexcept { return dir_; }
    /// Writes one line about the entry `name` of the directory, left in place by a prune
    /// (step 5 above), the first time it is seen.
    void note(const std::string& name);

private:
    std::filesystem::path dir_;
    std::ostream* notes_;
    spillway::unique_fd lock_;
    std::set<std::string> noted_;
};

/// Saves the run after `steps_done` steps into `save_dir` (the protocol above). Every rank
/// calls it (collective): each writes its optimizer shard, rank 0 the rest. With `streamed`
/// (--offload params) rank 0 writes model.bin and params-moments.bin layer by layer from the
/// streams instead (every rank's streams hold the same state) and there are no shards.
/// @throws save_error naming the directory, the step and the problem when a write fails
void save_checkpoint(save_directory& save_dir, std::int64_t steps_done, const gpt2& model,
                     optimizer& optim, const train_state& state,
                     streamed_params* streamed = nullptr);

/// Loads the latest save in `dir` (--resume): the model's parameters, this rank's optimizer
/// shard (whose params are `shard`), and the state, which must have been saved from a run of
/// the same shape as `state.shape` (checked when the save recorded it); returns the state,
/// carrying this run's shape. Every file is checked against save.manifest first (see above).
/// With `streamed`, model.bin and params-moments.bin (checked against the manifest, read in
/// pieces) fill the streams layer by layer; `optim` and `shard` are not used.
/// Throws input_error naming the file and the problem.
train_state resume_checkpoint(const std::filesystem::path& dir, const options& opt,
                              const std::string& data_name, gpt2& model, optimizer& optim,
                              std::span<float> shard, const train_state& state,
                              streamed_params* streamed = nullptr);

}  // namespace mini_gpt
