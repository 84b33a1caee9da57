// SPDX-License-Identifier: Apache-2.0
// examples/mini_gpt/dist.cpp: MPI collectives (MINI_GPT_HAVE_MPI) or a world of one.
#include "dist.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

#if MINI_GPT_HAVE_MPI
#include <mpi.h>
#endif

namespace mini_gpt {

namespace {
[[maybe_unused]] bool mpi_active = false;
int world_rank = 0, world_size = 1, node_size = 1;

#if MINI_GPT_HAVE_MPI
bool started_by_mpirun() {
    for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
        if (std::getenv(v)) return true;
    return false;
}
void check(int rc, const char* call) {
    if (rc != MPI_SUCCESS)
        throw std::runtime_error(std::string(call) + " failed with MPI error " +
                                 std::to_string(rc));
}
#endif
}  // namespace

void dist::init(int* argc, char*** argv) {
#if MINI_GPT_HAVE_MPI
    if (!started_by_mpirun()) return;
    check(MPI_Init(argc, argv), "MPI_Init");
    mpi_active = true;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &local);
    MPI_Comm_size(local, &node_size);
    MPI_Comm_free(&local);
#else
    (void)argc;
    (void)argv;
#endif
}

void dist::finalize() {
#if MINI_GPT_HAVE_MPI
    if (mpi_active) MPI_Finalize();
    mpi_active = false;
#endif
}

void dist::abort(int status) {
#if MINI_GPT_HAVE_MPI
    if (mpi_active) MPI_Abort(MPI_COMM_WORLD, status);
#endif
    std::exit(status);
}

int dist::rank() noexcept {
    return world_rank;
}
int dist::size() noexcept {
    return world_size;
}
int dist::local_size() noexcept {
    return node_size;
}

#if MINI_GPT_HAVE_MPI
namespace {
/// Waits until every rank has reached this point, asleep: Open MPI's blocking calls poll its
/// progress loop on the core for as long as they wait, so a rank that reaches a collective
/// first would take a core from the ranks still computing (and from its own I/O threads) on a
/// node with fewer cores than threads.
///  1. MPI_Ibarrier starts the barrier without blocking;
///  2. MPI_Test checks it; until it completes the thread sleeps, 20 us at first, doubling up
///     to 500 us (the collective that follows starts at most that late).
void arrive_quietly() {
    MPI_Request req;
    check(MPI_Ibarrier(MPI_COMM_WORLD, &req), "MPI_Ibarrier");  // 1.
    std::chrono::microseconds nap{20};
    for (int done = 0;;) {  // 2.
        check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
        if (done) return;
        std::this_thread::sleep_for(nap);
        nap = std::min(nap * 2, std::chrono::microseconds{500});
    }
}

/// Elements one MPI_Sendrecv of the ring moves (16 MiB of floats): bounds the scratch buffer.
constexpr std::size_t ring_segment = std::size_t{1} << 22;

/// Sums `data` over the ranks, in place, on every rank (one piece: data.size() < 2^31):
///  1. Split data into P chunks, chunk c = [P-th part c], sizes differing by at most one.
///  2. Reduce-scatter around the ring: at step s (0..P-2) rank r sends chunk (r-s) mod P to
///     rank r+1 and receives chunk (r-s-1) mod P from rank r-1, in segments of
///     ring_segment elements, adding each received segment into its own copy. After P-1
///     steps rank r holds chunk (r+1) mod P summed over every rank.
///  3. Allgather: rank r contributes chunk (r+1) mod P, and every rank receives every chunk.
/// Each chunk is summed on one rank in a fixed order and then copied, so every rank ends
/// with the same bits, run after run.
void ring_allreduce(std::span<float> data) {
    const auto P = static_cast<std::size_t>(world_size), r = static_cast<std::size_t>(world_rank);
    std::vector<std::size_t> off(P + 1);
    for (std::size_t c = 0; c <= P; ++c) off[c] = data.size() * c / P;  // 1.
    auto chunk = [&](std::size_t c) { return data.subspan(off[c], off[c + 1] - off[c]); };
    static std::vector<float> scratch;  // the trainer's one thread calls the collectives
    scratch.resize(std::min(ring_segment, off[1] + 1));
    const int right = static_cast<int>((r + 1) % P), left = static_cast<int>((r + P - 1) % P);
    for (std::size_t s = 0; s + 1 < P; ++s) {  // 2.
        auto out = chunk((r + P - s) % P);
        auto in = chunk((r + 2 * P - s - 1) % P);
        for (std::size_t k = 0; k < std::max(out.size(), in.size()); k += ring_segment) {
            const std::size_t n_out = out.size() > k ? std::min(ring_segment, out.size() - k) : 0;
            const std::size_t n_in = in.size() > k ? std::min(ring_segment, in.size() - k) : 0;
            check(
                MPI_Sendrecv(out.data() + k, static_cast<int>(n_out), MPI_FLOAT, right,
                             static_cast<int>(s), scratch.data(), static_cast<int>(n_in), MPI_FLOAT,
                             left, static_cast<int>(s), MPI_COMM_WORLD, MPI_STATUS_IGNORE),
                "MPI_Sendrecv");
            float* dst = in.data() + k;
            for (std::size_t i = 0; i < n_in; ++i) dst[i] += scratch[i];
        }
    }
    std::vector<int> counts(P), displs(P);  // 3.
    for (std::size_t q = 0; q < P; ++q) {
        const std::size_t c = (q + 1) % P;
        counts[q] = static_cast<int>(off[c + 1] - off[c]);
        displs[q] = static_cast<int>(off[c]);
    }
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data.data(), counts.data(),
                         displs.data(), MPI_FLOAT, MPI_COMM_WORLD),
          "MPI_Allgatherv");
}
}  // namespace
#endif

void dist::allreduce_sum(std::span<float> data) {
#if MINI_GPT_HAVE_MPI
    if (!mpi_active || world_size == 1) return;
    arrive_quietly();
    // Not MPI_Allreduce: the ring above copies each piece once between the processes and
    // sums it in one vectorised loop, where Open MPI's tuned algorithms are several times
    // slower for large float arrays between the ranks of one node. In pieces of at most 2^30
    // elements (MPI counts are int).
    for (std::size_t off = 0; off < data.size(); off += std::size_t{1} << 30)
        ring_allreduce(
            data.subspan(off, std::min<std::size_t>(data.size() - off, std::size_t{1} << 30)));
#else
    (void)data;
#endif
}

double dist::allreduce_sum(double value) {
#if MINI_GPT_HAVE_MPI
    if (mpi_active && world_size > 1)
        check(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD),
              "MPI_Allreduce");
#endif
    return value;
}

bool dist::any(bool value) {
#if MINI_GPT_HAVE_MPI
    if (mpi_active && world_size > 1) {
        arrive_quietly();
        int v = value ? 1 : 0;
        check(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD),
              "MPI_Allreduce");
        return v != 0;
    }
#endif
    return value;
}

bool dist::same_everywhere(std::uint64_t value) {
#if MINI_GPT_HAVE_MPI
    if (mpi_active && world_size > 1) {
        std::uint64_t lo = value, hi = value;
        check(MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD),
              "MPI_Allreduce");
        check(MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD),
              "MPI_Allreduce");
        return lo == hi;
    }
#endif
    (void)value;
    return true;
}

void dist::allgather(std::span<float> data, const std::vector<std::size_t>& offsets) {
#if MINI_GPT_HAVE_MPI
    if (!mpi_active || world_size == 1) return;
    arrive_quietly();
    std::vector<int> counts(static_cast<std::size_t>(world_size)),
        displs(static_cast<std::size_t>(world_size));
    for (std::size_t r = 0; r < counts.size(); ++r) {
        if (offsets[r + 1] > (std::size_t{1} << 31) - 1)
            throw std::runtime_error(
                "dist::allgather: more than 2^31 parameters are not supported");
        displs[r] = static_cast<int>(offsets[r]);
        counts[r] = static_cast<int>(offsets[r + 1] - offsets[r]);
    }
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data.data(), counts.data(),
                         displs.data(), MPI_FLOAT, MPI_COMM_WORLD),
          "MPI_Allgatherv");
#else
    (void)data;
    (void)offsets;
#endif
}

void dist::barrier() {
#if MINI_GPT_HAVE_MPI
    if (mpi_active && world_size > 1) arrive_quietly();
#endif
}

}  // namespace mini_gpt
