// SPDX-License-Identifier: Apache-2.0
// examples/quickstart/multi_node.cpp: step 4 of docs/integration.md. Several processes (MPI
// ranks, on one node or many) train one model data-parallel; each rank owns a shard of whole
// optimizer subgroups and keeps its state on a virtual tier over two paths: a node-local
// directory and a shared parallel file system (emulated here by a throttled directory).
// Ranks of a node take turns on each path under node_lock. Every rank also runs AdamW in
// memory on the whole model as a reference; the program exits non-zero (MPI_Abort under
// mpirun) unless the gathered shards have the reference's bits on every rank.
//
// Usage: mpirun -np 2 multi_node [SCRATCH_DIR]   (or multi_node [SCRATCH_DIR]: one process)
#include <algorithm>
#include <cstdio>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <spillway/schedule/shard_range.hpp>
#include <spillway/spillway.hpp>

#if QUICKSTART_HAVE_MPI
#include <mpi.h>
#endif

#include "quickstart.hpp"

using quickstart::expect;

namespace {

constexpr int steps = 4;
const spillway::adamw_config adam{.lr = 1e-2f, .weight_decay = 0.01f};

/// This process's place in the job: MPI's world, or a world of one when built without MPI.
struct job {
    int rank = 0;
    int size = 1;
};

job start_job(int* argc, char*** argv) {
    job j;
#if QUICKSTART_HAVE_MPI
    MPI_Init(argc, argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &j.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &j.size);
#else
    (void)argc;
    (void)argv;
#endif
    return j;
}

/// Every rank gets the element-wise sum of `data` over the ranks.
void allreduce_sum(std::span<float> data) {
#if QUICKSTART_HAVE_MPI
    MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(data.size()), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
#else
    (void)data;
#endif
}

/// Rank r contributes data[offsets[r], offsets[r + 1]); every rank receives all of it.
void allgather(std::span<float> data, const std::vector<int>& offsets) {
#if QUICKSTART_HAVE_MPI
    std::vector<int> counts(offsets.size() - 1);
    for (std::size_t r = 0; r < counts.size(); ++r) counts[r] = offsets[r + 1] - offsets[r];
    MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data.data(), counts.data(), offsets.data(),
                   MPI_FLOAT, MPI_COMM_WORLD);
#else
    (void)data;
    (void)offsets;
#endif
}

/// Ends the job: MPI_Finalize, or MPI_Abort after an error (the other ranks may be waiting
/// in a collective).
int end_job(int status) {
#if QUICKSTART_HAVE_MPI
    if (status != 0) MPI_Abort(MPI_COMM_WORLD, status);
    MPI_Finalize();
#endif
    return status;
}

}  // namespace

int main(int argc, char** argv) {
    const job world = start_job(&argc, &argv);
    const int rank = world.rank, size = world.size;
    const int status = quickstart::run_main("multi_node", [&] {
        quickstart::scratch_dir scratch(argc, argv, "multi_node",
                                        quickstart::scratch_dir::naming::shared_name);
        const std::filesystem::path local_root = scratch.path() / "local";  // e.g. /local/nvme0
        const std::filesystem::path shared_root =
            scratch.path() / "shared";  // e.g. /lustre/project
        const quickstart::linear_model model(std::size_t{1} << 17, 8, 5);
        const std::size_t n = model.param_count();
        std::vector<float> params = model.initial_params(1);

        // [step-4-shard-begin]
        const std::size_t subgroup = 8192;
        auto shard = [&](int r) {
            return spillway::shard_range(n, r, size, subgroup);
        };  // whole subgroups
        const std::size_t first = shard(rank).begin, count = shard(rank).size();
        // [step-4-shard-end]
        std::vector<int> offsets;
        for (int r = 0; r < size; ++r) offsets.push_back(static_cast<int>(shard(r).begin));
        offsets.push_back(static_cast<int>(n));

        // [step-4-tier-begin]
        using local_path = spillway::file_tier<>;  // node-local NVMe
        using shared_path =
            spillway::throttled_tier<spillway::file_tier<>>;  // parallel file system
        using tier_type = spillway::virtual_tier<spillway::node_lock, local_path, shared_path>;

        // This rank's own folder on each path (a killed rank's is removed by the next run),
        // and each path's lock name: the same on every rank that uses the path.
        const std::filesystem::path paths[] = {local_root, shared_root};
        const auto folders = spillway::path_folders::create(paths, "optimizer", "trainer-");
        const std::string mine = "rank-" + std::to_string(rank);  // this rank's keys

        spillway::virtual_tier_options tier_options;
        tier_options.name = "optimizer";
        tier_options.lock_names = folders.lock_names();
        tier_options.locks.directory = local_root;  // node-local, shared by the node's ranks
        const auto pfs_share =
            spillway::throttle_config::joint({.bytes_per_second = 200e6});  // this rank's cap
        tier_type tier(
            tier_options,
            spillway::child_args(folders.folder(0), spillway::file_tier_options{.name = "local"}),
            spillway::child_args(pfs_share, std::in_place, folders.folder(1),
                                 spillway::file_tier_options{.name = "pfs"}));
        // [step-4-tier-end]

        // [step-4-pipeline-begin]
        spillway::pipeline_config config;
        config.param_count = count;  // this rank's shard
        config.subgroup_size = subgroup;
        config.host_buffers = 6;
        config.adam = adam;
        spillway::pipeline_options pipeline_options;
        pipeline_options.key_prefix = mine;
        spillway::update_pipeline<tier_type, spillway::bfloat16, float> pipeline(
            tier, config, std::span(params).subspan(first, count), pipeline_options);
        // [step-4-pipeline-end]

        // The data-parallel split of the batch: rank r takes rows [r B / P, (r + 1) B / P).
        const std::size_t rows_first = model.rows() * rank / size,
                          rows_last = model.rows() * (rank + 1) / size;
        auto backward = [&](std::span<const float> w, std::span<float> grad) {
            model.gradient(w, rows_first, rows_last, grad);  // this rank's rows of the batch
            allreduce_sum(grad);                             // the gradients of the whole batch
        };
        std::vector<float> grad(n);
        std::vector<spillway::bfloat16> grad_bf16(n);
        for (int step = 1; step <= steps; ++step) {
            // [step-4-loop-begin]
            backward(params, grad);  // every rank gets the gradients of the whole batch
            spillway::narrow(grad, grad_bf16);
            pipeline.update(std::span(grad_bf16).subspan(first, count),
                            std::span(params).subspan(first, count));
            allgather(params, offsets);  // every rank gets every updated shard
            // [step-4-loop-end]
        }

        // [step-4-report-begin]
        for (const spillway::child_report& c : tier.report())
            std::printf("rank %d, path %zu (%s): %zu keys, wrote %llu KiB, %s\n", rank, c.index,
                        c.name.c_str(), c.keys,
                        static_cast<unsigned long long>(c.moved.bytes_written >> 10),
                        c.health == spillway::child_health::healthy ? "healthy" : c.fault.c_str());
        // [step-4-report-end]

        const std::vector<float> expected =
            quickstart::train_in_memory(model.initial_params(1), adam, steps, backward);
        expect(quickstart::same_bits(params, expected),
               "rank " + std::to_string(rank) + " of " + std::to_string(size) +
                   ": the sharded, offloaded optimizer gives the same parameter bits as AdamW in "
                   "memory");
        expect(model.loss(params) < model.loss(model.initial_params(1)), "the loss falls");
    });
    return end_job(status);
}
