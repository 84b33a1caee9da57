// SPDX-License-Identifier: Apache-2.0
// The trace recorder: tracks, complete events, thread safety, lanes for overlapping
// events, a disabled recorder that records nothing, and Chrome trace JSON that parses.
#include <doctest/doctest.h>

#include <spillway/trace/recorder.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <vector>

#include "support/temp_dir.hpp"

using namespace std::chrono_literals;
namespace tr = spillway::trace;

namespace {

// A small JSON parser, enough to check the export is well-formed and to read it back.
struct json_value {
    enum kind_t { null, boolean, number, string, array, object } kind = null;
    double num = 0;
    std::string str;
    std::vector<json_value> items;
    std::vector<std::string> keys;   // object members: keys[i] -> values[i]
    std::vector<json_value> values;  // (a pair would need the complete type)
    const json_value* get(const std::string& k) const {
        for (std::size_t i = 0; i < keys.size(); ++i)
            if (keys[i] == k) return &values[i];
        return nullptr;
    }
};

struct json_parser {
    std::string_view s;
    std::size_t i = 0;
    void ws() {
        while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    }
    void expect(char c) {
        ws();
        if (i >= s.size() || s[i] != c)
            throw std::runtime_error("json: expected " + std::string(1, c) + " at " +
                                     std::to_string(i));
        ++i;
    }
    std::string parse_string() {
        expect('"');
        std::string out;
        while (true) {
            if (i >= s.size()) throw std::runtime_error("json: unterminated string");
            char c = s[i++];
            if (c == '"') break;
            if (static_cast<unsigned char>(c) < 0x20)
                throw std::runtime_error("json: control character in string");
            if (c == '\\') {
                char e = s[i++];
                switch (e) {
                    case '"':
                        out += '"';
                        break;
                    case '\\':
                        out += '\\';
                        break;
                    case '/':
                        out += '/';
                        break;
                    case 'n':
                        out += '\n';
                        break;
                    case 't':
                        out += '\t';
                        break;
                    case 'r':
                        out += '\r';
                        break;
                    case 'b':
                        out += '\b';
                        break;
                    case 'f':
                        out += '\f';
                        break;
                    case 'u':
                        out +=
                            static_cast<char>(std::stoi(std::string(s.substr(i, 4)), nullptr, 16));
                        i += 4;
                        break;
                    default:
                        throw std::runtime_error("json: bad escape");
                }
            } else {
                out += c;
            }
        }
        return out;
    }
    json_value parse() {
        ws();
        json_value v;
        if (i >= s.size()) throw std::runtime_error("json: unexpected end");
        char c = s[i];
        if (c == '{') {
            v.kind = json_value::object;
            ++i;
            ws();
            if (s[i] == '}') {
                ++i;
                return v;
            }
            while (true) {
                std::string k = parse_string();
                expect(':');
                v.keys.push_back(k);
                v.values.push_back(parse());
                ws();
                if (s[i] == ',') {
                    ++i;
                    continue;
                }
                expect('}');
                return v;
            }
        }
        if (c == '[') {
            v.kind = json_value::array;
            ++i;
            ws();
            if (s[i] == ']') {
                ++i;
                return v;
            }
            while (true) {
                v.items.push_back(parse());
                ws();
                if (s[i] == ',') {
                    ++i;
                    continue;
                }
                expect(']');
                return v;
            }
        }
        if (c == '"') {
            v.kind = json_value::string;
            v.str = parse_string();
            return v;
        }
        std::size_t start = i;
        while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '-' ||
                                s[i] == '.' || s[i] == 'e' || s[i] == 'E' || s[i] == '+'))
            ++i;
        if (i == start)
            throw std::runtime_error("json: unexpected character at " + std::to_string(i));
        v.kind = json_value::number;
        v.num = std::stod(std::string(s.substr(start, i - start)));
        return v;
    }
    json_value parse_document() {
        auto v = parse();
        ws();
        if (i != s.size()) throw std::runtime_error("json: trailing characters");
        return v;
    }
};

json_value parse_json(const std::string& text) {
    return json_parser{text}.parse_document();
}

}  // namespace

TEST_CASE("events on named tracks export as Chrome trace JSON") {
    tr::recorder rec(tr::recording::enabled, "unit \"test\"");
    auto reads = rec.track("reads");
    auto compute = rec.track("compute");
    CHECK(rec.track("reads") == reads);
    CHECK(reads != compute);
    auto t0 = tr::clock::now();
    rec.complete(reads, "read 0", t0, t0 + 100us, "io", {{"bytes", 4096}});
    rec.complete(compute, "adam\t0", t0 + 100us, t0 + 250us);
    CHECK(rec.size() == 2);

    auto doc = parse_json(rec.json());
    REQUIRE(doc.kind == json_value::object);
    const auto* evs = doc.get("traceEvents");
    REQUIRE(evs);
    std::map<double, std::string> thread_names;
    std::vector<const json_value*> complete;
    std::string process_name;
    for (auto& e : evs->items) {
        std::string ph = e.get("ph")->str;
        if (ph == "M" && e.get("name")->str == "thread_name")
            thread_names[e.get("tid")->num] = e.get("args")->get("name")->str;
        if (ph == "M" && e.get("name")->str == "process_name")
            process_name = e.get("args")->get("name")->str;
        if (ph == "X") complete.push_back(&e);
    }
    CHECK(process_name == "unit \"test\"");
    REQUIRE(complete.size() == 2);
    const json_value* r = complete[0]->get("name")->str == "read 0" ? complete[0] : complete[1];
    const json_value* c = r == complete[0] ? complete[1] : complete[0];
    CHECK(thread_names[r->get("tid")->num] == "reads");
    CHECK(thread_names[c->get("tid")->num] == "compute");
    CHECK(c->get("name")->str == "adam\t0");
    CHECK(r->get("cat")->str == "io");
    CHECK(r->get("args")->get("bytes")->num == 4096);
    CHECK(r->get("dur")->num == doctest::Approx(100).epsilon(0.001));
    CHECK(c->get("dur")->num == doctest::Approx(150).epsilon(0.001));
    CHECK(c->get("ts")->num - r->get("ts")->num == doctest::Approx(100).epsilon(0.001));
    CHECK(r->get("ts")->num >= 0);
}

TEST_CASE("overlapping events on one track are split into properly nested lanes") {
    tr::recorder rec;
    auto reads = rec.track("reads");
    auto t0 = tr::clock::now();
    rec.complete(reads, "a", t0, t0 + 100us);
    rec.complete(reads, "b", t0 + 50us, t0 + 150us);   // overlaps a partially: new lane
    rec.complete(reads, "c", t0 + 10us, t0 + 20us);    // nests inside a: lane 1
    rec.complete(reads, "d", t0 + 200us, t0 + 300us);  // after both: lane 1 again
    auto doc = parse_json(rec.json());
    std::map<std::string, double> tid;
    std::map<double, std::string> lane_name;
    for (auto& e : doc.get("traceEvents")->items) {
        if (e.get("ph")->str == "X") tid[e.get("name")->str] = e.get("tid")->num;
        if (e.get("ph")->str == "M" && e.get("name")->str == "thread_name")
            lane_name[e.get("tid")->num] = e.get("args")->get("name")->str;
    }
    CHECK(tid["a"] == tid["c"]);
    CHECK(tid["a"] == tid["d"]);
    CHECK(tid["a"] != tid["b"]);
    CHECK(lane_name[tid["a"]] == "reads");
    CHECK(lane_name[tid["b"]] == "reads #2");
}

TEST_CASE("a disabled recorder records nothing and scoped events are inert") {
    tr::recorder rec(tr::recording::disabled);
    auto t = rec.track("writes");
    auto now = tr::clock::now();
    rec.complete(t, "x", now, now);
    { auto s = rec.scope(t, "y"); }
    { tr::scoped_event s(nullptr, 0, "z"); }
    CHECK(rec.size() == 0);
    rec.enable();
    {
        auto s = rec.scope(t, "y");
        std::this_thread::sleep_for(1ms);
    }
    REQUIRE(rec.size() == 1);
    auto e = rec.events()[0];
    CHECK(e.name == "y");
    CHECK(e.end - e.begin >= 1ms);
    rec.disable();
    { auto s = rec.scope(t, "after"); }
    CHECK(rec.size() == 1);
    rec.clear();
    CHECK(rec.size() == 0);
    CHECK(parse_json(rec.json()).get("traceEvents")->items.size() >= 1);  // metadata stays
}

TEST_CASE("bad events are refused") {
    tr::recorder rec;
    auto t = rec.track("t");
    auto now = tr::clock::now();
    CHECK_THROWS_AS(rec.complete(t, "backwards", now, now - 1us), std::invalid_argument);
    CHECK_THROWS_AS(rec.complete(t + 7, "nowhere", now, now), std::invalid_argument);
    CHECK(rec.size() == 0);
}

TEST_CASE("the recorder is thread-safe") {
    tr::recorder rec;
    constexpr int threads = 4, per = 500;
    std::vector<std::thread> ts;
    for (int k = 0; k < threads; ++k)
        ts.emplace_back([&, k] {
            // (names built with append: g++ 12 -O3 warns falsely on "lit" + std::string)
            std::string track_name = "track ";
            track_name.append(std::to_string(k % 2));
            auto t = rec.track(track_name);
            for (int i = 0; i < per; ++i) {
                std::string name = "e";
                name.append(std::to_string(i));
                auto s = rec.scope(t, name);
            }
        });
    for (auto& t : ts) t.join();
    CHECK(rec.size() == threads * per);
    CHECK(rec.tracks().size() == 2);
    auto doc = parse_json(rec.json());
    std::size_t x = 0;
    for (auto& e : doc.get("traceEvents")->items) x += e.get("ph")->str == "X";
    CHECK(x == threads * per);
}

namespace {
/// The file save() wrote: mode 0600, and the recorder's JSON exactly.
void check_saved(const std::filesystem::path& path, const tr::recorder& rec) {
    struct stat st {};
    REQUIRE(::stat(path.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
    std::ifstream in(path);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(text == rec.json());
}
// One 5 us span "k" on the track "compute".
void add_one_span(tr::recorder& rec) {
    auto t = rec.track("compute");
    auto now = tr::clock::now();
    rec.complete(t, "k", now, now + 5us);
}
}  // namespace

TEST_CASE("save writes a 0600 file and names the path on failure") {
    spillway::test::temp_dir dir("trace");
    tr::recorder rec;
    add_one_span(rec);
    auto path = dir.path() / "trace.json";
    rec.save(path);
    check_saved(path, rec);
    // A path under a regular file cannot be created: ENOTDIR, with the path in the message.
    auto bad = path / "nested.json";
    try {
        rec.save(bad);
        FAIL("save under a regular file succeeded");
    } catch (const std::system_error& e) {
        CHECK(e.code().value() == ENOTDIR);
        CHECK(std::string(e.what()).find(bad.string()) != std::string::npos);
    }
}

TEST_CASE(
    "names that are not UTF-8 are written as U+FFFD, so the file stays JSON; valid UTF-8 passes") {
    tr::recorder rec;
    auto t = rec.track("compute");
    auto now = tr::clock::now();
    // 0xff and 0xfe never occur in UTF-8; 0xc3 at the end is a truncated sequence; "\xed\xa0\x80"
    // is a surrogate; "\xc0\xaf" an overlong '/'. "é" and "€" are valid.
    rec.complete(t, std::string("bad \xff\xfe tail \xc3"), now, now + 5us);
    rec.complete(t, std::string("surrogate \xed\xa0\x80 overlong \xc0\xaf"), now, now + 5us);
    rec.complete(t, "caf\xc3\xa9 \xe2\x82\xac", now, now + 5us);
    const std::string text = rec.json();
    for (const char* bad : {"\xff", "\xfe", "\xed\xa0", "\xc0\xaf"})
        CHECK(text.find(bad) == std::string::npos);
    CHECK(text.find("bad \\ufffd\\ufffd tail \\ufffd\"") != std::string::npos);
    CHECK(text.find("surrogate \\ufffd\\ufffd\\ufffd overlong \\ufffd\\ufffd") !=
          std::string::npos);
    CHECK(text.find("caf\xc3\xa9 \xe2\x82\xac") != std::string::npos);
    CHECK_NOTHROW(json_parser{text}.parse_document());
}

TEST_CASE(
    "saves from several threads at once each write a whole file, 0600 even beside an old temporary "
    "file") {
    spillway::test::temp_dir dir("trace");
    tr::recorder rec;
    add_one_span(rec);
    auto path = dir.path() / "trace.json";
    // A world-readable temporary file named "<path>.tmp-<pid>" (no counter), left by someone:
    // not reused.
    std::ofstream(path.string() + ".tmp-" + std::to_string(::getpid())) << "old";
    std::filesystem::permissions(
        path.string() + ".tmp-" + std::to_string(::getpid()),
        std::filesystem::perms::owner_all | std::filesystem::perms::others_read);
    std::atomic<int> failures{0};
    std::vector<std::thread> savers;
    for (int k = 0; k < 4; ++k)
        savers.emplace_back([&] {
            for (int i = 0; i < 50; ++i) {
                try {
                    rec.save(path);
                } catch (...) {
                    ++failures;
                }
            }
        });
    for (auto& s : savers) s.join();
    CHECK(failures.load() == 0);
    check_saved(path, rec);
}

TEST_CASE("save replaces a hard or symbolic link at the path, never writing through it") {
    spillway::test::temp_dir dir("trace-links");
    tr::recorder rec;
    add_one_span(rec);
    const auto outside = dir.path() / "outside.json";
    { std::ofstream(outside) << "keep"; }
    const auto hard = dir.path() / "hard.json", soft = dir.path() / "soft.json";
    std::filesystem::create_hard_link(outside, hard);
    std::filesystem::create_symlink(outside, soft);
    rec.save(hard);
    rec.save(soft);
    check_saved(hard, rec);
    check_saved(soft, rec);
    CHECK(std::filesystem::is_regular_file(std::filesystem::symlink_status(soft)));
    std::ifstream in(outside);
    std::string content;
    in >> content;
    CHECK(content == "keep");
}
