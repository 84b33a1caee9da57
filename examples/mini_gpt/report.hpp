// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/report.hpp: what a run prints: the header line, one progress line (or,
// with --json, one JSON object) per step, and the summary table; and the per-step
// measurements a benchmark asks for (run_report).
#pragma once

#include <chrono>
#include <cstddef>
#include <iosfwd>
#include <string>
#include <vector>

#include "gpt2.hpp"
#include "step.hpp"
#include "streamed_params.hpp"
#include "trainer.hpp"

namespace mini_gpt {

/// Prints a run's lines to `out` (rank 0's stream) and fills `report` (may be null).
class run_printer {
public:
    /// `all_kept_bytes`: activations if every layer were kept in memory (it reads the model's
    /// own buffers, which the first forward allocates, so it is asked each time).
    run_printer(const options& opt, std::ostream& out, run_report* report, const gpt2& model,
                std::size_t layer_act_bytes);

    /// --offload params: the names of the streams' paths (--path order), for the per-path
    /// bytes of each step and of the summary.
    void stream_paths(std::vector<std::string> names) { path_names_ = std::move(names); }
    /// The line before the first step (not with --json or --quiet).
    void header(int threads, const std::string& data_name, std::size_t tokens);
    /// One step: the progress line or the JSON object, and the totals.
    void step(const step_result& r);
    /// After the last step: fills the run_report's totals, and prints the summary table
    /// (not with --json) with the store's and the optimizer's reports.
    /// With --offload params, `streamed` (else null) and the streams' planned windows.
    void summary(const step_runner& steps, const activation_store& store, const optimizer& optim,
                 const streamed_params* streamed = nullptr, std::size_t param_window = 0,
                 std::size_t state_window = 0);

private:
    [[nodiscard]] std::size_t all_kept_bytes() const;

    const options& opt_;
    std::ostream& out_;
    run_report* report_;
    const gpt2& model_;
    std::size_t layer_act_bytes_;
    double flops_tok_;
    struct totals_t {
        double fwd = 0, bwd = 0, upd = 0, io = 0, total = 0, param_wait = 0;
        std::size_t act_peak = 0;        // after the first step (the stash profiles on it)
        std::size_t act_peak_first = 0;  // the first step
        int steps = 0, skipped = 0;
        stream_traffic traffic;  // --offload params: the streams' bytes over every step (per
                                 // path: with the activations' on the first path)
        activation_store::io_bytes act_traffic;  // and the activation stash's
    } totals_;
    float first_loss_, last_loss_;
    std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
    int lines_ = 0;  // progress lines printed: the mean step time behind the estimate
    std::vector<std::string> path_names_;  // stream_paths()
};

}  // namespace mini_gpt
