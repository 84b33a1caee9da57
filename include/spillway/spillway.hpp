// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/spillway.hpp: the umbrella header; includes every public host header.
/// CUDA pieces (spillway/cuda/) are included separately by code compiled with nvcc.
///
/// Including one header of a piece is enough for that piece (each header compiles on its
/// own); this one is for code that uses many.
#pragma once

#include "spillway/config.hpp"
#include "spillway/error.hpp"
#include "spillway/human_bytes.hpp"
#include "spillway/io/aligned_buffer.hpp"
#include "spillway/io/buffer_arena.hpp"
#include "spillway/io/completion.hpp"
#include "spillway/io/durable_file.hpp"
#include "spillway/io/io_engine.hpp"
#include "spillway/io/posix_engine.hpp"
#include "spillway/io/uring_engine.hpp"
#include "spillway/lock/lock_name.hpp"
#include "spillway/lock/lock_policy.hpp"
#include "spillway/lock/node_lock.hpp"
#include "spillway/lock/owned_directory.hpp"
#include "spillway/optim/adam.hpp"
#include "spillway/optim/adam_formula.hpp"
#include "spillway/optim/step_hparams.hpp"
#include "spillway/optim/half.hpp"
#include "spillway/optim/pipeline_config.hpp"
#include "spillway/optim/update_pipeline.hpp"
#include "spillway/optim/update_stats.hpp"
#include "spillway/plan/memory_plan.hpp"
#include "spillway/plan/process_baseline.hpp"
#include "spillway/schedule/alternating_order.hpp"
#include "spillway/schedule/lr_schedule.hpp"
#include "spillway/schedule/shard_range.hpp"
#include "spillway/stash/activation_stash.hpp"
#include "spillway/stash/layer_stash.hpp"
#include "spillway/stash/layer_tensor.hpp"
#include "spillway/stash/split_rule.hpp"
#include "spillway/stash/stash_budget.hpp"
#include "spillway/stash/stash_handle.hpp"
#include "spillway/stash/stash_options.hpp"
#include "spillway/stash/tensor_desc.hpp"
#include "spillway/stream/layer_optimizer.hpp"
#include "spillway/stream/layer_optimizer_plan.hpp"
#include "spillway/stream/layer_optimizer_options.hpp"
#include "spillway/stream/layer_view.hpp"
#include "spillway/stream/tensor_layout.hpp"
#include "spillway/stream/param_stream.hpp"
#include "spillway/stream/param_stream_options.hpp"
#include "spillway/thread_pool.hpp"
#include "spillway/tier/bandwidth_estimate.hpp"
#include "spillway/tier/bandwidth_split.hpp"
#include "spillway/tier/faulty_tier.hpp"
#include "spillway/tier/file_tier.hpp"
#include "spillway/tier/file_tier_options.hpp"
#include "spillway/tier/host_tier.hpp"
#include "spillway/tier/path_folders.hpp"
#include "spillway/tier/storage_tier.hpp"
#include "spillway/tier/throttled_tier.hpp"
#include "spillway/tier/tier_stats.hpp"
#include "spillway/tier/virtual_tier.hpp"
#include "spillway/tier/virtual_tier_options.hpp"
#include "spillway/trace/json_string.hpp"
#include "spillway/trace/recorder.hpp"

/// @namespace spillway
/// Everything public in Spillway, by layer (each layer knows only the ones below it):
/// - storage: the storage_tier concept and its models (host_tier, file_tier, the
///   throttled_tier and faulty_tier decorators, virtual_tier over several paths), with
///   lock policies (null_lock, thread_lock, node_lock) guarding each path;
/// - I/O: io_completion handles, aligned_buffer, the io_uring and POSIX engines;
/// - the optimizer: the mixed-precision AdamW step (adamw_step), the alternating subgroup
///   order and the update pipeline;
/// - activations: the activation stash, and the budget it needs (stash_budget.hpp);
/// - planning: one memory budget split into fixed parts and stream windows (plan/).
///
/// Names in a nested `detail` namespace are internals, not part of the API.

/// @namespace spillway::cuda
/// The CUDA pieces (spillway/cuda/), compiled only by nvcc with the `spillway::cuda` target.
