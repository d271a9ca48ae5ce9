#include "colibri/engine/op_timing.hpp"

#include <chrono>

namespace colibri::engine {

namespace {

std::uint64_t now_ns() noexcept {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

// An event whose waits are counted: the host blocked on a copy.
class TimedEvent final : public sdk::Event {
 public:
  TimedEvent(std::unique_ptr<sdk::Event> inner, TimedCompute::Counter& waits)
      : inner_(std::move(inner)), waits_(waits) {}
  sdk::Status wait() noexcept override {
    const auto t0 = now_ns();
    auto s = inner_->wait();
    waits_.add(now_ns() - t0);
    return s;
  }
  [[nodiscard]] bool ready() const noexcept override { return inner_->ready(); }

 private:
  std::unique_ptr<sdk::Event> inner_;
  TimedCompute::Counter& waits_;
};

}  // namespace

sdk::Status TimedCompute::run(const sdk::OpCall& call) noexcept {
  const auto t0 = now_ns();
  auto s = inner_->run(call);
  if (const auto i = static_cast<std::size_t>(call.op); i < ops_.size()) ops_[i].add(now_ns() - t0);
  return s;
}

sdk::Expected<std::unique_ptr<sdk::Event>> TimedCompute::copy_to_device_async(const void* src, sdk::Buffer& dst,
                                                                              std::size_t offset,
                                                                              std::size_t bytes) noexcept {
  const auto t0 = now_ns();
  auto e = inner_->copy_to_device_async(src, dst, offset, bytes);
  others_[kCopyToDevice].add(now_ns() - t0);
  if (!e) return e;
  return std::unique_ptr<sdk::Event>(std::make_unique<TimedEvent>(std::move(*e), others_[kEventWait]));
}

sdk::Expected<std::unique_ptr<sdk::Event>> TimedCompute::copy_to_host_async(const sdk::Buffer& src, std::size_t offset,
                                                                            void* dst, std::size_t bytes) noexcept {
  const auto t0 = now_ns();
  auto e = inner_->copy_to_host_async(src, offset, dst, bytes);
  others_[kCopyToHost].add(now_ns() - t0);
  if (!e) return e;
  return std::unique_ptr<sdk::Event>(std::make_unique<TimedEvent>(std::move(*e), others_[kEventWait]));
}

sdk::Status TimedCompute::synchronize() noexcept {
  const auto t0 = now_ns();
  auto s = inner_->synchronize();
  others_[kSynchronize].add(now_ns() - t0);
  return s;
}

std::vector<OpTime> TimedCompute::totals() const {
  std::vector<OpTime> out;
  const auto take = [&](std::string name, const Counter& c) {
    const auto calls = c.calls.load(std::memory_order_relaxed);
    if (calls == 0) return;
    out.push_back({std::move(name), calls, static_cast<double>(c.nanoseconds.load(std::memory_order_relaxed)) * 1e-9});
  };
  for (std::size_t i = 0; i < ops_.size(); ++i) take(sdk::op_name(static_cast<sdk::Op>(i)), ops_[i]);
  take("copy to device", others_[kCopyToDevice]);
  take("copy to host", others_[kCopyToHost]);
  take("synchronize", others_[kSynchronize]);
  take("event wait", others_[kEventWait]);
  return out;
}

void TimedCompute::reset() {
  const auto clear = [](Counter& c) {
    c.calls.store(0, std::memory_order_relaxed);
    c.nanoseconds.store(0, std::memory_order_relaxed);
  };
  for (auto& c : ops_) clear(c);
  for (auto& c : others_) clear(c);
}

}  // namespace colibri::engine
