// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/report.cpp: what a run prints (report.hpp).
#include "report.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <ostream>
#include <sstream>

#include <spillway/trace/json_string.hpp>

#include "blas_kernels.hpp"
#include "dist.hpp"
#include "memory_plan.hpp"

namespace mini_gpt {

namespace {

/// Seconds as "m:ss", or "h:mm:ss" from an hour on.
std::string clock_text(double seconds) {
    const auto total = static_cast<long long>(seconds + 0.5);
    char buf[32];
    if (total >= 3600)
        std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", total / 3600, total / 60 % 60,
                      total % 60);
    else
        std::snprintf(buf, sizeof buf, "%lld:%02lld", total / 60, total % 60);
    return buf;
}

/// A step's bytes per --path: the streams' on each, the activations' on the first.
std::vector<stream_traffic::path_bytes> per_path(const stream_traffic& t,
                                                 const activation_store::io_bytes& act) {
    auto paths = t.paths;
    if (!paths.empty()) {
        paths[0].read += act.read;
        paths[0].written += act.written;
    }
    return paths;
}

}  // namespace

run_printer::run_printer(const options& opt, std::ostream& out, run_report* report,
                         const gpt2& model, std::size_t layer_act_bytes)
    : opt_(opt),
      out_(out),
      report_(report),
      model_(model),
      layer_act_bytes_(layer_act_bytes),
      flops_tok_(flops_per_token(model.config(), opt.seq)),
      first_loss_(NAN),
      last_loss_(NAN) {}

std::size_t run_printer::all_kept_bytes() const {
    return layer_act_bytes_ + model_.fixed_activation_bytes();
}

void run_printer::header(int threads, const std::string& data_name, std::size_t tokens) {
    if (opt_.json || opt_.quiet) return;
    const gpt2_config& config = model_.config();
    out_ << "mini_gpt: L=" << config.num_layers << " C=" << config.channels
         << " NH=" << config.num_heads << " V=" << config.vocab_size << " (padded "
         << config.padded_vocab_size << ") maxT=" << config.max_seq_len << ", "
         << model_.layout().total << " params; B=" << opt_.batch << " T=" << opt_.seq << ", "
         << dist::size() << " rank(s) x " << threads << " threads, grads " << dtype_name(opt_.grads)
         << ", offload " << offload_name(opt_.offload) << ", data " << data_name << " (" << tokens
         << " tokens)\n";
}

void run_printer::step(const step_result& r) {
    if (std::isnan(first_loss_)) first_loss_ = r.loss;
    last_loss_ = r.loss;
    const double BT = static_cast<double>(opt_.batch) * static_cast<double>(opt_.seq);
    const double tok_s = BT / (r.step_ms / 1e3);
    totals_.fwd += r.times.forward_ms;
    totals_.bwd += r.times.backward_ms;
    totals_.upd += r.update_ms;
    totals_.io += r.io_wait_ms;
    totals_.param_wait += r.times.param_wait_ms;
    totals_.total += r.step_ms;
    if (report_) {
        report_->step_ms.push_back(r.step_ms);
        report_->cpu_ms.push_back(r.cpu_ms);
        report_->param_wait_ms.push_back(r.times.param_wait_ms);
        report_->update_deferred.push_back(r.deferred);
        report_->update_under_backward.push_back(r.under_backward);
        report_->forward_ms.push_back(r.times.forward_ms);
        report_->backward_ms.push_back(r.times.backward_ms);
        report_->update_ms.push_back(r.update_ms);
        report_->io_wait_ms.push_back(r.io_wait_ms);
        report_->act_peak_bytes.push_back(r.act_peak);
        if (r.streamed) {
            report_->param_read.push_back(r.traffic.param_read);
            report_->param_written.push_back(r.traffic.param_written);
            report_->state_read.push_back(r.traffic.state_read);
            report_->state_written.push_back(r.traffic.state_written);
            report_->grad_read.push_back(r.traffic.grad_read);
            report_->grad_written.push_back(r.traffic.grad_written);
            std::vector<std::uint64_t> read, written;
            for (const auto& p : per_path(r.traffic, r.act_traffic)) {
                read.push_back(p.read);
                written.push_back(p.written);
            }
            report_->path_read.push_back(std::move(read));
            report_->path_written.push_back(std::move(written));
        }
    }
    if (r.streamed) {
        totals_.traffic.param_read += r.traffic.param_read;
        totals_.traffic.param_written += r.traffic.param_written;
        totals_.traffic.state_read += r.traffic.state_read;
        totals_.traffic.state_written += r.traffic.state_written;
        totals_.traffic.grad_read += r.traffic.grad_read;
        totals_.traffic.grad_written += r.traffic.grad_written;
        const auto paths = per_path(r.traffic, r.act_traffic);
        totals_.traffic.paths.resize(paths.size());
        for (std::size_t i = 0; i < paths.size(); ++i) {
            totals_.traffic.paths[i].read += paths[i].read;
            totals_.traffic.paths[i].written += paths[i].written;
        }
        totals_.act_traffic.read += r.act_traffic.read;
        totals_.act_traffic.written += r.act_traffic.written;
    }
    if (totals_.steps == 0)
        totals_.act_peak_first = r.act_peak;
    else
        totals_.act_peak = std::max(totals_.act_peak, r.act_peak);
    ++totals_.steps;
    if (!r.finite) ++totals_.skipped;
    if (opt_.json) {
        // cpu_ms: this process's CPU time in the step, all threads; act_all_kept_bytes:
        // what keeping every layer's activations would hold (act_peak_bytes' reference);
        // param_wait_ms: forward waiting for the previous step's deferred update (part of
        // forward_ms and io_wait_ms); update_deferred: this step's update runs under the
        // next forward (update_ms is then only the gradient check); update_under_backward:
        // it ran under this step's backward (update_ms is then what was left after it).
        char buf[800];
        std::snprintf(
            buf, sizeof buf,
            "{\"step\":%lld,\"loss\":%.9g,\"ms\":%.3f,\"tokens_per_s\":%.1f,\"act_peak_bytes\":%zu,"
            "\"act_all_kept_bytes\":%zu,\"forward_ms\":%.3f,\"backward_ms\":%.3f,\"update_ms\":%."
            "3f,"
            "\"io_wait_ms\":%.3f,\"param_wait_ms\":%.3f,\"update_deferred\":%s,"
            "\"update_under_backward\":%s,\"comm_ms\":%.3f,"
            "\"cpu_ms\":%.3f,\"loss_scale\":%g,\"skipped\":%s}\n",
            static_cast<long long>(r.step + 1), static_cast<double>(r.loss), r.step_ms, tok_s,
            r.act_peak, all_kept_bytes(), r.times.forward_ms, r.times.backward_ms, r.update_ms,
            r.io_wait_ms, r.times.param_wait_ms, r.deferred ? "true" : "false",
            r.under_backward ? "true" : "false", r.comm_ms, r.cpu_ms,
            static_cast<double>(r.loss_scale), r.finite ? "false" : "true");
        std::string line = buf;
        if (r.streamed) {
            // --offload params: VmHWM beside the budget, the bytes moved to and from the
            // path this step (params, m|v and the activations).
            std::snprintf(buf, sizeof buf,
                          ",\"peak_rss_bytes\":%zu,\"memory_budget\":%zu,\"param_read_bytes\":%llu,"
                          "\"param_written_bytes\":%llu,\"state_read_bytes\":%llu,"
                          "\"state_written_bytes\":%llu,\"grad_read_bytes\":%llu,"
                          "\"grad_written_bytes\":%llu,\"act_read_bytes\":%llu,"
                          "\"act_written_bytes\":%llu}\n",
                          r.peak_rss, opt_.memory_budget,
                          static_cast<unsigned long long>(r.traffic.param_read),
                          static_cast<unsigned long long>(r.traffic.param_written),
                          static_cast<unsigned long long>(r.traffic.state_read),
                          static_cast<unsigned long long>(r.traffic.state_written),
                          static_cast<unsigned long long>(r.traffic.grad_read),
                          static_cast<unsigned long long>(r.traffic.grad_written),
                          static_cast<unsigned long long>(r.act_traffic.read),
                          static_cast<unsigned long long>(r.act_traffic.written));
            // Per --path (in --path order): what the step read from and wrote to it, the
            // streams' layers l mod P on path l and the activations on the first.
            std::string paths = ",\"paths\":[";
            const auto bytes = per_path(r.traffic, r.act_traffic);
            for (std::size_t i = 0; i < bytes.size(); ++i) {
                char part[96];
                std::snprintf(part, sizeof part, ",\"read_bytes\":%llu,\"write_bytes\":%llu}",
                              static_cast<unsigned long long>(bytes[i].read),
                              static_cast<unsigned long long>(bytes[i].written));
                paths += std::string(i > 0 ? "," : "") + "{\"path\":" +
                         spillway::json_string(i < path_names_.size() ? path_names_[i] : "") + part;
            }
            line = line.substr(0, line.size() - 2) + paths + "]" + buf;  // (before "}\n")
        }
        out_ << line << std::flush;
    } else if (!opt_.quiet) {
        // Elapsed wall time since the printer started, and the time left at the mean step
        // time of this run's steps so far.
        ++lines_;
        const double elapsed_s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
        const double left_s = totals_.total / 1e3 / lines_ *
                              static_cast<double>(std::max<long long>(0, opt_.steps - r.step - 1));
        const std::string clock =
            " | " + clock_text(elapsed_s) + " elapsed, " + clock_text(left_s) + " left";
        char buf[320];
        std::snprintf(
            buf, sizeof buf,
            "step %5lld/%d | loss %.4f | %8.0f tok/s | fwd %7.1f bwd %7.1f upd %6.1f io-wait "
            "%6.1f%s ms%s%s\n",
            static_cast<long long>(r.step + 1), opt_.steps, static_cast<double>(r.loss), tok_s,
            r.times.forward_ms, r.times.backward_ms, r.update_ms, r.io_wait_ms,
            dist::size() > 1 ? (" comm " + std::to_string(r.comm_ms).substr(0, 6)).c_str() : "",
            !r.finite          ? " (overflow: step skipped)"
            : r.deferred       ? " (update under the next forward)"
            : r.under_backward ? " (update under backward)"
                               : "",
            clock.c_str());
        out_ << buf << std::flush;
    }
}

void run_printer::summary(const step_runner& steps, const activation_store& store,
                          const optimizer& optim, const streamed_params* streamed,
                          std::size_t param_window, std::size_t state_window) {
    const double BT = static_cast<double>(opt_.batch) * static_cast<double>(opt_.seq);
    const std::size_t peak_rss = peak_rss_bytes();
    if (report_) {
        report_->all_kept_bytes = all_kept_bytes();
        report_->layer_act_bytes = layer_act_bytes_;
        report_->flops_per_step = flops_tok_ * BT;
        report_->params = model_.layout().total;
        if (streamed) {
            report_->memory_budget = opt_.memory_budget;
            report_->peak_rss = peak_rss;
            report_->param_window = param_window;
            report_->state_window = state_window;
            report_->grad_window = streamed->grad_resident_bytes();
            report_->param_peak = streamed->param_stats().peak_resident_bytes;
            report_->state_peak = streamed->state_stats().peak_resident_bytes;
        }
    }
    if (opt_.json || totals_.steps == 0) return;
    const double n = totals_.steps;
    const double tok_s = BT * n / (totals_.total / 1e3);
    out_ << "\nsummary (" << totals_.steps << " steps, " << totals_.skipped << " skipped)\n";
    char buf[256];
    std::snprintf(buf, sizeof buf, "  loss            %.4f -> %.4f (%.1f%% lower)\n",
                  static_cast<double>(first_loss_), static_cast<double>(last_loss_),
                  100.0 * (1.0 - static_cast<double>(last_loss_ / first_loss_)));
    out_ << buf;
    std::snprintf(buf, sizeof buf, "  throughput      %.0f tokens/s, %.2f GFLOP/s (model FLOPs)\n",
                  tok_s, tok_s * flops_tok_ / 1e9);
    out_ << buf;
    out_ << "  matmul          " << blas::describe() << "\n";
    std::snprintf(
        buf, sizeof buf,
        "  ms per step     %.1f total: forward %.1f, backward %.1f, update %.1f, I/O wait %.1f\n",
        totals_.total / n, totals_.fwd / n, totals_.bwd / n, totals_.upd / n, totals_.io / n);
    out_ << buf;
    if (steps.steps_deferred() > 0) {
        std::snprintf(buf, sizeof buf,
                      "  deferred update %d of %d updates ran under the next forward; forward "
                      "waited %.1f ms per "
                      "step for their parameters\n",
                      steps.steps_deferred(), totals_.steps - totals_.skipped,
                      totals_.param_wait / n);
        out_ << buf;
    }
    if (steps.steps_under_backward() > 0) {
        std::snprintf(buf, sizeof buf,
                      "  under backward  %d of %d updates ran under their own backward\n",
                      steps.steps_under_backward(), totals_.steps - totals_.skipped);
        out_ << buf;
    }
    const double all_kept = static_cast<double>(all_kept_bytes());
    const double peak =
        static_cast<double>(totals_.steps > 1 ? totals_.act_peak : totals_.act_peak_first);
    std::snprintf(
        buf, sizeof buf, "  activations     peak resident %s, all layers kept %s (%.0f%% %s)%s\n",
        human_bytes(peak).c_str(), human_bytes(all_kept).c_str(),
        100.0 * std::abs(1.0 - peak / all_kept),
        peak <= all_kept ? "lower"
                         : "higher: buffer alignment and the stash's pool at this tiny size",
        totals_.steps > 1 ? "; after the first step" : "");
    out_ << buf;
    out_ << store.report();
    out_ << optim.report();
    if (streamed) {
        const auto ps = streamed->param_stats(), ss = streamed->state_stats();
        out_ << "  memory          peak RSS (VmHWM) " << human_bytes(static_cast<double>(peak_rss))
             << (opt_.memory_budget > 0
                     ? " of the budget " + human_bytes(static_cast<double>(opt_.memory_budget))
                     : std::string(" (no --memory-budget)"))
             << "; params window " << human_bytes(static_cast<double>(param_window)) << " (peak "
             << human_bytes(static_cast<double>(ps.peak_resident_bytes)) << "), m,v window "
             << human_bytes(static_cast<double>(state_window)) << " (peak "
             << human_bytes(static_cast<double>(ss.peak_resident_bytes)) << ")"
             << (streamed->grad_resident_bytes() > 0
                     ? ", fp16 gradients " +
                           human_bytes(static_cast<double>(streamed->grad_resident_bytes()))
                     : std::string())
             << "\n";
        const auto& t = totals_.traffic;
        out_ << "  path per step   params read "
             << human_bytes(static_cast<double>(t.param_read) / n) << ", written "
             << human_bytes(static_cast<double>(t.param_written) / n) << "; m,v read "
             << human_bytes(static_cast<double>(t.state_read) / n) << ", written "
             << human_bytes(static_cast<double>(t.state_written) / n)
             << (t.grad_read + t.grad_written > 0
                     ? "; fp16 gradients read " +
                           human_bytes(static_cast<double>(t.grad_read) / n) + ", written " +
                           human_bytes(static_cast<double>(t.grad_written) / n)
                     : std::string())
             << "; activations read "
             << human_bytes(static_cast<double>(totals_.act_traffic.read) / n) << ", written "
             << human_bytes(static_cast<double>(totals_.act_traffic.written) / n) << "\n";
        for (std::size_t i = 0; i < t.paths.size(); ++i)
            out_ << (i == 0 ? "  per path        " : "                  ")
                 << (i < path_names_.size() ? path_names_[i] : std::to_string(i)) << ": read "
                 << human_bytes(static_cast<double>(t.paths[i].read) / n) << ", written "
                 << human_bytes(static_cast<double>(t.paths[i].written) / n) << " per step ("
                 << (t.paths.size() > 1
                         ? "layers " + std::to_string(i) + " mod " + std::to_string(t.paths.size())
                         : std::string("every layer"))
                 << (i == 0 ? ", the activations" : "") << ")\n";
        std::snprintf(buf, sizeof buf,
                      "  stream waits    params %.1f ms, m,v %.1f ms per step (acquires that "
                      "found their layer not yet read)\n",
                      ps.wait_seconds * 1e3 / n, ss.wait_seconds * 1e3 / n);
        out_ << buf;
    }
}

}  // namespace mini_gpt
