// The cpu engine's run plan of a model graph (graph_plan.hpp): values, liveness, gradient sums.
#include "graph_plan.hpp"

namespace skyforge::cpu {

namespace {

constexpr size_t kNone = GraphPlan::kNone;

// Buffer slots handed out and given back; a slot's width is the most any of its holders needs.
class Slots {
 public:
  explicit Slots(std::vector<size_t>& widths) : widths_(widths), busy_(widths.size(), 0) {}
  // The first free slot wide enough, else the widest free one (widened), else a new one.
  size_t take(size_t width) {
    size_t pick = kNone;
    for (size_t s = 0; s < widths_.size(); ++s) {
      if (busy_[s]) continue;
      if (widths_[s] >= width) {
        pick = s;
        break;
      }
      if (pick == kNone || widths_[s] > widths_[pick]) pick = s;
    }
    if (pick == kNone) {
      pick = widths_.size();
      widths_.push_back(0);
      busy_.push_back(0);
    }
    if (widths_[pick] < width) widths_[pick] = width;
    busy_[pick] = 1;
    return pick;
  }
  void give(size_t s) { busy_[s] = 0; }

 private:
  std::vector<size_t>& widths_;
  std::vector<uint8_t> busy_;
};

}  // namespace

GraphPlan plan_graph(const std::vector<PlanLayer>& layers, const std::vector<size_t>& order, size_t output) {
  const size_t n = layers.size();
  GraphPlan p;
  p.value.assign(n, kNone);
  p.train_slot.assign(n, kNone);
  p.infer_slot.assign(n, kNone);
  p.needs_grad.assign(n, 0);
  auto value_of = [&](size_t j) { return j == GraphPlan::kInput ? GraphPlan::kInput : p.value[j]; };
  for (size_t i : order) {
    const PlanLayer& l = layers[i];
    p.value[i] = l.alias ? value_of(l.inputs[0]) : i;
    bool g = l.params;
    for (size_t j : l.inputs) g = g || (j != GraphPlan::kInput && p.needs_grad[j]);
    p.needs_grad[i] = g;
  }

  // Training keeps every output for the backward: one slot each.
  for (size_t i : order)
    if (!layers[i].alias) {
      p.train_slot[i] = p.act_width.size();
      p.act_width.push_back(layers[i].width);
    }
  // Inference: an output's slot is free again once its last reader ran (the model's output stays).
  std::vector<size_t> last(n, kNone);
  for (size_t pos = 0; pos < order.size(); ++pos)
    if (!layers[order[pos]].alias)
      for (size_t j : layers[order[pos]].inputs)
        if (const size_t v = value_of(j); v != GraphPlan::kInput) last[v] = pos;
  const size_t out = p.value[output];
  Slots acts(p.act_width);
  for (size_t pos = 0; pos < order.size(); ++pos) {
    const size_t i = order[pos];
    if (layers[i].alias) continue;
    p.infer_slot[i] = acts.take(layers[i].width);
    for (size_t j : layers[i].inputs)
      if (const size_t v = value_of(j); v != GraphPlan::kInput && v != out && last[v] == pos) acts.give(p.infer_slot[v]);
  }

  // Backward, in reverse run order: a value's gradient slot is born when its last-running reader
  // writes it, later readers' contributions come through scratch slots added into it, and it is
  // free again once the value's own layer read it.
  Slots grads(p.grad_width);
  std::vector<size_t> born(n, kNone);
  if (out != GraphPlan::kInput && p.needs_grad[out]) born[out] = p.output_grad = grads.take(layers[out].width);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const size_t i = *it;
    if (layers[i].alias || !p.needs_grad[i]) continue;
    GraphPlan::Step s;
    s.layer = i;
    s.dy = born[i];
    for (size_t j : layers[i].inputs) {
      const size_t v = value_of(j);
      if (v == GraphPlan::kInput || !p.needs_grad[v]) {
        s.dx.push_back(kNone);
        s.sum_into.push_back(kNone);
      } else if (born[v] == kNone) {
        s.dx.push_back(born[v] = grads.take(layers[v].width));
        s.sum_into.push_back(kNone);
      } else {
        s.dx.push_back(grads.take(layers[v].width));
        s.sum_into.push_back(born[v]);
      }
    }
    grads.give(s.dy);
    for (size_t k = 0; k < s.dx.size(); ++k)
      if (s.sum_into[k] != kNone) grads.give(s.dx[k]);
    p.backward.push_back(std::move(s));
  }
  return p;
}

}  // namespace skyforge::cpu
