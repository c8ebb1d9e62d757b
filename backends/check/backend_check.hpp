// The conformance suite every compute backend passes (docs/compute-backends.md, "Checking a
// backend"), run by `skyforge-backend-check NAME` and `skyforge backend-check NAME`. It loads the
// backend's .so as a node does (the host's catalogue and loader) and drives it through the C ABI
// only — no backend internals, no pool — so a third party's backend is checked exactly like `cpu`:
//   - layers: every layer of the schema (skyforge/layer_schema.hpp) in small models, and the
//     examples' residual and transformer blocks: the gradient one SGD step applies against central
//     finite differences of the training loss, dropout the identity at inference only, 2 ranks
//     following 1, the state resuming bit for bit, and agreement and checkpoints with the reference;
//   - data parallel: rank 0's initial weights reach every rank, ranks stay bit-identical, and
//     2 ranks follow 1 rank on the same global batch (skyforge/thread_group.hpp);
//   - synchronized batch_normalization: 2 ranks on unequal shares follow 1 rank and hold the
//     same moving statistics;
//   - state: state_dict -> load_state resumes bit for bit; damaged or foreign state is refused
//     and leaves the engine as it was;
//   - bad input: an empty batch, a label out of range and a bad model are refused with a message,
//     and the engine still works afterwards;
//   - bound data (ABI 1.8), where the backend keeps data: indexed steps are the plain steps;
//   - optimizers: each of the schema (skyforge/optimizer_schema.hpp) with every slot in use: its
//     state resumes bit for bit, agrees with the reference and its checkpoints move both ways;
//   - agreement: the same models, seed and batches on the reference backend (`cpu`) give the
//     same losses and weights within the documented tolerance, and checkpoints move both ways.
#pragma once

#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

namespace skyforge::backend_check {

struct Options {
  std::string backend;                                        // plugin name, as in the manifest
  std::vector<std::pair<std::string, std::string>> options;   // its options (plugin.toml checks them)
  std::vector<std::string> plugin_path;                       // searched before the default dirs
  std::string against = "cpu";                                // reference backend; "" or `backend`: none
  std::string program = "skyforge-backend-check";             // what messages are prefixed with
};

// Prints one line per check (PASS / SKIP / FAIL, what was measured) and a summary to `out`.
// Returns 0 when no check failed, 1 when one did, 2 when the backend cannot be found, loaded or
// run on this machine (its probe's reason goes to `err`).
int run(const Options& options, std::ostream& out, std::ostream& err);

}  // namespace skyforge::backend_check
