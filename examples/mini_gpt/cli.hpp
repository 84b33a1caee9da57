// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/cli.hpp: what main asks of the command line besides parse_options and
// usage_text (declared in trainer.hpp): whether the arguments only ask for --help or
// --version, and the learning-rate schedule they ask for. The flags are declared once, in cli.cpp,
// and parsed with CLI11 there; nothing outside cli.cpp includes CLI11.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "spillway/schedule/lr_schedule.hpp"

namespace mini_gpt {

struct options;

/// The learning-rate schedule the flags ask for: --lr-schedule, --lr, --lr-min,
/// --warmup-steps, and --steps as cosine's horizon (constant's lr_min and total_steps are 0,
/// so a constant schedule does not depend on --steps). parse_options has validated it.
spillway::lr_schedule lr_schedule_of(const options& opt);

/// The version line --version prints: "mini_gpt (Spillway X.Y.Z)\n".
std::string version_text();

/// What to print for `args` (argv without argv[0]) that ask for -h or --help (usage_text())
/// or --version (version_text()), whichever comes first, wherever it is: the other flags are
/// then not checked. std::nullopt when `args` ask for neither (a run: parse_options).
std::optional<std::string> help_or_version(const std::vector<std::string>& args);

}  // namespace mini_gpt
