// SPDX-License-Identifier: Apache-2.0
// --offload params with bf16 and fp16 gradients and from a --model file: the same
// bits as --offload none, every layer streamed; an fp16 overflow skips the step as none does;
// save and resume keep the bits; the budget still holds.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>

#include "checkpoint_dir.hpp"
#include "gpt2.hpp"
#include "llmc_format.hpp"
#include "memory_plan.hpp"
#include "streamed_params.hpp"
#include "support/temp_dir.hpp"
#include "trainer.hpp"
#include "trainer_support.hpp"

using namespace mini_gpt;
using namespace mini_gpt::testing;

namespace {

options tiny(const std::filesystem::path& scratch) {
    return tiny_options(scratch, 3, 5, 1);
}

const gpt2_config tiny_config{16, 256, 256, 3, 4, 32};

/// `o` with --offload params and the smallest budget: every layer leaves memory.
options streamed_smallest(options o) {
    o.offload = offload_mode::params;
    o.baseline_rss = 64 << 20;  // (a fixed baseline: the plan is then exact in this process)
    o.memory_budget = smallest_budget_of(o);
    return o;
}

/// The skipped steps the summary counts ("N skipped").
int skipped_of(const std::string& out) {
    const auto at = out.find(" skipped)");
    REQUIRE_MESSAGE(at != std::string::npos, out);
    const auto from = out.rfind(", ", at);
    return std::stoi(out.substr(from + 2, at - from - 2));
}

/// A model file of the tiny config: GPT-2's init from `seed`, the final LayerNorm's weights
/// times `lnf_scale` (large ones make the fp16 gradients overflow at the first loss scales).
std::filesystem::path model_file(const std::filesystem::path& dir, float lnf_scale) {
    spillway::thread_pool pool(1);
    gpt2 model(tiny_config, pool);
    model.init_gpt2(7);
    auto params = model.llmc_params();
    const param_layout layout(tiny_config);
    for (std::size_t i = 0; i < layout.sizes[14]; ++i)
        params[layout.llmc_offsets[14] + i] *= lnf_scale;
    const auto path = dir / ("model-x" + std::to_string(static_cast<int>(lnf_scale)) + ".bin");
    write_checkpoint(path, tiny_config, params);
    return path;
}

}  // namespace

TEST_CASE(
    "--offload params with bf16 and fp16 gradients, every layer streamed, gives the bits of "
    "--offload none") {
    spillway::test::temp_dir dir("mini_gpt");
    const std::uint64_t layer = streamed_params::layer_param_bytes(tiny_config);
    for (grad_dtype g : {grad_dtype::bf16, grad_dtype::fp16}) {
        INFO("--grad-dtype " << std::string(dtype_name(g)));
        options o = tiny(dir.path());
        o.grads = g;
        o.save_model = dir.path() / (std::string("none-") + dtype_name(g) + ".bin");
        const auto ref = run(o);
        options p = streamed_smallest(o);
        p.save_model = dir.path() / (std::string("params-") + dtype_name(g) + ".bin");
        std::ostringstream out;
        run_report report;
        CHECK(train(p, out, &report) == ref);
        CHECK(file_bytes(p.save_model) == file_bytes(o.save_model));
        // One layer's window each: every layer leaves memory; the windows are never passed.
        CHECK(report.param_window == streamed_params::smallest_param_window(tiny_config));
        CHECK(report.state_window == streamed_params::smallest_state_window(tiny_config));
        CHECK(report.param_peak <= report.param_window);
        CHECK(report.state_peak <= report.state_window);
        REQUIRE(report.param_read.size() == 5);
        if (g == grad_dtype::bf16) {  // updated in backward, as fp32: no spill
            CHECK(report.grad_window == 0);
            CHECK(report.update_under_backward == std::vector<bool>(5, true));
            for (std::size_t k = 0; k < 5; ++k) CHECK(report.grad_written[k] == 0);
            continue;
        }
        // fp16: the spill holds one layer; backward writes the other two and the next forward
        // reads them back; the update of step k runs in forward k+1 (the last one before
        // --save-model).
        CHECK(report.grad_window == streamed_params::smallest_grad_window(tiny_config));
        CHECK(report.update_deferred == std::vector<bool>(5, true));
        const std::uint64_t glayer = streamed_params::layer_grad_bytes(tiny_config);
        CHECK(report.grad_read[0] == 0);
        for (std::size_t k = 0; k < 5; ++k) {
            INFO("step " << k);
            CHECK(report.grad_written[k] == 2 * glayer);
            if (k > 0) CHECK(report.grad_read[k] == 2 * glayer);
            if (k > 0) CHECK(report.param_read[k] == 4 * layer);  // 2(N-1), as with fp32
        }
    }
}

TEST_CASE(
    "--offload params with fp16: an overflow skips the step as --offload none does, the "
    "loss scale halves, nothing changes") {
    spillway::test::temp_dir dir("mini_gpt");
    // x10: one good step, an overflow (after a pending update was applied), good steps;
    // x30: three overflows, then good steps.
    for (float x : {10.0f, 30.0f}) {
        INFO("final LayerNorm weights x" << x);
        options o = tiny(dir.path());
        o.grads = grad_dtype::fp16;
        o.steps = 6;
        o.model = model_file(dir.path(), x);
        o.save_model = dir.path() / "none.bin";
        std::ostringstream none_out;
        const auto ref = train(o, none_out);
        const int skipped = skipped_of(none_out.str());
        CHECK(skipped >= 1);
        CHECK(skipped < 6);
        options p = streamed_smallest(o);
        p.save_model = dir.path() / "params.bin";
        std::ostringstream out;
        run_report report;
        const auto losses = train(p, out, &report);
        CHECK(losses == ref);
        CHECK(file_bytes(p.save_model) == file_bytes(o.save_model));
        CHECK(skipped_of(out.str()) == skipped);
        // A skipped step updates nothing: its spilled gradients are dropped unread.
        int deferred = 0;
        for (bool d : report.update_deferred) deferred += d ? 1 : 0;
        CHECK(deferred == 6 - skipped);
        // The JSON lines say which steps were skipped, with the loss scale after each.
        options j = p;
        j.json = true;
        j.save_model.clear();
        std::ostringstream jout;
        train(j, jout);
        o.json = true;
        o.save_model.clear();
        std::ostringstream njout;
        train(o, njout);
        auto scales = [](const std::string& s) {
            std::string v;
            for (auto at = s.find("\"loss_scale\":"); at != std::string::npos;
                 at = s.find("\"loss_scale\":", at + 1))
                v += s.substr(at, s.find_first_of(",}", s.find("\"skipped\":", at) + 10) - at) +
                     "\n";
            return v;
        };
        CHECK(scales(jout.str()) == scales(njout.str()));
        CHECK(jout.str().find("\"skipped\":true") != std::string::npos);
    }
}

TEST_CASE("--offload params --model FILE gives the bits of --offload none --model FILE") {
    spillway::test::temp_dir dir("mini_gpt");
    options o = tiny(dir.path());
    o.layers = 2;  // (ignored: the shape is the file's)
    o.model = model_file(dir.path(), 1.0f);
    o.save_model = dir.path() / "none.bin";
    const auto ref = run(o);
    for (grad_dtype g : {grad_dtype::fp32, grad_dtype::fp16}) {
        INFO("--grad-dtype " << std::string(dtype_name(g)));
        options n = o;
        n.grads = g;
        n.save_model = dir.path() / (std::string("none-") + dtype_name(g) + ".bin");
        const auto want = run(n);
        if (g == grad_dtype::fp32) CHECK(want == ref);
        options p = streamed_smallest(n);
        p.save_model = dir.path() / (std::string("params-") + dtype_name(g) + ".bin");
        CHECK(run(p) == want);
        CHECK(file_bytes(p.save_model) == file_bytes(n.save_model));
    }
    // A file with a NaN parameter is refused by name, as --offload none refuses it.
    auto params = read_checkpoint(o.model).params;
    const param_layout layout(tiny_config);
    const std::size_t bad = layout.llmc_offsets[4] + 5;  // in qkvw (layer 0)
    params[bad] = std::nanf("");
    const auto nan_file = dir.path() / "nan.bin";
    write_checkpoint(nan_file, tiny_config, params);
    options p = o;
    p.offload = offload_mode::params;
    p.model = nan_file;
    const auto m = message_of([&] { run(p); });
    INFO(m);
    CHECK(m.find(nan_file.string()) != std::string::npos);
    CHECK(m.find("parameter " + std::to_string(bad) + " (in qkvw) is NaN") != std::string::npos);
    options n = o;
    n.model = nan_file;
    CHECK(message_of([&] { run(n); }) == m);
    // A truncated file is refused before any layer is read.
    std::filesystem::resize_file(nan_file, 2000);
    CHECK(message_of([&] { run(p); }).find("truncated checkpoint") != std::string::npos);
}

TEST_CASE(
    "--offload params with fp16: save and resume continue with exactly the uninterrupted "
    "losses and weights") {
    spillway::test::temp_dir dir("mini_gpt");
    options o = tiny(dir.path());
    o.grads = grad_dtype::fp16;
    o.steps = 6;
    o.model = model_file(dir.path(), 10.0f);  // step 2 overflows: a save with nothing pending
    o = streamed_smallest(o);
    o.save_model = dir.path() / "straight.bin";
    const auto straight = run(o);

    options first = o;
    first.steps = 4;
    first.save_dir = dir.path() / "saves";
    first.save_every = 2;  // after step 2 (skipped) and step 4 (its update pending)
    first.save_model.clear();
    const auto part1 = run(first);
    options second = o;
    second.resume_dir = dir.path() / "saves";
    second.save_model = dir.path() / "resumed.bin";
    const auto part2 = run(second);
    REQUIRE(part2.size() == 2);
    CHECK(std::vector<float>(straight.begin(), straight.begin() + 4) == part1);
    CHECK(part2[0] == straight[4]);
    CHECK(part2[1] == straight[5]);
    CHECK(file_bytes(dir.path() / "straight.bin") == file_bytes(dir.path() / "resumed.bin"));
    // The save's model.bin holds step 4's update: --offload none's save after 4 steps.
    options none = first;
    none.offload = offload_mode::none;
    none.memory_budget = 0;
    none.save_dir = dir.path() / "none-saves";
    run(none);
    CHECK(file_bytes(dir.path() / "saves" / "step-00000004" / "model.bin") ==
          file_bytes(dir.path() / "none-saves" / "step-00000004" / "model.bin"));
    // The spill's files are gone with the run.
    std::size_t left = 0;
    for (auto it = std::filesystem::recursive_directory_iterator(dir.path() / "p1");
         it != std::filesystem::recursive_directory_iterator(); ++it)
        if (it->is_regular_file()) ++left;
    CHECK(left == 0);
}

TEST_CASE("--offload params accepts every --grad-dtype and --model") {
    for (const char* d : {"fp32", "bf16", "fp16"})
        CHECK_NOTHROW(parse_options({"--offload", "params", "--grad-dtype", d}));
    CHECK(parse_options({"--offload", "params", "--model", "m.bin"}).model == "m.bin");
}

TEST_CASE(
    "the mini_gpt binary with --offload params and fp16 or bf16 gradients: VmHWM stays under "
    "the smallest budget that works") {
    spillway::test::temp_dir dir("mini_gpt");
    for (const char* g : {"bf16", "fp16"}) {
        INFO("--grad-dtype " << std::string(g));
        const std::string base =
            std::string(MINI_GPT_EXE) +
            " --layers 3 --channels 64 --heads 4 --max-seq 32 --seq 32 --batch 4 --steps 3 "
            "--threads 2 --corpus-bytes 16384 --offload params --grad-dtype " +
            g + " --path " + dir.path().string() + " --lock-dir " + dir.path().string();
        auto run_command = [](const std::string& command, int& status) {
            std::string out;
            FILE* p = ::popen((command + " 2>&1").c_str(), "r");
            REQUIRE(p != nullptr);
            char buf[4096];
            while (std::fgets(buf, sizeof buf, p)) out += buf;
            const int rc = ::pclose(p);
            status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
            return out;
        };
        int status = 0;
        const std::string refused = run_command(base + " --memory-budget 1M", status);
        CHECK(status == 2);
        CHECK(std::count(refused.begin(), refused.end(), '\n') == 1);
        const std::string key = "the smallest budget that works is ";
        const auto at = refused.find(key);
        REQUIRE_MESSAGE(at != std::string::npos, refused);
        // The process's baseline varies by a few pages from run to run: 2 MiB of room.
        const std::size_t smallest = std::stoull(refused.substr(at + key.size())) + (2 << 20);
        const std::string out =
            run_command(base + " --json --memory-budget " + std::to_string(smallest), status);
        REQUIRE_MESSAGE(status == 0, out);
        const auto last = out.rfind("\"peak_rss_bytes\":");
        REQUIRE(last != std::string::npos);
        const std::size_t hwm = std::stoull(out.substr(last + 17));
        MESSAGE("--grad-dtype " << std::string(g) << ": VmHWM " << hwm
                                << " bytes under a budget of " << smallest);
        CHECK(hwm > 0);
        CHECK(hwm <= smallest);
    }
}
