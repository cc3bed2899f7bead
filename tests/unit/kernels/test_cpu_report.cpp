// CPU report (util/cpu.h) against what Highway's runtime dispatch chose: the two read the CPU
// independently, so they must agree (an AVX3 target implies AVX-512 F/BW/DQ/VL, AVX2 implies
// AVX2 + FMA), and the report must be self-consistent.
#include <gtest/gtest.h>

#include <string>

#include "kernels/matmul.h"
#include "util/cpu.h"

namespace attnres {
namespace {

TEST(CpuReport, AgreesWithDispatchedTarget) {
  const CpuInfo& info = cpu_info();
  EXPECT_FALSE(info.model_name.empty());
  EXPECT_GE(info.logical_cpus, 1);
  const std::string target = matmul_simd_target();
  if (target == "AVX3" || target == "AVX3_DL") {
    EXPECT_TRUE(info.avx512f && info.avx512bw && info.avx512dq && info.avx512vl);
  }
  if (target == "AVX2" || target.rfind("AVX3", 0) == 0) {
    EXPECT_TRUE(info.avx2 && info.fma);
  }
  if (info.avx512f && info.avx512bw && info.avx512dq && info.avx512vl) {
    EXPECT_EQ(target.rfind("AVX3", 0), 0u) << "AVX-512 present but dispatch chose " << target;
  }
  if (info.avx512bf16) {
    EXPECT_TRUE(info.avx512f);
  }
  const std::string features = cpu_features_string(info);
  EXPECT_EQ(features.find("avx512bf16") != std::string::npos, info.avx512bf16);
  EXPECT_EQ(features.find("avx2") != std::string::npos, info.avx2);
}

TEST(CpuReport, CacheSizesArePlausible) {
  const CpuInfo& info = cpu_info();
  if (info.llc_bytes == 0) GTEST_SKIP() << "no cache sizes in sysfs on this machine";
  EXPECT_GE(info.llc_bytes, info.l2_bytes);
  EXPECT_GE(info.llc_bytes, size_t{64} << 10);
}

}  // namespace
}  // namespace attnres
