// spillway/spillway.hpp: the umbrella header; includes every public host header.
// CUDA pieces (spillway/cuda/) are included separately by code compiled with nvcc.
#pragma once

#include "spillway/config.hpp"
#include "spillway/error.hpp"
#include "spillway/io/aligned_buffer.hpp"
#include "spillway/io/completion.hpp"
#include "spillway/io/io_engine.hpp"
#include "spillway/io/posix_engine.hpp"
#include "spillway/io/uring_engine.hpp"
#include "spillway/lock/lock_policy.hpp"
#include "spillway/lock/node_lock.hpp"
#include "spillway/optim/adam.hpp"
#include "spillway/optim/adam_formula.hpp"
#include "spillway/optim/half.hpp"
#include "spillway/tier/faulty_tier.hpp"
#include "spillway/tier/file_tier.hpp"
#include "spillway/tier/host_tier.hpp"
#include "spillway/tier/storage_tier.hpp"
#include "spillway/tier/throttled_tier.hpp"
#include "spillway/tier/tier_stats.hpp"
