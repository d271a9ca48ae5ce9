// What this machine is: CPU features (AMX only after a run-time probe), cores, memory.
#pragma once

#include "colibri/sdk/plugin.hpp"

namespace colibri::util {

// Detects the host once per process (cached); the AMX probe runs in a forked child so a fault
// there cannot take the process down.
const sdk::HostInfo& host_info();

// Physical cores available to this process (affinity mask, SMT siblings counted once).
unsigned physical_core_count();

// Bytes of RAM this process may use: MemAvailable, capped by a cgroup v2 memory.max.
std::uint64_t available_memory_bytes();

// memory.expert_cache: auto: 80% of available_memory_bytes() now. An upper bound (a model that fits maps only its
// experts); the shared weights and the KV cache, which fills as the context does, come out of the rest.
std::uint64_t auto_expert_cache_bytes();

// Raises this process's soft open-file limit (ulimit -n) to its hard limit, as servers do (systemd starts services
// at 1024 soft): connections and expert reads each hold a descriptor. Returns the soft limit now in force.
std::uint64_t raise_open_file_limit();

}  // namespace colibri::util
