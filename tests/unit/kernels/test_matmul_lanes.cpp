// Lane-packed BF16 projections (matmul_lanes.h): the packed layout, and the dispatched kernel
// against its scalar twin bit for bit on every Highway target this CPU supports, for 1, 2 and 3
// threads, every tile size, ragged groups and row ranges; against the k-order reference within
// the rounding bound, and exactly where every partial sum is an integer.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/hwy_targets.h"
#include "kernels/matmul.h"
#include "kernels/matmul_lanes.h"
#include "util/numeric.h"
#include "util/parallel.h"

namespace attnres {
namespace {

std::vector<bf16> random_bf16(int64_t n, uint32_t seed, bool integers) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> small(-4, 4);
  std::vector<bf16> v(static_cast<size_t>(n));
  for (bf16& e : v) e = f32_to_bf16(integers ? static_cast<float>(small(rng)) : nd(rng));
  return v;
}

std::vector<bf16> packed(const std::vector<bf16>& w, int64_t N, int64_t K) {
  std::vector<bf16> p(static_cast<size_t>(lanes_size(N, K)));
  pack_bf16_lanes(w.data(), N, K, p.data());
  return p;
}

TensorView row_major(const std::vector<bf16>& w, int64_t N, int64_t K) {
  static const std::string kName = "w";
  TensorView v;
  v.name = kName;
  v.dtype = DType::kBF16;
  v.shape = {N, K};
  v.data = reinterpret_cast<const std::byte*>(w.data());
  v.nbytes = static_cast<size_t>(N * K) * sizeof(bf16);
  return v;
}

std::vector<float> widened(const std::vector<bf16>& x) {
  std::vector<float> f(x.size());
  for (size_t i = 0; i < x.size(); ++i) f[i] = bf16_to_f32(x[i]);
  return f;
}

bool same_bits(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

// Groups of 64 rows, the last one rounded up to 16 rows (zero past N): N = 70 is a group of 64
// and one of 16; each pair of a group's rows side by side per pair of columns.
TEST(MatmulLanes, PackLayout) {
  const int64_t N = 70, K = 6;
  std::vector<bf16> w(static_cast<size_t>(N * K));
  for (int64_t i = 0; i < N * K; ++i) w[i] = bf16{static_cast<uint16_t>(i + 1)};
  const std::vector<bf16> p = packed(w, N, K);
  ASSERT_EQ(static_cast<int64_t>(p.size()), 80 * K);
  EXPECT_EQ(lanes_group_rows(N, 0), 64);
  EXPECT_EQ(lanes_group_rows(N, 1), 16);
  for (int64_t g = 0; g < 2; ++g) {
    const int64_t R = g == 0 ? 64 : 16;
    for (int64_t q = 0; q < K / 2; ++q)
      for (int64_t j = 0; j < R; ++j)
        for (int64_t e = 0; e < 2; ++e) {
          const int64_t n = 64 * g + j, at = 64 * g * K + (q * R + j) * 2 + e;
          const uint16_t want = n < N ? w[n * K + 2 * q + e].bits : 0;
          ASSERT_EQ(p[at].bits, want) << "g " << g << " q " << q << " j " << j << " e " << e;
          if (n < N) {
            ASSERT_EQ(lanes_index(n, 2 * q + e, N, K), at);
          }
        }
  }
  // A view of the packed form reads the row-major values.
  TensorView v = row_major(p, N, K);
  v.layout = Layout::kBf16Lanes;
  for (int64_t i = 0; i < N * K; ++i) ASSERT_EQ(v.get_f32(i), bf16_to_f32(w[i])) << i;
}

struct Shape {
  int64_t N, K;
};
// Last groups of every width: 64 (N = 64), 48 (100, 40), 16 (130, 200), 32 (20).
constexpr Shape kShapes[] = {{64, 2}, {100, 30}, {130, 512}, {200, 1026}, {40, 64}, {20, 8}};
constexpr int64_t kTokens[] = {1, 2, 3, 5, 6, 7, 13, 40};

TEST(MatmulLanes, EqualsTwinOnEveryTargetThreadCountAndTokenCount) {
  const int saved = parallel_threads();
  for_each_target([&] {
    for (int threads : {1, 2, 3}) {
      set_parallel_threads(threads);
      SCOPED_TRACE("threads " + std::to_string(threads));
      for (const Shape& s : kShapes) {
        const std::vector<bf16> w = random_bf16(s.N * s.K, 1, false);
        const std::vector<bf16> p = packed(w, s.N, s.K);
        for (int64_t T : kTokens) {
          SCOPED_TRACE("N " + std::to_string(s.N) + " K " + std::to_string(s.K) + " T " +
                       std::to_string(T));
          const std::vector<bf16> x = random_bf16(T * s.K, 2, false);
          std::vector<float> y(static_cast<size_t>(T * s.N)), ref(y.size());
          matmul_bf16_lanes(x.data(), T, p.data(), s.N, s.K, 0, s.N, y.data(), s.N);
          matmul_bf16_lanes_ref(x.data(), T, p.data(), s.N, s.K, 0, s.N, ref.data(), s.N);
          for (size_t i = 0; i < y.size(); ++i)
            ASSERT_TRUE(same_bits(y[i], ref[i]))
                << "element " << i << ": " << y[i] << " vs " << ref[i];
        }
      }
    }
  });
  set_parallel_threads(saved);
}

// A row range that starts and ends inside groups writes exactly its rows, with the bits of the
// whole-matrix call, into an output with a wider row stride.
TEST(MatmulLanes, RowRangeIntoWiderOutput) {
  const int64_t N = 200, K = 64, T = 9, row0 = 37, rows = 100, ldy = 130;
  const std::vector<bf16> w = random_bf16(N * K, 3, false);
  const std::vector<bf16> p = packed(w, N, K);
  const std::vector<bf16> x = random_bf16(T * K, 4, false);
  std::vector<float> whole(static_cast<size_t>(T * N));
  matmul_bf16_lanes(x.data(), T, p.data(), N, K, 0, N, whole.data(), N);
  for_each_target([&] {
    std::vector<float> part(static_cast<size_t>(T * ldy), -7.0f);
    matmul_bf16_lanes(x.data(), T, p.data(), N, K, row0, rows, part.data(), ldy);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < ldy; ++c) {
        const float got = part[t * ldy + c];
        if (c < rows) {
          ASSERT_TRUE(same_bits(got, whole[t * N + row0 + c])) << "t " << t << " c " << c;
        } else {
          ASSERT_EQ(got, -7.0f) << "wrote past the range: t " << t << " c " << c;
        }
      }
  });
}

// Against the k-order reference: within the classic bound for two different summation orders
// of the same exact products, and bitwise where every partial sum is a small integer.
TEST(MatmulLanes, AgreesWithKOrderReference) {
  for (bool integers : {false, true}) {
    SCOPED_TRACE(integers ? "integers" : "normal values");
    for (const Shape& s : kShapes) {
      const int64_t T = 7;
      const std::vector<bf16> w = random_bf16(s.N * s.K, 5, integers);
      const std::vector<bf16> x = random_bf16(T * s.K, 6, integers);
      std::vector<float> y(static_cast<size_t>(T * s.N)), ref(y.size());
      matmul_bf16_lanes(x.data(), T, packed(w, s.N, s.K).data(), s.N, s.K, 0, s.N, y.data(), s.N);
      matmul_bf16_ref(x.data(), T, row_major(w, s.N, s.K), ref.data());
      for (int64_t t = 0; t < T; ++t)
        for (int64_t n = 0; n < s.N; ++n) {
          double abs_sum = 0.0;
          for (int64_t k = 0; k < s.K; ++k)
            abs_sum += std::fabs(static_cast<double>(bf16_to_f32(x[t * s.K + k])) *
                                 bf16_to_f32(w[n * s.K + k]));
          const float a = y[t * s.N + n], b = ref[t * s.N + n];
          if (integers) {
            ASSERT_EQ(a, b) << "t " << t << " n " << n;
          } else {
            ASSERT_LE(std::fabs(static_cast<double>(a) - b),
                      2.0 * static_cast<double>(s.K + 2) * 0x1p-24 * abs_sum)
                << "t " << t << " n " << n;
          }
        }
    }
  }
}

// f32 tokens: the twin's bits on every target with FMA (AVX2 and the AVX-512 targets, whose
// values are below HWY_SSE4's), and within the rounding of the products on the others, for any
// thread count and token count; tokens that are bf16 values give the bits of the bf16 path.
TEST(MatmulLanes, F32TokensEqualTwinAndBf16Path) {
  const int saved = parallel_threads();
  for_each_target([&](int64_t target) {
    const bool fma = target < HWY_SSE4;
    for (int threads : {1, 2}) {
      set_parallel_threads(threads);
      for (const Shape& s : kShapes) {
        const std::vector<bf16> w = random_bf16(s.N * s.K, 11, false);
        const std::vector<bf16> p = packed(w, s.N, s.K);
        for (int64_t T : {int64_t{1}, int64_t{5}, int64_t{13}}) {
          SCOPED_TRACE("threads " + std::to_string(threads) + " N " + std::to_string(s.N) + " K " +
                       std::to_string(s.K) + " T " + std::to_string(T));
          std::mt19937 rng(12);
          std::normal_distribution<float> nd(0.0f, 1.0f);
          std::vector<float> xf(static_cast<size_t>(T * s.K));
          for (float& v : xf) v = nd(rng);
          std::vector<float> y(static_cast<size_t>(T * s.N)), ref(y.size());
          matmul_lanes(xf.data(), T, p.data(), s.N, s.K, 0, s.N, y.data(), s.N);
          matmul_lanes_ref(xf.data(), T, p.data(), s.N, s.K, 0, s.N, ref.data(), s.N);
          for (int64_t t = 0; t < T; ++t)
            for (int64_t n = 0; n < s.N; ++n) {
              const float a = y[t * s.N + n], b = ref[t * s.N + n];
              if (fma) {
                ASSERT_TRUE(same_bits(a, b)) << "f32 tokens, t " << t << " n " << n;
              } else {
                double abs_sum = 0.0;
                for (int64_t k = 0; k < s.K; ++k)
                  abs_sum +=
                      std::fabs(static_cast<double>(xf[t * s.K + k]) * bf16_to_f32(w[n * s.K + k]));
                ASSERT_LE(std::fabs(static_cast<double>(a) - b),
                          2.0 * static_cast<double>(s.K + 2) * 0x1p-24 * abs_sum)
                    << "f32 tokens, t " << t << " n " << n;
              }
            }
          const std::vector<bf16> xh = random_bf16(T * s.K, 13, false);
          matmul_lanes(widened(xh).data(), T, p.data(), s.N, s.K, 0, s.N, y.data(), s.N);
          matmul_bf16_lanes(xh.data(), T, p.data(), s.N, s.K, 0, s.N, ref.data(), s.N);
          for (size_t i = 0; i < y.size(); ++i)
            ASSERT_TRUE(same_bits(y[i], ref[i])) << "bf16-valued tokens, element " << i;
        }
      }
    }
  });
  set_parallel_threads(saved);
}

// An infinite weight makes its own row infinite or NaN (as in the twin) and no other row.
TEST(MatmulLanes, NonFiniteWeightStaysInItsRow) {
  const int64_t N = 96, K = 40, T = 3;
  std::vector<bf16> w = random_bf16(N * K, 7, false);
  w[70 * K + 11] = f32_to_bf16(INFINITY);
  const std::vector<bf16> p = packed(w, N, K);
  const std::vector<bf16> x = random_bf16(T * K, 8, false);
  for_each_target([&] {
    std::vector<float> y(static_cast<size_t>(T * N)), ref(y.size());
    matmul_bf16_lanes(x.data(), T, p.data(), N, K, 0, N, y.data(), N);
    matmul_bf16_lanes_ref(x.data(), T, p.data(), N, K, 0, N, ref.data(), N);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = 0; n < N; ++n) {
        const float a = y[t * N + n];
        ASSERT_EQ(std::isfinite(a), n != 70) << "t " << t << " n " << n;
        ASSERT_TRUE(same_bits(a, ref[t * N + n]) || (std::isnan(a) && std::isnan(ref[t * N + n])))
            << "t " << t << " n " << n;
      }
  });
}

}  // namespace
}  // namespace attnres
