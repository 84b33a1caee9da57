// SPDX-License-Identifier: Apache-2.0
// A budget is a promise: for combinations of the flags that shape memory (--grad-dtype,
// --act-split, --act-budget, --act-recompute) the mini_gpt binary either refuses
// --memory-budget at start, naming the smallest budget that works, or keeps its peak RSS
// (VmHWM) within the budget, at the smallest budget and at 1.1 times it. The smallest
// budget named is the same in identical runs, the next identical run accepts it, and one
// byte less is refused. Each run is a fresh process, so VmHWM is its own.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "support/temp_dir.hpp"
#include "trainer_support.hpp"

using namespace mini_gpt::testing;

namespace {

/// ThreadSanitizer maps shadow memory for the memory the program touches, several times its
/// size, and VmHWM counts it: the peak is then not the program's, and no plan bounds it. The
/// peak checks run in every other build (release, minimal, asan).
#if defined(__SANITIZE_THREAD__)
constexpr bool rss_counts_tsan_shadow = true;
#else
constexpr bool rss_counts_tsan_shadow = false;
#endif

/// Twelve layers whose activations (about 150 MiB, every layer) outweigh the plan's margin,
/// so that activations left out of the plan show in the peak.
std::vector<std::string> base_args(const std::filesystem::path& dir,
                                   const std::string& mode = "params") {
    return {MINI_GPT_EXE,
            "--layers",
            "12",
            "--channels",
            "128",
            "--heads",
            "4",
            "--seq",
            "128",
            "--max-seq",
            "128",
            "--batch",
            "8",
            "--steps",
            "2",
            "--threads",
            "2",
            "--corpus-bytes",
            "65536",
            "--offload",
            mode,
            "--path",
            (dir / "p").string(),
            "--lock-dir",
            dir.string(),
            "--json"};
}

struct outcome {
    int status = 0;
    std::string out;  // stdout and stderr
};

outcome run_binary(std::vector<std::string> args, const std::filesystem::path& dir) {
    const auto out = dir / "out.txt";
    outcome r;
    r.status = run(args, out);
    r.out = slurp(out) + slurp(out.string() + ".err");
    return r;
}

std::vector<std::string> with_budget(std::vector<std::string> args, std::size_t budget) {
    args.push_back("--memory-budget");
    args.push_back(std::to_string(budget));
    return args;
}

/// The smallest budget the binary names when refusing a budget of one byte.
std::size_t named_smallest(const std::vector<std::string>& args, const std::filesystem::path& dir) {
    const outcome r = run_binary(with_budget(args, 1), dir);
    CHECK_MESSAGE(r.status == 2, r.out);
    const std::string key = "the smallest budget that works is ";
    const auto at = r.out.find(key);
    REQUIRE_MESSAGE(at != std::string::npos, r.out);
    return std::stoull(r.out.substr(at + key.size()));
}

/// The run's VmHWM from its last JSON line; the run must succeed.
std::size_t peak_of(const std::vector<std::string>& args, std::size_t budget,
                    const std::filesystem::path& dir) {
    const outcome r = run_binary(with_budget(args, budget), dir);
    REQUIRE_MESSAGE(r.status == 0, r.out);
    const auto last = r.out.rfind("\"peak_rss_bytes\":");
    REQUIRE_MESSAGE(last != std::string::npos, r.out);
    return std::stoull(r.out.substr(last + 17));
}

}  // namespace

TEST_CASE("every flag combination keeps its peak RSS within --memory-budget" *
          doctest::skip(rss_counts_tsan_shadow)) {
    spillway::test::temp_dir dir("mini_gpt-budget");
    // {--grad-dtype, --act-split, --act-recompute, --act-budget MiB (empty: the default)}:
    // every value of each flag, and each pair of split and budget that keeps layers.
    const std::vector<std::vector<std::string>> combos = {
        {"fp32", "adaptive", "on", ""},  {"fp32", "offload", "off", ""},
        {"fp32", "0", "off", "400"},     {"bf16", "3", "on", "80"},
        {"bf16", "0", "on", ""},         {"bf16", "adaptive", "off", "40"},
        {"fp16", "offload", "on", "80"}, {"fp16", "0", "off", ""},
        {"fp16", "3", "off", "40"},
    };
    for (const auto& c : combos) {
        std::vector<std::string> args = base_args(dir.path());
        args.insert(args.end(),
                    {"--grad-dtype", c[0], "--act-split", c[1], "--act-recompute", c[2]});
        if (!c[3].empty()) args.insert(args.end(), {"--act-budget", c[3]});
        INFO("--grad-dtype " << c[0] << " --act-split " << c[1] << " --act-recompute " << c[2]
                             << " --act-budget " << (c[3].empty() ? "default" : c[3]));
        const std::size_t smallest = named_smallest(args, dir.path());
        for (const std::size_t budget : {smallest, smallest + smallest / 10}) {
            const std::size_t peak = peak_of(args, budget, dir.path());
            MESSAGE("peak RSS " << peak << " of the budget " << budget << " ("
                                << static_cast<double>(peak) / static_cast<double>(budget) << ")");
            CHECK(peak <= budget);
        }
    }
}

TEST_CASE(
    "the smallest budget named is reproducible: identical runs name it and accept it, "
    "one byte less is refused") {
    spillway::test::temp_dir dir("mini_gpt-budget");
    std::vector<std::string> args = base_args(dir.path());
    // The combination that ran past its budget with the activations outside the plan.
    args.insert(args.end(), {"--act-split", "0", "--act-budget", "400", "--act-recompute", "off"});
    const std::size_t smallest = named_smallest(args, dir.path());
    for (int run = 0; run < 3; ++run) CHECK(named_smallest(args, dir.path()) == smallest);
    if (!rss_counts_tsan_shadow) CHECK(peak_of(args, smallest, dir.path()) <= smallest);
    const outcome below = run_binary(with_budget(args, smallest - 1), dir.path());
    CHECK(below.status == 2);
    CHECK_MESSAGE(below.out.find("the smallest budget that works is " + std::to_string(smallest)) !=
                      std::string::npos,
                  below.out);
}

TEST_CASE("--memory-budget with another --offload mode is refused at start") {
    spillway::test::temp_dir dir("mini_gpt-budget");
    for (const char* mode : {"none", "optimizer", "activations", "all"}) {
        std::vector<std::string> args = base_args(dir.path(), mode);
        args.insert(args.end(), {"--memory-budget", "1G"});
        const outcome r = run_binary(args, dir.path());
        CHECK_MESSAGE(r.status == 2, mode << ": " << r.out);
        CHECK(r.out.find("--memory-budget") != std::string::npos);
    }
}
