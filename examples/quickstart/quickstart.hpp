// SPDX-License-Identifier: Apache-2.0
// examples/quickstart/quickstart.hpp: what the quickstart programs share and the guide leaves
// out: a scratch directory, a deterministic toy model, and checks that end the program with
// a non-zero status and one line saying what did not hold.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include <spillway/optim/adam.hpp>
#include <spillway/optim/half.hpp>

namespace quickstart {

/// Throws std::runtime_error("<what>") unless `holds`: the programs' own assertions.
inline void expect(bool holds, const std::string& what) {
    if (!holds) throw std::runtime_error("check failed: " + what);
}

/// True when both spans hold the same bits (NaNs and signed zeros included).
inline bool same_bits(std::span<const float> a, std::span<const float> b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

/// Runs `body`, prints "<name>: ok" or the error, and returns the exit status.
template <class Body>
int run_main(const char* name, Body&& body) {
    try {
        body();
        std::printf("%s: ok\n", name);
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: %s\n", name, e.what());
        return 1;
    }
}

/// A directory for one run, removed at exit: "<base>/<name>-<random>", where base is the
/// program's first argument, else $SPILLWAY_TEST_TMPDIR, else the temporary directory.
/// With `shared_name` the directory is "<base>/<name>" exactly, so that the processes of one
/// MPI job started with the same base agree on it; it is then not removed.
class scratch_dir {
public:
    enum class naming { unique, shared_name };

    scratch_dir(int argc, char** argv, const std::string& name, naming mode = naming::unique) {
        namespace fs = std::filesystem;
        const char* env = std::getenv("SPILLWAY_TEST_TMPDIR");
        fs::path base = argc > 1 ? fs::path(argv[1]) : env && *env ? fs::path(env) : fs::temp_directory_path();
        path_ = base / name;
        owned_ = mode == naming::unique;
        if (owned_) path_ += "-" + std::to_string(std::random_device{}());
        fs::create_directories(path_);
    }
    scratch_dir(const scratch_dir&) = delete;
    scratch_dir& operator=(const scratch_dir&) = delete;
    ~scratch_dir() {
        std::error_code ec;
        if (owned_) std::filesystem::remove_all(path_, ec);
    }
    [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

private:
    std::filesystem::path path_;
    bool owned_ = true;
};

/// A value in [-1, 1) that depends only on (seed, i): the same on every machine and rank.
inline float uniform(std::uint64_t seed, std::uint64_t i) {
    std::uint64_t z = seed * 0x9e3779b97f4a7c15ull + i + 1;  // splitmix64
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return static_cast<float>(static_cast<double>(z >> 40) / static_cast<double>(1ull << 23) - 1.0);
}

/// Least squares on random data: rows x_b (params wide) and targets y_b; the loss is
/// sum_b (x_b . w - y_b)^2 / (2 rows) and its gradient sum_b x_b (x_b . w - y_b) / rows.
/// Stands in for a trainer's model: its gradients depend on the parameters, so two
/// optimizers give the same losses only if they give the same parameters.
class linear_model {
public:
    linear_model(std::size_t params, std::size_t rows, std::uint64_t seed)
        : params_(params), rows_(rows), x_(params * rows), y_(rows) {
        for (std::size_t i = 0; i < x_.size(); ++i) x_[i] = uniform(seed, i) / std::sqrt(static_cast<float>(params));
        for (std::size_t b = 0; b < rows; ++b) y_[b] = uniform(seed + 1, b);
    }
    [[nodiscard]] std::size_t param_count() const noexcept { return params_; }
    [[nodiscard]] std::size_t rows() const noexcept { return rows_; }

    /// Initial parameters (small random values).
    [[nodiscard]] std::vector<float> initial_params(std::uint64_t seed) const {
        std::vector<float> w(params_);
        for (std::size_t i = 0; i < params_; ++i) w[i] = 0.01f * uniform(seed, i);
        return w;
    }
    [[nodiscard]] double loss(std::span<const float> w) const {
        double total = 0;
        for (std::size_t b = 0; b < rows_; ++b) {
            double r = residual(w, b);
            total += r * r;
        }
        return total / (2.0 * static_cast<double>(rows_));
    }
    /// The gradient contributed by rows [first, last) (a rank's slice of the batch); the sum
    /// over all slices is the full gradient. `grad` is overwritten.
    void gradient(std::span<const float> w, std::size_t first, std::size_t last, std::span<float> grad) const {
        std::fill(grad.begin(), grad.end(), 0.0f);
        for (std::size_t b = first; b < last; ++b) {
            const float r = static_cast<float>(residual(w, b)) / static_cast<float>(rows_);
            const float* x = &x_[b * params_];
            for (std::size_t i = 0; i < params_; ++i) grad[i] += x[i] * r;
        }
    }
    void gradient(std::span<const float> w, std::span<float> grad) const { gradient(w, 0, rows_, grad); }

private:
    [[nodiscard]] double residual(std::span<const float> w, std::size_t b) const {
        const float* x = &x_[b * params_];
        double dot = 0;
        for (std::size_t i = 0; i < params_; ++i) dot += static_cast<double>(x[i]) * w[i];
        return dot - y_[b];
    }

    std::size_t params_, rows_;
    std::vector<float> x_, y_;
};

/// The trainer before Spillway: `steps` AdamW steps over arrays held in memory, from
/// `params`, with bf16 gradients; gradient(params, grad) is the backward pass. The reference
/// the offloaded runs must match bit for bit.
template <class Gradient>
std::vector<float> train_in_memory(std::vector<float> params, const spillway::adamw_config& adam, int steps,
                                   Gradient&& gradient) {
    std::vector<float> m(params.size()), v(params.size()), grad(params.size());
    std::vector<spillway::bfloat16> grad_bf16(params.size());
    for (int step = 1; step <= steps; ++step) {
        gradient(std::span<const float>(params), std::span<float>(grad));
        spillway::narrow(grad, grad_bf16);
        spillway::adamw_step(adam, {.step = step}, std::span(params), std::span(m), std::span(v),
                             std::span<const spillway::bfloat16>(grad_bf16));
    }
    return params;
}

}  // namespace quickstart
