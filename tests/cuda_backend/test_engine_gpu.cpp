// The cuda engine's CUDA build (skyforge_cuda_engine_gpu: CUDA runtime, cuBLAS, NCCL, the nvcc
// kernels). Without a driver it must refuse cleanly (NoDevice.*, runs everywhere); on a GPU it
// trains like the cpu backend (Gpu.*, label gpu, skipped visibly without a device).
// docs/compute-backends.md, "The cuda engine (in progress)".
#include "common.hpp"
#include "engine.hpp"

#include <cstring>
#include <memory>

using namespace cuda_test;
using skyforge::Communicator;
using skyforge::Error;
namespace cu = skyforge::cuda;

namespace {
// The engine, or null with *why set when this machine has no usable device.
std::unique_ptr<skyforge::Engine> try_make(const ModelSpec& m, std::string* why) {
  try {
    return cu::make_engine(m, Communicator{});
  } catch (const Error& e) {
    if (e.status() != SF_ERR_UNSUPPORTED) throw;
    *why = e.what();
    return nullptr;
  }
}
}  // namespace

TEST(NoDevice, EngineCreationFailsCleanlyWithoutADriver) {
  std::string why;
  auto e = try_make(mlp(1), &why);
  if (e) GTEST_SKIP() << "this machine has a usable CUDA device";
  // Without a driver the runtime says so (docs/compute-backends.md); a machine with a driver but
  // no device says "no CUDA device visible".
  EXPECT_TRUE(why.rfind("cuda: no usable CUDA driver (", 0) == 0 || why.rfind("cuda: no CUDA device visible", 0) == 0)
      << why;
}

TEST(Gpu, MlpTrainsLikeCpu) {
  std::string why;
  const ModelSpec m = mlp(3);
  auto g = try_make(m, &why);
  if (!g) GTEST_SKIP() << why;
  EXPECT_STREQ(cu::Device::build_name(), "cuda");
  auto c = skyforge::cpu::make_engine(m, Communicator{});
  const auto p0 = params_of(*g);
  ASSERT_EQ(0, std::memcmp(p0.data(), params_of(*c).data(), p0.size() * sizeof(float)));
  for (int s = 0; s < 20; ++s) {
    const Batch b = make_batch(100 + s, 64, 784);
    const double lc = c->train_step(b.x.data(), b.y.data(), 64).loss;
    const double lg = g->train_step(b.x.data(), b.y.data(), 64).loss;
    EXPECT_NEAR(lg, lc, 1e-4 * lc) << "step " << s;
  }
  EXPECT_LE(max_abs_diff(params_of(*c), params_of(*g)), 1e-4);
  // state_dict round trip on the device.
  auto h = try_make(m, &why);
  ASSERT_TRUE(h);
  h->load_state(g->state_dict());
  EXPECT_EQ(params_of(*h), params_of(*g));
}
