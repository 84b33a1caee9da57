// SPDX-License-Identifier: Apache-2.0
// tests/trace/json_string_test.cpp: text as a JSON string, for any bytes.
#include <doctest/doctest.h>

#include <string>

#include <spillway/trace/json_string.hpp>

using spillway::json_string;

TEST_CASE("json_string escapes quotes, backslashes and control bytes") {
    CHECK(json_string("plain /mnt/nvme") == "\"plain /mnt/nvme\"");
    CHECK(json_string("a\"b\\c") == "\"a\\\"b\\\\c\"");
    CHECK(json_string("t\tn\nr\r") == "\"t\\tn\\nr\\r\"");
    CHECK(json_string(std::string("\x01\x1f", 2)) == "\"\\u0001\\u001f\"");
    CHECK(json_string(std::string("a\0b", 3)) == "\"a\\u0000b\"");
}

TEST_CASE("json_string keeps valid UTF-8 and writes each invalid byte as U+FFFD") {
    CHECK(json_string("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80") ==
          "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"");
    CHECK(json_string("\xff") == "\"\\ufffd\"");                        // never a UTF-8 byte
    CHECK(json_string("\x80x") == "\"\\ufffdx\"");                      // a stray continuation byte
    CHECK(json_string("\xc3") == "\"\\ufffd\"");                        // truncated at the end
    CHECK(json_string("\xc0\xaf") == "\"\\ufffd\\ufffd\"");             // overlong '/'
    CHECK(json_string("\xed\xa0\x80") == "\"\\ufffd\\ufffd\\ufffd\"");  // a surrogate
    CHECK(json_string("\xf4\x90\x80\x80") == "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");  // > U+10FFFF
}
