// SPDX-License-Identifier: Apache-2.0
// bench/support/fio.hpp: runs fio (Debian package `fio`) as the file-system limit that the
// benchmarks compare themselves against in the same run.
//
// Guarantees: run_fio() never throws for a failed or missing fio; it returns a result whose
// ok() is false (and the benchmark then reports no vs_limit, saying why). Bandwidths are
// fio's own `bw_bytes` of job 0, summed over its read and write sides separately.
// background_fio runs a fio job beside something else (a load, not a limit: what the
// machine charges a computation for I/O it does not do itself), with the same guarantees:
// stop() interrupts it (SIGINT, after which fio reports what it moved) and returns its
// result; the destructor stops a job still running, so no fio outlives its benchmark.
//
// Memory: fio's I/O buffers come from malloc, so they are base pages, physically scattered
// 4 KiB pages. On a virtual disk that caps a request's segments, that alone can cut fio's
// bandwidth several times (docs/benchmarks.md shows both). fio_memory::huge_pages runs fio with
// glibc's malloc tunable glibc.malloc.hugetlb=1, under which malloc madvise()s its chunks for
// transparent huge pages: the memory aligned_buffer gives large buffers by default. Compare
// like with like: a benchmark's buffers and its fio job use the same kind of pages.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

namespace spillway::bench {

struct fio_result {
    double read_bytes_per_second = -1;   // < 0: fio did not report reads
    double write_bytes_per_second = -1;  // < 0: fio did not report writes
    int status = -1;                     // fio's exit status (pclose)
    [[nodiscard]] bool ok() const noexcept { return status == 0; }
};

/// `s` as one word for /bin/sh.
inline std::string shell_quote(const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

namespace detail {
/// Reads the bandwidths of job 0 from fio's JSON output `out` into `result` (status -1 when
/// the output holds no job).
inline fio_result parse_fio_json(const std::string& out, fio_result result) {
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
}  // namespace detail

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
    return detail::parse_fio_json(out, result);
}

/// A fio job running in the background (see the file comment). `arguments` as for run_fio()
/// (a time-based job with a long --runtime: stop() ends it); its JSON goes to a file in
/// `output_dir`.
class background_fio {
public:
    background_fio(const std::string& arguments, const std::filesystem::path& output_dir,
                   fio_memory memory = fio_memory::base_pages)
        : output_(output_dir / ("fio-background-" + std::to_string(::getpid()) + ".json")) {
        if (!fio_available()) return;
        std::string cmd = std::string(memory == fio_memory::huge_pages ? "GLIBC_TUNABLES=glibc.malloc.hugetlb=1 " : "") +
                          "exec fio --output-format=json --output=" + shell_quote(output_.string()) + " " + arguments +
                          " >/dev/null 2>&1";
        pid_ = ::fork();
        if (pid_ == 0) {
            ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
            ::_exit(127);
        }
    }
    background_fio(const background_fio&) = delete;
    background_fio& operator=(const background_fio&) = delete;
    ~background_fio() { stop(); }

    /// Interrupts the job and returns what it moved (status -1 when it could not run).
    fio_result stop() {
        fio_result result;
        if (pid_ <= 0) return result;
        ::kill(pid_, SIGINT);
        int status = 0;
        while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
        }
        pid_ = -1;
        std::ifstream in(output_);
        std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        std::error_code ec;
        std::filesystem::remove(output_, ec);
        // Interrupted, fio still reports; its exit status then is not the job's verdict.
        result.status = WIFEXITED(status) && WEXITSTATUS(status) != 127 ? 0 : -1;
        return detail::parse_fio_json(out, result);
    }

private:
    std::filesystem::path output_;
    pid_t pid_ = -1;
};

}  // namespace spillway::bench
