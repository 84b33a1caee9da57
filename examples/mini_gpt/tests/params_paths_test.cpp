// SPDX-License-Identifier: Apache-2.0
// --offload params over several --paths: the streams are striped by layer over
// every path (layer l on path l mod P), the bits do not change, each step's bytes are
// reported per path, and each path's free space is checked at start for its share.
#include <doctest/doctest.h>

#include <fstream>
#include <functional>
#include <numeric>
#include <sstream>

#include "memory_plan.hpp"
#include "streamed_params.hpp"
#include "support/skip.hpp"
#include "support/temp_dir.hpp"
#include "trainer.hpp"
#include "trainer_support.hpp"

using namespace mini_gpt;
using namespace mini_gpt::testing;

namespace {

options tiny(const std::filesystem::path& scratch) { return tiny_options(scratch, 3, 4, 2); }

std::size_t files_under(const std::filesystem::path& dir) {
    std::size_t n = 0;
    for (auto it = std::filesystem::recursive_directory_iterator(dir);
         it != std::filesystem::recursive_directory_iterator(); ++it)
        if (it->is_regular_file()) ++n;
    return n;
}

}  // namespace

TEST_CASE(
    "--offload params over two paths: layers striped over both, the bits of --offload none, "
    "bytes per step per path") {
    spillway::test::temp_dir dir("mini_gpt");
    const gpt2_config c{16, 256, 256, 3, 4, 32};
    for (grad_dtype g : {grad_dtype::fp32, grad_dtype::fp16}) {
        INFO("--grad-dtype " << std::string(dtype_name(g)));
        options o = tiny(dir.path());
        o.grads = g;
        o.save_model = dir.path() / "none.bin";
        std::ostringstream none_out;
        const auto ref = train(o, none_out);
        options p = o;
        p.offload = offload_mode::params;
        p.baseline_rss = 64 << 20;
        p.memory_budget = 1;
        const std::string m = message_of([&] { train(p, none_out); });
        const std::string key = "the smallest budget that works is ";
        REQUIRE_MESSAGE(m.find(key) != std::string::npos, m);
        p.memory_budget = std::stoull(m.substr(m.find(key) + key.size()));  // every layer out
        p.save_model = dir.path() / "params.bin";
        std::ostringstream out;
        run_report report;
        CHECK(train(p, out, &report) == ref);
        CHECK(file_bytes(p.save_model) == file_bytes(o.save_model));
        REQUIRE(report.path_read.size() == 4);
        for (std::size_t k = 1; k < 4; ++k) {
            INFO("step " << k);
            REQUIRE(report.path_read[k].size() == 2);
            // Each path moves its layers' bytes (0 and 2 on the first, 1 on the second).
            CHECK(report.path_read[k][0] > 0);
            CHECK(report.path_read[k][1] > 0);
            CHECK(report.path_written[k][1] > 0);
        }
        // The summary names each path with its bytes per step.
        const std::string text = out.str();
        INFO(text);
        CHECK(text.find("per path        " + (dir.path() / "p1").string() + ": read ") !=
              std::string::npos);
        CHECK(text.find((dir.path() / "p2").string() + ": read ") != std::string::npos);
        CHECK(text.find("(layers 1 mod 2)") != std::string::npos);
        // --json: a "paths" list on every step, in --path order.
        options j = p;
        j.json = true;
        j.save_model.clear();
        std::ostringstream jout;
        train(j, jout);
        CHECK(jout.str().find("\"paths\":[{\"path\":\"" + (dir.path() / "p1").string() +
                              "\",\"read_bytes\":") != std::string::npos);
        CHECK(jout.str().find("{\"path\":\"" + (dir.path() / "p2").string() +
                              "\",\"read_bytes\":") != std::string::npos);
    }
    // The streams' files are gone from both paths.
    CHECK(files_under(dir.path() / "p1") == 0);
    CHECK(files_under(dir.path() / "p2") == 0);
    // Each path's share: layers l mod P.
    CHECK(streamed_params::stored_bytes_on(c, grad_dtype::fp32, 0, 2) ==
          2 * streamed_params::stored_bytes(c) / 3);
    CHECK(streamed_params::stored_bytes_on(c, grad_dtype::fp32, 1, 2) ==
          streamed_params::stored_bytes(c) / 3);
    CHECK(streamed_params::stored_bytes_on(c, grad_dtype::fp16, 3, 4) == 0);
    CHECK(streamed_params::stored_bytes_on(c, grad_dtype::fp16, 0, 1) ==
          streamed_params::stored_bytes(c, grad_dtype::fp16));
}

TEST_CASE(
    "--offload params over two paths: a path without room for its share (and the shares "
    "of the paths on its file system) is refused, named, with the space it needs" *
    spillway::test::skip_with_free_space_over(std::uintmax_t{300} << 30)) {
    spillway::test::temp_dir dir("mini_gpt");
    options o = tiny(dir.path());
    o.offload = offload_mode::params;
    o.layers = 200;  // ~580 GB of params and m,v: about 290 GB a path
    o.channels = 4096;
    o.heads = 64;
    const auto m = message_of([&] {
        std::ostringstream out;
        train(o, out);
    });
    INFO(m);
    CHECK(m.find((dir.path() / "p1").string() + ": ") == 0);
    CHECK(m.find("needed for the model's state") != std::string::npos);
    CHECK(m.find("of its layers, 0 mod 2") != std::string::npos);
    // Both paths are on one file system here: their shares are counted together.
    CHECK(m.find("with --path " + (dir.path() / "p2").string() + " on the same file system") !=
          std::string::npos);
    CHECK(m.find("free") != std::string::npos);
}
