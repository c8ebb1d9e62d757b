// NCCL_SOCKET_IFNAME for the CUDA build's communicator (backends/cuda/nccl_env.hpp): the
// interface that holds the node's pool address, unless the variable is set or no interface
// holds it. Reads this machine's interfaces (getifaddrs); sends nothing.
#include <gtest/gtest.h>

#include "nccl_env.hpp"

#include <cstdlib>

namespace cu = skyforge::cuda;

namespace {

TEST(NcclEnv, TheInterfaceThatHoldsThePoolAddress) {
  EXPECT_EQ(cu::nccl_socket_ifname(nullptr, "127.0.0.1"), "=lo");  // exactly lo, not a prefix
}

TEST(NcclEnv, NothingWhereNoInterfaceHoldsTheAddress) {
  EXPECT_EQ(cu::nccl_socket_ifname(nullptr, "224.0.0.1"), std::nullopt);  // a multicast group, no interface's address
  EXPECT_EQ(cu::nccl_socket_ifname(nullptr, ""), std::nullopt);           // off a pool: no address
  EXPECT_EQ(cu::nccl_socket_ifname(nullptr, "not-an-address"), std::nullopt);
}

TEST(NcclEnv, AValueAlreadySetStays) {
  EXPECT_EQ(cu::nccl_socket_ifname("eth1", "127.0.0.1"), std::nullopt);
  EXPECT_EQ(cu::nccl_socket_ifname("", "127.0.0.1"), std::nullopt);  // set, if empty
}

// The export into this process's environment, where NCCL's init reads it (ctest runs each test
// in a process of its own).
TEST(NcclEnv, ExportSetsOnlyAnUnsetVariable) {
  ::unsetenv("NCCL_SOCKET_IFNAME");
  cu::export_nccl_socket_ifname("224.0.0.1");
  EXPECT_EQ(std::getenv("NCCL_SOCKET_IFNAME"), nullptr);
  cu::export_nccl_socket_ifname("127.0.0.1");
  ASSERT_NE(std::getenv("NCCL_SOCKET_IFNAME"), nullptr);
  EXPECT_STREQ(std::getenv("NCCL_SOCKET_IFNAME"), "=lo");
  ::setenv("NCCL_SOCKET_IFNAME", "^docker", 1);
  cu::export_nccl_socket_ifname("127.0.0.1");
  EXPECT_STREQ(std::getenv("NCCL_SOCKET_IFNAME"), "^docker");
  ::unsetenv("NCCL_SOCKET_IFNAME");
}

}  // namespace
