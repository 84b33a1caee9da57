// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/optimizer.cpp: the in-memory AdamW back end and the shared helpers.
#include "optimizer.hpp"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <system_error>

#include "llmc_format.hpp"
#include "spillway/optim/adam.hpp"

namespace mini_gpt {

const char* dtype_name(grad_dtype d) noexcept {
    switch (d) {
        case grad_dtype::fp32:
            return "fp32";
        case grad_dtype::bf16:
            return "bf16";
        case grad_dtype::fp16:
            return "fp16";
    }
    return "?";
}

namespace {

constexpr std::uint64_t moments_magic = 0x4d475054'4d4f4d31ull;  // "MGPTMOM1"

}  // namespace

void write_moments(const std::filesystem::path& path, std::span<const float> m,
                   std::span<const float> v) {
    std::uint64_t head[2] = {moments_magic, m.size()};
    std::vector<std::byte> b(sizeof head + m.size_bytes() + v.size_bytes());
    std::memcpy(b.data(), head, sizeof head);
    std::memcpy(b.data() + sizeof head, m.data(), m.size_bytes());
    std::memcpy(b.data() + sizeof head + m.size_bytes(), v.data(), v.size_bytes());
    write_file_atomic(path, b);
}

void read_moments(const std::filesystem::path& path, std::span<float> m, std::span<float> v) {
    auto b = read_file(path);
    std::uint64_t head[2] = {0, 0};
    if (b.size() >= sizeof head) std::memcpy(head, b.data(), sizeof head);
    if (head[0] != moments_magic)
        throw input_error(path.string() + ": bad magic (not a mini_gpt moments file)");
    if (head[1] != m.size())
        throw input_error(path.string() + ": holds moments of " + std::to_string(head[1]) +
                          " parameters, the model has " + std::to_string(m.size()));
    if (b.size() != sizeof head + m.size_bytes() + v.size_bytes())
        throw input_error(path.string() + ": truncated moments file (" + std::to_string(b.size()) +
                          " bytes)");
    std::memcpy(m.data(), b.data() + sizeof head, m.size_bytes());
    std::memcpy(v.data(), b.data() + sizeof head + m.size_bytes(), v.size_bytes());
}

namespace {

class memory_optimizer final : public optimizer {
public:
    memory_optimizer(const optimizer_settings& s, std::size_t count)
        : s_(s), m_(count, 0.0f), v_(count, 0.0f) {}

    void init(std::span<float>) override {
        std::fill(m_.begin(), m_.end(), 0.0f);
        std::fill(v_.begin(), v_.end(), 0.0f);
    }
    void load(const std::filesystem::path& dir, std::span<float>) override {
        auto file = dir / "moments.bin";
        std::error_code ec;
        if (!std::filesystem::exists(std::filesystem::symlink_status(file, ec)))
            throw input_error(
                file.string() + ": missing" +
                (std::filesystem::exists(std::filesystem::symlink_status(dir / "optimizer", ec))
                     ? " (this save was made with --offload optimizer|all; resume with the same "
                       "mode)"
                     : ""));
        read_moments(file, m_, v_);
    }
    double check(float grad_scale, const grad_span& grads) override {
        return std::visit(
            [&](auto g) { return spillway::grad_sum_squares(g, grad_scale, s_.pool); }, grads);
    }
    void step(std::int64_t t, const spillway::step_hparams& h, float grad_scale,
              const grad_span& grads, std::span<float> params) override {
        const spillway::adamw_config cfg = spillway::with_step(
            {s_.adam.lr, s_.adam.beta1, s_.adam.beta2, s_.adam.eps, s_.adam.weight_decay}, h);
        spillway::adamw_step_args args;
        args.step = t;
        args.grad_scale = grad_scale;
        // The trainer checked these gradients for inf/NaN before the step (check()).
        args.check = spillway::grad_check::caller_verified;
        std::visit(
            [&](auto g) {
                using G = typename decltype(g)::element_type;
                spillway::adamw_step<std::remove_const_t<G>>(cfg, args, params, m_, v_, g, {},
                                                             s_.pool);
            },
            grads);
    }
    void save(const std::filesystem::path& dir) override {
        write_moments(dir / "moments.bin", m_, v_);
    }

private:
    optimizer_settings s_;
    std::vector<float> m_, v_;
};

}  // namespace

std::unique_ptr<optimizer> make_memory_optimizer(const optimizer_settings& s, std::size_t count) {
    return std::make_unique<memory_optimizer>(s, count);
}

}  // namespace mini_gpt
