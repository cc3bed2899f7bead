// What this CPU offers, for reports (`attnres bench`, the micro-benchmarks, docs): model name,
// logical CPUs, cache sizes and the x86 SIMD extensions the kernels care about. Dispatch itself
// does not use this (Highway chooses its target at run time, see kernels/matmul.h
// matmul_simd_target()); this only reports.
// Thread-safety: cpu_info() is safe to call from any thread (computed once).
#pragma once

#include <cstddef>
#include <string>

namespace attnres {

struct CpuInfo {
  std::string model_name;  // "model name" of /proc/cpuinfo, or "unknown"
  int logical_cpus = 0;
  size_t l2_bytes = 0;   // per core, from sysfs (0 if unknown)
  size_t llc_bytes = 0;  // last-level cache, from sysfs (0 if unknown)
  bool avx2 = false, fma = false;
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false;
  bool avx512vnni = false, avx512bf16 = false;
};

const CpuInfo& cpu_info();

// "avx2 fma avx512f avx512bw avx512dq avx512vl avx512vnni avx512bf16" (those present).
std::string cpu_features_string(const CpuInfo& info);

}  // namespace attnres
