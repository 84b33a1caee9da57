// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/corpus.cpp: the sentence grammar behind builtin_corpus().
#include "corpus.hpp"

#include <array>
#include <string_view>

namespace mini_gpt {

namespace {

class pick_rng {
public:
    explicit pick_rng(std::uint64_t seed) : s_(seed * 2 + 1) {}
    std::size_t below(std::size_t n) {
        s_ ^= s_ << 13;
        s_ ^= s_ >> 7;
        s_ ^= s_ << 17;
        return static_cast<std::size_t>(s_ % n);
    }
    template <class Array>
    std::string_view of(const Array& a) {
        return a[below(a.size())];
    }

private:
    std::uint64_t s_;
};

constexpr std::array<std::string_view, 16> subjects = {
    "the miller", "the old ferryman", "a young baker", "the keeper of the lock", "my sister", "the river pilot",
    "a tired clerk", "the blacksmith", "our neighbour", "the night watchman", "a quiet weaver",
    "the schoolteacher", "the harbour master", "a travelling tinker", "the gardener", "the potter"};
constexpr std::array<std::string_view, 14> verbs = {
    "carried", "mended", "painted", "counted", "found", "sold", "opened", "watched",
    "polished", "borrowed", "cleaned", "measured", "buried", "weighed"};
constexpr std::array<std::string_view, 12> adjectives = {
    "small", "heavy", "green", "broken", "silver", "wooden", "warm", "narrow", "bright", "empty", "crooked",
    "quiet"};
constexpr std::array<std::string_view, 16> objects = {
    "boat", "lantern", "basket of apples", "bridge", "wheel", "door", "kettle", "ledger", "fishing net",
    "bell", "ladder", "sack of flour", "clock", "window", "rope", "cart"};
constexpr std::array<std::string_view, 12> places = {
    "near the mill", "by the water gate", "in the market square", "under the stone bridge", "behind the chapel",
    "at the end of the lane", "beside the canal", "on the upper meadow", "inside the boathouse",
    "across the weir", "outside the inn", "along the towpath"};
constexpr std::array<std::string_view, 10> times = {
    "before dawn", "in the morning", "at noon", "after the rain", "in the evening", "on market day",
    "during the flood", "late at night", "every spring", "when the bells rang"};
constexpr std::array<std::string_view, 8> reasons = {
    "because the water was rising", "so that the children could cross", "while the town was asleep",
    "although nobody had asked", "as the lock keeper had said", "since the ferry was late",
    "before the frost came", "for the winter fair"};
constexpr std::array<std::string_view, 8> replies = {
    "\"It will hold,\" said", "\"Not today,\" said", "\"Look at the river,\" said", "\"We are nearly done,\" said",
    "\"Bring the lantern,\" said", "\"Count them again,\" said", "\"The gate is open,\" said",
    "\"Mind the step,\" said"};

std::string capitalised(std::string_view s) {
    std::string out(s);
    if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = static_cast<char>(out[0] - 'a' + 'A');
    return out;
}

std::string sentence(pick_rng& rng) {
    std::string s;
    auto add = [&s](std::string_view part) { s.append(part.data(), part.size()); };
    switch (rng.below(4)) {
        case 0:  // Subject verb the adjective object place.
            s = capitalised(rng.of(subjects));
            add(" "), add(rng.of(verbs)), add(" the "), add(rng.of(adjectives)), add(" "), add(rng.of(objects));
            add(" "), add(rng.of(places)), add(".");
            break;
        case 1:  // Time, subject verb the object reason.
            s = capitalised(rng.of(times));
            add(", "), add(rng.of(subjects)), add(" "), add(rng.of(verbs)), add(" the "), add(rng.of(objects));
            add(" "), add(rng.of(reasons)), add(".");
            break;
        case 2:  // "Quote," said subject.
            add(rng.of(replies)), add(" "), add(rng.of(subjects)), add(".");
            break;
        default:  // Subject and subject verb the adjective object time.
            s = capitalised(rng.of(subjects));
            add(" and "), add(rng.of(subjects)), add(" "), add(rng.of(verbs)), add(" the "), add(rng.of(adjectives));
            add(" "), add(rng.of(objects)), add(" "), add(rng.of(times)), add(".");
            break;
    }
    return s;
}

}  // namespace

std::string builtin_corpus(std::size_t nbytes, std::uint64_t seed) {
    pick_rng rng(seed);
    std::string text;
    text.reserve(nbytes + 256);
    while (text.size() < nbytes) {
        text += sentence(rng);
        text += rng.below(5) == 0 ? "\n" : " ";
    }
    return text;
}

std::vector<std::uint16_t> builtin_tokens(std::size_t nbytes, std::uint64_t seed) {
    std::string text = builtin_corpus(nbytes, seed);
    std::vector<std::uint16_t> tokens(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
    return tokens;
}

}  // namespace mini_gpt
