// The cuda engine's CUDA build (skyforge_cuda_engine_gpu: CUDA runtime, cuBLAS, NCCL, the nvcc
// kernels). Without a driver it must refuse cleanly (NoDevice.*, runs everywhere); on a GPU it
// trains like the cpu backend (Gpu.*, label gpu, skipped visibly without a device).
// docs/compute-backends.md, "The cuda engine".
#include "common.hpp"
#include "engine.hpp"
#include "bf16_training.hpp"
#include "sync_batchnorm.hpp"

#include <skyforge/thread_group.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <thread>
#include <tuple>
#include <utility>

using namespace cuda_test;
using skyforge::Communicator;
using skyforge::Error;
namespace cu = skyforge::cuda;

namespace {
// The engine, or null with *why set when this machine has no usable device.
std::unique_ptr<skyforge::Engine> try_make(const ModelSpec& m, std::string* why, const cu::EngineOptions& o = {}) {
  try {
    return cu::make_engine(m, Communicator{}, skyforge::Host{}, o);
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

// On the GPU: bound data with CUDA graphs (captured at a shape's second step, replayed after) is
// the eager engine bit for bit — the same kernels in the same order, the step counter, sample
// count and sums read from device memory — over 3 epochs of the convnet with its dropout, and
// the deferred sums agree.
// batch_normalization with synchronized = true on one GPU: the nvcc build's split kernels (sums,
// then normalise / dx) give the fused kernels' bits (tests/cpu_backend/sync_batchnorm.hpp).
TEST(Gpu, SynchronizedBatchNormOnOneGpuTrainsAsUnsynchronized) {
  std::string why;
  if (!try_make(sync_bn_model(true), &why)) GTEST_SKIP() << why;
  check_one_replica_either_way([](const ModelSpec& m, const Communicator& c) { return cu::make_engine(m, c); });
}

TEST(Gpu, ACudaGraphStepEqualsAnEagerStep) {
  std::string why;
  const ModelSpec m = convnet(5);
  auto probe = try_make(m, &why);
  if (!probe) GTEST_SKIP() << why;
  cu::EngineOptions eager_only;
  eager_only.graphs = false;
  auto a = cu::make_engine(m, Communicator{}, skyforge::Host{}, eager_only);
  auto b = cu::make_engine(m, Communicator{});
  const uint32_t n = 200, batch = 32;
  const Batch all = make_batch(7, n, 784);
  const uint64_t da = a->bind_data(all.x.data(), all.y.data(), n), db = b->bind_data(all.x.data(), all.y.data(), n);
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (uint32_t at = 0; at < n; at += batch) {
      std::vector<uint64_t> idx;
      for (uint32_t i = at; i < std::min(n, at + batch); ++i) idx.push_back((i * 37u + epoch) % n);
      a->train_step_indexed(da, idx.data(), static_cast<uint32_t>(idx.size()), true);
      b->train_step_indexed(db, idx.data(), static_cast<uint32_t>(idx.size()), true);
    }
    const auto ta = a->take_results(), tb = b->take_results();
    EXPECT_EQ(ta.loss, tb.loss) << "epoch " << epoch;
    EXPECT_EQ(ta.correct, tb.correct);
  }
  const auto pa = params_of(*a), pb = params_of(*b);
  EXPECT_EQ(0, std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(float))) << "the graph trained other bits";
  const cu::GraphStats g = dynamic_cast<const cu::CudaEngine&>(*b).graph_stats();
  EXPECT_EQ(g.captured, 2u);  // batch 32 and the last 8
  EXPECT_EQ(g.replayed, 21u - 2u);
}

// On 2 GPUs: a peer that stops taking part (rank 1 makes its engine, then never steps) makes
// rank 0's step fail once the collective timeout has passed, the NCCL communicator aborted
// (ncclCommAbort), instead of hanging; the engine refuses collectives afterwards.
TEST(Gpu, ALostPeerAbortsTheCommunicatorInsteadOfHanging) {
  std::string why;
  const ModelSpec m = mlp(6);
  if (!try_make(m, &why)) GTEST_SKIP() << why;
  skyforge::ThreadGroup group(2);
  std::atomic<bool> done{false};
  std::string error, skipped;
  double seconds = 0;
  try {
    group.run([&](uint32_t rank) {
      cu::EngineOptions o;
      o.collective_timeout_s = 5;
      std::unique_ptr<skyforge::Engine> e;
      try {
        e = cu::make_engine(m, Communicator(group.comm(rank)), skyforge::Host{}, o);
      } catch (const Error& x) {
        if (x.status() == SF_ERR_UNSUPPORTED) skipped = x.what();  // one GPU: two ranks cannot share it
        throw;
      }
      if (rank == 1) {  // the lost peer: alive, silent
        while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        return;
      }
      const Batch b = make_batch(1, 16, 784);
      const auto t0 = std::chrono::steady_clock::now();
      try {
        e->train_step(b.x.data(), b.y.data(), 16);
      } catch (const Error& x) {
        error = x.what();
      }
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      try {
        e->train_step(b.x.data(), b.y.data(), 16);
        error += " | a second step ran";
      } catch (const Error&) {
      }
      done = true;
    });
  } catch (const std::exception&) {
  }
  if (!skipped.empty()) GTEST_SKIP() << skipped;
  EXPECT_NE(error.find("not done after the collective timeout of 5"), std::string::npos) << error;
  EXPECT_NE(error.find("the NCCL communicator was aborted"), std::string::npos) << error;
  EXPECT_EQ(error.find("a second step ran"), std::string::npos) << error;
  EXPECT_LT(seconds, 60.0) << "the step waited " << seconds << " s for a peer that never came";
}

// On the GPU: the convnet (conv2d on cuDNN where its padding allows, else im2col + GEMM; batch
// normalization, dropout, pooling) follows the cpu backend in lockstep (the GPU engine takes
// the cpu backend's state before each step), 10 steps of SGD + momentum.
namespace {
// Model m on the GPU with options o, 10 steps of batch 32 of SGD + momentum, taking the cpu
// backend's state before each: the worst relative loss difference and the worst parameter
// difference, printed with what, within the tolerances (the test skips on a machine without a
// usable device).
void expect_lockstep_with_cpu(ModelSpec m, const cu::EngineOptions& o, const char* what, double loss_tolerance,
                              double param_tolerance) {
  std::string why;
  m.optimizer = "sgd";
  m.optimizer_options = opts({{"learning_rate", "0.05"}, {"momentum", "0.9"}});
  auto g = try_make(m, &why, o);
  if (!g) GTEST_SKIP() << why;
  auto c = skyforge::cpu::make_engine(m, Communicator{});
  const size_t features = size_t{m.input_shape[0]} * m.input_shape[1] * m.input_shape[2];
  double worst_loss = 0, worst_param = 0;
  for (int s = 0; s < 10; ++s) {
    const Batch b = make_batch(300 + s, 32, features);
    g->load_state(c->state_dict());
    const double lc = c->train_step(b.x.data(), b.y.data(), 32).loss;
    const double lg = g->train_step(b.x.data(), b.y.data(), 32).loss;
    worst_loss = std::max(worst_loss, std::fabs(lg - lc) / lc);
    worst_param = std::max(worst_param, max_abs_diff(params_of(*c), params_of(*g)));
  }
  std::printf("%s on the GPU vs cpu, in lockstep: loss %.3g (relative), params %.3g\n", what, worst_loss,
              worst_param);
  EXPECT_LE(worst_loss, loss_tolerance);
  EXPECT_LE(worst_param, param_tolerance);
}

void expect_convnet_lockstep_with_cpu(const cu::EngineOptions& o, const char* what, double loss_tolerance,
                                      double param_tolerance) {
  expect_lockstep_with_cpu(convnet(4), o, (std::string("convnet ") + what).c_str(), loss_tolerance, param_tolerance);
}
}  // namespace

// FP32, deterministic algorithms chosen by cuDNN's heuristics (the defaults): the convnets'
// documented tolerance (docs/compute-backends.md), 1e-4 on the loss and the parameters.
TEST(Gpu, ConvnetTrainsLikeCpu) { expect_convnet_lockstep_with_cpu({}, "in FP32", 1e-4, 1e-4); }

// autotune = true, deterministic = false (docs/compute-backends.md, "Convolution algorithms"):
// each direction of each window takes the fastest FP32 algorithm cuDNN timed, atomics allowed.
// That changes the order of additions and may change the arithmetic (FFT and Winograd
// algorithms transform in FP32, with more rounding than a direct sum); the FP32 tolerance is
// asserted all the same: a candidate that misses it is not one to take silently.
TEST(Gpu, AutotunedNondeterministicConvnetTrainsLikeCpu) {
  cu::EngineOptions o;
  o.autotune = true;
  o.deterministic = false;
  expect_convnet_lockstep_with_cpu(o, "autotuned, atomics allowed,", 1e-4, 1e-4);
}

// autotune = true in FP32 with deterministic algorithms only: cuDNN's timed choice, or the
// engine's im2col + GEMM backward where that was faster than cuDNN's chosen backward (both
// deterministic: the FP32 tolerance).
TEST(Gpu, AutotunedConvnetTrainsLikeCpu) {
  cu::EngineOptions o;
  o.autotune = true;
  expect_convnet_lockstep_with_cpu(o, "autotuned, deterministic,", 1e-4, 1e-4);
}

// conv_layout = "nchw" (docs/compute-backends.md, "Convolution algorithms"): every cuDNN call in
// NCHW, its tensors and kernel transformed there and back (cudnnTransformTensor), the heuristics'
// deterministic FP32 algorithms: a layout change moves values without rounding them, so the FP32
// tolerance holds.
TEST(Gpu, ConvnetInNchwTrainsLikeCpu) {
  cu::EngineOptions o;
  o.conv_layout = cu::DeviceOptions::ConvLayout::nchw;
  expect_convnet_lockstep_with_cpu(o, "with its convolutions in NCHW", 1e-4, 1e-4);
}

// The same with autotune: the fastest NCHW candidates, timed with their transforms (whose timing
// runs write y, dw and dx from scratch before the calls that overwrite them).
TEST(Gpu, AutotunedConvnetInNchwTrainsLikeCpu) {
  cu::EngineOptions o;
  o.autotune = true;
  o.conv_layout = cu::DeviceOptions::ConvLayout::nchw;
  expect_convnet_lockstep_with_cpu(o, "autotuned, in NCHW,", 1e-4, 1e-4);
}

// Thin windows' weight gradients from the engine's column reduction (kernels::conv_filter_grad),
// cuDNN computing only their input gradients (Device::conv_backward without dw) where it can pad
// them, in NHWC and pinned to NCHW (there the data gradient converts dy itself: no filter
// gradient did), beside a window cuDNN cannot pad (im2col + GEMM).
TEST(Gpu, ThinConvolutionsTrainLikeCpu) {
  expect_lockstep_with_cpu(thin_convnet(17), {}, "thin convolutions", 1e-4, 1e-4);
  cu::EngineOptions o;
  o.conv_layout = cu::DeviceOptions::ConvLayout::nchw;
  expect_lockstep_with_cpu(thin_convnet(17), o, "thin convolutions in NCHW", 1e-4, 1e-4);
}

// tf32 = true (docs/compute-backends.md, "TF32"): GEMMs and convolutions may round their inputs
// to TF32 (10 mantissa bits), so a step is about 1e-3 from FP32, not at rounding level: 1e-2 on
// the loss, 1e-3 on the parameters.
TEST(Gpu, Tf32ConvnetStaysNearFp32) {
  cu::EngineOptions o;
  o.tf32 = true;
  expect_convnet_lockstep_with_cpu(o, "with tf32", 1e-2, 1e-3);
}

// NCCL on one GPU (collectives_alone): one rank takes the data-parallel path — an NCCL
// communicator of one rank, the loss sums and the gradient buckets on the collectives stream,
// captured into the step's CUDA graph and replayed — and trains the bits of the rank without it
// (NCCL's sum over one rank is a copy). The convnet (cuDNN, batch normalization, dropout) and a
// synchronized BatchNorm model, 3 epochs of bound-data steps.
TEST(Gpu, OneRankThroughNcclTrainsTheBitsOfOneRankWithout) {
  std::string why;
  if (!try_make(mlp(1), &why)) GTEST_SKIP() << why;
  for (const ModelSpec& m : {convnet(8), sync_bn_model(true)}) {
    const size_t f = features(m);
    const uint32_t n = 200, batch = 32;
    const Batch all = make_batch(9, n, f);
    std::vector<std::vector<float>> params;
    std::vector<uint64_t> collectives;
    // (alone, graphs, step_batches): the last chooses its graphs from the batches it is told.
    for (const auto& [alone, graphs, told] : {std::tuple{false, true, false}, std::tuple{true, false, false},
                                              std::tuple{true, true, false}, std::tuple{true, true, true}}) {
      cu::EngineOptions o;
      o.collectives_alone = alone;
      o.graphs = graphs;
      o.bucket_bytes = 64 << 10;  // several buckets a step
      skyforge::ThreadGroup one(1);
      auto e = cu::make_engine(m, Communicator(one.comm(0)), skyforge::Host{}, o);
      const uint64_t d = e->bind_data(all.x.data(), all.y.data(), n);
      for (int epoch = 0; epoch < 3; ++epoch) {
        for (uint32_t at = 0; at < n; at += batch) {
          std::vector<uint64_t> idx;
          for (uint32_t i = at; i < std::min(n, at + batch); ++i) idx.push_back((i * 37u + epoch) % n);
          if (told) e->step_batches(std::vector<uint32_t>{static_cast<uint32_t>(idx.size())});
          e->train_step_indexed(d, idx.data(), static_cast<uint32_t>(idx.size()), true);
        }
        e->take_results();
      }
      params.push_back(params_of(*e));
      collectives.push_back(dynamic_cast<const cu::CudaEngine&>(*e).collectives());
    }
    for (size_t i = 1; i < params.size(); ++i)
      EXPECT_EQ(0, std::memcmp(params[i].data(), params[0].data(), params[0].size() * sizeof(float)))
          << "configuration " << i << " trained other bits";
    EXPECT_EQ(collectives[0], 0u);
    EXPECT_GT(collectives[1], collectives[2]) << "every step eager gives NCCL more launches than two captures";
    EXPECT_GT(collectives[2], 0u);
    EXPECT_EQ(collectives[3], collectives[2]) << "step_batches chose other graphs";
  }
}

// ncclCommAbort while graphs of the communicator are in flight: 200 replays of a captured step
// are queued — 8 copies of 256 MiB on the stream (about 1.5 ms a replay on an H100) around
// in-place allreduces on the collectives stream (which NCCL skips on one rank: the graph holds
// their fork and join, and the communicator) — then the device aborts. abort() returns while
// they run (it destroys the executables first: ncclCommAbort waits for every graph that holds
// the communicator), later collectives and replays refuse with its reason, and the device goes
// down. A watchdog fails the test instead of hanging it. What one GPU cannot show: NCCL's own
// kernels waiting on a peer (two ranks).
TEST(Gpu, AbortingNcclWhileAGraphIsInFlightReturns) {
  std::string why;
  if (!try_make(mlp(1), &why)) GTEST_SKIP() << why;
  skyforge::ThreadGroup one(1);
  cu::DeviceOptions o;
  o.collectives_alone = true;
  auto dev = std::make_unique<cu::Device>(Communicator(one.comm(0)), skyforge::Host{}, o);
  ASSERT_TRUE(dev->data_parallel());
  constexpr size_t kFloats = size_t{64} << 20;  // 256 MiB
  cu::Buffer<float> buf(*dev, kFloats), other(*dev, kFloats);
  dev->zero(buf.get(), kFloats * sizeof(float));
  dev->begin_capture();
  for (int i = 0; i < 4; ++i) {
    dev->copy(other.get(), buf.get(), kFloats * sizeof(float));
    dev->allreduce_sum(buf.get(), kFloats);
    dev->copy(buf.get(), other.get(), kFloats * sizeof(float));
  }
  dev->join_collectives();
  auto graph = dev->end_capture();
  for (int i = 0; i < 200; ++i) dev->replay(*graph);
  auto aborted = std::async(std::launch::async, [&] { dev->abort("cuda: aborted by the test"); });
  if (aborted.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    ADD_FAILURE() << "abort() did not return within 60 s while graphs were in flight";
    std::_Exit(1);  // a deadlock: do not hang the suite
  }
  const auto [st, msg] = status_of([&] { dev->allreduce_sum(buf.get(), 16); });
  EXPECT_EQ(st, SF_ERR);
  EXPECT_NE(msg.find("aborted by the test"), std::string::npos) << msg;
  EXPECT_EQ(status_of([&] { dev->replay(*graph); }).first, SF_ERR) << "a graph of the aborted communicator replayed";
  auto gone = std::async(std::launch::async, [&] {
    graph.reset();
    other.reset();
    buf.reset();
    dev.reset();
  });
  if (gone.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    ADD_FAILURE() << "the aborted device did not go down within 60 s";
    std::_Exit(1);
  }
}

// precision = "bf16" on the GPU (cublasGemmEx and cublasGemmStridedBatchedEx on bf16 operands,
// FP32 sums; convolutions through im2col): the host build's checks (test_bf16.cpp), the same
// bounds: a step from the cpu backend's FP32 state within bf16's rounding of it, and the main
// job's MLP after 1,000 steps within 1% of FP32's loss.
TEST(Gpu, Bf16StepsAreFp32sToBf16Rounding) {
  std::string why;
  if (!try_make(mlp(1), &why, bf16_options())) GTEST_SKIP() << why;
  for (const ModelSpec& m : {mlp(75), convnet(76)}) {
    const auto [loss, weights] = bf16_steps_beside_cpu(m);
    std::printf("GPU bf16 step vs the cpu backend's FP32 step: loss %.3g (relative), weights %.3g\n", loss, weights);
    EXPECT_LE(loss, 1e-2);
    EXPECT_LE(weights, 1e-3);
    EXPECT_GT(weights, 0.0);
  }
}

TEST(Gpu, Bf16MainJobsMlpAfter1000StepsIsWithinOnePercentOfFp32) {
  std::string why;
  if (!try_make(mlp(1), &why, bf16_options())) GTEST_SKIP() << why;
  expect_main_jobs_mlp_within_one_percent("cuda");
}
