// CPU report (see cpu.h): /proc/cpuinfo for the model name, sysfs for caches, the compiler's
// cpuid wrapper for instruction-set extensions.
#include "util/cpu.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>

namespace attnres {
namespace {

// sysfs cache size text ("32768K", "1024K", "8M") -> bytes; 0 if unparsable.
size_t parse_size(const std::string& s) {
  size_t value = 0, i = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) value = value * 10 + (s[i] - '0');
  if (i == 0) return 0;
  if (i < s.size() && s[i] == 'K') return value << 10;
  if (i < s.size() && s[i] == 'M') return value << 20;
  return value;
}

CpuInfo detect() {
  CpuInfo info;
  info.model_name = "unknown";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos && colon + 2 <= line.size())
        info.model_name = line.substr(colon + 2);
      break;
    }
  }
  info.logical_cpus = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i);
    std::ifstream type_in(dir + "/type"), size_in(dir + "/size"), level_in(dir + "/level");
    std::string type, size;
    int level = 0;
    if (!(type_in >> type) || !(size_in >> size) || !(level_in >> level)) continue;
    if (type == "Instruction") continue;
    const size_t bytes = parse_size(size);
    if (level == 2) info.l2_bytes = bytes;
    info.llc_bytes = std::max(info.llc_bytes, bytes);
  }
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  info.avx2 = __builtin_cpu_supports("avx2");
  info.fma = __builtin_cpu_supports("fma");
  info.avx512f = __builtin_cpu_supports("avx512f");
  info.avx512bw = __builtin_cpu_supports("avx512bw");
  info.avx512dq = __builtin_cpu_supports("avx512dq");
  info.avx512vl = __builtin_cpu_supports("avx512vl");
  info.avx512vnni = __builtin_cpu_supports("avx512vnni");
  info.avx512bf16 = __builtin_cpu_supports("avx512bf16");
#endif
  return info;
}

}  // namespace

const CpuInfo& cpu_info() {
  static const CpuInfo info = detect();
  return info;
}

std::string cpu_features_string(const CpuInfo& info) {
  std::string out;
  const auto add = [&out](bool has, const char* name) {
    if (!has) return;
    if (!out.empty()) out += ' ';
    out += name;
  };
  add(info.avx2, "avx2");
  add(info.fma, "fma");
  add(info.avx512f, "avx512f");
  add(info.avx512bw, "avx512bw");
  add(info.avx512dq, "avx512dq");
  add(info.avx512vl, "avx512vl");
  add(info.avx512vnni, "avx512vnni");
  add(info.avx512bf16, "avx512bf16");
  return out;
}

}  // namespace attnres
