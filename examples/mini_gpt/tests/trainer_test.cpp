// SPDX-License-Identifier: Apache-2.0
// The trainer through its API: every --offload mode gives the same bits, save/resume is
// exact, the loss falls, batches are taken as llm.c takes them.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <fstream>
#include <sstream>

#include "checkpoint_dir.hpp"
#include "corpus.hpp"
#include "gpt2.hpp"
#include "llmc_format.hpp"
#include "memory_plan.hpp"
#include "spillway/io/aligned_buffer.hpp"
#include "streamed_params.hpp"
#include "support/skip.hpp"
#include "support/temp_dir.hpp"
#include "trainer.hpp"
#include "trainer_support.hpp"

using namespace mini_gpt;
using namespace mini_gpt::testing;

namespace {

options tiny(const std::filesystem::path& scratch) {
    options o = tiny_options(scratch, 2, 4, 2);
    o.subgroup = 5000;  // several subgroups (the tiny model has ~30k params)
    return o;
}

/// Runs `o` as given, then with `mode` and each --act-split choice: every run must give the
/// same losses.
void check_act_splits(const options& o, offload_mode mode, std::initializer_list<int> splits) {
    auto ref = run(o);
    for (int split : splits) {
        options s = o;
        s.offload = mode;
        s.act_split = split;
        INFO("--offload " << offload_name(mode) << " --act-split " << split);
        CHECK(run(s) == ref);
    }
}

}  // namespace

TEST_CASE("every --offload mode gives bit-identical losses and parameters") {
    spillway::test::temp_dir dir("mini_gpt");
    for (grad_dtype g : {grad_dtype::fp32, grad_dtype::bf16, grad_dtype::fp16}) {
        std::vector<float> ref_losses;
        std::vector<char> ref_model;
        for (offload_mode m : {offload_mode::none, offload_mode::optimizer,
                               offload_mode::activations, offload_mode::all}) {
            options o = tiny(dir.path());
            o.grads = g;
            o.offload = m;
            o.save_model = dir.path() / ("model-" + std::to_string(static_cast<int>(g)) + "-" +
                                         offload_name(m) + ".bin");
            auto losses = run(o);
            auto model = file_bytes(o.save_model);
            INFO("grad dtype " << static_cast<int>(g) << ", offload " << offload_name(m));
            REQUIRE(losses.size() == 4);
            if (m == offload_mode::none) {
                ref_losses = losses;
                ref_model = model;
                CHECK(losses.back() < losses.front());
            } else {
                CHECK(losses == ref_losses);
                CHECK(model == ref_model);
            }
        }
    }
    // The offloading back ends cleaned up their files.
    for (const char* p : {"p1", "p2"}) {
        auto d = dir.path() / p;
        std::size_t left = 0;
        if (std::filesystem::exists(d))
            for (auto it = std::filesystem::recursive_directory_iterator(d);
                 it != std::filesystem::recursive_directory_iterator(); ++it)
                if (it->is_regular_file()) ++left;
        CHECK(left == 0);
    }
}

TEST_CASE("updates run under the next forward give the same bits, on ascending iterations only") {
    spillway::test::temp_dir dir("mini_gpt");
    options o = tiny(dir.path());
    o.layers = 3;
    o.steps = 6;
    o.subgroup = 2000;  // ~20 subgroups: each layer spans several
    o.offload = offload_mode::optimizer;
    o.grads = grad_dtype::bf16;
    o.save_dir = dir.path() / "saves";
    o.save_every = 3;  // saves after steps 2 and 5: those updates finish before the save
    std::vector<std::vector<char>> models;
    std::vector<std::vector<float>> losses;
    for (bool under : {false, true}) {
        options u = o;
        u.update_under_forward = under;
        u.save_model = dir.path() / (under ? "under.bin" : "sync.bin");
        std::ostringstream out;
        run_report report;
        losses.push_back(train(u, out, &report));
        models.push_back(file_bytes(u.save_model));
        REQUIRE(report.update_deferred.size() == 6);
        // Ascending iterations are steps 0, 2, 4; step 2 saves, the last step ends the run.
        const std::vector<bool> expected =
            under ? std::vector<bool>{true, false, false, false, true, false}
                  : std::vector<bool>(6, false);
        CHECK(report.update_deferred == expected);
        for (std::size_t k = 0; k < 6; ++k)
            if (k == 0 || !report.update_deferred[k - 1]) CHECK(report.param_wait_ms[k] == 0.0);
    }
    CHECK(losses[0] == losses[1]);
    CHECK(models[0] == models[1]);
    {
        // --order ascending: every update walks upwards, so each one but those before a save
        // and the last runs under the next forward; the same bits again.
        options a = o;
        a.ascending_order = true;
        a.save_model = dir.path() / "ascending.bin";
        std::ostringstream out;
        run_report report;
        CHECK(train(a, out, &report) == losses[0]);
        CHECK(file_bytes(a.save_model) == models[0]);
        CHECK(report.update_deferred == std::vector<bool>{true, true, false, true, true, false});
    }
    // The in-memory optimizer never defers, and gives the same bits.
    options m = o;
    m.offload = offload_mode::none;
    m.save_dir.clear();
    m.save_model = dir.path() / "none.bin";
    run_report report;
    std::ostringstream out;
    CHECK(train(m, out, &report) == losses[0]);
    CHECK(file_bytes(m.save_model) == models[0]);
    CHECK(report.update_deferred == std::vector<bool>(6, false));
}

TEST_CASE(
    "updates run under backward give the same bits, on descending iterations with fp32 gradients "
    "only") {
    spillway::test::temp_dir dir("mini_gpt");
    options o = tiny(dir.path());
    o.layers = 3;
    o.steps = 6;
    o.subgroup = 2000;  // ~20 subgroups: each layer spans several, and the embeddings several more
    o.offload = offload_mode::optimizer;
    o.save_dir = dir.path() / "saves";
    o.save_every =
        4;  // a save after step 3, a descending step: its update finishes before the save
    std::vector<std::vector<char>> models;
    std::vector<std::vector<float>> losses;
    for (bool under : {false, true}) {
        options u = o;
        u.update_under_backward = under;
        u.save_model = dir.path() / (under ? "under.bin" : "sync.bin");
        std::ostringstream out;
        run_report report;
        losses.push_back(train(u, out, &report));
        models.push_back(file_bytes(u.save_model));
        // Descending iterations are steps 1, 3, 5; the ascending ones run under the next
        // forward either way.
        const std::vector<bool> expected =
            under ? std::vector<bool>{false, true, false, true, false, true}
                  : std::vector<bool>(6, false);
        CHECK(report.update_under_backward == expected);
        CHECK(report.update_deferred == std::vector<bool>{true, false, true, false, true, false});
        CHECK((out.str().find("ran under their own backward") != std::string::npos) == under);
    }
    CHECK(losses[0] == losses[1]);
    CHECK(models[0] == models[1]);
    // Resumed from the save after step 3: steps 4 (under the next forward) and 5 (under
    // backward) continue with the same bits.
    {
        options r = o;
        r.resume_dir = o.save_dir;
        r.save_dir.clear();
        r.save_model = dir.path() / "resumed.bin";
        std::ostringstream out;
        auto tail = train(r, out);
        REQUIRE(tail.size() == 2);
        CHECK(tail[0] == losses[1][4]);
        CHECK(tail[1] == losses[1][5]);
        CHECK(file_bytes(r.save_model) == models[1]);
    }
    // bf16 gradients are narrowed after backward: never under it, and the same bits as none.
    options b = o;
    b.grads = grad_dtype::bf16;
    b.save_dir.clear();
    run_report report;
    std::ostringstream out;
    auto bf16_losses = train(b, out, &report);
    CHECK(report.update_under_backward == std::vector<bool>(6, false));
    b.offload = offload_mode::none;
    CHECK(run(b) == bf16_losses);
    // The in-memory optimizer never runs under backward, and gives the same bits.
    options m = o;
    m.offload = offload_mode::none;
    m.save_dir.clear();
    m.save_model = dir.path() / "none.bin";
    run_report mreport;
    std::ostringstream mout;
    CHECK(train(m, mout, &mreport) == losses[0]);
    CHECK(file_bytes(m.save_model) == models[0]);
    CHECK(mreport.update_under_backward == std::vector<bool>(6, false));
}

TEST_CASE("an inf or NaN gradient in an update under backward stops the run with a clear error") {
    spillway::test::temp_dir dir("mini_gpt");
    options o = tiny(dir.path());
    o.offload = offload_mode::optimizer;
    o.lr = 1e30f;  // step 0's update blows the params up: step 1's gradients are NaN
    // Step 1 walks downwards, under backward: it cannot skip, so the run stops, naming the step.
    CHECK_THROWS_WITH_AS(run(o),
                         doctest::Contains("step 2: update_pipeline: a gradient of subgroup"),
                         std::runtime_error);
    // With the update after backward, the step is skipped as in every other mode.
    o.update_under_backward = false;
    std::ostringstream out;
    run_report report;
    auto losses = train(o, out, &report);
    REQUIRE(losses.size() == 4);
    CHECK(std::isfinite(losses[0]));
    CHECK(std::isnan(losses[1]));
    CHECK(out.str().find("3 skipped") != std::string::npos);
}

TEST_CASE("every --act-split choice gives the same bits") {
    spillway::test::temp_dir dir("mini_gpt");
    options o = tiny(dir.path());
    o.layers = 3;
    o.steps = 3;
    check_act_splits(o, offload_mode::activations, {-1, 0, 2, 1 << 30});
}

TEST_CASE(
    "recomputing the LayerNorm, attention and GELU outputs in backward gives the same bits and a "
    "lower peak") {
    spillway::test::temp_dir dir("mini_gpt");
    options o = tiny(dir.path());
    o.layers = 3;
    o.steps = 3;
    o.save_model = dir.path() / "model.bin";
    const auto ref = run(o);
    const auto ref_model = file_bytes(o.save_model);
    std::size_t peak[2] = {};
    for (bool recompute : {false, true}) {
        options s = o;
        s.offload = offload_mode::activations;
        s.act_split =
            1 << 30;  // every layer offloaded: the peak is the stash's budget and forward's buffers
        s.act_recompute = recompute;
        s.save_model = dir.path() / (recompute ? "recompute-on.bin" : "recompute-off.bin");
        INFO("--act-recompute " << (recompute ? "on" : "off"));
        std::ostringstream out;
        run_report rep;
        CHECK(train(s, out, &rep) == ref);
        CHECK(file_bytes(s.save_model) == ref_model);
        peak[recompute] =
            *std::max_element(rep.act_peak_bytes.begin() + 1, rep.act_peak_bytes.end());
        // Stored, the attention probabilities are saved twice (by the softmax and by att @ v)
        // and deduplicated; recomputed, they are not saved, and the summary says why.
        const std::string summary = out.str();
        const auto dedup = summary.find("(dedup ");
        REQUIRE(dedup != std::string::npos);
        CHECK((summary.compare(dedup, 10, "(dedup 0 B") == 0) == recompute);
        CHECK((summary.find("probabilities, saved twice otherwise, are recomputed") !=
               std::string::npos) == recompute);
    }
    // Stored with recompute: 9 of 16 (B,T,C)-sized floats per position, and no attention
    // probabilities; the scratch buffers hold 6 of them and the probabilities.
    const std::size_t btc = static_cast<std::size_t>(o.batch * o.seq * o.channels) * sizeof(float);
    CHECK(peak[1] + btc <= peak[0]);
}

TEST_CASE("the summary reports each optimizer path on its own line") {
    spillway::test::temp_dir dir("mini_gpt");
    options o = tiny(dir.path());
    o.offload = offload_mode::optimizer;
    o.steps = 2;
    std::ostringstream out;
    train(o, out);
    for (const auto& p : o.paths) {
        INFO(out.str());
        CHECK(out.str().find("tier " + p.string() + ": read ") != std::string::npos);
    }
}

TEST_CASE("tensors on huge-page slabs give the same bits") {
    // A layer of 16 (B,T,C) tensors of 512 KiB and more: at least two slabs, so the store
    // takes its tensors under 2 MiB from the stash's huge-page arena.
    spillway::test::temp_dir dir("mini_gpt");
    options o = tiny(dir.path());
    o.layers = 1;
    o.channels = 128;
    o.batch = 16;
    o.seq = o.max_seq = 64;
    o.steps = 2;
    o.corpus_bytes = 1 << 16;
    const auto ref = run(o);
    options s = o;
    s.offload = offload_mode::activations;
    s.act_split = 1 << 30;
    std::ostringstream out;
    CHECK(train(s, out) == ref);
    CHECK(out.str().find("tensors under 2 MiB on huge-page slabs") != std::string::npos);
}

TEST_CASE("offloading every layer keeps at most the computed layer and one more resident") {
    spillway::test::temp_dir dir("mini_gpt");
    options o = tiny(dir.path());
    o.layers = 6;
    o.channels = 64;
    o.seq = 32;
    o.max_seq = 32;
    o.batch = 8;
    o.steps = 3;
    o.offload = offload_mode::activations;
    o.act_split = 1 << 30;
    std::ostringstream out;
    run_report rep;
    train(o, out, &rep);
    gpt2_config c;
    c.num_layers = o.layers;
    c.channels = o.channels;
    c.num_heads = o.heads;
    c.max_seq_len = o.max_seq;
    const std::size_t layer = layer_acts::floats(c, o.batch, o.seq) * sizeof(float);
    const std::size_t fixed = rep.all_kept_bytes - layer * static_cast<std::size_t>(o.layers);
    // The stash's default budget (one layer, one more (B,T,C) tensor: the last layer's
    // output, and the kept LayerNorm statistics) plus the layer forward computes into, each
    // tensor's buffer rounded up to 4 KiB.
    const std::size_t bt = static_cast<std::size_t>(o.batch * o.seq);
    const std::size_t stats =
        4 * spillway::align_up(bt * sizeof(float)) * static_cast<std::size_t>(o.layers);
    const std::size_t residual = bt * static_cast<std::size_t>(o.channels) * sizeof(float);
    const std::size_t bound =
        fixed + 2 * layer + residual + stats + (2 * layer_acts::num_tensors + 1) * 4096;
    REQUIRE(rep.act_peak_bytes.size() == 3);
    for (std::size_t peak : rep.act_peak_bytes) {
        CHECK(peak <= bound);
        CHECK(static_cast<double>(peak) < 0.55 * static_cast<double>(rep.all_kept_bytes));
    }
}

TEST_CASE("the default activation budget holds the last layer's backward at any batch") {
    // The last layer's scope (its input, its tensors and its output) is the largest load of
    // backward; a default budget with a fixed 1 MiB of slack instead of the output's size
    // failed there once a (B,T,C) tensor outgrew the slack (here 1.25 MiB).
    spillway::test::temp_dir dir("mini_gpt");
    options o = tiny(dir.path());
    o.channels = 64;
    o.batch = 320;
    o.steps = 2;
    REQUIRE(static_cast<std::size_t>(o.batch * o.seq * o.channels) * sizeof(float) >
            (std::size_t{1} << 20));
    check_act_splits(o, offload_mode::all, {-1, 1 << 30});
}

TEST_CASE("what the trainer creates is the user's alone: folders 0700, files 0600") {
    spillway::test::temp_dir dir("mini_gpt");
    options o = tiny(dir.path());
    o.paths = {dir.path() / "new" / "p1", dir.path() / "new" / "p2"};
    o.lock_dir = dir.path() / "new" / "locks";
    o.offload = offload_mode::all;
    o.steps = 2;
    o.save_dir = dir.path() / "new" / "saves";
    o.save_every = 1;
    o.save_model = dir.path() / "model.bin";
    const ::mode_t old_mask = ::umask(022);  // a usual umask: without care, folders would be 0755
    run(o);
    ::umask(old_mask);
    std::size_t folders = 0, files = 0;
    for (auto it = std::filesystem::recursive_directory_iterator(dir.path() / "new");
         it != std::filesystem::recursive_directory_iterator(); ++it) {
        struct ::stat st {};
        REQUIRE(::lstat(it->path().c_str(), &st) == 0);
        INFO(it->path().string());
        if (S_ISDIR(st.st_mode)) {
            ++folders;
            CHECK((st.st_mode & 0777) == 0700);
        } else {
            ++files;
            CHECK((st.st_mode & 0777) == 0600);
        }
    }
    CHECK(folders >= 6);  // new, p1, p2, locks, saves, step-2, its shard, the optimizer's folder
    CHECK(files >= 4);    // latest, model.bin, train.state, the optimizer's manifest, lock files
    struct ::stat st {};
    REQUIRE(::stat(o.save_model.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
}

TEST_CASE("grad dtypes differ from each other (the narrowing is real)") {
    spillway::test::temp_dir dir("mini_gpt");
    // The parameters, not the losses: Adam's first step moves each parameter by lr times the
    // sign of its gradient whatever the precision, and the loss after the second may round to
    // the same float (it did with OpenBLAS's AVX-512 kernels).
    options o = tiny(dir.path());
    o.steps = 3;
    std::vector<std::vector<char>> models;
    std::vector<std::vector<float>> losses;
    for (grad_dtype g : {grad_dtype::fp32, grad_dtype::bf16, grad_dtype::fp16}) {
        o.grads = g;
        o.save_model = dir.path() / ("model-" + std::to_string(static_cast<int>(g)) + ".bin");
        losses.push_back(run(o));
        models.push_back(file_bytes(o.save_model));
    }
    for (std::size_t i = 1; i < models.size(); ++i) {
        INFO("grad dtype " << i << " against fp32");
        CHECK(losses[i][0] == losses[0][0]);  // the first forward precedes any update
        CHECK(models[i].size() == models[0].size());
        CHECK(models[i] != models[0]);
    }
    CHECK(models[1] != models[2]);  // bf16 and fp16 round differently
}

TEST_CASE("save and resume continue with exactly the uninterrupted losses") {
    for (offload_mode m : {offload_mode::none, offload_mode::all}) {
        for (grad_dtype g : {grad_dtype::fp32, grad_dtype::fp16}) {
            INFO("offload " << offload_name(m) << ", grad dtype " << static_cast<int>(g));
            spillway::test::temp_dir dir("mini_gpt");
            options o = tiny(dir.path());
            o.offload = m;
            o.grads = g;
            o.steps = 6;
            o.save_model = dir.path() / "straight.bin";
            auto straight = run(o);

            options first = o;
            first.steps = 4;
            first.save_dir = dir.path() / "saves";
            first.save_every = 2;
            first.save_model.clear();
            auto part1 = run(first);
            CHECK(std::filesystem::exists(dir.path() / "saves" / "step-00000004"));
            CHECK_FALSE(std::filesystem::exists(dir.path() / "saves" /
                                                "step-00000002"));  // older saves pruned

            options second = o;
            second.resume_dir = dir.path() / "saves";
            second.save_model = dir.path() / "resumed.bin";
            auto part2 = run(second);
            REQUIRE(part2.size() == 2);
            CHECK(std::vector<float>(straight.begin(), straight.begin() + 4) == part1);
            CHECK(part2[0] == straight[4]);
            CHECK(part2[1] == straight[5]);
            CHECK(file_bytes(dir.path() / "straight.bin") ==
                  file_bytes(dir.path() / "resumed.bin"));
        }
    }
}

TEST_CASE("the loss falls on the built-in corpus and starts near ln(256)") {
    spillway::test::temp_dir dir("mini_gpt");
    options o = tiny(dir.path());
    o.steps = 40;
    o.lr = 3e-3f;
    auto losses = run(o);
    CHECK(std::abs(losses.front() - std::log(256.0f)) < 0.1f);
    float tail = (losses[37] + losses[38] + losses[39]) / 3;
    MESSAGE("loss " << losses.front() << " -> " << tail);
    CHECK(tail < losses.front() - 1.5f);
}

TEST_CASE("batch k starts at token k*B*T, targets are shifted by one, and batches wrap") {
    std::vector<std::uint16_t> tokens(2 * 3 * 4 + 5);  // K = (29-1)/12 = 2 whole batches
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint16_t>(i);
    std::vector<int> in, tg;
    fill_batch(tokens, 1, 3, 4, 0, 3, in, tg);
    REQUIRE(in.size() == 12);
    for (int i = 0; i < 12; ++i) {
        CHECK(in[static_cast<std::size_t>(i)] == 12 + i);
        CHECK(tg[static_cast<std::size_t>(i)] == 13 + i);
    }
    fill_batch(tokens, 2, 3, 4, 0, 3, in, tg);  // wraps to batch 0
    CHECK(in[0] == 0);
    CHECK(tg[11] == 12);
    fill_batch(tokens, 3, 3, 4, 1, 2, in, tg);  // rows 1..2 of batch 1
    REQUIRE(in.size() == 8);
    CHECK(in[0] == 16);
    CHECK(tg[7] == 24);
}

TEST_CASE(
    "llm.c files round trip, and a model trained from a token file matches the built-in run") {
    spillway::test::temp_dir dir("mini_gpt");
    options o = tiny(dir.path());
    o.steps = 2;
    o.save_model = dir.path() / "a.bin";
    auto a = run(o);
    // The built-in corpus written as an llm.c token file gives the same run.
    write_tokens(dir.path() / "corpus.bin", builtin_tokens(o.corpus_bytes));
    CHECK(read_tokens(dir.path() / "corpus.bin") == builtin_tokens(o.corpus_bytes));
    options with_file = o;
    with_file.data = dir.path() / "corpus.bin";
    with_file.save_model.clear();
    CHECK(run(with_file) == a);
    auto ck = read_checkpoint(o.save_model);
    CHECK(ck.config.num_layers == 2);
    CHECK(ck.config.channels == 32);
    CHECK(ck.config.padded_vocab_size == 256);
    write_checkpoint(dir.path() / "copy.bin", ck.config, ck.params);
    CHECK(file_bytes(dir.path() / "copy.bin") == file_bytes(o.save_model));
    // Continue from the checkpoint with --model: the first loss is the loss of that model.
    options from = o;
    from.model = o.save_model;
    from.save_model.clear();
    from.steps = 1;
    auto b = run(from);
    CHECK(b[0] < a[0]);
}

// ---- --offload params: parameters and gradients leave memory too ------------------------

namespace {

/// The smallest budget train() names when refusing `o` with a budget of one byte.
/// Runs `command` (stderr merged); returns its output and sets `status` to its exit status.
std::string run_command(const std::string& command, int& status) {
    std::string out;
    FILE* p = ::popen((command + " 2>&1").c_str(), "r");
    REQUIRE(p != nullptr);
    char buf[4096];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    const int rc = ::pclose(p);
    status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    return out;
}

}  // namespace

TEST_CASE(
    "--offload params with the smallest budget streams every layer and gives the bits of --offload "
    "none") {
    spillway::test::temp_dir dir("mini_gpt");
    options o = tiny(dir.path());
    o.layers = 3;
    o.steps = 5;
    o.save_model = dir.path() / "none.bin";
    const auto ref = run(o);
    const auto ref_model = file_bytes(o.save_model);

    options p = o;
    p.offload = offload_mode::params;
    p.save_model = dir.path() / "params.bin";
    p.baseline_rss = 64 << 20;  // (a fixed baseline: the plan is then exact in this process)
    p.memory_budget = smallest_budget_of(p);
    std::ostringstream out;
    run_report report;
    const auto losses = train(p, out, &report);
    CHECK(losses == ref);
    CHECK(file_bytes(p.save_model) == ref_model);
    // The smallest budget gives each stream one layer's window: every layer leaves memory.
    const gpt2_config c{16, 256, 256, 3, 4, 32};
    CHECK(report.param_window == streamed_params::smallest_param_window(c));
    CHECK(report.state_window == streamed_params::smallest_state_window(c));
    // The streams' instrumented peaks never pass their windows.
    CHECK(report.param_peak <= report.param_window);
    CHECK(report.state_peak <= report.state_window);
    CHECK(report.param_peak > 0);
    // Each step reads 2(N-1) layers' params (the last of forward starts backward) and every
    // layer's m|v, and writes every layer's m|v back. The m|v stream prefetches the next
    // step's first layer as the step ends, so one layer's read or write-back may complete
    // on either side of a step's boundary: per step, whole layers; over steps 1-4, 12 layers
    // give or take the one at each end.
    const std::uint64_t layer = streamed_params::layer_param_bytes(c);
    REQUIRE(report.param_read.size() == 5);
    std::uint64_t state_read = 0, state_written = 0;
    for (std::size_t k = 1; k < 5; ++k) {
        INFO("step " << k);
        CHECK(report.param_read[k] == 4 * layer);
        CHECK(report.state_read[k] % (2 * layer) == 0);
        CHECK(report.state_written[k] % (2 * layer) == 0);
        state_read += report.state_read[k];
        state_written += report.state_written[k];
    }
    for (const std::uint64_t moved : {state_read, state_written}) {
        CHECK(moved >= 11 * 2 * layer);
        CHECK(moved <= 13 * 2 * layer);
    }
    // A budget one byte smaller is refused.
    p.memory_budget -= 1;
    CHECK(message_of([&] { run(p); }).find("is too small") != std::string::npos);
    // The streams' files are gone.
    std::size_t left = 0;
    for (auto it = std::filesystem::recursive_directory_iterator(dir.path() / "p1");
         it != std::filesystem::recursive_directory_iterator(); ++it)
        if (it->is_regular_file()) ++left;
    CHECK(left == 0);
}

TEST_CASE(
    "--offload params with the default windows and with a larger budget gives the same bits") {
    spillway::test::temp_dir dir("mini_gpt");
    options o = tiny(dir.path());
    o.layers = 4;
    const auto ref = run(o);
    options p = o;
    p.offload = offload_mode::params;
    CHECK(run(p) == ref);  // two layers' windows
    p.baseline_rss = 64 << 20;
    p.memory_budget = smallest_budget_of(p) + (1 << 20);  // every layer fits
    run_report report;
    std::ostringstream out;
    CHECK(train(p, out, &report) == ref);
    CHECK(report.param_read.back() == 0);  // all resident after the first step
}

TEST_CASE(
    "--offload params: save and resume continue with exactly the uninterrupted losses and "
    "weights") {
    spillway::test::temp_dir dir("mini_gpt");
    options o = tiny(dir.path());
    o.layers = 3;
    o.steps = 6;
    o.offload = offload_mode::params;
    o.baseline_rss = 64 << 20;
    o.memory_budget = smallest_budget_of(o);  // every layer streamed, at save and at resume
    o.save_model = dir.path() / "straight.bin";
    const auto straight = run(o);

    options first = o;
    first.steps = 4;
    first.save_dir = dir.path() / "saves";
    first.save_every = 2;
    first.save_model.clear();
    const auto part1 = run(first);
    const auto save = dir.path() / "saves" / "step-00000004";
    REQUIRE(std::filesystem::exists(save / "model.bin"));
    REQUIRE(std::filesystem::exists(save / streamed_moments_file));
    CHECK_FALSE(std::filesystem::exists(dir.path() / "saves" / "step-00000002"));

    options second = o;
    second.resume_dir = dir.path() / "saves";
    second.save_model = dir.path() / "resumed.bin";
    const auto part2 = run(second);
    REQUIRE(part2.size() == 2);
    CHECK(std::vector<float>(straight.begin(), straight.begin() + 4) == part1);
    CHECK(part2[0] == straight[4]);
    CHECK(part2[1] == straight[5]);
    CHECK(file_bytes(dir.path() / "straight.bin") == file_bytes(dir.path() / "resumed.bin"));

    // The save's model.bin is the llm.c checkpoint of the weights after step 4: the same bytes
    // as --offload none's save after 4 steps.
    options none = first;
    none.offload = offload_mode::none;
    none.memory_budget = 0;
    none.save_dir = dir.path() / "none-saves";
    run(none);
    CHECK(file_bytes(save / "model.bin") ==
          file_bytes(dir.path() / "none-saves" / "step-00000004" / "model.bin"));

    // A save of one offload mode is not resumed by the other, and says why.
    options other = o;
    other.offload = offload_mode::none;
    other.memory_budget = 0;
    other.resume_dir = dir.path() / "saves";
    CHECK(message_of([&] { run(other); }).find("resume it with --offload params") !=
          std::string::npos);
    options from_none = o;
    from_none.resume_dir = dir.path() / "none-saves";
    CHECK(message_of([&] { run(from_none); }).find("made without --offload params") !=
          std::string::npos);

    // A damaged file of the save is refused by name.
    for (const char* name : {"model.bin", streamed_moments_file}) {
        spillway::test::temp_dir copy("mini_gpt");
        std::filesystem::copy(dir.path() / "saves", copy.path() / "saves",
                              std::filesystem::copy_options::recursive);
        const auto file = copy.path() / "saves" / "step-00000004" / name;
        {
            std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
            f.seekp(2000);
            char b = 0;
            f.read(&b, 1);
            b = static_cast<char>(b ^ 0x40);
            f.seekp(2000);
            f.write(&b, 1);
        }
        options damaged = o;
        damaged.resume_dir = copy.path() / "saves";
        const auto m = message_of([&] { run(damaged); });
        INFO(m);
        CHECK(m.find(file.string()) != std::string::npos);
        CHECK(m.find("corrupted") != std::string::npos);
    }
}

TEST_CASE("per-layer GPT-2 init gives the bits of the whole-model init") {
    spillway::thread_pool pool(1);
    const gpt2_config c{16, 300, 320, 3, 4, 128};  // (fc and fcproj: 4 pieces of a pool's)
    gpt2 model(c, pool);
    model.init_gpt2(42);
    const auto& layout = model.layout();
    for (int l = -1; l <= c.num_layers; ++l) {
        const auto [b, e] = layout.layer_range(l);
        std::vector<float> part(e - b);
        init_gpt2_layer(c, 42, l, part);
        INFO("layer " << l);
        CHECK(std::equal(part.begin(), part.end(),
                         model.params().begin() + static_cast<std::ptrdiff_t>(b)));
        // On a pool's threads (pieces of at least 16384 draws): the same bits.
        spillway::thread_pool threads(3);
        std::vector<float> pooled(e - b);
        init_gpt2_layer(c, 42, l, pooled, &threads);
        CHECK(pooled == part);
    }
}

TEST_CASE("--init names the standard GPT-2 sizes") {
    struct size_row {
        const char* name;
        int L, C, NH;
    };
    for (auto r : {size_row{"gpt2", 12, 768, 12}, size_row{"gpt2-medium", 24, 1024, 16},
                   size_row{"gpt2-large", 36, 1280, 20}, size_row{"gpt2-xl", 48, 1600, 25}}) {
        const options o = parse_options({"--init", r.name});
        INFO(r.name);
        CHECK(o.layers == r.L);
        CHECK(o.channels == r.C);
        CHECK(o.heads == r.NH);
        CHECK(o.vocab == 50257);
        CHECK(o.max_seq == 1024);
    }
    CHECK_THROWS_AS(parse_options({"--init", "gpt3"}), input_error);
    CHECK_THROWS_AS(parse_options({"--init", "gpt2", "--layers", "3"}), input_error);
}

TEST_CASE("--offload params refusals: a budget without it, no space") {
    // (fp16/bf16 gradients and --model are taken: params_dtypes_test.cpp)
    CHECK(message_of([] {
              parse_options({"--memory-budget", "1G"});
          }).find("needs --offload params") != std::string::npos);
    CHECK(parse_options({"--offload", "params", "--memory-budget", "3.5G"}).memory_budget ==
          static_cast<std::size_t>(3.5 * 1024 * 1024 * 1024));
    CHECK(parse_options({"--offload", "params", "--memory-budget", "800M"}).memory_budget ==
          800u << 20);
    CHECK_THROWS_AS(parse_options({"--offload", "params", "--memory-budget", "8X"}), input_error);
}

TEST_CASE("--offload params refuses a model whose state the disk cannot hold, naming the space" *
          spillway::test::skip_with_free_space_over(std::uintmax_t{600} << 30)) {
    // A model whose state no disk here holds: 200 layers of C=4096 (~580 GB of params and m,v).
    spillway::test::temp_dir dir("mini_gpt");
    options o = tiny(dir.path());
    o.offload = offload_mode::params;
    o.layers = 200;
    o.channels = 4096;
    o.heads = 64;
    const auto m = message_of([&] { run(o); });
    INFO(m);
    CHECK(m.find("needed for the model's state") != std::string::npos);
    CHECK(m.find("free") != std::string::npos);
}

TEST_CASE(
    "the mini_gpt binary: a too-small budget exits 2 naming the smallest; VmHWM stays under the "
    "budget") {
    spillway::test::temp_dir dir("mini_gpt");
    const std::string base = std::string(MINI_GPT_EXE) +
                             " --layers 3 --channels 64 --heads 4 --max-seq 32 --seq 32 --batch 4 "
                             "--steps 3 --threads 2 --corpus-bytes 16384 --offload params --path " +
                             dir.path().string() + " --lock-dir " + dir.path().string();
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
    MESSAGE("VmHWM " << hwm << " bytes under a budget of " << smallest);
    CHECK(hwm > 0);
    CHECK(hwm <= smallest);
}
