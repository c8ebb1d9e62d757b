// The checks of the conformance suite (backend_check.hpp lists what each one shows). Each returns
// a line saying what it measured, or throws Failure (the backend does not conform) or Skip (the
// check does not apply to it; engine.hpp).
#pragma once

#include <skyforge/keras.hpp>

#include <string>

#include "models.hpp"

namespace skyforge::backend_check {

// Everything a harness (models.hpp) is held to: gradients against central finite differences;
// dropout the identity at inference and a mask in training; 2 ranks following 1; its state
// resuming bit for bit; with `ref`, its initial weights, 10 steps and checkpoints both ways against
// the reference's.
std::string harness(keras::Backend b, const Harness& h, const keras::Backend* ref, const std::string& ref_name);
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
