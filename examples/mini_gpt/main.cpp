// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/main.cpp: the mini_gpt command line. Exit status, one meaning each: 0 the
// run completed; 1 the run failed (a write failed: a full disk, an I/O error; out of memory;
// an MPI rank failed); 2 bad input (a flag, a file read, a save refused, a --save another run
// holds): a one-line message naming the file or flag and the problem. The message's control
// bytes are escaped (spillway::escaped): a name read from a file never reaches the terminal raw.
#include <exception>
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include "cli.hpp"
#include "dist.hpp"
#include "llmc_format.hpp"
#include "spillway/error.hpp"
#include "trainer.hpp"

namespace {
/// Prints the error; under MPI with several ranks the others may be waiting in a collective,
/// so the whole job is aborted with the same status.
int fail(int status, const char* kind, const char* what) {
    std::cerr << "mini_gpt: " << kind << ": " << spillway::escaped(what) << "\n";
    if (mini_gpt::dist::size() > 1) mini_gpt::dist::abort(status);
    mini_gpt::dist::finalize();
    return status;
}
}  // namespace

int main(int argc, char** argv) {
    mini_gpt::dist::init(&argc, &argv);
    std::vector<std::string> args(argv + 1, argv + argc);
    if (const auto text = mini_gpt::help_or_version(args)) {
        if (mini_gpt::dist::rank() == 0) std::cout << *text;
        mini_gpt::dist::finalize();
        return 0;
    }
    try {
        mini_gpt::options opt = mini_gpt::parse_options(args);
        mini_gpt::train(opt, std::cout);
        mini_gpt::dist::finalize();
        return 0;
    } catch (const mini_gpt::input_error& e) {
        return fail(2, "error", e.what());
    } catch (const std::invalid_argument& e) {
        return fail(2, "error", e.what());
    } catch (const std::bad_alloc&) {
        return fail(1, "failed",
                    "out of memory: the model, the batch or the buffers asked for more than this "
                    "machine gives (std::bad_alloc)");
    } catch (const std::exception& e) {
        return fail(1, "failed", e.what());
    }
}
