// The checks of the conformance suite (backend_check.hpp lists what each one shows). Each returns
// a line saying what it measured, or throws Failure (the backend does not conform) or Skip (the
// check does not apply to it; engine.hpp).
#pragma once

#include <skyforge/keras.hpp>

#include <string>

#include "models.hpp"

namespace skyforge::backend_check {

// The layer in `model` (harness()): gradients against central finite differences.
std::string gradients(keras::Backend b, const Model& model);
// The harness of dropout: the identity at inference, a mask in training.
std::string dropout(keras::Backend b, const Model& with);
std::string data_parallel(keras::Backend b);
// batch_normalization with synchronized = true, 1 rank vs 2 on unequal shares.
std::string synchronized_batchnorm(keras::Backend b);
std::string state(keras::Backend b);
std::string bound_data(keras::Backend b);
std::string bad_input(keras::Backend b);
// Against the reference backend `ref`, named `ref_name` in the messages.
std::string agreement(keras::Backend b, keras::Backend ref, const std::string& ref_name);
std::string checkpoint(keras::Backend b, keras::Backend ref, const std::string& ref_name);
// One optimizer of the schema: state round trip; with `ref`, agreement and checkpoints both ways.
std::string optimizer(keras::Backend b, const std::string& name, const keras::Backend* ref, const std::string& ref_name);

}  // namespace skyforge::backend_check
