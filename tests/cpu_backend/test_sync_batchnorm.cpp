// batch_normalization with synchronized = true on the cpu engine: statistics over the global
// batch of every replica (docs/layers.md), against one replica holding the whole batch.
#include "sync_batchnorm.hpp"

using namespace cpu_test;

namespace {

std::unique_ptr<skyforge::Engine> cpu_engine(const ModelSpec& m, const skyforge::Communicator& comm) {
  skyforge::cpu::EngineOptions eo;
  eo.bucket_bytes = 256;  // several gradient buckets, interleaved with the BatchNorms' allreduces
  return std::make_unique<skyforge::cpu::CpuEngine>(m, comm, eo);
}

}  // namespace

TEST(SyncBatchNorm, TwoReplicasFollowOneOnTheGlobalBatch) { check_two_follow_one(cpu_engine, 2e-6); }
TEST(SyncBatchNorm, UnsynchronizedReplicasKeepStatisticsOfTheirOwn) { check_unsynchronized_replicas_differ(cpu_engine); }
TEST(SyncBatchNorm, OneAllreduceEachWayPerLayer) { check_one_allreduce_each_way(cpu_engine); }
TEST(SyncBatchNorm, OneReplicaTrainsTheSameEitherWay) { check_one_replica_either_way(cpu_engine); }
