// A consumer's program: stores a blob in a host tier and reads it back.
#include <spillway/spillway.hpp>

#include <cstdio>
#include <string_view>
#include <vector>

int main() {
    spillway::host_tier tier;
    std::string_view text = "hello from a consumer";
    auto bytes = std::as_bytes(std::span(text.data(), text.size()));
    tier.write("greeting", bytes).wait();
    std::vector<std::byte> back(bytes.size());
    tier.read("greeting", back).wait();
    bool same = std::equal(back.begin(), back.end(), bytes.begin());
    std::printf("spillway %s consumer: round trip %s\n", SPILLWAY_VERSION_STRING, same ? "ok" : "FAILED");
    return same ? 0 : 1;
}
