// examples/mini_gpt/offload.cpp: the offloaded optimizer (update pipeline over a virtual tier)
// and the offloading activation store (activation stash over a file tier).
#include "llmc_format.hpp"
#include "optimizer.hpp"

namespace mini_gpt {

std::unique_ptr<optimizer> make_offloaded_optimizer(const optimizer_settings&, std::size_t) {
    throw input_error("--offload optimizer: not available yet in this build");
}

std::unique_ptr<activation_store> make_offloading_store(int, std::size_t, const std::vector<std::filesystem::path>&) {
    throw input_error("--offload activations: not available yet in this build");
}

}  // namespace mini_gpt
