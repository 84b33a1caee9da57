// SPDX-License-Identifier: Apache-2.0
/// @file
/// spillway/stash/layer_tensor.hpp: one tensor a layer saves for its backward, as
/// layer_stash declares it and smallest_stash_budget() sizes it.
#pragma once

#include <cstddef>
#include <string>

#include "spillway/stash/tensor_desc.hpp"

namespace spillway {

/// One tensor a layer saves for its backward: its name (how calls and messages refer to it),
/// its element count and its element type.
struct layer_tensor {
    std::string name;         ///< Unique among the layer's tensors.
    std::size_t count = 0;    ///< Elements (the tensor is saved as shape {count}).
    dtype type = dtype::f32;  ///< Element type; load<T>() and output<T>() need sizeof(T) to match.
};

}  // namespace spillway
