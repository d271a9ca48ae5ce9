// sdk/device_copies.hpp: the buffer ownership check and the bookkeeping of copies in flight of device backends.
#include "colibri/sdk/device_copies.hpp"

#include <gtest/gtest.h>

#include <mutex>

namespace {

using namespace colibri::sdk;

struct OwnedBuffer final : Buffer {
  int owner;
  std::size_t bytes;
  OwnedBuffer(int o, std::size_t n) : owner(o), bytes(n) {}
  [[nodiscard]] std::size_t size() const noexcept override { return bytes; }
  [[nodiscard]] void* host_pointer() noexcept override { return nullptr; }
};

struct ForeignBuffer final : Buffer {
  [[nodiscard]] std::size_t size() const noexcept override { return 1024; }
  [[nodiscard]] void* host_pointer() noexcept override { return nullptr; }
};

TEST(OwnBuffer, OnlyThisObjectsBuffersAndOnlyInside) {
  auto ours = [](const OwnedBuffer& b) { return b.owner == 1; };
  OwnedBuffer mine(1, 100), theirs(2, 100);
  ForeignBuffer foreign;
  auto ok = own_buffer<OwnedBuffer>(mine, 60, 40, "copy_to_device_async", "Test", ours);
  ASSERT_TRUE(ok);
  EXPECT_EQ(*ok, &mine);
  for (const Buffer* b : {static_cast<const Buffer*>(&theirs), static_cast<const Buffer*>(&foreign)}) {
    auto no = own_buffer<OwnedBuffer>(*b, 0, 1, "copy_to_device_async", "Test", ours);
    ASSERT_FALSE(no);
    EXPECT_EQ(no.error().message(), "copy_to_device_async: the buffer was not allocated by this Test compute object");
  }
  auto over = own_buffer<OwnedBuffer>(mine, 60, 41, "copy_to_host_async", "Test", ours);
  ASSERT_FALSE(over);
  EXPECT_EQ(over.error().message(), "copy_to_host_async: 41 bytes at offset 60 overrun the buffer of 100 bytes");
}

// A copy that lands when the test says so and reports `result` once finished.
struct FakeCopy {
  bool landed = false;
  Status result;
  int finishes = 0;
  std::mutex mu;
  bool finished = false;
  Status finish(bool block) noexcept {
    std::lock_guard lock(mu);
    if (finished) return result;
    if (!block && !landed) return {};
    ++finishes;
    finished = true;
    return result;
  }
  bool is_finished() noexcept {
    std::lock_guard lock(mu);
    return finished;
  }
};

TEST(CopiesInFlight, EventsFinishOnceAndSynchronizeFinishesTheRest) {
  CopiesInFlight<FakeCopy> copies;
  auto a = std::make_shared<FakeCopy>(), b = std::make_shared<FakeCopy>(), c = std::make_shared<FakeCopy>();
  b->result = Status(StatusCode::io_error, "b failed");
  c->result = Status(StatusCode::io_error, "c failed");
  auto ea = copies.track(a);
  auto eb = copies.track(b);
  auto ec = copies.track(c);
  EXPECT_FALSE(ea->ready());  // not landed yet
  a->landed = true;
  EXPECT_TRUE(ea->ready());
  EXPECT_TRUE(ea->wait());
  const Status all = copies.finish_all();  // a is done; b and c are waited for, the first error wins
  EXPECT_EQ(all.message(), "b failed");
  EXPECT_TRUE(b->is_finished() && c->is_finished());
  EXPECT_EQ(eb->wait().message(), "b failed");  // finished already: the same status, no second finish
  EXPECT_EQ(a->finishes + b->finishes + c->finishes, 3);
  EXPECT_TRUE(copies.finish_all());  // nothing left in flight
}

}  // namespace
