// SPDX-License-Identifier: Apache-2.0
// The mini_gpt command line as a user runs it: bad input exits with 2 and one line naming
// the file and the problem; a run killed with SIGKILL and resumed gives the uninterrupted
// losses; --json and --trace write what they promise.
#include <cblas.h>
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli.hpp"
#include "cli_support.hpp"
#include "llmc_format.hpp"
#include "spillway/config.hpp"
#include "spillway/lock/owned_directory.hpp"
#include "support/temp_dir.hpp"
#include "trainer.hpp"

using namespace mini_gpt;
using namespace mini_gpt::cli_testing;

TEST_CASE("bad input: exit status 2 and a one-line message naming the file and the problem") {
    spillway::test::temp_dir dir("mini_gpt_cli");
    const auto d = dir.path();
    // A good checkpoint and token file to corrupt.
    auto good = d / "good.bin";
    REQUIRE(run(d, tiny_args() +
                       std::vector<std::string>{"--steps", "1", "--save-model", good.string()})
                .status == 0);
    auto ck = read_file(good);
    std::vector<std::uint16_t> toks(100, 65);
    write_tokens(d / "tokens.bin", toks);
    auto tk = read_file(d / "tokens.bin");

    SUBCASE("missing files") {
        expect_refused(run(d, {"--model", (d / "nope.bin").string()}),
                       {"nope.bin", "No such file"});
        expect_refused(run(d, {"--data", (d / "nodata.bin").string()}),
                       {"nodata.bin", "No such file"});
    }
    SUBCASE("wrong magic and version") {
        auto bad = ck;
        bad[0] = std::byte{1};
        write_bytes(d / "magic.bin", bad);
        expect_refused(run(d, {"--model", (d / "magic.bin").string()}), {"magic.bin", "bad magic"});
        bad = ck;
        bad[4] = std::byte{5};
        write_bytes(d / "version.bin", bad);
        expect_refused(run(d, {"--model", (d / "version.bin").string()}),
                       {"version.bin", "version 5"});
        auto badt = tk;
        badt[0] = std::byte{0};
        write_bytes(d / "tmagic.bin", badt);
        expect_refused(run(d, {"--data", (d / "tmagic.bin").string()}),
                       {"tmagic.bin", "bad magic"});
        badt = tk;
        badt[4] = std::byte{2};
        write_bytes(d / "tversion.bin", badt);
        expect_refused(run(d, {"--data", (d / "tversion.bin").string()}),
                       {"tversion.bin", "version 2"});
    }
    SUBCASE("truncated files") {
        auto cut = ck;
        cut.resize(cut.size() - 4);
        write_bytes(d / "cut.bin", cut);
        expect_refused(run(d, {"--model", (d / "cut.bin").string()}),
                       {"cut.bin", "truncated checkpoint"});
        cut.resize(100);
        write_bytes(d / "cut_header.bin", cut);
        expect_refused(run(d, {"--model", (d / "cut_header.bin").string()}),
                       {"cut_header.bin", "truncated"});
        auto cutt = tk;
        cutt.resize(cutt.size() - 1);
        write_bytes(d / "cut_tokens.bin", cutt);
        expect_refused(run(d, {"--data", (d / "cut_tokens.bin").string()}),
                       {"cut_tokens.bin", "truncated token file"});
    }
    SUBCASE("tokens out of range and too few tokens") {
        std::vector<std::uint16_t> bad(200, 65);
        bad[57] = 300;
        write_tokens(d / "range.bin", bad);
        expect_refused(
            run(d, tiny_args() + std::vector<std::string>{"--data", (d / "range.bin").string()}),
            {"range.bin", "token 300 at position 57", "out of range"});
        write_tokens(d / "short.bin", std::vector<std::uint16_t>(10, 65));
        expect_refused(
            run(d, tiny_args() + std::vector<std::string>{"--data", (d / "short.bin").string()}),
            {"short.bin", "fewer than one batch"});
    }
    SUBCASE("a config that does not divide, a checkpoint whose header does not") {
        expect_refused(run(d, {"--channels", "30", "--heads", "4"}),
                       {"--channels 30", "not divisible"});
        auto bad = ck;
        std::int32_t heads = 5;  // channels 32 is not divisible by 5
        std::memcpy(bad.data() + 5 * sizeof(std::int32_t), &heads, sizeof heads);
        write_bytes(d / "heads.bin", bad);
        expect_refused(run(d, {"--model", (d / "heads.bin").string()}),
                       {"heads.bin", "not divisible by num_heads 5"});
    }
    SUBCASE("unwritable paths") {
        // A path under a regular file cannot be created (ENOTDIR), even for root.
        auto under = (d / "good.bin" / "x").string();
        expect_refused(
            run(d, tiny_args() + std::vector<std::string>{"--steps", "1", "--save-model", under}),
            {under, "--save-model"});
        expect_refused(
            run(d, tiny_args() + std::vector<std::string>{"--steps", "1", "--save", under}),
            {under, "--save"});
        expect_refused(run(d, tiny_args() + std::vector<std::string>{"--steps", "1", "--offload",
                                                                     "all", "--path", under}),
                       {under, "--path"});
        expect_refused(
            run(d, tiny_args() + std::vector<std::string>{"--steps", "1", "--trace", under}),
            {under, "--trace"});
    }
    SUBCASE("bad flags") {
        expect_refused(run(d, {"--bogus"}), {"--bogus", "unknown flag"});
        expect_refused(run(d, {"--bogus=3"}), {"--bogus", "unknown flag"});
        expect_refused(run(d, {"--path", "a", "b"}), {"b", "unknown flag"});
        expect_refused(run(d, {"--steps", "1", "--batch"}), {"--batch", "needs a value"});
        expect_refused(run(d, {"--offload=disk"}), {"--offload", "disk"});
        expect_refused(run(d, {"--batch=0x10"}), {"--batch", "0x10"});
        expect_refused(run(d, {"--offload", "disk"}), {"--offload", "disk"});
        expect_refused(run(d, {"--grad-dtype", "fp8"}), {"--grad-dtype", "fp8"});
        expect_refused(run(d, {"--update-under-forward", "maybe"}),
                       {"--update-under-forward", "maybe"});
        expect_refused(run(d, {"--order", "random"}), {"--order", "random"});
        expect_refused(run(d, {"--batch", "zero"}), {"--batch", "zero"});
        expect_refused(run(d, {"--act-recompute", "yes"}), {"--act-recompute", "yes"});
        // A stash budget below the last layer's backward (5.1 MiB at this batch; 9.6 without
        // the recompute) is refused before training, not when backward first loads that layer.
        expect_refused(run(d, {"--offload", "activations", "--batch", "16", "--act-budget", "5"}),
                       {"--act-budget", "5.0 MiB", "is below"});
        expect_refused(run(d, {"--offload", "activations", "--batch", "16", "--act-budget", "9",
                               "--act-recompute", "off"}),
                       {"--act-budget", "9.0 MiB", "is below"});
        expect_refused(run(d, {"--resume", (d / "nosave").string()}), {"nosave", "latest"});
        // An empty path would silently mean "none".
        for (const char* flag : {"--model", "--data", "--save", "--save-model", "--resume",
                                 "--trace", "--path", "--lock-dir"})
            expect_refused(run(d, {flag, ""}), {flag, "empty path"});
        // AdamW's settings are checked before training, even with --steps 0.
        expect_refused(run(d, {"--steps", "0", "--beta1", "1"}), {"--beta1", "must be below 1"});
        expect_refused(run(d, {"--steps", "0", "--beta2", "2"}), {"--beta2", "must be below 1"});
        expect_refused(run(d, {"--steps", "0", "--eps", "0"}), {"--eps", "must be above 0"});
        expect_refused(run(d, {"--subgroup", "1"}), {"--subgroup", "outside [1024"});
        // The shape of a model from --model is its header's: a shape flag beside it is refused.
        expect_refused(run(d, {"--model", good.string(), "--channels", "64"}),
                       {"--channels", "comes from --model"});
        // --save-model naming a directory fails before training, not after it.
        std::filesystem::create_directories(d / "adir");
        expect_refused(run(d, tiny_args() + std::vector<std::string>{"--steps", "1", "--save-model",
                                                                     (d / "adir").string()}),
                       {"adir", "--save-model names a directory"});
    }
    SUBCASE("a corrupted train.state, and a save already past --steps") {
        const auto saves = d / "s";
        REQUIRE(run(d, tiny_args() + std::vector<std::string>{"--steps", "2", "--save",
                                                              saves.string(), "--save-every", "1"})
                    .status == 0);
        std::string latest = slurp(saves / "latest");
        const auto state = saves / latest / "train.state";
        auto bytes = read_file(state);
        const auto good_state = bytes;
        const auto manifest = saves / latest / "save.manifest";
        const auto good_manifest = read_file(manifest);
        const std::int64_t next_step = -1000;  // the field after the 8-byte magic
        std::memcpy(bytes.data() + 8, &next_step, sizeof next_step);
        write_bytes(state, bytes);
        expect_refused(run(d, tiny_args() + std::vector<std::string>{"--steps", "4", "--resume",
                                                                     saves.string()}),
                       {"train.state", "corrupted", "CRC-32C", "save.manifest"});
        write_bytes(state, good_state);
        write_bytes(manifest, good_manifest);
        expect_refused(run(d, tiny_args() + std::vector<std::string>{"--steps", "1", "--resume",
                                                                     saves.string()}),
                       {"--steps 1", "already at step 2"});
        CHECK(run(d, tiny_args() +
                         std::vector<std::string>{"--steps", "3", "--resume", saves.string()})
                  .status == 0);
    }
    SUBCASE("a resume refuses another gradient type, batch, sequence length or data") {
        const auto saves = d / "r";
        std::vector<std::uint16_t> a(400), b(400);
        for (std::size_t i = 0; i < a.size(); ++i) {
            a[i] = static_cast<std::uint16_t>(32 + i % 90);
            b[i] = static_cast<std::uint16_t>(32 + (i * 7) % 90);
        }
        write_tokens(d / "a.bin", a);
        write_tokens(d / "b.bin", b);
        write_tokens(d / "short_a.bin", std::vector<std::uint16_t>(a.begin(), a.begin() + 300));
        auto with = [&](std::vector<std::string> extra) {
            return tiny_args() +
                   std::vector<std::string>{"--grad-dtype", "fp16", "--data",
                                            (d / "a.bin").string()} +
                   extra;
        };
        REQUIRE(
            run(d, with({"--steps", "2", "--save", saves.string(), "--save-every", "2"})).status ==
            0);
        const auto resume =
            std::vector<std::string>{"--steps", "4", "--resume", saves.string(), "--json"};
        auto r = [&](std::vector<std::string> extra) { return run(d, with(extra) + resume); };
        expect_refused(r({"--grad-dtype", "fp32"}),
                       {"--grad-dtype fp32", "made with fp16 gradients"});
        expect_refused(r({"--batch", "1"}), {"--batch 1 --seq 16", "made with --batch 2 --seq 16"});
        expect_refused(r({"--seq", "8"}), {"--batch 2 --seq 8", "made with --batch 2 --seq 16"});
        expect_refused(r({"--data", (d / "b.bin").string()}),
                       {"b.bin", "not the data", "400 tokens there, 400 here, other values"});
        expect_refused(r({"--data", (d / "short_a.bin").string()}),
                       {"short_a.bin", "400 tokens there, 300 here"});
        auto straight = run(d, with({"--steps", "4", "--json"}));
        REQUIRE(straight.status == 0);
        auto want = json_losses(straight.out);
        auto resumed = r({});
        REQUIRE(resumed.status == 0);
        auto got = json_losses(resumed.out);
        REQUIRE(got.size() == 2);
        CHECK(got[0] == want[2]);
        CHECK(got[1] == want[3]);
    }
    SUBCASE("headers whose sizes overflow, non-finite parameters, a FIFO") {
        // channels 2^30 and a padded vocabulary near 2^31: the parameter count wraps to 0 in
        // 64 bits, so a header-only file would pass the size check.
        auto huge = ck;
        const std::int32_t fields[] = {2147483647, 256,     1,
                                       1,          1 << 30, 2147483634};  // maxT, V, L, NH, C, Vp
        std::memcpy(huge.data() + 2 * sizeof(std::int32_t), fields, sizeof fields);
        huge.resize(256 * sizeof(std::int32_t));
        write_bytes(d / "huge.bin", huge);
        expect_refused(run(d, {"--model", (d / "huge.bin").string(), "--steps", "0"}),
                       {"huge.bin", "more than the 2^38"});
        auto nan = ck;
        const float not_a_number = std::nanf("");
        std::memcpy(nan.data() + 256 * sizeof(std::int32_t) + 5 * sizeof(float), &not_a_number,
                    sizeof not_a_number);
        write_bytes(d / "nan.bin", nan);
        expect_refused(run(d, {"--model", (d / "nan.bin").string()}),
                       {"nan.bin", "parameter 5 (in wte) is NaN"});
        REQUIRE(::mkfifo((d / "fifo").c_str(), 0600) == 0);
        expect_refused(run(d, {"--model", (d / "fifo").string()}), {"fifo", "not a regular file"});
        expect_refused(run(d, {"--data", (d / "fifo").string()}), {"fifo", "not a regular file"});
    }
}

namespace {

/// Runs `mode` (offload and gradient flags) for 10 steps straight, then again with saves every
/// 3 steps killed with SIGKILL after step 7, then resumed: the same losses.
void check_killed_and_resumed(const std::vector<std::string>& mode) {
    spillway::test::temp_dir dir("mini_gpt_cli");
    const auto d = dir.path();
    const int steps = 10;
    auto common = tiny_args() + mode +
                  std::vector<std::string>{
                      "--steps",    std::to_string(steps), "--json", "--path", (d / "p").string(),
                      "--lock-dir", (d / "locks").string()};
    auto straight = run(d, common);
    REQUIRE(straight.status == 0);
    auto want = json_losses(straight.out);
    REQUIRE(want.size() == static_cast<std::size_t>(steps));

    // Start the same run with saves every 3 steps; kill it once it reported step 7 (of 1..10).
    auto args =
        common + std::vector<std::string>{"--save", (d / "saves").string(), "--save-every", "3"};
    kill_after_step(args, 7);
    // The latest complete save is step 6 (or 9 if the kill landed after it).
    std::string latest = slurp(d / "saves" / "latest");
    MESSAGE("killed after step 7; latest save: " << latest);
    CHECK((latest == "step-00000006" || latest == "step-00000009"));

    auto resumed = run(d, common + std::vector<std::string>{"--resume", (d / "saves").string()});
    REQUIRE(resumed.status == 0);
    auto got = json_losses(resumed.out);
    REQUIRE(!got.empty());
    std::size_t from = static_cast<std::size_t>(steps) - got.size();
    CHECK((from == 6 || from == 9));
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == want[from + i]);
}

}  // namespace

TEST_CASE("a run killed with SIGKILL and resumed gives exactly the uninterrupted losses") {
    check_killed_and_resumed({"--offload", "all", "--grad-dtype", "bf16"});
}

TEST_CASE(
    "--offload params: a run killed with SIGKILL and resumed gives exactly the uninterrupted "
    "losses") {
    check_killed_and_resumed({"--offload", "params"});
}

TEST_CASE("--lr-schedule cosine: killed and resumed, the uninterrupted losses") {
    check_killed_and_resumed(
        {"--offload", "all", "--lr-schedule", "cosine", "--warmup-steps", "3", "--lr-min", "1e-5"});
}

TEST_CASE(
    "--offload params with --lr-schedule cosine and fp16: killed and resumed, the uninterrupted "
    "losses") {
    // fp16's update is deferred to the next forward: it must keep its own step's lr.
    check_killed_and_resumed({"--offload", "params", "--grad-dtype", "fp16", "--lr-schedule",
                              "cosine", "--warmup-steps", "2", "--lr-min", "1e-4"});
}

TEST_CASE(
    "--lr-schedule: the same losses in every --offload mode, other losses than constant, a resume "
    "with another schedule refused, bad flags refused") {
    spillway::test::temp_dir dir("mini_gpt_cli");
    const auto d = dir.path();
    const std::vector<std::string> cosine = {"--lr-schedule", "cosine", "--warmup-steps", "2",
                                             "--lr-min",      "1e-4"};
    auto losses = [&](const std::vector<std::string>& extra) {
        auto r = run(
            d, tiny_args() + extra +
                   std::vector<std::string>{"--steps", "6", "--json", "--path", (d / "p").string(),
                                            "--lock-dir", (d / "locks").string()});
        REQUIRE(r.status == 0);
        return json_losses(r.out);
    };
    const auto want = losses(cosine);
    REQUIRE(want.size() == 6);
    for (const char* mode : {"optimizer", "params"}) {
        CAPTURE(mode);
        CHECK(losses(cosine + std::vector<std::string>{"--offload", mode}) == want);
    }
    // The fp16 path defers its update to the next forward; the in-memory and the streamed runs
    // agree with the schedule too.
    const auto fp16 = cosine + std::vector<std::string>{"--grad-dtype", "fp16"};
    CHECK(losses(fp16 + std::vector<std::string>{"--offload", "params"}) == losses(fp16));
    const auto constant = losses({});
    CHECK(constant[0] == want[0]);          // the same first forward
    CHECK(constant.back() != want.back());  // the schedule reached the updates

    // A save made with one schedule resumes only with it.
    const auto saves = d / "s";
    REQUIRE(run(d, tiny_args() + cosine +
                       std::vector<std::string>{"--steps", "6", "--save", saves.string(),
                                                "--save-every", "3"})
                .status == 0);
    auto resume = [&](const std::vector<std::string>& extra) {
        return run(d, tiny_args() + extra +
                          std::vector<std::string>{"--steps", "6", "--resume", saves.string()});
    };
    expect_refused(resume({}), {"--lr-schedule constant --lr 0.001 --warmup-steps 0",
                                "was made with --lr-schedule cosine --lr 0.001 --lr-min 1e-04 "
                                "--warmup-steps 2 --steps 6"});
    expect_refused(resume({"--lr-schedule", "cosine", "--warmup-steps", "2", "--lr-min", "2e-4"}),
                   {"--lr-min 2e-04", "resume with its schedule"});
    expect_refused(run(d, tiny_args() + cosine +
                              std::vector<std::string>{"--steps", "8", "--resume", saves.string()}),
                   {"--steps 8", "--steps 6"});

    // Bad flags, before training.
    expect_refused(run(d, {"--lr-schedule", "linear"}), {"--lr-schedule", "linear"});
    expect_refused(run(d, {"--lr-min", "1e-5"}), {"--lr-min", "needs --lr-schedule cosine"});
    expect_refused(run(d, {"--lr-schedule", "cosine", "--lr", "1e-4", "--lr-min", "1e-3"}),
                   {"--lr-min", "at most --lr"});
    expect_refused(run(d, {"--lr-schedule", "cosine", "--steps", "5", "--warmup-steps", "5"}),
                   {"--warmup-steps", "fewer warmup steps"});
    expect_refused(run(d, {"--warmup-steps", "-1"}), {"--warmup-steps"});
}

TEST_CASE(
    "every file of a save is covered by a CRC-32C in save.manifest; a damaged one is refused by "
    "name") {
    spillway::test::temp_dir dir("mini_gpt_cli");
    const auto d = dir.path();
    for (const std::string mode : {"none", "all"}) {
        CAPTURE(mode);
        const auto common =
            tiny_args() + std::vector<std::string>{"--offload",  mode,
                                                   "--path",     (d / "p").string(),
                                                   "--lock-dir", (d / "locks").string(),
                                                   "--json"};
        const auto saves = d / ("saves-" + mode);
        auto straight = run(d, common + std::vector<std::string>{"--steps", "22"});
        REQUIRE(straight.status == 0);
        const auto want = json_losses(straight.out);
        REQUIRE(run(d, common + std::vector<std::string>{"--steps", "20", "--save", saves.string(),
                                                         "--save-every", "5"})
                    .status == 0);
        const auto save = saves / slurp(saves / "latest");
        const auto resume =
            common + std::vector<std::string>{"--steps", "22", "--resume", saves.string()};
        // Every file but the optimizer's subgroup files is listed (its manifest.txt lists those).
        const std::string shard_file =
            mode == "none" ? "shard-0-of-1/moments.bin" : "shard-0-of-1/optimizer/manifest.txt";
        const std::string listed = slurp(save / "save.manifest");
        for (const auto& f : {std::string("model.bin"), std::string("train.state"), shard_file})
            CHECK(listed.find(" " + f + "\n") != std::string::npos);
        CHECK(listed.find("subgroup-") == std::string::npos);
        CHECK(listed.find("manifest_crc ") != std::string::npos);

        // One byte of `file` xor `mask`: the resume is refused with `needles`, then the file is put
        // back.
        auto flipped = [&](const std::filesystem::path& file, std::size_t at, unsigned mask,
                           const std::vector<std::string>& needles) {
            CAPTURE(file);
            const auto good = read_file(file);
            REQUIRE(at < good.size());
            auto bad = good;
            bad[at] ^= std::byte(mask);
            write_bytes(file, bad);
            expect_refused(run(d, resume), needles);
            write_bytes(file, good);
        };
        // Bit 0 of byte 8 makes the next step 21: the resume would skip batch 20.
        flipped(save / "train.state", 8, 1,
                {(save / "train.state").string(), "corrupted", "CRC-32C", "save.manifest"});
        flipped(save / "model.bin", 256 * 4 + 100, 0x10,
                {(save / "model.bin").string(), "corrupted", "CRC-32C"});
        flipped(save / shard_file, 20, 0x01,
                {(save / shard_file).string(), "corrupted", "CRC-32C"});
        flipped(save / "save.manifest", 20, 0x01,
                {(save / "save.manifest").string(), "damaged save manifest"});
        // A truncated file, and a listed file that is gone.
        const auto model = read_file(save / "model.bin");
        write_bytes(save / "model.bin", std::vector<std::byte>(model.begin(), model.end() - 4));
        expect_refused(run(d, resume),
                       {(save / "model.bin").string(), "save.manifest records", "truncated"});
        write_bytes(save / "model.bin", model);
        const auto shard = read_file(save / shard_file);
        std::filesystem::remove(save / shard_file);
        expect_refused(run(d, resume),
                       {(save / shard_file).string(), "missing", "save.manifest lists it"});
        write_bytes(save / shard_file, shard);
        // A save written with a manifest (train.state format 4) that lost it is refused, not
        // resumed unchecked.
        const auto manifest = read_file(save / "save.manifest");
        std::filesystem::remove(save / "save.manifest");
        expect_refused(run(d, resume),
                       {(save / "save.manifest").string(), "missing", "cannot be checked"});
        write_bytes(save / "save.manifest", manifest);
        // Put back, the save resumes with the uninterrupted losses.
        auto resumed = run(d, resume);
        REQUIRE(resumed.status == 0);
        const auto got = json_losses(resumed.out);
        REQUIRE(got.size() == 2);
        CHECK(got[0] == want[20]);
        CHECK(got[1] == want[21]);
    }
}

TEST_CASE("a FIFO or a directory in place of a save's file fails the resume at once, naming it") {
    spillway::test::temp_dir dir("mini_gpt_cli");
    const auto d = dir.path();
    for (const std::string mode : {"none", "all"}) {
        CAPTURE(mode);
        const auto common =
            tiny_args() + std::vector<std::string>{"--offload",  mode,
                                                   "--path",     (d / "p").string(),
                                                   "--lock-dir", (d / "locks").string()};
        const auto saves = d / ("saves-" + mode);
        REQUIRE(run(d, common + std::vector<std::string>{"--steps", "5", "--save", saves.string(),
                                                         "--save-every", "5"})
                    .status == 0);
        const auto save = saves / slurp(saves / "latest");
        const auto resume =
            common + std::vector<std::string>{"--steps", "6", "--resume", saves.string()};
        std::vector<std::filesystem::path> files = {saves / "latest", save / "save.manifest",
                                                    save / "train.state", save / "model.bin"};
        if (mode == "none") {
            files.push_back(save / "shard-0-of-1" / "moments.bin");
        } else {
            files.push_back(save / "shard-0-of-1" / "optimizer" / "manifest.txt");
            files.push_back(save / "shard-0-of-1" / "optimizer" / "subgroup-000000.bin");
        }
        for (const auto& file : files) {
            CAPTURE(file);
            auto away = file;
            away += ".away";
            std::filesystem::rename(file, away);
            REQUIRE(::mkfifo(file.c_str(), 0600) == 0);
            // A reader that opened the FIFO would wait for a writer for ever: 60 s is a hang.
            const auto r = run_within(d, resume, 60);
            CHECK(r.status != 128 + SIGKILL);
            expect_refused(r, {file.string() + " is a FIFO"});
            std::filesystem::remove(file);
            std::filesystem::create_directory(file);
            expect_refused(run_within(d, resume, 60), {file.string() + " is a directory"});
            std::filesystem::remove(file);
            std::filesystem::rename(away, file);
        }
        CHECK(run(d, resume).status == 0);
    }
}

TEST_CASE(
    "a save whose optimizer manifest.txt is gone is reported as missing, not as another --offload "
    "mode") {
    spillway::test::temp_dir dir("mini_gpt_cli");
    const auto d = dir.path();
    auto args = [&](const std::string& mode) {
        return tiny_args() + std::vector<std::string>{"--offload",  mode,
                                                      "--path",     (d / "p").string(),
                                                      "--lock-dir", (d / "locks").string()};
    };
    const auto saves = d / "saves";
    REQUIRE(run(d, args("all") + std::vector<std::string>{"--steps", "5", "--save", saves.string(),
                                                          "--save-every", "5"})
                .status == 0);
    const auto save = saves / slurp(saves / "latest");
    const auto resume = std::vector<std::string>{"--steps", "6", "--resume", saves.string()};
    const auto optimizer_manifest = save / "shard-0-of-1" / "optimizer" / "manifest.txt";
    // Another mode's save is still told as such.
    expect_refused(run(d, args("none") + resume),
                   {"moments.bin", "made with --offload optimizer|all"});
    const auto text = read_file(optimizer_manifest);
    std::filesystem::remove(optimizer_manifest);
    // Checked by save.manifest, which lists it.
    auto r = run(d, args("all") + resume);
    expect_refused(r, {optimizer_manifest.string(), "missing"});
    CHECK(r.err.find("--offload none") == std::string::npos);
    write_bytes(optimizer_manifest, text);
    CHECK(run(d, args("all") + resume).status == 0);
}

TEST_CASE(
    "the trainer never writes through a hard or symbolic link left where it writes its files") {
    spillway::test::temp_dir dir("mini_gpt_cli");
    const auto d = dir.path();
    const std::string precious = "a file outside, shared through a link";
    auto victim = [&](const std::string& name) {
        const auto p = d / ("outside-" + name);
        std::vector<std::byte> b(precious.size());
        std::memcpy(b.data(), precious.data(), b.size());
        write_bytes(p, b);
        return p;
    };
    auto link_to = [](const std::filesystem::path& target, const std::filesystem::path& at) {
        REQUIRE(::link(target.c_str(), at.c_str()) == 0);
    };
    // --save-model writes model.bin.tmp and renames it: a hard link or a symbolic link planted
    // at that temporary name (a killed run's leftover, or an attacker's) is replaced, and so is
    // one at the final name.
    const auto hard = victim("hard"), soft = victim("soft"), final_name = victim("final"),
               latest = victim("latest"), trace = victim("trace");
    link_to(hard, d / "a.bin.tmp");
    REQUIRE(::symlink(soft.c_str(), (d / "b.bin.tmp").c_str()) == 0);
    link_to(final_name, d / "c.bin");
    std::filesystem::create_directory(d / "saves");
    link_to(latest, d / "saves" / "latest.tmp");
    link_to(trace, d / "trace.json");
    for (const char* out : {"a.bin", "b.bin", "c.bin"}) {
        CAPTURE(out);
        auto r = run(d, tiny_args() + std::vector<std::string>{
                                          "--steps", "1", "--save-model", (d / out).string(),
                                          "--save", (d / "saves").string(), "--save-every", "1",
                                          "--trace", (d / "trace.json").string()});
        INFO("stderr: " << r.err);
        CHECK(r.status == 0);
        CHECK(read_checkpoint(d / out).params.size() > 0);
    }
    for (const auto& p : {hard, soft, final_name, latest, trace}) {
        CAPTURE(p);
        CHECK(slurp(p) == precious);
        CHECK(std::filesystem::hard_link_count(p) == 1);
    }
    CHECK(slurp(d / "saves" / "latest") == "step-00000001");
}

TEST_CASE(
    "the default paths a killed run left are removed by the next run, a running one's are not") {
    spillway::test::temp_dir dir("mini_gpt_cli");
    const auto d = dir.path();
    const auto tmp = d / "tmp";
    std::filesystem::create_directory(tmp);
    const char* old_tmpdir = std::getenv("TMPDIR");
    const std::string saved_tmpdir = old_tmpdir ? old_tmpdir : "";
    ::setenv("TMPDIR", tmp.c_str(), 1);  // the runs' default paths go here
    auto scratch = [&] {
        std::vector<std::filesystem::path> found;
        for (const auto& e : std::filesystem::directory_iterator(tmp))
            if (e.path().filename().string().rfind("mini_gpt-", 0) == 0) found.push_back(e.path());
        return found;
    };
    auto common = tiny_args() + std::vector<std::string>{"--offload", "all", "--lock-dir",
                                                         (d / "locks").string()};

    kill_after_step(common + std::vector<std::string>{"--steps", "1000", "--json"}, 2);
    auto left = scratch();
    REQUIRE(left.size() == 1);
    CHECK(std::filesystem::exists(left[0] / spillway::owned_directory::owner_file));
    auto running = spillway::owned_directory::create(tmp, "mini_gpt-");  // another run's, alive

    auto r = run(d, common + std::vector<std::string>{"--steps", "2"});
    CHECK(r.status == 0);
    auto after = scratch();
    CHECK(after == std::vector<std::filesystem::path>{running.path()});

    if (old_tmpdir)
        ::setenv("TMPDIR", saved_tmpdir.c_str(), 1);
    else
        ::unsetenv("TMPDIR");
}

TEST_CASE("what a killed run left on --path is removed by the next run on that path") {
    spillway::test::temp_dir dir("mini_gpt_cli");
    const auto d = dir.path();
    auto common = tiny_args() + std::vector<std::string>{"--offload",  "all",
                                                         "--path",     (d / "p").string(),
                                                         "--lock-dir", (d / "locks").string()};
    // Files of this process's folders (proc-XXXXXX) under the path's shared directories.
    auto left = [&] {
        std::size_t files = 0;
        if (std::filesystem::exists(d / "p"))
            for (const auto& e : std::filesystem::recursive_directory_iterator(d / "p"))
                files += e.is_regular_file() &&
                         e.path().filename() != spillway::owned_directory::owner_file;
        return files;
    };
    kill_after_step(common + std::vector<std::string>{"--steps", "1000", "--json"}, 2);
    REQUIRE(left() > 0);  // the optimizer's state and the activations of the killed run
    REQUIRE(run(d, common + std::vector<std::string>{"--steps", "2"}).status == 0);
    CHECK(left() == 0);
    CHECK_FALSE(std::filesystem::exists(d / "p" / "mini_gpt-optimizer"));
    CHECK_FALSE(std::filesystem::exists(d / "p" / "mini_gpt-activations"));
}

TEST_CASE("--json lines, the progress table, --trace and --help") {
    spillway::test::temp_dir dir("mini_gpt_cli");
    const auto d = dir.path();
    auto r = run(d, tiny_args() + std::vector<std::string>{"--steps", "3", "--json", "--offload",
                                                           "all", "--path", (d / "p").string(),
                                                           "--lock-dir", (d / "locks").string(),
                                                           "--trace", (d / "trace.json").string()});
    REQUIRE(r.status == 0);
    // The path's node_lock files went to --lock-dir (not /dev/shm), one per direction.
    std::size_t lock_files = 0;
    for (const auto& e : std::filesystem::directory_iterator(d / "locks"))
        lock_files += e.path().extension() == ".lock";
    CHECK(lock_files == 2);
    std::istringstream lines(r.out);
    std::string line;
    int n = 0;
    while (std::getline(lines, line)) {
        for (const char* key : {"\"step\":", "\"loss\":", "\"ms\":", "\"tokens_per_s\":",
                                "\"act_peak_bytes\":", "\"act_all_kept_bytes\":", "\"cpu_ms\":"})
            CHECK(line.find(key) != std::string::npos);
        CHECK(line.front() == '{');
        CHECK(line.back() == '}');
        ++n;
    }
    CHECK(n == 3);
    // Steps count from 1, as the progress line's "step 1/2" below and the saves' names do.
    CHECK(json_values(r.out, "step") == std::vector<std::string>{"1", "2", "3"});
    for (const auto& cpu : json_values(r.out, "cpu_ms")) CHECK(std::stod(cpu) > 0);
    // The first update (ascending) ran under the second step's forward; the second
    // (descending) and the last did not; only a step after a deferred one can wait.
    CHECK(json_values(r.out, "update_deferred") ==
          std::vector<std::string>{"true", "false", "false"});
    auto waits = json_values(r.out, "param_wait_ms");
    REQUIRE(waits.size() == 3);
    CHECK(std::stod(waits[0]) == 0.0);
    CHECK(std::stod(waits[2]) == 0.0);
    // In memory, the activation peak is exactly what keeping every activation holds, from
    // the first step on (the model's own buffers included).
    auto kept = run(
        d, tiny_args() + std::vector<std::string>{"--steps", "2", "--json", "--offload", "none"});
    REQUIRE(kept.status == 0);
    CHECK(json_values(kept.out, "act_peak_bytes") == json_values(kept.out, "act_all_kept_bytes"));
    CHECK(json_values(kept.out, "act_all_kept_bytes").size() == 2);
    auto trace = slurp(d / "trace.json");
    CHECK(trace.find("\"traceEvents\"") != std::string::npos);
    for (const char* name :
         {"forward 1", "backward 3", "update 2", "gradient check", "optimizer step",
          "optimizer step (under forward 2)", "save layer 1", "load layer 0"})
        CHECK(trace.find(name) != std::string::npos);
    // One process: no exchange between ranks, and only the file asked for.
    CHECK(trace.find("gradient exchange") == std::string::npos);
    CHECK_FALSE(std::filesystem::exists(d / "trace.rank1.json"));
    // Under mpirun, rank k > 0 writes beside rank 0 (the MPI test runs it).
    CHECK(trace_path(d / "trace.json", 0) == d / "trace.json");
    CHECK(trace_path(d / "trace.json", 1) == d / "trace.rank1.json");
    CHECK(trace_path(d / "trace", 12) == d / "trace.rank12");

    auto table =
        run(d, tiny_args() + std::vector<std::string>{"--steps", "2", "--offload", "all", "--path",
                                                      (d / "p").string(), "--lock-dir",
                                                      (d / "locks").string()});
    REQUIRE(table.status == 0);
    for (const char* s : {"step     1/2", "loss", "tok/s", "fwd", "bwd", "upd", "io-wait",
                          "elapsed, ", " left", "summary", "throughput", "activations", "stash",
                          "optimizer", "resident set", "(update under the next forward)",
                          "deferred update 1 of 2 updates ran under the next forward"})
        CHECK(table.out.find(s) != std::string::npos);
    // The matmul line names the kernels OpenBLAS runs: the child inherits this process's
    // environment, so its OpenBLAS picks what this one picked.
    CHECK(table.out.find("matmul          OpenBLAS ") != std::string::npos);
    CHECK(table.out.find(std::string(openblas_get_corename()) + " kernels (") != std::string::npos);
    auto help = run(d, {"--help"});
    CHECK(help.status == 0);
    CHECK(help.out == usage_text());
    CHECK(help.out.find("--offload") != std::string::npos);
    CHECK(help.out.find("--version") != std::string::npos);
    // --help wins wherever it is, even beside a bad flag.
    CHECK(run(d, {"--bogus", "-h"}).out == help.out);
    auto version = run(d, {"--version"});
    CHECK(version.status == 0);
    CHECK(version.out == "mini_gpt (Spillway " SPILLWAY_VERSION_STRING ")\n");
}

namespace {

/// Every field of `o`, printed: two parses that give the same text gave the same options.
std::string fields(const options& o) {
    std::ostringstream s;
    s << o.model << ' ' << o.data << ' ' << o.batch << ' ' << o.seq << ' ' << o.steps << ' ' << o.lr
      << ' ' << o.beta1 << ' ' << o.beta2 << ' ' << o.eps << ' ' << o.weight_decay << ' ' << o.seed
      << ' ' << o.threads << ' ' << o.save_model << ' ' << static_cast<int>(o.grads) << ' '
      << offload_name(o.offload) << ' ' << o.memory_budget << ' ' << o.init << ' ' << o.lock_dir
      << ' ' << o.act_split << ' ' << o.act_budget_mib << ' ' << o.act_recompute << ' '
      << o.subgroup << ' ' << o.buffers << ' ' << o.update_under_forward << ' '
      << o.update_under_backward << ' ' << o.ascending_order << ' ' << o.save_dir << ' '
      << o.save_every << ' ' << o.resume_dir << ' ' << o.json << ' ' << o.quiet << ' ' << o.trace
      << ' ' << o.layers << ' ' << o.channels << ' ' << o.heads << ' ' << o.vocab << ' '
      << o.max_seq << ' ' << o.corpus_bytes << ' ' << static_cast<int>(o.lr_schedule) << ' '
      << o.warmup_steps << ' ' << o.lr_min << " paths";
    for (const auto& p : o.paths) s << ' ' << p;
    return s.str();
}

}  // namespace

TEST_CASE("every flag: --flag value and --flag=value give the same options, and --help lists it") {
    struct row {
        std::string flag, value;
        std::vector<std::string> with;  // flags the row needs beside it
    };
    const std::vector<row> rows = {
        {"--model", "m.bin", {}},
        {"--init", "gpt2", {}},
        {"--data", "d.bin", {}},
        {"--corpus-bytes", "4096", {}},
        {"--layers", "2", {}},
        {"--channels", "64", {}},
        {"--heads", "8", {}},
        {"--vocab", "300", {}},
        {"--max-seq", "32", {}},
        {"--batch", "4", {}},
        {"--seq", "32", {}},
        {"--steps", "7", {}},
        {"--lr", "1e-3", {}},
        {"--lr-schedule", "cosine", {}},
        {"--warmup-steps", "3", {}},
        {"--lr-min", "1e-5", {"--lr-schedule", "cosine"}},
        {"--beta1", "0.8", {}},
        {"--beta2", "0.99", {}},
        {"--eps", "1e-6", {}},
        {"--wd", "0.1", {}},
        {"--seed", "7", {}},
        {"--threads", "3", {}},
        {"--grad-dtype", "bf16", {}},
        {"--offload", "all", {}},
        {"--memory-budget", "800M", {"--offload", "params"}},
        {"--path", "p", {}},
        {"--lock-dir", "locks", {}},
        {"--act-split", "2", {}},
        {"--act-budget", "64", {}},
        {"--act-recompute", "off", {}},
        {"--subgroup", "2048", {}},
        {"--buffers", "4", {}},
        {"--update-under-forward", "off", {}},
        {"--update-under-backward", "off", {}},
        {"--order", "ascending", {}},
        {"--save", "s", {}},
        {"--save-every", "5", {}},
        {"--resume", "r", {}},
        {"--save-model", "out.bin", {}},
        {"--trace", "t.json", {}},
    };
    const std::string help = usage_text();
    for (const auto& r : rows) {
        CAPTURE(r.flag);
        const auto apart =
            fields(parse_options(r.with + std::vector<std::string>{r.flag, r.value}));
        CHECK(apart != fields(parse_options(r.with)));  // the flag changed something
        CHECK(apart ==
              fields(parse_options(r.with + std::vector<std::string>{r.flag + "=" + r.value})));
        CHECK(help.find("\n  " + r.flag + " ") != std::string::npos);
    }
    for (const std::string flag : {"--json", "--quiet"}) {
        CAPTURE(flag);
        CHECK(fields(parse_options({flag})) != fields(parse_options({})));
        CHECK(fields(parse_options({flag})) == fields(parse_options({flag + "=true"})));
        CHECK(help.find("\n  " + flag + " ") != std::string::npos);
    }
    for (const char* s : {"-h,--help", "--version", "\"step\" counts from 1",
                          "default 16; 1 to 1048576", "at least 1024", "3.5G"})
        CHECK(help.find(s) != std::string::npos);

    // A flag given twice keeps its last value; --path keeps every one.
    CHECK(parse_options({"--batch", "2", "--batch=4"}).batch == 4);
    CHECK(parse_options({"--path", "a", "--path=b"}).paths ==
          std::vector<std::filesystem::path>{"a", "b"});
    // Decimal only (CLI11 alone would read 010 as 8); the numbers are the ones std::stof reads.
    CHECK(parse_options({"--batch", "010"}).batch == 10);
    CHECK(parse_options({"--lr", "1e-3"}).lr == 1e-3f);
    CHECK(parse_options({"--eps", "3e-9"}).eps == 3e-9f);
    CHECK(parse_options({"--act-split", "offload"}).act_split == 1 << 30);
    CHECK(parse_options({"--act-split", "adaptive", "--act-split=3"}).act_split == 3);
    CHECK(parse_options({"--memory-budget=3.5G", "--offload=params"}).memory_budget ==
          static_cast<std::size_t>(3.5 * 1024 * 1024 * 1024));
    // --help and --version are answered before any flag is checked.
    CHECK(help_or_version({"--steps", "3", "--version"}) == version_text());
    CHECK(help_or_version({"--bogus", "--help"}) == help);
    CHECK_FALSE(help_or_version({"--steps", "3"}).has_value());
}
