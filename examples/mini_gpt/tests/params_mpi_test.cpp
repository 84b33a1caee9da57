// SPDX-License-Identifier: Apache-2.0
// --offload params under mpirun: two ranks give the bits of two ranks with --offload none for
// fp32, bf16 and fp16 gradients (each layer's gradients summed when final, the fp16 verdict
// agreed by the ranks, an overflow skipped by both). Built only with MPI and mpirun.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "gpt2.hpp"
#include "llmc_format.hpp"
#include "support/temp_dir.hpp"
#include "trainer_support.hpp"

using namespace mini_gpt;
using namespace mini_gpt::testing;

namespace {

/// Each JSON line's loss, loss scale and skipped flag (what both modes must print alike).
std::string steps_of(const std::string& out) {
    std::string v;
    for (auto at = out.find("\"loss\":"); at != std::string::npos;
         at = out.find("\"loss\":", at + 1))
        v += out.substr(at, out.find(',', at) - at) + " ";
    for (auto at = out.find("\"loss_scale\":"); at != std::string::npos;
         at = out.find("\"loss_scale\":", at + 1))
        v += out.substr(at, out.find_first_of(",}", out.find("\"skipped\":", at) + 10) - at) + " ";
    return v;
}

std::vector<std::string> mpirun(const std::vector<std::string>& command) {
    std::vector<std::string> args = {MINI_GPT_MPIEXEC, "-np", "2", "--oversubscribe"};
    if (::geteuid() == 0) args.push_back("--allow-run-as-root");
        // Sanitized builds: Open MPI's start-up allocations live until exit (mpi_test.cpp).
#if defined(SPILLWAY_SANITIZED)
    args.push_back("-x");
    args.push_back("ASAN_OPTIONS=detect_leaks=0");
#endif
    args.insert(args.end(), command.begin(), command.end());
    return args;
}

}  // namespace

TEST_CASE(
    "two ranks with --offload params give the bits of two ranks with --offload none, for "
    "every --grad-dtype") {
    spillway::test::temp_dir dir("mini_gpt_mpi");
    const auto d = dir.path();
    // A model whose final LayerNorm weights are 10x GPT-2's: the fp16 run skips a step.
    const gpt2_config c{16, 256, 256, 3, 4, 32};
    spillway::thread_pool pool(1);
    gpt2 model(c, pool);
    model.init_gpt2(7);
    auto params = model.llmc_params();
    const param_layout layout(c);
    for (std::size_t i = 0; i < layout.sizes[14]; ++i) params[layout.llmc_offsets[14] + i] *= 10;
    write_checkpoint(d / "start.bin", c, params);
    for (const char* g : {"fp32", "bf16", "fp16"}) {
        INFO("--grad-dtype " << std::string(g));
        std::string steps[2], models[2];
        for (int params_mode = 0; params_mode < 2; ++params_mode) {
            const std::string tag = std::string(g) + (params_mode ? "-params" : "-none");
            std::vector<std::string> args = {MINI_GPT_EXE,
                                             "--model",
                                             (d / "start.bin").string(),
                                             "--seq",
                                             "16",
                                             "--batch",
                                             "4",
                                             "--threads",
                                             "1",
                                             "--corpus-bytes",
                                             "8192",
                                             "--lr",
                                             "1e-3",
                                             "--steps",
                                             "5",
                                             "--subgroup",
                                             "5000",
                                             "--json",
                                             "--grad-dtype",
                                             g,
                                             "--offload",
                                             params_mode ? "params" : "none",
                                             "--path",
                                             (d / "p").string(),
                                             "--lock-dir",
                                             (d / "locks").string(),
                                             "--save-model",
                                             (d / (tag + ".bin")).string()};
            const auto out = d / (tag + ".txt");
            const int rc = run(mpirun(args), out);
            INFO("mpirun stderr: " << slurp(out.string() + ".err"));
            REQUIRE(rc == 0);
            steps[params_mode] = steps_of(slurp(out));
            models[params_mode] = slurp(d / (tag + ".bin"));
        }
        CHECK(steps[1] == steps[0]);
        CHECK(models[1] == models[0]);
        CHECK(!models[0].empty());
        if (std::string(g) == "fp16") CHECK(steps[0].find("\"skipped\":true") != std::string::npos);
    }
}
