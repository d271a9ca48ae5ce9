#include "colibri/util/host_info.hpp"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <limits>
#include <set>
#include <string>
#include <utility>

#include "colibri/sdk/cpu_features.hpp"

namespace colibri::util {

namespace {

std::uint64_t meminfo_bytes(const char* key) {
  std::ifstream in("/proc/meminfo");
  std::string name;
  std::uint64_t kib = 0;
  std::string unit;
  while (in >> name >> kib) {
    std::getline(in, unit);
    if (name == key) return kib * 1024;
  }
  return 0;
}

std::uint64_t cgroup_limit_bytes() {
  std::ifstream in("/sys/fs/cgroup/memory.max");
  std::string v;
  if (!(in >> v) || v == "max") return 0;
  try {
    return std::stoull(v);
  } catch (...) {
    return 0;
  }
}

// AMX needs the kernel's permission for the tile state, and some hypervisors fault on tile
// instructions even when CPUID reports them: run one in a child and see whether it survives.
bool probe_amx() {
  if (!__builtin_cpu_supports("avx512f")) return false;
  unsigned eax = 7, ebx = 0, ecx = 0, edx = 0;
  __asm__ volatile("cpuid" : "+a"(eax), "=b"(ebx), "+c"(ecx), "=d"(edx));
  const bool amx_tile = (edx >> 24) & 1u;
  if (!amx_tile) return false;
  const pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    constexpr long kArchReqXcompPerm = 0x1023;
    constexpr long kXfeatureXtiledata = 18;
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) _exit(2);
    alignas(64) unsigned char cfg[64] = {};
    cfg[0] = 1;                                                                    // palette 1
    cfg[16] = 64;                                                                  // tile 0: 64 bytes per row
    cfg[48] = 1;                                                                   // tile 0: 1 row
    __asm__ volatile(".byte 0xc4, 0xe2, 0x78, 0x49, 0x00" ::"a"(cfg) : "memory");  // ldtilecfg [rax]
    __asm__ volatile(".byte 0xc4, 0xe2, 0x78, 0x49, 0xc0" ::: "memory");           // tilerelease
    _exit(0);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return false;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

sdk::HostInfo detect() {
  sdk::HostInfo h;
  __builtin_cpu_init();
  h.avx2 = __builtin_cpu_supports("avx2");
  h.fma = __builtin_cpu_supports("fma");
  h.f16c = sdk::cpu_has_f16c();
  h.avx512f = __builtin_cpu_supports("avx512f");
  h.avx512bw = __builtin_cpu_supports("avx512bw");
  h.avx512vl = __builtin_cpu_supports("avx512vl");
  h.avx512_vnni = __builtin_cpu_supports("avx512vnni");
  h.avx512_bf16 = __builtin_cpu_supports("avx512bf16");
  h.avx_vnni = sdk::cpu_has_avx_vnni();
  h.amx_usable = probe_amx();
  h.physical_cores = physical_core_count();
  h.logical_cpus = static_cast<unsigned>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  h.ram_total_bytes = meminfo_bytes("MemTotal:");
  h.ram_available_bytes = available_memory_bytes();
  utsname u{};
  if (uname(&u) == 0) h.kernel_release = u.release;
  return h;
}

}  // namespace

const sdk::HostInfo& host_info() {
  static const sdk::HostInfo info = detect();
  return info;
}

unsigned physical_core_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  std::set<std::pair<std::string, std::string>> cores;
  unsigned logical = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    ++logical;
    const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::ifstream core_in(base + "core_id"), pkg_in(base + "physical_package_id");
    std::string core, pkg;
    if (!(core_in >> core) || !(pkg_in >> pkg)) {
      core = std::to_string(cpu);
      pkg = "0";
    }
    cores.emplace(pkg, core);
  }
  const auto n = static_cast<unsigned>(cores.size());
  return n > 0 ? n : std::max(1u, logical);
}

std::uint64_t available_memory_bytes() {
  std::uint64_t avail = meminfo_bytes("MemAvailable:");
  const std::uint64_t limit = cgroup_limit_bytes();
  if (limit > 0 && (avail == 0 || limit < avail)) avail = limit;
  return avail;
}

std::uint64_t auto_expert_cache_bytes() {
  return available_memory_bytes() / 10 * 8;
}

std::uint64_t raise_open_file_limit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return 0;
  if (lim.rlim_cur < lim.rlim_max) {
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
  }
  return lim.rlim_cur == RLIM_INFINITY ? std::numeric_limits<std::uint64_t>::max() : lim.rlim_cur;
}

}  // namespace colibri::util
