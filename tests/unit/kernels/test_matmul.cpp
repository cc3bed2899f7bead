// Dispatched projections (matmul_hwy.cpp) against their scalar twins (matmul_ref.cpp), on every
// Highway target this CPU supports (AVX3, AVX2, SSE4, SSSE3, SCALAR here), over sizes that are
// and are not multiples of the vector width and of the register tile, T = 1 (decode GEMV) and
// T > 1 (prefill GEMM), F32/BF16/MXFP4 weights.
//
// Two kinds of check:
//  - exact: small-integer (or power-of-two-scaled) data whose every partial sum is exactly
//    representable, so any accumulation order gives the same bits; fast == ref bitwise. This
//    catches a dropped, duplicated or misplaced term, which a tolerance could hide.
//  - bounded: random data; |y - y_ref| <= (2K + 8) u sum_k |x_k w_k| (u = 2^-24), the sum of the
//    worst-case bounds of the two accumulation orders (matmul_hwy.cpp header).
// Plus bitwise thread-count invariance (1 vs 2 OpenMP threads) and decode/prefill consistency
// (a token's row is bitwise the same in a T = 1 call and inside a T > 1 call).
#include <gtest/gtest.h>
#include <hwy/highway.h>
#include <hwy/targets.h>
#include "util/parallel.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/hwy_targets.h"
#include "kernels/matmul.h"

namespace attnres {
namespace {

struct Shape {
  int64_t T, N, K;
};

// Covers K < 4, K == a vector width (4, 8, 16), K one off a width, long K with ragged tails;
// N and T around the register tiles (3x3, 4x6, 2x4) and blocks.
const Shape kDenseShapes[] = {{1, 1, 1},    {1, 7, 5},    {1, 13, 16},  {2, 6, 8},
                              {3, 10, 17},  {5, 9, 33},   {7, 13, 100}, {1, 64, 64},
                              {9, 20, 129}, {4, 25, 250}, {13, 31, 47}, {1, 37, 1031}};
// K is a multiple of the 32-element MXFP4 block.
const Shape kMxfp4Shapes[] = {{1, 1, 32},   {1, 7, 64},   {2, 6, 96},  {3, 10, 32},
                              {5, 13, 160}, {1, 50, 512}, {9, 20, 64}, {13, 7, 256}};

// for_each_target (hwy_targets.h), also checking that matmul dispatches to the forced target.
template <class Body>
void for_each_matmul_target(const Body& body) {
  for_each_target([&](int64_t target) {
    ASSERT_STREQ(matmul_simd_target(), hwy::TargetName(target));
    body();
  });
}

TensorView make_view(DType dtype, int64_t N, int64_t K, const void* data, size_t elem) {
  TensorView v;
  v.name = "w";
  v.dtype = dtype;
  v.shape = {N, K};
  v.data = static_cast<const std::byte*>(data);
  v.nbytes = static_cast<size_t>(N * K) * elem;
  return v;
}

// Dense weights in both storage types from the same f32 values (exact in bf16 when integral).
struct DenseCase {
  Shape s;
  std::vector<float> x, w32;
  std::vector<bf16> w16;
  TensorView view(DType d) const {
    return d == DType::kF32 ? make_view(d, s.N, s.K, w32.data(), 4)
                            : make_view(d, s.N, s.K, w16.data(), 2);
  }
};

DenseCase make_dense(Shape s, bool integers, uint32_t seed) {
  std::mt19937 rng(seed);
  DenseCase c{s, {}, {}, {}};
  std::uniform_int_distribution<int> xi(-4, 4), wi(-8, 8);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  c.x.resize(static_cast<size_t>(s.T * s.K));  // [T, K]
  for (float& v : c.x) v = integers ? static_cast<float>(xi(rng)) : nd(rng);
  c.w16.resize(static_cast<size_t>(s.N * s.K));  // [N, K]
  c.w32.resize(c.w16.size());                    // [N, K]
  for (size_t i = 0; i < c.w16.size(); ++i) {
    c.w16[i] = f32_to_bf16(integers ? static_cast<float>(wi(rng)) : nd(rng));
    c.w32[i] = bf16_to_f32(c.w16[i]);
  }
  return c;
}

// |y - y_ref| <= (2K + 8) u sum_k |x_k w_k| for every output element.
template <class GetW>
void expect_within_bound(const std::vector<float>& x, Shape s, const GetW& get_w,
                         const std::vector<float>& y, const std::vector<float>& ref) {
  const double u = std::ldexp(1.0, -24);
  for (int64_t t = 0; t < s.T; ++t) {
    for (int64_t n = 0; n < s.N; ++n) {
      double mag = 0.0;
      for (int64_t k = 0; k < s.K; ++k)
        mag += std::fabs(static_cast<double>(x[t * s.K + k]) * get_w(n, k));
      const size_t i = static_cast<size_t>(t * s.N + n);
      if (std::isnan(ref[i])) {
        EXPECT_TRUE(std::isnan(y[i])) << "t=" << t << " n=" << n;
        continue;
      }
      const double bound = (2.0 * static_cast<double>(s.K) + 8.0) * u * mag;
      EXPECT_LE(std::fabs(static_cast<double>(y[i]) - ref[i]), bound)
          << "t=" << t << " n=" << n << " K=" << s.K << " y=" << y[i] << " ref=" << ref[i];
    }
  }
}

std::string shape_str(Shape s) {
  return "T=" + std::to_string(s.T) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K);
}

TEST(Matmul, DenseExactOnIntegerData) {
  for_each_matmul_target([] {
    for (Shape s : kDenseShapes) {
      SCOPED_TRACE(shape_str(s));
      const DenseCase c = make_dense(s, /*integers=*/true, 1);
      for (DType d : {DType::kF32, DType::kBF16}) {
        std::vector<float> y(static_cast<size_t>(s.T * s.N), -1.0f);    // [T, N]
        std::vector<float> ref(static_cast<size_t>(s.T * s.N), -2.0f);  // [T, N]
        matmul(c.x.data(), s.T, c.view(d), y.data());
        matmul_ref(c.x.data(), s.T, c.view(d), ref.data());
        ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * sizeof(float))) << dtype_name(d);
      }
    }
  });
}

TEST(Matmul, DenseRandomWithinBound) {
  for_each_matmul_target([] {
    for (Shape s : kDenseShapes) {
      SCOPED_TRACE(shape_str(s));
      const DenseCase c = make_dense(s, /*integers=*/false, 2);
      for (DType d : {DType::kF32, DType::kBF16}) {
        std::vector<float> y(static_cast<size_t>(s.T * s.N));    // [T, N]
        std::vector<float> ref(static_cast<size_t>(s.T * s.N));  // [T, N]
        matmul(c.x.data(), s.T, c.view(d), y.data());
        matmul_ref(c.x.data(), s.T, c.view(d), ref.data());
        expect_within_bound(
            c.x, s, [&](int64_t n, int64_t k) { return c.w32[n * s.K + k]; }, y, ref);
      }
    }
  });
}

struct Mxfp4Case {
  Shape s;
  std::vector<float> x;         // [T, K]
  std::vector<uint8_t> packed;  // [N, K/2]
  std::vector<uint8_t> scale;   // [N, K/32]
  float w(int64_t n, int64_t k) const {
    return mxfp4_get(packed.data() + n * (s.K / 2), scale.data() + n * (s.K / 32), k);
  }
};

// Codes uniform over all 16 (code 8 = -0.0 included); scales uniform in [lo, hi].
Mxfp4Case make_mxfp4(Shape s, bool integers, int scale_lo, int scale_hi, uint32_t seed) {
  std::mt19937 rng(seed);
  Mxfp4Case c{s, {}, {}, {}};
  std::uniform_int_distribution<int> xi(-4, 4), byte(0, 255), sc(scale_lo, scale_hi);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  c.x.resize(static_cast<size_t>(s.T * s.K));
  for (float& v : c.x) v = integers ? static_cast<float>(xi(rng)) : nd(rng);
  c.packed.resize(static_cast<size_t>(s.N * s.K / 2));
  for (uint8_t& b : c.packed) b = static_cast<uint8_t>(byte(rng));
  c.scale.resize(static_cast<size_t>(s.N * s.K / 32));
  for (uint8_t& b : c.scale) b = static_cast<uint8_t>(sc(rng));
  return c;
}

void run_mxfp4(const Mxfp4Case& c, std::vector<float>& y, std::vector<float>& ref) {
  const Shape s = c.s;
  y.assign(static_cast<size_t>(s.T * s.N), -1.0f);
  ref.assign(y.size(), -2.0f);
  mxfp4_matmul(c.x.data(), s.T, c.packed.data(), c.scale.data(), s.N, s.K, y.data());
  mxfp4_matmul_ref(c.x.data(), s.T, c.packed.data(), c.scale.data(), s.N, s.K, ref.data());
}

TEST(Mxfp4Matmul, ExactOnIntegerData) {
  // Scales 2^-2 .. 2^3: every product is a multiple of 2^-3 below 2^8, sums stay below 2^20.
  for_each_matmul_target([] {
    for (Shape s : kMxfp4Shapes) {
      SCOPED_TRACE(shape_str(s));
      const Mxfp4Case c = make_mxfp4(s, /*integers=*/true, 125, 130, 3);
      std::vector<float> y, ref;
      run_mxfp4(c, y, ref);
      ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * sizeof(float)));
    }
  });
}

TEST(Mxfp4Matmul, RandomWideScalesWithinBound) {
  // Scales 2^-27 .. 2^23: results span many binades; random signs cancel.
  for_each_matmul_target([] {
    for (Shape s : kMxfp4Shapes) {
      SCOPED_TRACE(shape_str(s));
      const Mxfp4Case c = make_mxfp4(s, /*integers=*/false, 100, 150, 4);
      std::vector<float> y, ref;
      run_mxfp4(c, y, ref);
      expect_within_bound(
          c.x, s, [&](int64_t n, int64_t k) { return c.w(n, k); }, y, ref);
    }
  });
}

TEST(Mxfp4Matmul, ExtremeScalesAndNegativeZero) {
  // Row 0: scale 0 (2^-127, subnormal weights); row 1: scale 1; row 2: scale 245 (2^118) with
  // codes of magnitude <= 1 (finite sums near 2^120); row 3: scale 255 (NaN) -> NaN; row 4:
  // every code 8 (-0.0) -> exactly +0.0 as in the reference, also for negative x; rows 5..6:
  // random.
  const Shape s{3, 7, 64};
  Mxfp4Case c = make_mxfp4(s, /*integers=*/false, 120, 135, 5);
  const int64_t bpr = s.K / 2, spr = s.K / 32;
  std::mt19937 rng(6);
  std::uniform_int_distribution<int> small_code(0, 2);
  for (int64_t i = 0; i < spr; ++i) {
    c.scale[0 * spr + i] = 0;
    c.scale[1 * spr + i] = 1;
    c.scale[2 * spr + i] = 245;
    c.scale[3 * spr + i] = 255;
  }
  for (int64_t i = 0; i < bpr; ++i) {
    const int lo = small_code(rng) | (i % 2 ? 8 : 0), hi = small_code(rng) | (i % 3 ? 8 : 0);
    c.packed[2 * bpr + i] = static_cast<uint8_t>(lo | (hi << 4));
    c.packed[4 * bpr + i] = 0x88;
  }
  for (int64_t k = 0; k < s.K; ++k) c.x[k] = -std::fabs(c.x[k]) - 0.01f;  // token 0 negative
  for_each_matmul_target([&] {
    std::vector<float> y, ref;
    run_mxfp4(c, y, ref);
    expect_within_bound(
        c.x, s, [&](int64_t n, int64_t k) { return c.w(n, k); }, y, ref);
    for (int64_t t = 0; t < s.T; ++t) {
      EXPECT_TRUE(std::isnan(y[t * s.N + 3]));
      EXPECT_EQ(y[t * s.N + 4], 0.0f);
      EXPECT_FALSE(std::signbit(y[t * s.N + 4]));
      EXPECT_EQ(std::signbit(ref[t * s.N + 4]), std::signbit(y[t * s.N + 4]));
      EXPECT_TRUE(std::isfinite(y[t * s.N + 2]));
      EXPECT_NE(y[t * s.N + 0], 0.0f);  // subnormal weights still contribute
    }
  });
}

// Results must not depend on the thread count: 1 vs 2 vs 3 OpenMP threads, bitwise. Shapes are
// above the kernels' serial cutoff (T N K >= 2^18) so the parallel partition is exercised.
TEST(Matmul, ThreadCountInvariant) {
  const int saved = parallel_threads();
  const Shape s{11, 130, 300};
  const DenseCase c = make_dense(s, /*integers=*/false, 7);
  const Mxfp4Case q = make_mxfp4({11, 130, 320}, /*integers=*/false, 110, 140, 8);
  for_each_matmul_target([&] {
    std::vector<float> ref[3];  // with 1 thread: f32, bf16, mxfp4
    for (int threads : {1, 2, 3}) {
      set_parallel_threads(threads);
      std::vector<float> out[3];
      int i = 0;
      for (DType d : {DType::kF32, DType::kBF16}) {
        out[i].assign(static_cast<size_t>(s.T * s.N), 0.0f);
        matmul(c.x.data(), s.T, c.view(d), out[i].data());
        ++i;
      }
      out[2].assign(static_cast<size_t>(q.s.T * q.s.N), 0.0f);
      mxfp4_matmul(q.x.data(), q.s.T, q.packed.data(), q.scale.data(), q.s.N, q.s.K, out[2].data());
      for (int j = 0; j < 3; ++j) {
        if (threads == 1) {
          ref[j] = out[j];
        } else {
          EXPECT_EQ(0, std::memcmp(ref[j].data(), out[j].data(), ref[j].size() * sizeof(float)))
              << "kernel " << j << " with " << threads << " threads";
        }
      }
    }
  });
  set_parallel_threads(saved);
}

// A token's outputs are bitwise the same whether it is decoded alone (T = 1, GEMV) or sits in
// any position of a prefill batch (T > 1, GEMM): per-element arithmetic ignores the tiling.
TEST(Matmul, DecodeMatchesPrefillRows) {
  // T N K >= 2^18: the prefill call runs in parallel, the decode calls serially.
  const Shape s{12, 300, 77};
  const DenseCase c = make_dense(s, /*integers=*/false, 9);
  const Mxfp4Case q = make_mxfp4({12, 300, 96}, /*integers=*/false, 115, 135, 10);
  for_each_matmul_target([&] {
    std::vector<float> all(static_cast<size_t>(s.T * s.N)), one(static_cast<size_t>(s.N));
    matmul(c.x.data(), s.T, c.view(DType::kBF16), all.data());
    for (int64_t t = 0; t < s.T; ++t) {
      matmul(c.x.data() + t * s.K, 1, c.view(DType::kBF16), one.data());
      EXPECT_EQ(0, std::memcmp(one.data(), all.data() + t * s.N, one.size() * sizeof(float)));
    }
    std::vector<float> qall(static_cast<size_t>(q.s.T * q.s.N)), qone(static_cast<size_t>(q.s.N));
    mxfp4_matmul(q.x.data(), q.s.T, q.packed.data(), q.scale.data(), q.s.N, q.s.K, qall.data());
    for (int64_t t = 0; t < q.s.T; ++t) {
      mxfp4_matmul(q.x.data() + t * q.s.K, 1, q.packed.data(), q.scale.data(), q.s.N, q.s.K,
                   qone.data());
      EXPECT_EQ(0, std::memcmp(qone.data(), qall.data() + t * q.s.N, qone.size() * sizeof(float)));
    }
  });
}

TEST(Matmul, ReportsChosenTarget) {
  // Dispatch picks the best compiled target the CPU supports (lowest bit = best).
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  EXPECT_STREQ(matmul_simd_target(), hwy::TargetName(targets.front()));
}

}  // namespace
}  // namespace attnres

namespace attnres {
namespace {

// matmul_bf16: bf16 activations (the dense cases' x rounded to bf16; integers stay exact).
std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
  return out;
}

std::vector<float> widen_all(const std::vector<bf16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_f32(v[i]);
  return out;
}

TEST(MatmulBf16Act, ExactOnIntegerDataAndWithinBoundOnRandom) {
  for_each_matmul_target([] {
    for (Shape s : kDenseShapes) {
      SCOPED_TRACE(shape_str(s));
      for (bool integers : {true, false}) {
        const DenseCase c = make_dense(s, integers, integers ? 11 : 12);
        const std::vector<bf16> xb = to_bf16(c.x);  // [T, K]
        for (DType d : {DType::kF32, DType::kBF16}) {
          std::vector<float> y(static_cast<size_t>(s.T * s.N), -1.0f);    // [T, N]
          std::vector<float> ref(static_cast<size_t>(s.T * s.N), -2.0f);  // [T, N]
          matmul_bf16(xb.data(), s.T, c.view(d), y.data());
          matmul_bf16_ref(xb.data(), s.T, c.view(d), ref.data());
          if (integers) {
            ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * sizeof(float)))
                << dtype_name(d);
          } else {
            expect_within_bound(
                widen_all(xb), s, [&](int64_t n, int64_t k) { return c.w32[n * s.K + k]; }, y, ref);
          }
        }
      }
    }
  });
}

TEST(MatmulBf16Act, ThreadCountInvariantAndDecodeMatchesPrefill) {
  const int saved = parallel_threads();
  const Shape s{12, 130, 300};  // above the serial cutoff
  const DenseCase c = make_dense(s, /*integers=*/false, 13);
  const std::vector<bf16> xb = to_bf16(c.x);
  for_each_matmul_target([&] {
    for (DType d : {DType::kF32, DType::kBF16}) {
      std::vector<float> ref;
      for (int threads : {1, 2, 3}) {
        set_parallel_threads(threads);
        std::vector<float> y(static_cast<size_t>(s.T * s.N));
        matmul_bf16(xb.data(), s.T, c.view(d), y.data());
        if (threads == 1) {
          ref = y;
        } else {
          EXPECT_EQ(0, std::memcmp(ref.data(), y.data(), y.size() * sizeof(float))) << threads;
        }
      }
      std::vector<float> one(static_cast<size_t>(s.N));
      for (int64_t t = 0; t < s.T; ++t) {
        matmul_bf16(xb.data() + t * s.K, 1, c.view(d), one.data());
        EXPECT_EQ(0, std::memcmp(one.data(), ref.data() + t * s.N, one.size() * sizeof(float)))
            << "token " << t << " " << dtype_name(d);
      }
    }
  });
  set_parallel_threads(saved);
}

TEST(MatmulBf16Act, UsesDotProductWhenTheCpuHasAvx512Bf16) {
  // The check is a property of this machine; on CPUs without AVX512_BF16 it must say false.
  const bool expect =
      __builtin_cpu_supports("avx512bf16") && std::string(matmul_simd_target()) == "AVX3";
  EXPECT_EQ(matmul_bf16_uses_dot_product(), expect);
}

}  // namespace
}  // namespace attnres
