// examples/mini_gpt/dist.cpp: MPI collectives (MINI_GPT_HAVE_MPI) or a world of one.
#include "dist.hpp"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>

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
    if (rc != MPI_SUCCESS) throw std::runtime_error(std::string(call) + " failed with MPI error " + std::to_string(rc));
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

int dist::rank() noexcept { return world_rank; }
int dist::size() noexcept { return world_size; }
int dist::local_size() noexcept { return node_size; }

void dist::allreduce_sum(std::span<float> data) {
#if MINI_GPT_HAVE_MPI
    if (!mpi_active || world_size == 1) return;
    // In pieces of at most 2^30 elements (MPI counts are int).
    for (std::size_t off = 0; off < data.size(); off += std::size_t{1} << 30) {
        int n = static_cast<int>(std::min<std::size_t>(data.size() - off, std::size_t{1} << 30));
        check(MPI_Allreduce(MPI_IN_PLACE, data.data() + off, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
    }
#else
    (void)data;
#endif
}

double dist::allreduce_sum(double value) {
#if MINI_GPT_HAVE_MPI
    if (mpi_active && world_size > 1)
        check(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
#endif
    return value;
}

bool dist::any(bool value) {
#if MINI_GPT_HAVE_MPI
    if (mpi_active && world_size > 1) {
        int v = value ? 1 : 0;
        check(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
        return v != 0;
    }
#endif
    return value;
}

void dist::allgather(std::span<float> data, const std::vector<std::size_t>& offsets) {
#if MINI_GPT_HAVE_MPI
    if (!mpi_active || world_size == 1) return;
    std::vector<int> counts(static_cast<std::size_t>(world_size)), displs(static_cast<std::size_t>(world_size));
    for (std::size_t r = 0; r < counts.size(); ++r) {
        if (offsets[r + 1] > (std::size_t{1} << 31) - 1)
            throw std::runtime_error("dist::allgather: more than 2^31 parameters are not supported");
        displs[r] = static_cast<int>(offsets[r]);
        counts[r] = static_cast<int>(offsets[r + 1] - offsets[r]);
    }
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data.data(), counts.data(), displs.data(), MPI_FLOAT,
                         MPI_COMM_WORLD),
          "MPI_Allgatherv");
#else
    (void)data;
    (void)offsets;
#endif
}

void dist::barrier() {
#if MINI_GPT_HAVE_MPI
    if (mpi_active && world_size > 1) MPI_Barrier(MPI_COMM_WORLD);
#endif
}

}  // namespace mini_gpt
