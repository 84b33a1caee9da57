// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/optim/step_hparams.hpp: the AdamW hyper-parameters a trainer may change from one
/// step to the next (a learning-rate schedule's output), passed with each step by the update
/// pipeline and the streamed optimizer.
///
/// What it guarantees: with_step(config, h) is config with lr and weight_decay replaced by h's,
/// so a step given step_hparams{config.lr, config.weight_decay} computes exactly what a step
/// given config alone computes (the same floats reach adamw_step).
#pragma once

#include "spillway/optim/adam.hpp"

namespace spillway {

/// The per-step hyper-parameters: the learning rate and the decoupled weight decay of this
/// step (validated as adamw_config's: finite and >= 0).
struct step_hparams {
    float lr = 1e-3f;            ///< this step's learning rate
    float weight_decay = 0.0f;  ///< this step's decoupled weight decay
};

/// `config` with this step's lr and weight decay.
[[nodiscard]] inline adamw_config with_step(adamw_config config, const step_hparams& h) noexcept {
    config.lr = h.lr;
    config.weight_decay = h.weight_decay;
    return config;
}

/// The hyper-parameters `config` itself names (for a constant schedule).
[[nodiscard]] inline step_hparams hparams_of(const adamw_config& config) noexcept {
    return {config.lr, config.weight_decay};
}

}  // namespace spillway
