// The driver that turns a fuzz target into a unit test where libFuzzer is not used (g++ builds, CI): it runs every
// file of the corpus, then a fixed number of deterministic mutations of them (bit flips, byte changes, inserts,
// deletions, copies and splices), so each run covers more than the seeds and fails the same way every time. An input
// that crashes or breaks a property is written to ./fuzz-crash-<target> for `colibri_fuzz_<target> FILE` (or this
// binary) to replay. --trace names each input before it runs (to find one that hangs), --save N FILE writes mutation N.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);
// A target that needs files this machine may lack defines this; a non-null reason skips the test.
extern "C" __attribute__((weak)) const char* colibri_fuzz_unavailable();
extern "C" __attribute__((weak)) void __sanitizer_set_death_callback(void (*callback)());

namespace {

const std::string* g_current = nullptr;
char g_crash_path[512] = "fuzz-crash";

void save_current() {
  if (g_current == nullptr) return;
  const int fd = ::open(g_crash_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  const char* p = g_current->data();
  std::size_t left = g_current->size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n <= 0) break;
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  ::close(fd);
  const char note[] = "the failing input is in ";
  (void)!::write(2, note, sizeof(note) - 1);
  (void)!::write(2, g_crash_path, std::strlen(g_crash_path));
  (void)!::write(2, "\n", 1);
  g_current = nullptr;
}

void on_signal(int sig) {
  save_current();
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

std::string mutate(const std::vector<std::string>& corpus, std::mt19937_64& rng) {
  auto pick = [&](std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng() % n); };
  std::string s = corpus[pick(corpus.size())];
  static constexpr unsigned char kInteresting[] = {0,   1,   0x7f, 0x80, 0xff, '"', '\\', '{', '}', '[', ']', ',',
                                                   ':', '<', '>',  '|',  '\n', ' ', '0',  '9', '-', 'e', '.', '%'};
  const int steps = 1 + static_cast<int>(rng() % 4);
  for (int i = 0; i < steps; ++i) {
    switch (rng() % 8) {
      case 0:
        if (!s.empty()) s[pick(s.size())] ^= static_cast<char>(1U << (rng() % 8));
        break;
      case 1:
        if (!s.empty()) s[pick(s.size())] = static_cast<char>(kInteresting[pick(sizeof(kInteresting))]);
        break;
      case 2: s.insert(pick(s.size() + 1), 1, static_cast<char>(rng() & 0xff)); break;
      case 3:
        if (!s.empty()) {
          const std::size_t at = pick(s.size());
          s.erase(at, 1 + pick(std::min<std::size_t>(16, s.size() - at)));
        }
        break;
      case 4:
        if (!s.empty()) {  // copy a piece elsewhere
          const std::size_t from = pick(s.size());
          const std::string piece = s.substr(from, 1 + pick(32));
          s.insert(pick(s.size() + 1), piece);
        }
        break;
      case 5: {  // splice: a piece of another input
        const std::string& other = corpus[pick(corpus.size())];
        if (!other.empty()) {
          const std::size_t from = pick(other.size());
          s.insert(pick(s.size() + 1), other.substr(from, 1 + pick(64)));
        }
        break;
      }
      case 6:
        if (s.size() > 1) s.resize(pick(s.size()));  // truncate
        break;
      case 7:
        if (s.size() >= 8) {  // overwrite a little-endian integer-sized field with an extreme value
          const std::size_t at = pick(s.size() - 7);
          const std::uint64_t v = (rng() % 2 == 0) ? ~std::uint64_t{0} >> pick(64) : std::uint64_t{1} << pick(64);
          std::memcpy(s.data() + at, &v, 1U << pick(4));
        }
        break;
    }
  }
  if (s.size() > (1U << 20)) s.resize(1U << 20);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::filesystem::path> inputs;
  long mutations = 0;
  std::uint64_t seed = 1;
  std::string name = std::filesystem::path(argv[0]).filename().string();
  bool trace = false;
  long save_index = -1;
  std::string save_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mutations" && i + 1 < argc) {
      mutations = std::strtol(argv[++i], nullptr, 10);
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--trace") {
      trace = true;
    } else if (a == "--save" && i + 2 < argc) {  // writes mutation N to FILE instead of running anything
      save_index = std::strtol(argv[++i], nullptr, 10);
      save_path = argv[++i];
    } else if (a.rfind("--", 0) == 0) {
      std::fprintf(stderr,
                   "%s: unknown option '%s' (use: [--mutations N] [--seed S] [--trace] [--save N FILE] FILE|DIR...)\n",
                   name.c_str(), a.c_str());
      return 2;
    } else {
      inputs.emplace_back(a);
    }
  }
  if (colibri_fuzz_unavailable != nullptr) {
    if (const char* reason = colibri_fuzz_unavailable()) {
      std::printf("skipped: %s\n", reason);
      return 77;
    }
  }
  std::vector<std::pair<std::string, std::string>> corpus;  // (where, bytes)
  for (const auto& in : inputs) {
    if (std::filesystem::is_directory(in)) {
      std::vector<std::filesystem::path> files;
      for (const auto& e : std::filesystem::directory_iterator(in)) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
      std::sort(files.begin(), files.end());
      for (const auto& f : files) corpus.emplace_back(f.string(), colibri::fuzz::read_file(f));
    } else if (std::filesystem::is_regular_file(in)) {
      corpus.emplace_back(in.string(), colibri::fuzz::read_file(in));
    } else {
      std::fprintf(stderr, "%s: '%s' is neither a file nor a directory\n", name.c_str(), in.c_str());
      return 2;
    }
  }
  if (corpus.empty()) {
    std::fprintf(stderr, "%s: no inputs (give corpus files or directories)\n", name.c_str());
    return 2;
  }
  std::snprintf(g_crash_path, sizeof(g_crash_path), "fuzz-crash-%s", name.c_str());
  for (const int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) ::signal(sig, on_signal);
  if (__sanitizer_set_death_callback != nullptr) __sanitizer_set_death_callback(save_current);

  std::string current;
  if (save_index >= 0) {
    std::vector<std::string> seeds;
    for (const auto& c : corpus) seeds.push_back(c.second);
    std::mt19937_64 rng(seed);
    for (long i = 0; i <= save_index; ++i) current = mutate(seeds, rng);
    std::ofstream(save_path, std::ios::binary) << current;
    std::printf("mutation %ld (seed %llu) written to %s\n", save_index, static_cast<unsigned long long>(seed),
                save_path.c_str());
    return 0;
  }
  for (const auto& [where, bytes] : corpus) {
    if (trace) std::fprintf(stderr, "corpus %s\n", where.c_str());
    current = bytes;
    g_current = &current;
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(current.data()), current.size());
  }
  std::vector<std::string> seeds;
  for (const auto& c : corpus) seeds.push_back(c.second);
  std::mt19937_64 rng(seed);
  for (long i = 0; i < mutations; ++i) {
    current = mutate(seeds, rng);
    if (trace) std::fprintf(stderr, "mutation %ld (%zu bytes)\n", i, current.size());
    g_current = &current;
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(current.data()), current.size());
  }
  g_current = nullptr;
  std::printf("%s: %zu corpus inputs and %ld mutations (seed %llu) ran clean\n", name.c_str(), corpus.size(), mutations,
              static_cast<unsigned long long>(seed));
  return 0;
}
