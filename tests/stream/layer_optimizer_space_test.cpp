// SPDX-License-Identifier: Apache-2.0
// layer_optimizer's stored_bytes_on() is enough: a run of fp32 and fp16 steps with write-backs,
// the gradient spill and a flush succeeds on a tmpfs of exactly the figure, and one on a tmpfs
// smaller than the layers' blobs fails with ENOSPC (the check can fail). Mounting needs the
// privilege to mount a tmpfs; without it the test exits 77, which ctest reports as skipped.
#include <doctest/doctest.h>

#include <spillway/stream/layer_optimizer.hpp>
#include <spillway/tier/file_tier.hpp>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include <sys/mount.h>

#include "stream/constant_steps.hpp"
#include "support/temp_dir.hpp"
#include "support/tmpfs_mount.hpp"

namespace fs = std::filesystem;
using spillway::grad_dtype;

namespace {

const std::vector<std::size_t> sizes = {30000, 51200, 15000, 40960, 70001, 22222};

/// Three steps (run_constant_steps), params and the spill under p/, m|v under s/.
void run(const fs::path& root, const spillway::layer_optimizer_options& o) {
    fs::create_directories(root / "p");
    fs::create_directories(root / "s");
    spillway::file_tier<> pt(root / "p"), st(root / "s");
    spillway::layer_optimizer<spillway::file_tier<>> opt(pt, st, sizes, o);
    spillway::test::run_constant_steps(opt, 3);
}

spillway::layer_optimizer_options options(grad_dtype g) {
    spillway::layer_optimizer_options o;
    o.grads = g;
    o.param_window = 2 * spillway::smallest_param_window(sizes);
    o.state_window = 2 * spillway::smallest_state_window(sizes);
    o.spill_window = 2 * spillway::smallest_spill_window(sizes);
    return o;
}

}  // namespace

TEST_CASE(
    "layer_optimizer: a run fits a tmpfs of exactly stored_bytes() and not one below its blobs") {
    spillway::test::temp_dir dir;
    for (grad_dtype g : {grad_dtype::fp32, grad_dtype::fp16}) {
        CAPTURE(static_cast<int>(g));
        const auto o = options(g);
        const std::size_t figure = spillway::stored_bytes(sizes, o);
        REQUIRE(figure % 4096 == 0);
        {
            spillway::test::tmpfs_mount fs_at(dir.path() / "exact", figure);
            CHECK_NOTHROW(run(dir.path() / "exact", o));
        }
        std::size_t blobs = 0;  // the layers' params and m|v alone
        for (auto n : sizes) blobs += 12 * n;
        {
            spillway::test::tmpfs_mount fs_at(dir.path() / "small", blobs / 4096 * 4096 - 4096);
            try {
                run(dir.path() / "small", o);
                FAIL("a tmpfs smaller than the blobs held them");
            } catch (const std::system_error& e) {
                CHECK(e.code().value() == ENOSPC);
            }
        }
    }
}
