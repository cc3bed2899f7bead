// Batched projections (matmul_batch, matmul.h): several jobs in one parallel region must give,
// for every job, exactly the bits the single-call kernels give (matmul / mxfp4_matmul), on every
// Highway target this CPU supports and for 1, 2 and 3 OpenMP threads; the scalar twin must agree
// with the single-call references; integer data (exact partial sums) must match it bitwise.
#include <gtest/gtest.h>
#include "util/parallel.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/hwy_targets.h"
#include "kernels/matmul.h"
#include "util/lanes.h"
#include "util/numeric.h"

namespace attnres {
namespace {

TensorView view(DType dtype, int64_t N, int64_t K, const void* data) {
  // (A copy of a named string: GCC 12 -O3 reports a false -Wrestrict for `v.name = "w"` here.)
  static const std::string kName = "w";
  TensorView v;
  v.name = kName;
  v.dtype = dtype;
  v.shape = {N, K};
  v.data = static_cast<const std::byte*>(data);
  v.nbytes = static_cast<size_t>(N * K) * dtype_size(dtype);
  return v;
}

// A mixed batch: dense f32 and bf16, a row slice of a bf16 matrix, MXFP4 experts of different
// token counts (one with T = 0), a lane-packed bf16 matrix with f32 and with bf16 tokens, sizes
// off the vector width and the register tiles. Large enough in total (> 2^18 multiply-adds) to
// run in parallel.
struct Batch {
  std::vector<float> x1, x2, x3, x4, x5, w32;
  std::vector<bf16> w16, x5h, wl;  // wl: lane-packed
  TensorView vl;
  std::vector<uint8_t> packed, scale;  // two MXFP4 matrices [N, K/2], [N, K/32] back to back
  TensorView v32, v16;
  static constexpr int64_t T1 = 5, K1 = 97, N32 = 61, N16 = 203;
  static constexpr int64_t Tq = 3, Nq = 45, Kq = 320;
  static constexpr int64_t Tq2 = 1;
  static constexpr int64_t row0 = 37, rows = 100;
  static constexpr int64_t Nl = 150, Kl = 96;  // last group of 32 rows (util/lanes.h)

  explicit Batch(bool integers, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> small(-3, 3);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto val = [&] { return integers ? static_cast<float>(small(rng)) : nd(rng); };
    x1.resize(T1 * K1);
    for (float& v : x1) v = val();
    x2.resize(T1 * K1);
    for (float& v : x2) v = val();
    x3.resize(Tq * Kq);
    for (float& v : x3) v = val();
    x4.resize(Tq2 * Kq);
    for (float& v : x4) v = val();
    w32.resize(N32 * K1);
    for (float& v : w32) v = val();
    w16.resize(N16 * K1);
    for (bf16& v : w16) v = f32_to_bf16(val());
    std::uniform_int_distribution<int> byte(0, 255);
    // Scales 2^-2..2^3 keep integer data's partial sums exact.
    std::uniform_int_distribution<int> sc(integers ? 125 : 110, integers ? 130 : 140);
    packed.resize(2 * Nq * Kq / 2);
    for (uint8_t& b : packed) b = static_cast<uint8_t>(byte(rng));
    scale.resize(2 * Nq * Kq / kMxfp4BlockSize);
    for (uint8_t& s : scale) s = static_cast<uint8_t>(sc(rng));
    v32 = view(DType::kF32, N32, K1, w32.data());
    v16 = view(DType::kBF16, N16, K1, w16.data());
    x5h.resize(T1 * Kl);
    for (bf16& v : x5h) v = f32_to_bf16(val());
    for (const bf16 v : x5h) x5.push_back(bf16_to_f32(v));  // bf16 values: xh can be attached
    std::vector<bf16> rows_l(Nl * Kl);
    for (bf16& v : rows_l) v = f32_to_bf16(val());
    wl.resize(static_cast<size_t>(lanes_size(Nl, Kl)));
    pack_bf16_lanes(rows_l.data(), Nl, Kl, wl.data());
    vl = view(DType::kBF16, Nl, Kl, wl.data());
    vl.layout = Layout::kBf16Lanes;
  }
  const uint8_t* packed_b(int i) const { return packed.data() + i * Nq * Kq / 2; }
  const uint8_t* scale_b(int i) const { return scale.data() + i * Nq * Kq / kMxfp4BlockSize; }

  // Outputs: one vector per job.
  std::vector<std::vector<float>> outputs() const {
    return {std::vector<float>(T1 * N32, -1.0f),  std::vector<float>(T1 * N16, -1.0f),
            std::vector<float>(T1 * rows, -1.0f), std::vector<float>(Tq * Nq, -1.0f),
            std::vector<float>(1, -7.0f),         std::vector<float>(Tq2 * Nq, -1.0f),
            std::vector<float>(T1 * Nl, -1.0f),   std::vector<float>(T1 * Nl, -1.0f)};
  }
  std::vector<MatmulJob> jobs(std::vector<std::vector<float>>& y) const {
    MatmulJob with_xh = dense_job(x5.data(), T1, vl, y[7].data());
    with_xh.xh = x5h.data();
    return {dense_job(x1.data(), T1, v32, y[0].data()),
            dense_job(x2.data(), T1, v16, y[1].data()),
            dense_rows_job(x1.data(), T1, v16, row0, rows, y[2].data()),
            mxfp4_job(x3.data(), Tq, packed_b(0), scale_b(0), Nq, Kq, y[3].data()),
            mxfp4_job(x3.data(), 0, packed_b(1), scale_b(1), Nq, Kq, y[4].data()),
            mxfp4_job(x4.data(), Tq2, packed_b(1), scale_b(1), Nq, Kq, y[5].data()),
            dense_job(x5.data(), T1, vl, y[6].data()),
            with_xh};
  }
  // The same products through the single-call kernels (fast or reference).
  std::vector<std::vector<float>> single(bool ref) const {
    auto y = outputs();
    auto mm = ref ? matmul_ref : matmul;
    auto mq = ref ? mxfp4_matmul_ref : mxfp4_matmul;
    mm(x1.data(), T1, v32, y[0].data());
    mm(x2.data(), T1, v16, y[1].data());
    std::vector<float> full(T1 * N16);
    mm(x1.data(), T1, v16, full.data());
    for (int64_t t = 0; t < T1; ++t)
      std::memcpy(y[2].data() + t * rows, full.data() + t * N16 + row0, rows * sizeof(float));
    mq(x3.data(), Tq, packed_b(0), scale_b(0), Nq, Kq, y[3].data());
    mq(x4.data(), Tq2, packed_b(1), scale_b(1), Nq, Kq, y[5].data());
    mm(x5.data(), T1, vl, y[6].data());
    if (ref) {  // the reference reads x, whether or not a job has xh
      mm(x5.data(), T1, vl, y[7].data());
    } else {
      matmul_bf16(x5h.data(), T1, vl, y[7].data());
    }
    return y;
  }
};

void expect_bitwise(const std::vector<std::vector<float>>& a,
                    const std::vector<std::vector<float>>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t j = 0; j < a.size(); ++j) {
    ASSERT_EQ(a[j].size(), b[j].size());
    EXPECT_EQ(0, std::memcmp(a[j].data(), b[j].data(), a[j].size() * sizeof(float)))
        << what << ": job " << j;
  }
}

TEST(MatmulBatch, EqualsSingleCallsBitwiseForAnyThreadCount) {
  const int saved = parallel_threads();
  const Batch b(/*integers=*/false, 3);
  for_each_target([&] {
    const auto expected = b.single(/*ref=*/false);
    for (int threads : {1, 2, 3}) {
      set_parallel_threads(threads);
      auto y = b.outputs();
      const auto jobs = b.jobs(y);
      matmul_batch(jobs.data(), static_cast<int64_t>(jobs.size()));
      expect_bitwise(y, expected, std::to_string(threads) + " threads");
      EXPECT_EQ(y[4][0], -7.0f) << "a T = 0 job must not write";
    }
  });
  set_parallel_threads(saved);
}

// job_rows: a dense job cut into parts (row-major at any row, lane-packed at whole 64-row groups,
// the last part ragged), the parts run one at a time, writes the whole job's bits.
TEST(MatmulBatch, JobRowsPartsEqualTheWholeJob) {
  const Batch b(/*integers=*/false, 9);
  for_each_target([&] {
    auto whole = b.outputs();
    auto parts = b.outputs();
    const auto jobs = b.jobs(whole);
    const auto part_jobs = b.jobs(parts);
    matmul_batch(jobs.data(), static_cast<int64_t>(jobs.size()));
    for (size_t i : {size_t{0}, size_t{1}, size_t{2}, size_t{6}, size_t{7}}) {
      const MatmulJob& j = part_jobs[i];
      const int64_t step = j.kind == WeightKind::kBF16Lanes ? kLaneGroupRows : 17;
      for (int64_t r0 = 0; r0 < j.N; r0 += step) {
        const MatmulJob part = job_rows(j, r0, std::min(step, j.N - r0));
        matmul_batch(&part, 1);
      }
      EXPECT_EQ(0, std::memcmp(parts[i].data(), whole[i].data(), whole[i].size() * sizeof(float)))
          << "job " << i;
    }
  });
}

TEST(MatmulBatch, ReferenceEqualsSingleReferences) {
  const Batch b(/*integers=*/false, 4);
  auto y = b.outputs();
  const auto jobs = b.jobs(y);
  matmul_batch_ref(jobs.data(), static_cast<int64_t>(jobs.size()));
  expect_bitwise(y, b.single(/*ref=*/true), "reference");
}

TEST(MatmulBatch, ExactOnIntegerData) {
  const Batch b(/*integers=*/true, 5);
  auto ref = b.outputs();
  const auto ref_jobs = b.jobs(ref);
  matmul_batch_ref(ref_jobs.data(), static_cast<int64_t>(ref_jobs.size()));
  for_each_target([&] {
    auto y = b.outputs();
    const auto jobs = b.jobs(y);
    matmul_batch(jobs.data(), static_cast<int64_t>(jobs.size()));
    expect_bitwise(y, ref, "fast vs reference");
  });
}

// Many tiny jobs (each far below the serial cutoff, together above it) still cover every row.
TEST(MatmulBatch, ManySmallJobs) {
  const int saved = parallel_threads();
  constexpr int64_t kJobs = 40, N = 7, K = 1000;
  std::mt19937 rng(6);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(K), w(kJobs * N * K);
  for (float& v : x) v = nd(rng);
  for (float& v : w) v = nd(rng);
  std::vector<TensorView> views;
  for (int64_t j = 0; j < kJobs; ++j)
    views.push_back(view(DType::kF32, N, K, w.data() + j * N * K));
  std::vector<float> expected(kJobs * N);
  for (int64_t j = 0; j < kJobs; ++j) matmul(x.data(), 1, views[j], expected.data() + j * N);
  for (int threads : {1, 2, 3}) {
    set_parallel_threads(threads);
    std::vector<float> y(kJobs * N, -1.0f);
    std::vector<MatmulJob> jobs;
    for (int64_t j = 0; j < kJobs; ++j)
      jobs.push_back(dense_job(x.data(), 1, views[j], y.data() + j * N));
    matmul_batch(jobs.data(), kJobs);
    EXPECT_EQ(0, std::memcmp(y.data(), expected.data(), y.size() * sizeof(float)))
        << threads << " threads";
  }
  set_parallel_threads(saved);
}

// bf16_exact_copy accepts exactly the bf16-representable values.
TEST(MatmulBatch, Bf16ExactCopy) {
  std::vector<float> x = {0.0f, -0.0f, 1.0f, -2.5f, 3.0e38f, 1.0e-40f, 65280.0f};
  for (float& v : x) v = round_bf16(v);
  std::vector<bf16> h(x.size());
  ASSERT_TRUE(bf16_exact_copy(x.data(), static_cast<int64_t>(x.size()), h.data()));
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(bf16_to_f32(h[i]), x[i]) << i;
  for (float bad : {1.0f + 0x1p-10f, 0.1f}) {
    std::vector<float> y = x;
    y[3] = bad;
    EXPECT_FALSE(bf16_exact_copy(y.data(), static_cast<int64_t>(y.size()), h.data())) << bad;
  }
  // NaN (also one whose payload sits only in the dropped half) becomes a bf16 NaN of its sign.
  for (uint32_t bits : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800123u}) {
    std::vector<float> y = x;
    y[3] = std::bit_cast<float>(bits);
    ASSERT_TRUE(bf16_exact_copy(y.data(), static_cast<int64_t>(y.size()), h.data()));
    EXPECT_TRUE(std::isnan(bf16_to_f32(h[3]))) << std::hex << bits;
    EXPECT_EQ(std::signbit(bf16_to_f32(h[3])), (bits >> 31) != 0u);
  }
}

// The dispatched copy gives its scalar twin's bits and verdict on every target, for lengths on
// and off the vector width, with the one inexact or NaN value at every position (the vector
// body and the ragged end).
TEST(MatmulBatch, Bf16ExactCopyEqualsTwin) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  for_each_target([&] {
    for (int64_t n : {1, 7, 15, 16, 17, 31, 32, 33, 100}) {
      std::vector<float> x(n);
      for (float& v : x) v = round_bf16(nd(rng));
      for (int64_t at = -1; at < n; ++at) {
        for (uint32_t odd : {0x3f800001u, 0x7f800001u, 0xffc00000u, 0x80000000u}) {
          std::vector<float> y = x;
          if (at >= 0) y[at] = std::bit_cast<float>(odd);
          std::vector<bf16> fast(n, bf16{0x1234}), ref(n, bf16{0x1234});
          const bool f = bf16_exact_copy(y.data(), n, fast.data());
          const bool r = bf16_exact_copy_ref(y.data(), n, ref.data());
          ASSERT_EQ(f, r) << n << " " << at << " " << std::hex << odd;
          if (r) {
            ASSERT_EQ(0, std::memcmp(fast.data(), ref.data(), n * sizeof(bf16))) << n << " " << at;
          }
        }
      }
    }
  });
}

// round_bf16 on a job rounds each output to the nearest bf16 value: the bits of the unrounded
// job's outputs through round_bf16, for every kind, token count and thread count, with strided
// outputs (ldy > N) whose gaps are left untouched; the scalar twin agrees.
TEST(MatmulBatch, RoundedOutputsEqualRoundedBits) {
  const int saved = parallel_threads();
  const Batch b(false, 11);
  for_each_target([&] {
    for (int threads : {1, 2, 3}) {
      set_parallel_threads(threads);
      auto plain = b.outputs(), rounded = b.outputs(), ref = b.outputs();
      std::vector<MatmulJob> pj = b.jobs(plain), rj = b.jobs(rounded), fj = b.jobs(ref);
      for (MatmulJob& j : rj) j.round_bf16 = true;
      for (MatmulJob& j : fj) j.round_bf16 = true;
      matmul_batch(pj.data(), static_cast<int64_t>(pj.size()));
      matmul_batch(rj.data(), static_cast<int64_t>(rj.size()));
      matmul_batch_ref(fj.data(), static_cast<int64_t>(fj.size()));
      for (size_t j = 0; j < plain.size(); ++j)
        for (size_t i = 0; i < plain[j].size(); ++i) {
          ASSERT_EQ(std::bit_cast<uint32_t>(rounded[j][i]),
                    std::bit_cast<uint32_t>(round_bf16(plain[j][i])))
              << threads << " job " << j << " at " << i;
          EXPECT_EQ(ref[j][i], round_bf16(ref[j][i])) << j << " " << i;
        }
    }
    // Strided: a [T, N] result in columns [3, 3 + N) of rows ldy = N + 5 apart.
    constexpr int64_t T = 4, K = 64, N = 37, ld = N + 5;
    std::vector<float> x(T * K), w(N * K), y(T * ld, -3.0f), plain(T * N);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) * 0.1f;
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 5) * 0.3f - 0.5f;
    const TensorView v = view(DType::kF32, N, K, w.data());
    matmul(x.data(), T, v, plain.data());
    MatmulJob j = dense_job(x.data(), T, v, y.data() + 3);
    j.ldy = ld;
    j.round_bf16 = true;
    matmul_batch(&j, 1);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < ld; ++c) {
        const float want = c >= 3 && c < 3 + N ? round_bf16(plain[t * N + c - 3]) : -3.0f;
        EXPECT_EQ(std::bit_cast<uint32_t>(y[t * ld + c]), std::bit_cast<uint32_t>(want))
            << t << " " << c;
      }
  });
  set_parallel_threads(saved);
}

// The same for jobs with bf16 tokens (xh), which run the vdpbf16ps tiles where the CPU has
// AVX512_BF16: row-major BF16 and MXFP4 weights at token counts that take every tile shape and
// its stores (the register-decode MXFP4 tiles below 11 tokens, the decoded rows from 11), an odd
// last MXFP4 block, row counts off the tiles, strided outputs, and a NaN token (its outputs NaN).
TEST(MatmulBatch, RoundedBf16TokenOutputsEqualRoundedBits) {
  const int saved = parallel_threads();
  std::mt19937 rng(23);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255), sc(110, 140);
  constexpr int64_t Kd = 96, Nd = 37, Kq = 352, Nq = 45, ld = 50, Tmax = 16;
  std::vector<bf16> wd(Nd * Kd), xh(Tmax * Kq);
  for (bf16& v : wd) v = f32_to_bf16(nd(rng));
  for (bf16& v : xh) v = f32_to_bf16(nd(rng));
  xh[5 * Kq + 3] = f32_to_bf16(std::nanf(""));
  std::vector<float> x(xh.size());
  for (size_t i = 0; i < xh.size(); ++i) x[i] = bf16_to_f32(xh[i]);
  std::vector<uint8_t> packed(Nq * Kq / 2), scale(Nq * Kq / kMxfp4BlockSize);
  for (uint8_t& b : packed) b = static_cast<uint8_t>(byte(rng));
  for (uint8_t& b : scale) b = static_cast<uint8_t>(sc(rng));
  const TensorView vd = view(DType::kBF16, Nd, Kd, wd.data());
  for_each_target([&] {
    for (int threads : {1, 2}) {
      set_parallel_threads(threads);
      for (int64_t T : {1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 16}) {
        std::vector<float> plain(2 * T * ld, -3.0f), rounded(2 * T * ld, -3.0f);
        const auto jobs = [&](std::vector<float>& y) {
          MatmulJob d = dense_job(x.data(), T, vd, y.data());
          MatmulJob q =
              mxfp4_job(x.data(), T, packed.data(), scale.data(), Nq, Kq, y.data() + T * ld);
          d.ldy = q.ldy = ld;
          return std::vector<MatmulJob>{d, q};
        };
        // The dense job's tokens: the first Kd values of each token, as rows of Kd.
        std::vector<bf16> xd(T * Kd);
        std::vector<float> xdf(T * Kd);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t k = 0; k < Kd; ++k) {
            xd[t * Kd + k] = xh[t * Kq + k];
            xdf[t * Kd + k] = x[t * Kq + k];
          }
        std::vector<MatmulJob> pj = jobs(plain), rj = jobs(rounded);
        for (std::vector<MatmulJob>* js : {&pj, &rj}) {
          (*js)[0].x = xdf.data();
          (*js)[0].xh = xd.data();
          (*js)[1].xh = xh.data();
        }
        for (MatmulJob& j : rj) j.round_bf16 = true;
        matmul_batch(pj.data(), 2);
        matmul_batch(rj.data(), 2);
        for (size_t i = 0; i < plain.size(); ++i) {
          const int64_t c = static_cast<int64_t>(i) % ld;
          const int64_t n = static_cast<int64_t>(i) < T * ld ? Nd : Nq;
          const float want = c < n ? round_bf16(plain[i]) : -3.0f;
          ASSERT_EQ(std::bit_cast<uint32_t>(rounded[i]), std::bit_cast<uint32_t>(want))
              << threads << " threads, T " << T << " at " << i;
        }
        if (T > 5) {
          EXPECT_TRUE(std::isnan(plain[5 * ld])) << T;  // the NaN token's dense row 0
        }
      }
    }
  });
  set_parallel_threads(saved);
}

// A BF16-weight job given its input as bf16 (xh) computes what matmul_bf16 computes, bitwise,
// for any thread count and batch grouping; jobs of other kinds ignore xh.
TEST(MatmulBatch, Bf16InputJobsEqualMatmulBf16) {
  const int saved = parallel_threads();
  constexpr int64_t T = 3, K = 331, N = 150;
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(T * K), w32(N * K);
  std::vector<bf16> xh(T * K), w16(N * K);
  for (float& v : x) v = round_bf16(nd(rng));
  for (float& v : w32) v = nd(rng);
  for (bf16& v : w16) v = f32_to_bf16(nd(rng));
  ASSERT_TRUE(bf16_exact_copy(x.data(), T * K, xh.data()));
  const TensorView v16 = view(DType::kBF16, N, K, w16.data());
  const TensorView v32 = view(DType::kF32, N, K, w32.data());
  for_each_target([&] {
    std::vector<float> e16(T * N), e32(T * N), ref(T * N);
    matmul_bf16(xh.data(), T, v16, e16.data());
    matmul(x.data(), T, v32, e32.data());
    matmul_bf16_ref(xh.data(), T, v16, ref.data());
    for (int threads : {1, 2, 3}) {
      set_parallel_threads(threads);
      std::vector<float> y16(T * N, -1.0f), y32(T * N, -1.0f), y1(N, -1.0f);
      MatmulJob jobs[3] = {dense_job(x.data(), T, v16, y16.data()),
                           dense_job(x.data(), T, v32, y32.data()),
                           dense_rows_job(x.data() + K, 1, v16, 0, N, y1.data())};
      jobs[0].xh = xh.data();
      jobs[1].xh = xh.data();
      jobs[2].xh = xh.data() + K;
      matmul_batch(jobs, 3);
      EXPECT_EQ(0, std::memcmp(y16.data(), e16.data(), y16.size() * sizeof(float))) << threads;
      EXPECT_EQ(0, std::memcmp(y32.data(), e32.data(), y32.size() * sizeof(float))) << threads;
      EXPECT_EQ(0, std::memcmp(y1.data(), e16.data() + N, y1.size() * sizeof(float))) << threads;
      // Same dot products as the scalar twin up to summation order (|x w| sums of ~K terms).
      for (int64_t i = 0; i < T * N; ++i) EXPECT_NEAR(y16[i], ref[i], 1e-3f) << i;
    }
  });
  set_parallel_threads(saved);
}

// Decode walks weight rows shorter than a 4 KiB page in page-strided tiles (rows q, q + P, ...
// of each run of page-sized groups; matmul_hwy.cpp, PageStride), or, on vdpbf16ps (bf16 inputs
// and weights on AVX512_BF16), one row at a time (WithDotBf16Tiles). Only the order of rows and
// the tile shape change: each token's outputs are the bits of the same token inside a T > 1
// product (which never strides), with f32 or bf16 inputs, through matmul / matmul_bf16 and
// batch jobs (whole matrices and row slices that start mid-page), for 1-3 threads; integer data
// equals the scalar twin. Shapes: P = 2, 4, 16 and 64 (2 KiB, 1 KiB, 256 B and 64 B rows), row
// counts with whole strided runs plus a ragged rest, serial and parallel, and a K that is no
// multiple of a vector (1000: 31 whole steps of 32 and a tail of 8).
TEST(MatmulBatch, PageStridedDecodeEqualsPrefillRows) {
  const int saved = parallel_threads();
  struct Case {
    DType dtype;
    int64_t N, K;
  };
  const Case cases[] = {{DType::kBF16, 300, 1024}, {DType::kBF16, 43, 1024},
                        {DType::kBF16, 59, 512},   {DType::kF32, 270, 512},
                        {DType::kF32, 100, 64},    {DType::kBF16, 800, 32},
                        {DType::kBF16, 97, 1000}};
  constexpr int64_t T = 3;
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(dtype_name(c.dtype)) + " N=" + std::to_string(c.N) +
                 " K=" + std::to_string(c.K));
    for (bool integers : {false, true}) {
      std::mt19937 rng(static_cast<uint32_t>(c.N * 7 + c.K + integers));
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::uniform_int_distribution<int> small(-3, 3);
      auto val = [&] { return integers ? static_cast<float>(small(rng)) : round_bf16(nd(rng)); };
      std::vector<float> x(T * c.K), w32(c.N * c.K);
      std::vector<bf16> xh(T * c.K), w16(c.N * c.K);
      for (float& v : x) v = val();
      ASSERT_TRUE(bf16_exact_copy(x.data(), T * c.K, xh.data()));
      for (size_t i = 0; i < w32.size(); ++i) {
        w16[i] = f32_to_bf16(val());
        w32[i] = bf16_to_f32(w16[i]);
      }
      const TensorView w = c.dtype == DType::kF32 ? view(DType::kF32, c.N, c.K, w32.data())
                                                  : view(DType::kBF16, c.N, c.K, w16.data());
      std::vector<float> ref(T * c.N);
      matmul_ref(x.data(), T, w, ref.data());
      const int64_t row0 = 5, rows = c.N - 7;  // a slice starting mid-page
      for_each_target([&] {
        std::vector<float> all(T * c.N), all_h(T * c.N);
        matmul(x.data(), T, w, all.data());
        matmul_bf16(xh.data(), T, w, all_h.data());
        if (integers) {
          EXPECT_EQ(0, std::memcmp(all.data(), ref.data(), all.size() * sizeof(float)));
          EXPECT_EQ(0, std::memcmp(all_h.data(), ref.data(), all_h.size() * sizeof(float)));
        }
        for (int threads : {1, 2, 3}) {
          set_parallel_threads(threads);
          for (int64_t t = 0; t < T; ++t) {
            const float* xt = x.data() + t * c.K;
            const bf16* xht = xh.data() + t * c.K;
            std::vector<float> one(c.N, -1.0f), one_h(c.N, -1.0f), b0(c.N, -1.0f), b1(c.N, -1.0f),
                slice(rows, -1.0f);
            matmul(xt, 1, w, one.data());
            matmul_bf16(xht, 1, w, one_h.data());
            MatmulJob jobs[3] = {dense_job(xt, 1, w, b0.data()), dense_job(xt, 1, w, b1.data()),
                                 dense_rows_job(xt, 1, w, row0, rows, slice.data())};
            jobs[1].xh = xht;
            jobs[2].xh = xht;
            matmul_batch(jobs, 3);
            const float* want = all.data() + t * c.N;
            const float* want_h = all_h.data() + t * c.N;
            const size_t bytes = static_cast<size_t>(c.N) * sizeof(float);
            EXPECT_EQ(0, std::memcmp(one.data(), want, bytes)) << threads << " t=" << t;
            EXPECT_EQ(0, std::memcmp(one_h.data(), want_h, bytes)) << threads << " t=" << t;
            EXPECT_EQ(0, std::memcmp(b0.data(), want, bytes)) << threads << " t=" << t;
            EXPECT_EQ(0, std::memcmp(b1.data(), want_h, bytes)) << threads << " t=" << t;
            EXPECT_EQ(0, std::memcmp(slice.data(), want_h + row0, rows * sizeof(float)))
                << threads << " t=" << t;
          }
        }
      });
    }
  }
  set_parallel_threads(saved);
}

// bf16 tokens with MXFP4 weights: within the error bound of the scalar reference (NaN and inf
// blocks propagate), thread-count invariant, and every token's row bitwise the row a T = 1 call
// gives, at token counts that take each of the lane kernel's tile widths (1-7 tokens) and sums
// of them (8, 9, 13, 24, 460). K = 288 and 1056 have an odd number of blocks; N = 37 is off the
// 16-row groups, so these row-major jobs end in a ragged group.
TEST(MatmulBatch, Bf16InputMxfp4Jobs) {
  const int saved = parallel_threads();
  constexpr int64_t Tmax = 460, N = 37;
  for (const int64_t K : {int64_t{288}, int64_t{1056}}) {
    SCOPED_TRACE("K " + std::to_string(K));
    std::mt19937 rng(10);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_int_distribution<int> byte(0, 255), sc(118, 130);
    std::vector<float> x(Tmax * K);
    std::vector<bf16> xh(Tmax * K);
    for (float& v : x) v = round_bf16(nd(rng));
    ASSERT_TRUE(bf16_exact_copy(x.data(), Tmax * K, xh.data()));
    std::vector<uint8_t> packed(N * K / 2), scale(N * K / 32);
    for (uint8_t& b : packed) b = static_cast<uint8_t>(byte(rng));
    for (uint8_t& b : scale) b = static_cast<uint8_t>(sc(rng));
    scale[3 * (K / 32) + 1] = 255;  // row 3: a NaN block
    scale[5 * (K / 32) + 2] = 254;  // row 5: 2^127 times codes up to 6 -> inf (or -inf, or 0 * inf)
    std::vector<float> ref(Tmax * N);
    mxfp4_matmul_ref(x.data(), Tmax, packed.data(), scale.data(), N, K, ref.data());
    std::vector<double> mag(Tmax * N, 0.0);  // sum_k |x w| per output
    for (int64_t t = 0; t < Tmax; ++t)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k)
          mag[t * N + n] += std::fabs(x[t * K + k] * mxfp4_get(packed.data() + n * (K / 2),
                                                               scale.data() + n * (K / 32), k));
    for_each_target([&] {
      for (int64_t T : {2, 3, 4, 5, 6, 7, 8, 9, 13, 24, 460}) {
        SCOPED_TRACE("T " + std::to_string(T));
        std::vector<float> first;
        for (int threads : {1, 2, 3}) {
          set_parallel_threads(threads);
          std::vector<float> y(T * N, -1.0f), y1(T * N, -1.0f);
          std::vector<MatmulJob> jobs = {
              mxfp4_job(x.data(), T, packed.data(), scale.data(), N, K, y.data())};
          jobs[0].xh = xh.data();
          for (int64_t t = 0; t < T; ++t) {
            jobs.push_back(mxfp4_job(x.data() + t * K, 1, packed.data(), scale.data(), N, K,
                                     y1.data() + t * N));
            jobs.back().xh = xh.data() + t * K;
          }
          matmul_batch(jobs.data(), static_cast<int64_t>(jobs.size()));
          ASSERT_EQ(0, std::memcmp(y1.data(), y.data(), y.size() * sizeof(float))) << threads;
          if (first.empty()) first = y;
          ASSERT_EQ(0, std::memcmp(y.data(), first.data(), y.size() * sizeof(float))) << threads;
          if (threads > 1) continue;
          for (int64_t t = 0; t < T; ++t) {
            for (int64_t n = 0; n < N; ++n) {
              const float a = y[t * N + n], r = ref[t * N + n];
              if (std::isnan(r) || std::isinf(r)) {
                // The reference adds scaled products, so the 2^127 block's +inf and -inf products
                // give NaN; the lane kernels scale each block's sum once, which stays finite or
                // overflows. Against that sum in f64 (no overflow there):
                double exact = 0.0, magnitude = 0.0;
                for (int64_t k = 0; k < K; ++k) {
                  const uint8_t code = packed[n * (K / 2) + k / 2];
                  const double p = static_cast<double>(x[t * K + k]) *
                                   kE2m1Values[k % 2 == 0 ? code & 0x0f : code >> 4] *
                                   e8m0_to_f32(scale[n * (K / 32) + k / 32]);
                  exact += p;
                  magnitude += std::fabs(p);
                }
                const double bound = 2.0 * K * 0x1p-24 * magnitude;
                if (std::isnan(exact)) {
                  EXPECT_TRUE(std::isnan(a)) << t << "," << n;
                } else if (std::isinf(a)) {
                  EXPECT_GE(std::fabs(exact) + bound, FLT_MAX) << t << "," << n;
                  EXPECT_EQ(a > 0, exact > 0) << t << "," << n;
                } else {
                  EXPECT_LE(std::fabs(a - exact), bound) << t << "," << n;
                }
                continue;
              }
              // Both sum K exact products in f32: |a - r| <= 2 K u sum |x w|.
              EXPECT_LE(std::fabs(a - r), 2.0 * K * 0x1p-24 * mag[t * N + n] + 1e-30)
                  << t << "," << n;
            }
          }
        }
      }
    });
  }
  set_parallel_threads(saved);
}

}  // namespace
}  // namespace attnres
