// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/dist.hpp: the few collectives data-parallel training needs, over MPI when
// the build has it and the process was started by mpirun, and trivial otherwise.
//
// Data parallelism in mini_gpt, step by step (P ranks, global batch B):
//  1. rank r takes rows [r*B/P, (r+1)*B/P) of every batch;
//  2. backward scales its loss by (its rows / B), so the gradients summed over ranks
//     (allreduce_sum) are the gradients of the global mean loss;
//  3. the optimizer subgroups are split into P contiguous shards; rank r runs AdamW (in
//     memory or through the update pipeline on the shared paths, under node_lock) only for its
//     shard (ZeRO stage 1/2 style: each rank stores 1/P of the optimizer state);
//  4. allgather_params gives every rank the updated parameters of every shard.
// Without MPI (or without mpirun) the world has one rank and every collective is a no-op.
// Every collective except allreduce_sum(double) first waits for all ranks asleep (dist.cpp,
// arrive_quietly), so a rank that arrives early leaves its core to the others.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace mini_gpt {

class dist {
public:
    /// Initialises MPI when built with it and started by mpirun (argc/argv may be modified);
    /// otherwise a world of one. Call once, in main().
    static void init(int* argc, char*** argv);
    /// Finalises MPI if init() started it.
    static void finalize();
    /// Aborts every rank (after an error on one of them).
    [[noreturn]] static void abort(int status);

    [[nodiscard]] static int rank() noexcept;
    [[nodiscard]] static int size() noexcept;
    /// Ranks of this world on this node (for a default thread count).
    [[nodiscard]] static int local_size() noexcept;

    /// In place: every rank gets the element-wise sum, with the same bits on every rank.
    static void allreduce_sum(std::span<float> data);
    static double allreduce_sum(double value);
    /// True on every rank when `value` is true on any rank.
    static bool any(bool value);
    /// True on every rank when every rank passed the same `value`.
    static bool same_everywhere(std::uint64_t value);
    /// Every rank contributes data[offsets[r], offsets[r+1]); all receive all of it.
    static void allgather(std::span<float> data, const std::vector<std::size_t>& offsets);
    static void barrier();
};

}  // namespace mini_gpt
