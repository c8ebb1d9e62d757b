// The rendezvous store over real loopback TCP, with concurrent clients.
#include <gtest/gtest.h>

#include <atomic>

#include "helpers.hpp"
#include "store.hpp"

using namespace skyforge;
using namespace skyforge::net;
using namespace sftest;

namespace {

const std::string kSecret = "store-secret";

struct StoreFixture : ::testing::Test {
  IoThread io;
  StoreServer server{io.io(), "127.0.0.1", 0, kSecret};
  std::unique_ptr<StoreClient> client(uint32_t node = 0) {
    return StoreClient::connect("127.0.0.1", server.port(), kSecret, node, 2000);
  }
};

}  // namespace

TEST_F(StoreFixture, SetThenGet) {
  auto c = client();
  c->set("a", "1");
  const std::string binary("\0\xff\x01", 3);
  c->set("bin", binary);
  EXPECT_EQ(c->get("a", 1000), "1");
  EXPECT_EQ(c->get("bin", 0), binary);
  c->set("a", "overwritten");
  EXPECT_EQ(c->get("a", 0), "overwritten");
  c->set("empty", "");
  EXPECT_EQ(c->get("empty", 0), "");
  auto other = client(1);
  EXPECT_EQ(other->get("a", 0), "overwritten");
}

TEST_F(StoreFixture, GetWaitsForALaterSet) {
  auto waiter = client(0);
  auto setter = client(1);
  std::thread t([&] {
    std::this_thread::sleep_for(150ms);
    setter->set("nccl/unique_id", std::string(128, '\x42'));
  });
  const auto t0 = Clock::now();
  EXPECT_EQ(waiter->get("nccl/unique_id", 5000), std::string(128, '\x42'));
  EXPECT_GE(Clock::now() - t0, 100ms);
  t.join();
}

TEST_F(StoreFixture, GetTimesOutNamingKeyAndTimeout) {
  auto c = client();
  const auto t0 = Clock::now();
  try {
    c->get("missing/key", 150);
    FAIL();
  } catch (const StoreTimeout& e) {
    EXPECT_NE(std::string(e.what()).find("'missing/key'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("150 ms"), std::string::npos) << e.what();
  }
  const auto elapsed = Clock::now() - t0;
  EXPECT_GE(elapsed, 140ms);
  EXPECT_LT(elapsed, 1500ms);
  EXPECT_THROW(c->get("missing/key", 0), StoreTimeout);
  // The connection is still good afterwards, and a late set does not confuse anything.
  c->set("missing/key", "now");
  EXPECT_EQ(c->get("missing/key", 0), "now");
}

TEST_F(StoreFixture, BlockedGetDoesNotBlockTheSameClient) {
  auto c = client();
  std::atomic<bool> got{false};
  std::thread blocked([&] {
    EXPECT_EQ(c->get("later", 3000), "v");
    got = true;
  });
  std::this_thread::sleep_for(50ms);
  const auto t0 = Clock::now();
  for (int i = 0; i < 100; ++i) {
    c->set("k" + std::to_string(i), "x");
    EXPECT_EQ(c->add("counter", 1), i + 1);
  }
  EXPECT_LT(Clock::now() - t0, 1000ms);
  EXPECT_FALSE(got.load());
  c->set("later", "v");
  blocked.join();
  EXPECT_TRUE(got.load());
}

TEST_F(StoreFixture, AddIsAtomicAcrossClients) {
  constexpr int kClients = 8, kAdds = 1000;
  std::vector<std::unique_ptr<StoreClient>> clients;
  for (int i = 0; i < kClients; ++i) clients.push_back(client(static_cast<uint32_t>(i)));
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&, i] {
      for (int k = 0; k < kAdds; ++k) clients[static_cast<size_t>(i)]->add("counter", 1);
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(clients[0]->add("counter", 0), kClients * kAdds);
  EXPECT_EQ(clients[0]->get("counter", 0), std::to_string(kClients * kAdds));
  EXPECT_EQ(clients[1]->add("counter", -kClients * kAdds - 5), -5);
}

TEST_F(StoreFixture, ManyClientsRendezvous) {
  // Every "rank" publishes its address and reads everyone else's: the Gloo/NCCL bootstrap.
  constexpr int kRanks = 16;
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] {
      auto c = client(static_cast<uint32_t>(r));
      c->set("addr/" + std::to_string(r), "10.0.0." + std::to_string(r));
      c->add("arrived", 1);
      bool all = true;
      for (int o = 0; o < kRanks; ++o) all &= c->get("addr/" + std::to_string(o), 5000) == "10.0.0." + std::to_string(o);
      if (all) ++ok;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kRanks);
  auto c = client();
  EXPECT_EQ(c->add("arrived", 0), kRanks);
  std::vector<std::string> keys;
  for (int r = 0; r < kRanks; ++r) keys.push_back("addr/" + std::to_string(r));
  EXPECT_TRUE(c->check(keys));
  keys.push_back("addr/99");
  EXPECT_FALSE(c->check(keys));
  EXPECT_THROW(c->wait(keys, 100), StoreTimeout);
}

TEST_F(StoreFixture, ErrorsAreClear) {
  auto c = client();
  c->set("text", "not a number");
  try {
    c->add("text", 1);
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("not a decimal integer"), std::string::npos) << e.what();
  }
  EXPECT_THROW(c->set("", "v"), std::runtime_error);
  EXPECT_THROW(c->set(std::string(kMaxKeyBytes + 1, 'k'), "v"), std::runtime_error);
  c->set("big", std::to_string(INT64_MAX));
  EXPECT_THROW(c->add("big", 1), std::runtime_error);
  EXPECT_EQ(c->get("big", 0), std::to_string(INT64_MAX));
}

TEST_F(StoreFixture, WrongSecretIsRejected) {
  EXPECT_THROW(StoreClient::connect("127.0.0.1", server.port(), "wrong", 0, 2000), AuthError);
}

TEST_F(StoreFixture, ServerCloseFailsPendingCalls) {
  auto c = client();
  std::thread closer([&] {
    std::this_thread::sleep_for(100ms);
    server.close();
  });
  try {
    c->get("never", 10000);
    ADD_FAILURE() << "get returned after the store closed";
  } catch (const StoreTimeout&) {
    ADD_FAILURE() << "expected a lost connection, not a timeout";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("connection lost"), std::string::npos) << e.what();
  }
  closer.join();
  EXPECT_THROW(c->set("x", "y"), std::runtime_error);
}

TEST_F(StoreFixture, ClientDestructorIsPromptWithAGetPendingOnAnotherClient) {
  auto a = client();
  auto b = client();
  std::thread t([&] { EXPECT_THROW(a->get("nothing", 300), StoreTimeout); });
  const auto t0 = Clock::now();
  b.reset();
  EXPECT_LT(Clock::now() - t0, 1000ms);
  t.join();
}
