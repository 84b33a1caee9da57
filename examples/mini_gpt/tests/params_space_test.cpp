// SPDX-License-Identifier: Apache-2.0
// --offload params: the free-space check asks for every byte the run writes on a path. The
// second --path is a tmpfs of exactly the figure the check names for it
// (streamed_params::disk_bytes_on: blobs in whole blocks, the fp16 spill, the file tiers'
// spare files and rewrites in flight): fp32 and fp16 runs end normally there, and one page
// less is refused at start, naming the path. Mounting needs the privilege to mount a tmpfs;
// without it the test exits 77, which ctest reports as skipped.
#include <doctest/doctest.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>

#include <sys/mount.h>

#include "streamed_params.hpp"
#include "support/temp_dir.hpp"
#include "support/tmpfs_mount.hpp"
#include "trainer.hpp"
#include "trainer_support.hpp"

using namespace mini_gpt;
using namespace mini_gpt::testing;

namespace {


}  // namespace

TEST_CASE("--offload params: a path of exactly the free space the check asks for is enough") {
    spillway::test::temp_dir dir("mini_gpt");
    for (grad_dtype g : {grad_dtype::fp32, grad_dtype::fp16}) {
        INFO("--grad-dtype " << std::string(dtype_name(g)));
        options o = tiny_options(dir.path(), 4, 3, 2);
        o.offload = offload_mode::params;
        o.grads = g;
        const gpt2_config c{o.max_seq, 256, 256, o.layers, o.heads, o.channels};
        // The windows the trainer takes without --memory-budget: two layers each.
        const auto L = static_cast<std::size_t>(c.num_layers);
        const std::size_t pw = std::min(
                              spillway::charge_of(streamed_params::layer_param_bytes(c)) * L,
                              2 * streamed_params::smallest_param_window(c)),
                          sw = std::min(
                              spillway::charge_of(streamed_params::layer_state_bytes(c)) * L,
                              2 * streamed_params::smallest_state_window(c)),
                          gw = g == grad_dtype::fp16 ? 2 * streamed_params::smallest_grad_window(c)
                                                     : 0;
        const std::size_t figure = streamed_params::disk_bytes_on(c, g, 1, 2, pw, sw, gw);
        REQUIRE(figure % 4096 == 0);
        {
            spillway::test::tmpfs_mount at(o.paths[1], figure);
            CHECK(run(o).size() == 3);
        }
        {
            spillway::test::tmpfs_mount at(o.paths[1], figure - 4096);
            const std::string m = message_of([&] { (void)run(o); });
            INFO(m);
            CHECK(m.find(o.paths[1].string() + ": ") == 0);
            CHECK(m.find("needed for the model's state") != std::string::npos);
        }
    }
}
