// SPDX-License-Identifier: Apache-2.0
// The save manifest of the update pipeline, without a tier: the writer's text parses back to
// the same fields, and the parser refuses every bad, missing or corrupted field with a
// message that names it and the path.
#include <doctest/doctest.h>

#include <spillway/optim/detail/pipeline_manifest.hpp>

#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>

#include "support/temp_dir.hpp"

using namespace spillway;
using detail::manifest_text;
using detail::parse_manifest;
using detail::pipeline_manifest;

namespace {

const std::filesystem::path dir = "/saves/ckpt";
const std::string where = (dir / "manifest.txt").string();

// 3 subgroups of 100, the last one 50 parameters.
pipeline_config shape() {
    return pipeline_config{.param_count = 250, .subgroup_size = 100};
}

pipeline_manifest sample() {
    pipeline_manifest m{
        .param_count = 250, .subgroup_size = 100, .step = 7, .iteration = 5, .subgroups = {}};
    m.subgroups = {{1200, 0xdeadbeefu}, {1200, 0}, {600, 0xffffffffu}};
    return m;
}

// `text` with its manifest_crc line recomputed, so that only the edit under test is wrong.
std::string resealed(std::string text) {
    const auto at = text.rfind("\nmanifest_crc ");
    REQUIRE(at != std::string::npos);
    text.resize(at + 1);
    const auto crc = crc32c(std::as_bytes(std::span(text.data(), text.size())));
    return text + "manifest_crc " + std::to_string(crc) + "\nend\n";
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
    const auto at = text.find(from);
    REQUIRE(at != std::string::npos);
    return text.replace(at, from.size(), to);
}

template <class Error>
void refused(const std::string& text, const std::string& message) {
    CHECK_THROWS_WITH_AS((void)parse_manifest(text, shape(), dir), message.c_str(), Error);
}

}  // namespace

TEST_CASE("manifest: the writer's text parses back to the same fields") {
    const auto m = sample();
    const std::string text = manifest_text(m);
    CHECK(text.rfind("spillway-optimizer-state 2\nparam_count 250\nsubgroup_size 100\n"
                     "subgroups 3\nstep 7\niteration 5\nsubgroup 0 1200 3735928559\n",
                     0) == 0);
    CHECK(text.ends_with("\nend\n"));
    const auto back = parse_manifest(text, shape(), dir);
    CHECK(back.param_count == m.param_count);
    CHECK(back.subgroup_size == m.subgroup_size);
    CHECK(back.step == m.step);
    CHECK(back.iteration == m.iteration);
    REQUIRE(back.subgroups.size() == m.subgroups.size());
    for (std::size_t s = 0; s < m.subgroups.size(); ++s) {
        CHECK(back.subgroups[s].nbytes == m.subgroups[s].nbytes);
        CHECK(back.subgroups[s].crc == m.subgroups[s].crc);
    }
    CHECK(detail::saved_blob_bytes(shape(), 2) == 600);
    CHECK(detail::subgroup_file_name(3) == "subgroup-000003.bin");
}

TEST_CASE("manifest: format 1, without its own checksum, is still read") {
    std::string text = manifest_text(sample());
    text = replaced(text, "spillway-optimizer-state 2", "spillway-optimizer-state 1");
    text.resize(text.rfind("manifest_crc "));
    text += "end\n";
    const auto back = parse_manifest(text, shape(), dir);
    CHECK(back.step == 7);
    CHECK(back.subgroups[2].crc == 0xffffffffu);
}

TEST_CASE("manifest: a text that is not a save, or whose checksum does not match, is refused") {
    const std::string text = manifest_text(sample());
    const std::string not_a_save =
        "update_pipeline::restore: " + where + " is not a spillway optimizer save (format 1 or 2)";
    refused<std::runtime_error>("", not_a_save);
    refused<std::runtime_error>(replaced(text, "spillway-optimizer-state", "other-state"),
                                not_a_save);
    refused<std::runtime_error>(replaced(text, "state 2", "state 3"), not_a_save);
    const std::string corrupted = "update_pipeline::restore: " + where +
                                  " is corrupted: its text does not match its checksum "
                                  "(manifest_crc)";
    refused<std::runtime_error>(replaced(text, "step 7", "step 8"), corrupted);  // not resealed
    std::string no_crc = text;
    no_crc.resize(no_crc.rfind("manifest_crc "));
    refused<std::runtime_error>(no_crc + "end\n", corrupted);
    refused<std::runtime_error>(replaced(text, "manifest_crc ", "manifest_crc x"), corrupted);
}

TEST_CASE("manifest: each missing, malformed or out-of-range field is named") {
    const std::string text = manifest_text(sample());
    auto field = [&](const char* name) {
        return "update_pipeline::restore: manifest field '" + std::string(name) +
               "' is missing or malformed in " + dir.string();
    };
    refused<std::runtime_error>(resealed(replaced(text, "param_count 250", "param_count x")),
                                field("param_count"));
    refused<std::runtime_error>(resealed(replaced(text, "subgroup_size 100\n", "")),
                                field("subgroup_size"));
    refused<std::runtime_error>(resealed(replaced(text, "subgroups 3", "subgroups -3")),
                                field("subgroups"));
    refused<std::runtime_error>(resealed(replaced(text, "step 7", "steps 7")), field("step"));
    refused<std::runtime_error>(resealed(replaced(text, "iteration 5", "iteration")),
                                field("iteration"));
    refused<std::runtime_error>(
        resealed(replaced(text, "step 7",
                          "step " + std::to_string(std::numeric_limits<std::int64_t>::max()))),
        "update_pipeline::restore: manifest field 'step' is out of range in " + dir.string());
    auto entry = [&](int s) {
        return "update_pipeline::restore: manifest entry of subgroup " + std::to_string(s) +
               " is missing or malformed in " + dir.string();
    };
    refused<std::runtime_error>(resealed(replaced(text, "subgroup 1 1200", "subgroup 2 1200")),
                                entry(1));
    refused<std::runtime_error>(resealed(replaced(text, "subgroup 2 600", "subgroup 2 601")),
                                entry(2));  // not 12 bytes per parameter
    refused<std::runtime_error>(resealed(replaced(text, "1200 0\n", "1200 4294967296\n")),
                                entry(1));  // not a 32-bit CRC
    refused<std::runtime_error>(resealed(replaced(text, "subgroup 2 600 4294967295\n", "")),
                                entry(2));
    // Format 1 has no checksum to protect its end.
    std::string v1 = replaced(text, "state 2", "state 1");
    v1.resize(v1.rfind("manifest_crc "));
    refused<std::runtime_error>(
        v1, "update_pipeline::restore: manifest in " + dir.string() + " is truncated");
}

TEST_CASE("manifest: a save of another shape is refused, naming the field") {
    const std::string text = manifest_text(sample());
    pipeline_config other = shape();
    other.param_count = 251;
    CHECK_THROWS_WITH_AS((void)parse_manifest(text, other, dir),
                         "update_pipeline::restore: the save has param_count 250, the config 251",
                         std::invalid_argument);
    other = shape();
    other.subgroup_size = 50;
    CHECK_THROWS_WITH_AS((void)parse_manifest(text, other, dir),
                         "update_pipeline::restore: the save has subgroup_size 100, the config 50",
                         std::invalid_argument);
    refused<std::runtime_error>(
        resealed(replaced(text, "subgroups 3", "subgroups 4")),
        "update_pipeline::restore: the manifest lists 4 subgroups, the shape implies 3");
}

TEST_CASE("manifest: a missing manifest.txt is a system_error saying so, naming the path") {
    test::temp_dir root("manifest-missing");
    try {
        (void)detail::read_manifest_text(root.path());
        FAIL("read a manifest that does not exist");
    } catch (const std::system_error& e) {
        CHECK(e.code().value() == ENOENT);
        const std::string what = e.what();
        INFO(what);
        CHECK(what.find("the manifest " + (root.path() / "manifest.txt").string() +
                        " is missing") != std::string::npos);
    }
}

TEST_CASE("manifest: a directory named manifest.txt is refused as a directory") {
    // An ifstream would open it and read nothing, and the empty text would be called "not a
    // spillway optimizer save": the message must say it is a directory.
    test::temp_dir root("manifest-dir");
    std::filesystem::create_directory(root.path() / "manifest.txt");
    try {
        (void)detail::read_manifest_text(root.path());
        FAIL("read a directory as a manifest");
    } catch (const std::system_error& e) {
        CHECK(e.code().value() == EISDIR);
        const std::string what = e.what();
        INFO(what);
        CHECK(what.find((root.path() / "manifest.txt").string() + " is a directory") !=
              std::string::npos);
    }
}

TEST_CASE("manifest: the text is read back whole, and a symbolic link is not followed") {
    test::temp_dir root("manifest-read");
    const std::string text = manifest_text(sample()) + std::string(10000, '#');  // > one read
    { std::ofstream(root.path() / "saved.txt", std::ios::binary) << text; }
    std::filesystem::copy_file(root.path() / "saved.txt", root.path() / "manifest.txt");
    CHECK(detail::read_manifest_text(root.path()) == text);
    std::filesystem::remove(root.path() / "manifest.txt");
    std::filesystem::create_symlink(root.path() / "saved.txt", root.path() / "manifest.txt");
    CHECK_THROWS_WITH_AS((void)detail::read_manifest_text(root.path()),
                         doctest::Contains("is a symbolic link"), std::system_error);
}
