// bench/support/fio.hpp: runs fio (Debian package `fio`) as the file-system limit that the
// benchmarks compare themselves against in the same run.
//
// Guarantees: run_fio() never throws for a failed or missing fio; it returns a result whose
// ok() is false (and the benchmark then reports no vs_limit, saying why). Bandwidths are
// fio's own `bw_bytes` of job 0, summed over its read and write sides separately.
//
// Memory: fio's I/O buffers come from malloc, so they are base pages, physically scattered
// 4 KiB pages. On a virtual disk that caps a request's segments, that alone can cut fio's
// bandwidth 3-4x (fio rw=rw 1 MiB qd32 moved 0.67 GB/s from base pages and 2.6 GB/s from huge
// pages, a minute apart, on the development machine). fio_memory::huge_pages runs fio with
// glibc's malloc tunable glibc.malloc.hugetlb=1, under which malloc madvise()s its chunks for
// transparent huge pages: the memory aligned_buffer gives large buffers by default. Compare
// like with like: a benchmark's buffers and its fio job use the same kind of pages.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

namespace spillway::bench {

struct fio_result {
    double read_bytes_per_second = -1;   // < 0: fio did not report reads
    double write_bytes_per_second = -1;  // < 0: fio did not report writes
    int status = -1;                     // fio's exit status (pclose)
    [[nodiscard]] bool ok() const noexcept { return status == 0; }
};

inline bool fio_available() {
    static const bool available = std::system("fio --version >/dev/null 2>&1") == 0;
    return available;
}

/// The pages of fio's I/O buffers (see the file comment).
enum class fio_memory {
    base_pages,  ///< fio's default: malloc'd base pages
    huge_pages,  ///< transparent huge pages, through glibc.malloc.hugetlb=1
};

/// Runs `fio --output-format=json <arguments>` with its buffers in `memory` and reads the
/// bandwidths of its first job.
inline fio_result run_fio(const std::string& arguments, fio_memory memory = fio_memory::base_pages) {
    fio_result result;
    if (!fio_available()) return result;
    std::string out;
    std::string cmd = std::string(memory == fio_memory::huge_pages ? "GLIBC_TUNABLES=glibc.malloc.hugetlb=1 " : "") +
                      "fio --output-format=json " + arguments + " 2>/dev/null";
    if (FILE* pipe = ::popen(cmd.c_str(), "r")) {
        char buf[4096];
        std::size_t n;
        while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
        result.status = ::pclose(pipe);
    }
    auto first_brace = out.find('{');
    if (!result.ok() || first_brace == std::string::npos) {
        result.status = result.ok() ? -1 : result.status;
        return result;
    }
    auto doc = nlohmann::json::parse(out.begin() + static_cast<std::ptrdiff_t>(first_brace), out.end(), nullptr,
                                     /*allow_exceptions=*/false);
    if (doc.is_discarded() || !doc.contains("jobs") || doc["jobs"].empty()) {
        result.status = -1;
        return result;
    }
    const auto& job = doc["jobs"][0];
    auto bandwidth = [&](const char* side) {
        return job.contains(side) ? job[side].value("bw_bytes", -1.0) : -1.0;
    };
    result.read_bytes_per_second = bandwidth("read");
    result.write_bytes_per_second = bandwidth("write");
    return result;
}

}  // namespace spillway::bench
