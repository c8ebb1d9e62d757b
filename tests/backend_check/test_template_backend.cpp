// The compute-backend template (templates/compute-backend/my_backend.cpp), built into this test
// and driven through its plugin descriptor as the host would: its optimizer comes from the
// optimizer schema, so it refuses what the cpu and cuda engines refuse, with the same message
// (tests/cpu_backend, tests/cuda_backend), and takes Keras' defaults for the options left out.
#include <skyforge/abi.h>

#include <gtest/gtest.h>

#include <string>
#include <vector>

extern "C" const sf_plugin_descriptor* skyforge_plugin_entry(const sf_host_services* host, uint16_t major,
                                                             uint16_t minor);

namespace {

// One instance of the template's backend; engine_create on a small MLP with `optimizer`.
class Template {
 public:
  Template() : d_(skyforge_plugin_entry(nullptr, SKYFORGE_ABI_MAJOR, SKYFORGE_ABI_MINOR)) {
    if (d_->create(nullptr, nullptr, 0, &self_) != SF_OK) throw std::runtime_error(d_->last_error(nullptr));
  }
  ~Template() { d_->destroy(self_); }
  Template(const Template&) = delete;
  Template& operator=(const Template&) = delete;

  // SF_OK, or the status and last_error()'s message.
  std::pair<sf_status, std::string> engine_create(const char* optimizer, const std::vector<sf_kv>& options) {
    const uint32_t shape[] = {4};
    const sf_kv units[] = {{"units", "3"}};
    const sf_layer_spec layers[] = {{"dense", units, 1}};
    sf_model_spec spec{};
    spec.struct_size = sizeof spec;
    spec.input_shape = shape;
    spec.input_rank = 1;
    spec.layers = layers;
    spec.n_layers = 1;
    spec.optimizer = optimizer;
    spec.optimizer_options = options.data();
    spec.n_optimizer_options = options.size();
    spec.loss = "sparse_categorical_crossentropy";
    spec.seed = 1;
    const auto* hooks = static_cast<const sf_compute_hooks*>(d_->hooks);
    void* engine = nullptr;
    const sf_status st = hooks->engine_create(self_, &spec, nullptr, &engine);
    if (st != SF_OK) return {st, d_->last_error(self_)};
    hooks->engine_destroy(self_, engine);
    return {SF_OK, ""};
  }

 private:
  const sf_plugin_descriptor* d_;
  void* self_ = nullptr;
};

}  // namespace

TEST(TemplateBackend, ReadsTheOptimizerSchema) {
  Template t;
  EXPECT_EQ(t.engine_create("adam", {{"beta_1", "1"}}),
            std::make_pair(SF_ERR_INVALID, std::string("optimizer adam: option 'beta_1': expected a number in [0, 1), got '1'")));
  EXPECT_EQ(t.engine_create("sgd", {{"momentum", "1.5"}}),
            std::make_pair(SF_ERR_INVALID, std::string("optimizer sgd: option 'momentum': expected a number in [0, 1], got '1.5'")));
  EXPECT_EQ(t.engine_create("sgd", {{"beta_1", "0.9"}}),
            std::make_pair(SF_ERR_INVALID, std::string("optimizer sgd: unknown option 'beta_1'")));
  EXPECT_EQ(t.engine_create("adagrad", {}),
            std::make_pair(SF_ERR_INVALID, std::string("unknown optimizer 'adagrad' (known: adam, adamw, sgd, rmsprop)")));
  // In the schema but not in the template: refused, never trained as another optimizer.
  EXPECT_EQ(t.engine_create("rmsprop", {}),
            std::make_pair(SF_ERR_UNSUPPORTED, std::string("rmsprop: not implemented here (adam and sgd are)")));
  EXPECT_EQ(t.engine_create("adamw", {}).first, SF_ERR_UNSUPPORTED);
  EXPECT_EQ(t.engine_create("sgd", {}).first, SF_OK);  // Keras' defaults for everything left out
  EXPECT_EQ(t.engine_create("", {}).first, SF_OK);     // the default optimizer, as on every backend
  EXPECT_EQ(t.engine_create("sgd", {{"nesterov", "true"}}).first, SF_ERR_UNSUPPORTED);  // the template's own limit
}
