// SPDX-License-Identifier: Apache-2.0
// The save directory and the storage paths as an attacker or a careless user meets them:
// --save removes only the saves it can prove it wrote, and one run at a time holds it; a
// --path and a --save never nest; a save without its manifest is never read as an older,
// unchecked format; bytes after the manifest's CRC line are refused; control bytes from a
// save file are escaped in messages; each exit status means one thing; --path and --save
// create only their last component; a sub-byte --memory-budget is refused.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "cli.hpp"
#include "cli_support.hpp"
#include "llmc_format.hpp"
#include "spillway/error.hpp"
#include "spillway/io/durable_file.hpp"
#include "support/temp_dir.hpp"
#include "trainer.hpp"
#include "trainer_support.hpp"

using namespace mini_gpt;
using namespace mini_gpt::cli_testing;
namespace fs = std::filesystem;

namespace {

bool has(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}

std::size_t count_of(const std::string& text, const std::string& part) {
    std::size_t n = 0;
    for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
    return n;
}

void write_text(const fs::path& p, const std::string& text) {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f << text;
}

/// A save of the tiny model after 2 steps in `saves` (--save-every 2), with `extra` flags; the
/// save folder `latest` names.
fs::path make_save(const fs::path& d, const fs::path& saves, std::vector<std::string> extra = {}) {
    const auto r = run(d, tiny_args() + extra +
                              std::vector<std::string>{"--steps", "2", "--save", saves.string(),
                                                       "--save-every", "2"});
    INFO("stderr: " << r.err);
    REQUIRE(r.status == 0);
    return saves / slurp(saves / "latest");
}

/// Resumes the tiny model from `saves` for 4 steps, with `extra` flags.
result resume(const fs::path& d, const fs::path& saves, std::vector<std::string> extra = {}) {
    return run(d, tiny_args() + extra +
                      std::vector<std::string>{"--steps", "4", "--resume", saves.string()});
}

/// Each test's scratch directory `d`, removed after it, and `saves` in it for --save.
struct scratch {
    spillway::test::temp_dir dir{"mini_gpt_save_safety"};
    fs::path d = dir.path();
    fs::path saves = d / "s";
};

}  // namespace

TEST_CASE("--memory-budget: a value that is not a whole number of bytes of at least 1 is refused") {
    for (const std::string v : {"0.5", "0.0001K", "1.1K", "1.5", "0", "0K", "0.0G", "-1", "1e3",
                                ".5K", "5.K", "1X", "", "99999999999999999999999999999999"}) {
        CAPTURE(v);
        const auto m = testing::message_of([&] {
            parse_options({"--offload", "params", "--memory-budget", v});
        });
        CHECK(has(m, "--memory-budget"));
        CHECK(has(m, spillway::quoted(v)));
        CHECK_THROWS_AS(parse_options({"--offload", "params", "--memory-budget", v}), input_error);
    }
    auto budget = [](const char* v) {
        return parse_options({"--offload", "params", "--memory-budget", v}).memory_budget;
    };
    CHECK(budget("1") == 1);
    CHECK(budget("1.5K") == 1536);
    CHECK(budget("0.5K") == 512);
    CHECK(budget("3.5G") == std::size_t{7} << 29);
    CHECK(budget("800MiB") == std::size_t{800} << 20);
    CHECK(budget("2tB") == std::size_t{2} << 40);
    CHECK(budget("1000000000000000000") == 1'000'000'000'000'000'000ull);
    CHECK_THROWS_AS(budget("1000000000000000001"), input_error);
}

TEST_CASE_FIXTURE(
    scratch, "--save removes only the saves it wrote; the user's step-* entries stay, noted once") {
    fs::create_directories(saves / "step-notes");
    write_text(saves / "step-notes" / "a", "hi\n");
    write_text(saves / "step-plan.txt", "x\n");
    fs::create_directories(saves / "step-00000007");  // our name, but no manifest: not ours
    write_text(saves / "step-00000007" / "mine", "y\n");
    fs::create_directories(saves / "step-0000001");  // one digit short of our names
    const auto r =
        run(d, tiny_args() + std::vector<std::string>{"--steps", "3", "--save", saves.string(),
                                                      "--save-every", "1"});
    INFO("stderr: " << r.err);
    REQUIRE(r.status == 0);
    CHECK(slurp(saves / "step-notes" / "a") == "hi\n");
    CHECK(slurp(saves / "step-plan.txt") == "x\n");
    CHECK(slurp(saves / "step-00000007" / "mine") == "y\n");
    CHECK(fs::is_directory(saves / "step-0000001"));
    CHECK(slurp(saves / "latest") == "step-00000003");
    CHECK(fs::exists(saves / "step-00000003" / "save.manifest"));
    CHECK_FALSE(fs::exists(saves / "step-00000001"));  // the earlier saves of this run go
    CHECK_FALSE(fs::exists(saves / "step-00000002"));
    // Three saves pruned the folder; each foreign entry is mentioned once, by name.
    for (const char* name : {"step-notes", "step-plan.txt", "step-00000007", "step-0000001"}) {
        CAPTURE(name);
        CHECK(count_of(r.err, (saves / name).string() + "'") == 1);
    }
    CHECK(count_of(r.err, "\n") == 4);
}

TEST_CASE_FIXTURE(scratch,
                  "a save's step-N.tmp in the way goes only when it holds a save's names") {
    // A killed save's leftover (a model.bin, a shard folder): removed, and the save is made.
    fs::create_directories(saves / "step-00000001.tmp" / "shard-0-of-1");
    write_text(saves / "step-00000001.tmp" / "model.bin", "partial");
    // The user's folder under the name of the next save: kept, and that save fails, naming it.
    fs::create_directories(saves / "step-00000002.tmp");
    write_text(saves / "step-00000002.tmp" / "notes.txt", "mine\n");
    const auto r =
        run(d, tiny_args() + std::vector<std::string>{"--steps", "2", "--save", saves.string(),
                                                      "--save-every", "1"});
    INFO("stderr: " << r.err);
    CHECK(r.status == 1);
    CHECK(has(r.err, spillway::quoted((saves / "step-00000002.tmp").string()) + " is in the way"));
    CHECK(slurp(saves / "step-00000002.tmp" / "notes.txt") == "mine\n");
    CHECK(fs::exists(saves / "step-00000001" / "save.manifest"));
    CHECK_FALSE(fs::exists(saves / "step-00000001.tmp"));
}

TEST_CASE_FIXTURE(scratch,
                  "a --path inside --save, or a --save inside a --path, is refused naming both") {
    auto o = testing::tiny_options(d, 1, 2, 1);
    o.offload = offload_mode::params;
    o.save_every = 1;
    fs::path untouched;  // refused before anything is created: this stays missing
    SUBCASE("--path in --save") {
        o.save_dir = saves;
        o.paths = {saves / "step-00000001"};
        untouched = saves;
    }
    SUBCASE("--save in --path") {
        o.paths = {d / "p"};
        o.save_dir = d / "p" / "saves";
        untouched = d / "p";
    }
    SUBCASE("the same directory, spelled otherwise") {
        o.paths = {d / "p"};
        o.save_dir = d / "p" / ".." / "p" / ".";
        fs::create_directories(o.paths[0]);
        untouched = d / "p" / "latest";
    }
    const auto m = testing::message_of([&] { testing::run(o); });
    CHECK(has(m, "--path '" + o.paths[0].string() + "'"));
    CHECK(has(m, "--save '" + o.save_dir.string() + "'"));
    CHECK(has(m, "inside"));
    CHECK(count_of(m, "\n") == 0);
    CHECK_FALSE(fs::exists(untouched));
}

TEST_CASE_FIXTURE(
    scratch,
    "a second run on the same --save is refused at start, naming the directory and the "
    "holder's pid") {
    fs::create_directories(d / "a");
    // Run A: long, saving rarely; it holds the save directory from its start.
    const auto a_out = d / "a" / "stdout.txt";
    std::fflush(nullptr);
    const pid_t a = ::fork();
    REQUIRE(a >= 0);
    if (a == 0) {
        if (!std::freopen(a_out.c_str(), "w", stdout)) ::_exit(126);
        if (!std::freopen((d / "a" / "stderr.txt").c_str(), "w", stderr)) ::_exit(126);
        auto args = tiny_args() +
                    std::vector<std::string>{"--steps",      "1000000",      "--json", "--save",
                                             saves.string(), "--save-every", "1000000"};
        exec_mini_gpt(args);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!has(slurp(a_out), "\"step\":1,") && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const bool a_started = has(slurp(a_out), "\"step\":1,");
    const auto b =
        run(d, tiny_args() + std::vector<std::string>{"--steps", "1", "--save", saves.string(),
                                                      "--save-every", "1"});
    ::kill(a, SIGKILL);
    int st = 0;
    ::waitpid(a, &st, 0);
    REQUIRE(a_started);
    expect_refused(b, {"--save '" + saves.string() + "'", "pid " + std::to_string(a)});
    CHECK_FALSE(fs::exists(saves / "latest"));
    // The holder is gone (SIGKILL): the lock went with it, and the next run takes the directory.
    CHECK(run(d, tiny_args() + std::vector<std::string>{"--steps", "1", "--save", saves.string(),
                                                        "--save-every", "1"})
              .status == 0);
}

TEST_CASE_FIXTURE(scratch,
                  "a save cannot be downgraded: without its manifest it is refused, whatever "
                  "train.state's format says") {
    const auto save = make_save(d, saves);
    const auto state = save / "train.state";
    auto bytes = read_file(state);
    for (const std::uint64_t magic : {0x4d475054'53544132ull, 0x4d475054'53544154ull}) {
        std::memcpy(bytes.data(), &magic, sizeof magic);  // "MGPTSTA2", "MGPTSTAT"
        write_bytes(state, bytes);
        fs::remove(save / "save.manifest");
        expect_refused(resume(d, saves), {(save / "save.manifest").string(), "missing"});
    }
}

TEST_CASE_FIXTURE(scratch, "bytes after save.manifest's CRC line are refused") {
    const auto save = make_save(d, saves);
    const auto manifest = save / "save.manifest";
    const std::string good = slurp(manifest);
    for (const std::string tail : {"\n", " ", "\n\n\t", "x"}) {
        CAPTURE(tail);
        write_text(manifest, good + tail);
        expect_refused(resume(d, saves), {manifest.string(), "damaged save manifest"});
    }
    write_text(manifest, good);
    CHECK(resume(d, saves).status == 0);
}

TEST_CASE_FIXTURE(scratch, "control bytes quoted from a save's files are escaped in messages") {
    const auto save = make_save(d, saves);
    SUBCASE("latest naming a folder with an escape sequence") {
        write_text(saves / "latest", "step-\033[2J");
        const auto r = resume(d, saves);
        expect_refused(r, {(saves / "latest").string(), "step-\\x1b[2J"});
        CHECK_FALSE(has(r.err, "\033"));
    }
    SUBCASE("a manifest line with an escape sequence (its CRC recomputed)") {
        std::string text = "mini_gpt-save 1\nfile \033[2J\n";
        const auto crc = spillway::crc32c(std::as_bytes(std::span(text.data(), text.size())));
        char hex[16];
        std::snprintf(hex, sizeof hex, "%08x", crc);
        write_text(save / "save.manifest", text + "manifest_crc " + hex + "\nend\n");
        const auto r = resume(d, saves);
        expect_refused(r, {(save / "save.manifest").string(), "file \\x1b[2J"});
        CHECK_FALSE(has(r.err, "\033"));
    }
}

TEST_CASE_FIXTURE(
    scratch, "a flipped latest is blamed on latest; a missing params-moments.bin on its absence") {
    const std::vector<std::string> params = {"--offload", "params", "--path", (d / "p").string()};
    const auto save = make_save(d, saves, params);
    SUBCASE("latest") {
        std::string latest = slurp(saves / "latest");
        latest[5] ^= 1;  // step-00000002 -> step-10000002
        write_text(saves / "latest", latest);
        const auto r = resume(d, saves, params);
        expect_refused(r, {(saves / "latest").string(), "'step-10000002'"});
        CHECK_FALSE(has(r.err, "train.state"));
    }
    SUBCASE("params-moments.bin") {
        fs::remove(save / "params-moments.bin");
        const auto r = resume(d, saves, params);
        expect_refused(r, {(save / "params-moments.bin").string(), "missing", "save.manifest"});
        CHECK_FALSE(has(r.err, "without --offload params"));
    }
}

TEST_CASE_FIXTURE(
    scratch,
    "exit status: a write that fails during a save is 1 (the run failed), never 2 (bad "
    "input); --help says what each means") {
    // A file size limit makes the save's writes fail (EFBIG) as a full disk does (ENOSPC).
    const auto r =
        run_within(d,
                   tiny_args() + std::vector<std::string>{"--steps", "1", "--save", saves.string(),
                                                          "--save-every", "1"},
                   0, [] {
                       ::signal(SIGXFSZ, SIG_IGN);
                       const rlimit lim{64 << 10, 64 << 10};
                       ::setrlimit(RLIMIT_FSIZE, &lim);
                   });
    INFO("stderr: " << r.err);
    CHECK(r.status == 1);
    CHECK(count_of(r.err, "\n") == 1);
    CHECK(has(r.err, saves.string()));
    CHECK(has(r.err, std::strerror(EFBIG)));
    const std::string help = usage_text();
    CHECK(has(help, "Exit status: 0"));
    CHECK(has(help, "1 when the run fails"));
    CHECK(has(help, "2 for bad input"));
}

TEST_CASE_FIXTURE(scratch,
                  "--path and --save create only their last component; a missing parent is named") {
    auto o = testing::tiny_options(d, 1, 1, 1);
    o.offload = offload_mode::params;
    SUBCASE("--path") {
        o.paths = {d / "missing" / "x"};
    }
    SUBCASE("--save") {
        o.save_dir = d / "missing" / "x";
    }
    const auto m = testing::message_of([&] { testing::run(o); });
    CHECK(has(m, spillway::quoted((d / "missing").string())));
    CHECK(has(m, "does not exist"));
    CHECK_FALSE(fs::exists(d / "missing"));
    // The last component alone is created.
    o = testing::tiny_options(d, 1, 1, 1);
    o.offload = offload_mode::params;
    o.paths = {d / "new"};
    o.save_dir = d / "saves";
    o.save_every = 1;
    CHECK_NOTHROW(testing::run(o));
    CHECK(fs::is_directory(d / "new"));
    CHECK(fs::exists(d / "saves" / "latest"));
}
