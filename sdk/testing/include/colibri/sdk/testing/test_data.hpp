#pragma once
// Small helpers the SDK's suites and the plugins' own tests share: seeded normal data and a scoped environment
// variable.
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace colibri::sdk::testing {

// n values from N(0, sigma^2), the same for the same seed.
inline std::vector<float> randn(std::size_t n, unsigned seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Sets an environment variable for its lifetime and restores what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

}  // namespace colibri::sdk::testing
