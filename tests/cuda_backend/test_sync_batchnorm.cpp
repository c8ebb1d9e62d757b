// batch_normalization with synchronized = true on the cuda engine's host build: the checks the
// cpu engine passes (tests/cpu_backend/sync_batchnorm.hpp), the cpu engine's results, and the
// BatchNorms' allreduces inside captured graphs (bound-data steps).
#include "common.hpp"
#include "engine.hpp"
#include "sync_batchnorm.hpp"

using namespace cuda_test;
namespace cu = skyforge::cuda;

namespace {

std::unique_ptr<skyforge::Engine> cuda_engine(const ModelSpec& m, const skyforge::Communicator& comm) {
  cu::EngineOptions eo;
  eo.bucket_bytes = 256;  // several gradient buckets, interleaved with the BatchNorms' allreduces
  return cu::make_engine(m, comm, skyforge::Host{}, eo);
}

std::unique_ptr<skyforge::Engine> cpu_engine(const ModelSpec& m, const skyforge::Communicator& comm) {
  return std::make_unique<skyforge::cpu::CpuEngine>(m, comm);
}

}  // namespace

TEST(SyncBatchNorm, TwoReplicasFollowOneOnTheGlobalBatch) { check_two_follow_one(cuda_engine, 2e-6); }
TEST(SyncBatchNorm, UnsynchronizedReplicasKeepStatisticsOfTheirOwn) { check_unsynchronized_replicas_differ(cuda_engine); }
TEST(SyncBatchNorm, OneAllreduceEachWayPerLayer) { check_one_allreduce_each_way(cuda_engine); }
TEST(SyncBatchNorm, OneReplicaTrainsTheSameEitherWay) { check_one_replica_either_way(cuda_engine); }

// Two replicas of each engine, synchronized: the same losses and values within float rounding.
TEST(SyncBatchNorm, TwoReplicasFollowTheCpuEngine) {
  const ModelSpec m = sync_bn_model(true);
  const auto cpu = train_replicas(m, cpu_engine, 2, 4);
  const auto cuda = train_replicas(m, cuda_engine, 2, 4);
  for (size_t s = 0; s < 4; ++s) {
    EXPECT_NEAR(cuda[0].losses[s], cpu[0].losses[s], 2e-6) << "step " << s;
    EXPECT_LT(largest_difference(state_values(m, cuda[0].states[s]), state_values(m, cpu[0].states[s])), 2e-6)
        << "step " << s;
  }
}

// Bound-data steps run as captured graphs from the second step of a shape on: the BatchNorms'
// allreduces are recorded and replayed with the gradient allreduce, and the replicas end with
// the bits of the plain (eager) steps.
TEST(SyncBatchNorm, CapturedStepsEqualPlainSteps) {
  const ModelSpec m = sync_bn_model(true);
  const size_t f = features_of(m);
  constexpr uint32_t kSteps = 4;
  const auto plain = train_replicas(m, cuda_engine, 2, kSteps);
  skyforge::ThreadGroup group(2);
  std::vector<std::string> states(2);
  group.run([&](uint32_t rank) {
    const Share my = share_of(2, rank);
    Batch mine;  // this rank's share of every global batch, one after another
    for (uint32_t s = 0; s < kSteps; ++s) {
      const SyncBatch b = sync_batch(m, s);
      mine.x.insert(mine.x.end(), b.x.begin() + my.first * f, b.x.begin() + (my.first + my.rows) * f);
      mine.y.insert(mine.y.end(), b.y.begin() + my.first, b.y.begin() + my.first + my.rows);
    }
    auto e = cuda_engine(m, skyforge::Communicator(group.comm(rank)));
    const uint64_t id = e->bind_data(mine.x.data(), mine.y.data(), mine.y.size());
    for (uint32_t s = 0; s < kSteps; ++s) {
      std::vector<uint64_t> idx(my.rows);
      for (uint32_t i = 0; i < my.rows; ++i) idx[i] = s * my.rows + i;
      const StepResult r = e->train_step_indexed(id, idx.data(), my.rows, false);
      EXPECT_EQ(r.loss, plain[rank].losses[s]) << "step " << s;
    }
    const cu::GraphStats g = dynamic_cast<const cu::CudaEngine&>(*e).graph_stats();
    EXPECT_EQ(g.eager, 1u);
    EXPECT_EQ(g.captured, 1u);
    EXPECT_EQ(g.replayed, kSteps - 1);
    states[rank] = e->state_dict();
  });
  EXPECT_TRUE(states[0] == states[1]) << "the replicas differ";
  EXPECT_TRUE(states[0] == plain[0].states.back()) << "the graphs trained other bits";
}
