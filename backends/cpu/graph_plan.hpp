// How the cpu engine runs a model graph (schema::Graph): which layers run forward and backward,
// which buffer slot holds each output and each gradient, and where a fan-out's gradients are
// summed. Slots are reused as soon as no later step reads them (liveness), so memory follows the
// widest live set rather than the layer count. Pure bookkeeping: no floats, no layers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace skyforge::cpu {

// One layer as the plan sees it (indexed by its listing position, like schema::Graph's).
struct PlanLayer {
  std::vector<size_t> inputs;  // producers, in order (kInput: the model's input)
  size_t width = 0;            // its output's values per sample
  bool params = false;         // it has trainable parameters
  bool alias = false;          // a view or a fused relu: its output IS its (only) input's buffer
};

struct GraphPlan {
  static constexpr size_t kInput = SIZE_MAX;  // the model's input (schema::Graph::kInput)
  static constexpr size_t kNone = SIZE_MAX;   // no slot

  // Per layer: the layer whose forward wrote the buffer this layer's output is (itself, or for an
  // alias its input's value; kInput: the caller's input).
  std::vector<size_t> value;
  // Per layer: the activation slot of its output in training (every output kept for the
  // backward) and in inference (an output's slot is free again after its last consumer);
  // kNone for an alias.
  std::vector<size_t> train_slot, infer_slot;
  std::vector<size_t> act_width;  // per activation slot: values per sample

  // Per layer: something at or below it has parameters, so its gradient is needed.
  std::vector<uint8_t> needs_grad;
  // One backward step: layer `layer` reads its output's gradient from slot `dy` and writes input
  // k's into slot dx[k] (kNone: not needed); where that input's gradient already holds another
  // consumer's contribution, dx[k] is a scratch slot added into sum_into[k] after the step.
  struct Step {
    size_t layer = 0;
    size_t dy = kNone;
    std::vector<size_t> dx, sum_into;
  };
  std::vector<Step> backward;  // in the order they run (reverse run order)
  size_t output_grad = kNone;  // the slot the loss writes the output's gradient into
  std::vector<size_t> grad_width;  // per gradient slot: values per sample
};

// The plan of `layers` run in `order` (topological), `output` the model's output. Non-alias
// layers run forward; of them, the layers that need a gradient run backward.
GraphPlan plan_graph(const std::vector<PlanLayer>& layers, const std::vector<size_t>& order, size_t output);

}  // namespace skyforge::cpu
