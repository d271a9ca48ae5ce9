// CPU features that __builtin_cpu_supports cannot name with every compiler (clang 14 knows neither "f16c" nor
// "avxvnni"), read from CPUID directly. Callers check AVX first: that check includes the OS's YMM state support.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace colibri::sdk {

// CPUID.1:ECX bit 29.
inline bool cpu_has_f16c() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & (1U << 29)) != 0;
#else
  return false;
#endif
}

// CPUID.(EAX=7,ECX=1):EAX bit 4 (AVX-VNNI, the VEX-encoded VNNI of Alder Lake and Sapphire Rapids).
inline bool cpu_has_avx_vnni() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) != 0 && (a & (1U << 4)) != 0;
#else
  return false;
#endif
}

}  // namespace colibri::sdk
