// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/corpus.hpp: the built-in training text, generated deterministically.
//
// A small grammar (written for this project, no third-party text) strings sentences about
// a river town together from fixed word lists, picked by a seeded generator: the text has
// real structure (spelling, agreement, punctuation, recurring phrases) for a byte-level
// model to learn, needs no network and is the same on every machine for a given seed.
// Tokens are bytes (vocabulary 256).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mini_gpt {

/// About `nbytes` bytes of text (whole sentences) from `seed`.
std::string builtin_corpus(std::size_t nbytes, std::uint64_t seed = 2024);

/// The text as byte tokens.
std::vector<std::uint16_t> builtin_tokens(std::size_t nbytes, std::uint64_t seed = 2024);

}  // namespace mini_gpt
