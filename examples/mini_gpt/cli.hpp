// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/cli.hpp: what main asks of the command line besides parse_options and
// usage_text (declared in trainer.hpp): whether the arguments only ask for --help or
// --version. The flags are declared once, in cli.cpp, and parsed with CLI11 there; nothing
// outside cli.cpp includes CLI11.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace mini_gpt {

/// The version line --version prints: "mini_gpt (Spillway X.Y.Z)\n".
std::string version_text();

/// What to print for `args` (argv without argv[0]) that ask for -h or --help (usage_text())
/// or --version (version_text()), whichever comes first, wherever it is: the other flags are
/// then not checked. std::nullopt when `args` ask for neither (a run: parse_options).
std::optional<std::string> help_or_version(const std::vector<std::string>& args);

}  // namespace mini_gpt
