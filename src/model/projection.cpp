#include "model/projection.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>

#include "kernels/activation.h"
#include "kernels/norm.h"
#include "kernels/parallel.h"
#include "util/lanes.h"
#include "util/parallel.h"

namespace attnres {

Proj make_proj(const ForwardOptions& opt, Arena& arena, const float* input, const bf16* input_h) {
  return Proj{arena, opt.bf16(), opt.bf16() && matmul_bf16_uses_dot_product(), opt.projection_stats,
              input, input_h};
}

namespace {

// Sets xh on the BF16 and MXFP4 jobs: the block input's bf16 values where the job reads the block
// input and the caller has them (Proj::input_h), else one exact bf16 copy per run of adjacent
// jobs with the same input (the blocks put the jobs that share an input next to each other), the
// copies made in parallel in chunks of kCopyChunk elements. A copy is attached only where every
// value of the input was exact (bf16_exact_copy), whichever threads copied its chunks.
constexpr int64_t kCopyChunk = int64_t{1} << 14;

void attach_bf16_inputs(const Proj& pj, MatmulJob* jobs, int64_t n) {
  if (!pj.dot) return;
  struct Copy {
    int64_t job, elements, chunk0;  // first job of the run, T * K, its first chunk
    bf16* out;
  };
  Copy* copies = pj.arena.take<Copy>(n);
  int64_t* copy_of = pj.arena.take<int64_t>(n);  // job -> its copy, -1: none
  int64_t nc = 0, chunks = 0, elements = 0;
  for (int64_t i = 0; i < n; ++i) {
    MatmulJob& j = jobs[i];
    copy_of[i] = -1;
    if (j.kind == WeightKind::kF32 || j.T <= 0 || j.xh != nullptr) continue;
    if (j.x == pj.input && pj.input_h != nullptr) {
      j.xh = pj.input_h;
      continue;
    }
    if (nc > 0) {
      const MatmulJob& p = jobs[copies[nc - 1].job];
      if (p.x == j.x && p.T == j.T && p.K == j.K) {  // same run: shares the copy
        copy_of[i] = nc - 1;
        continue;
      }
    }
    copy_of[i] = nc;
    const int64_t e = j.T * j.K;
    copies[nc++] = Copy{i, e, chunks, pj.arena.take<bf16>(e)};
    chunks += (e + kCopyChunk - 1) / kCopyChunk;
    elements += e;
  }
  if (nc == 0) return;
  uint8_t* inexact = pj.arena.take<uint8_t>(nc);
  std::fill(inexact, inexact + nc, uint8_t{0});
  parallel_ranges(chunks, elements > kParallelMinWork, [&](int64_t c0, int64_t c1) {
    // The copy holding chunk c0, then onwards.
    int64_t ci = std::upper_bound(copies, copies + nc, c0,
                                  [](int64_t c, const Copy& k) { return c < k.chunk0; }) -
                 copies - 1;
    for (int64_t c = c0; c < c1; ++c) {
      while (ci + 1 < nc && copies[ci + 1].chunk0 <= c) ++ci;
      const Copy& k = copies[ci];
      const int64_t begin = (c - k.chunk0) * kCopyChunk;
      const int64_t len = std::min(kCopyChunk, k.elements - begin);
      if (!bf16_exact_copy(jobs[k.job].x + begin, len, k.out + begin))
        std::atomic_ref<uint8_t>(inexact[ci]).store(1, std::memory_order_relaxed);
    }
  });
  for (int64_t i = 0; i < n; ++i)
    if (copy_of[i] >= 0 && inexact[copy_of[i]] == 0) jobs[i].xh = copies[copy_of[i]].out;
}

void record(ProjectionStats& stats, const MatmulJob* jobs, int64_t n, double seconds) {
  int64_t bytes = 0;
  double flops = 0;
  bool mxfp4 = false;
  for (int64_t i = 0; i < n; ++i) {
    bytes += job_weight_bytes(jobs[i]);
    flops += 2.0 * static_cast<double>(jobs[i].T) * static_cast<double>(jobs[i].N) *
             static_cast<double>(jobs[i].K);
    mxfp4 = mxfp4 || (is_mxfp4(jobs[i].kind) && jobs[i].T > 0);
  }
  (mxfp4 ? stats.mxfp4_seconds : stats.dense_seconds) += seconds;
  (mxfp4 ? stats.mxfp4_bytes : stats.dense_bytes) += bytes;
  (mxfp4 ? stats.mxfp4_flops : stats.dense_flops) += flops;
  ++stats.batches;
}

// Sets the batch's bf16 inputs and rounding, on the thread that owns the arena (before the work
// is shared out).
void prepare_batch(const Proj& pj, MatmulJob* jobs, int64_t n, int64_t first_rounded) {
  attach_bf16_inputs(pj, jobs, n);
  for (int64_t i = first_rounded; i < n; ++i) jobs[i].round_bf16 = pj.bf16;
}

// run() and, with stats, its time recorded as the batch's.
template <typename Run>
void timed(const Proj& pj, const MatmulJob* jobs, int64_t n, const Run& run) {
  if (pj.stats == nullptr) {
    run();
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  run();
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  record(*pj.stats, jobs, n, sec);
}

constexpr int64_t kBesidePartBytes = int64_t{32} << 10;

}  // namespace

void project_batch(const Proj& pj, MatmulJob* jobs, int64_t n, int64_t first_rounded) {
  prepare_batch(pj, jobs, n, first_rounded);
  timed(pj, jobs, n, [&] { matmul_batch(jobs, n); });
}

void project_batch_beside(const Proj& pj, MatmulJob* jobs, int64_t n, CallRef<> side) {
  prepare_batch(pj, jobs, n, 0);
  // Parts of whole 64-row groups (a lane-packed job's rows split only there).
  const auto part_rows = [](const MatmulJob& j) {
    const int64_t row_bytes = std::max<int64_t>(1, job_row_bytes(j));
    return std::max<int64_t>(1, kBesidePartBytes / row_bytes / kLaneGroupRows) * kLaneGroupRows;
  };
  int64_t parts = 0;
  for (int64_t i = 0; i < n; ++i)
    parts += (jobs[i].N + part_rows(jobs[i]) - 1) / part_rows(jobs[i]);
  MatmulJob* part = pj.arena.take<MatmulJob>(parts);
  parts = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r0 = 0; r0 < jobs[i].N; r0 += part_rows(jobs[i]))
      part[parts++] = job_rows(jobs[i], r0, std::min(part_rows(jobs[i]), jobs[i].N - r0));
  timed(pj, jobs, n, [&] {
    parallel_tasks(parts + 1, [&](int64_t t) {
      if (t == 0)
        side();
      else
        matmul_batch(part + t - 1, 1);  // inside a task: on this thread
    });
  });
}

TpStep tp_step(const ForwardOptions& opt) {
  TpStep s;
  s.tp = opt.tp;
  if (opt.tp != nullptr) s.shard = opt.tp->shard();
  return s;
}

void TpStep::gather(std::initializer_list<GatherPart> parts) const {
  start(parts);
  finish();
}

void TpStep::start(std::initializer_list<GatherPart> parts) const {
  if (tp != nullptr) {
    tp->start(std::span<const GatherPart>(parts.begin(), parts.size()));
    return;
  }
  TensorParallel::copy_local(std::span<const GatherPart>(parts.begin(), parts.size()));
}

void TpStep::finish() const {
  if (tp != nullptr) tp->finish();
}

MatmulJob cols_job(const float* x, int64_t T, const Matrix& W, float* y, int64_t col0, int64_t ld) {
  MatmulJob j = dense_job(x, T, W, y + col0);
  j.ldy = ld;
  return j;
}

MatmulJob expert_cols_job(const float* x, int64_t T, const ExpertMatrix& m, float* y, int64_t col0,
                          int64_t ld) {
  MatmulJob j = expert_job(x, T, m, y + col0);
  j.ldy = ld;
  return j;
}

void project(const Proj& pj, const float* x, int64_t T, const Matrix& W, float* y) {
  MatmulJob j = dense_job(x, T, W, y);
  project_batch(pj, &j, 1);
}

MatmulJob expert_job(const float* x, int64_t T, const ExpertMatrix& m, float* y) {
  assert(!m.mxfp4 || m.packed.layout == m.scale.layout);
  if (!m.mxfp4) return dense_job(x, T, m.dense, y);
  MatmulJob j = mxfp4_job(x, T, m.packed.as<uint8_t>(), m.scale.as<uint8_t>(), m.rows, m.cols, y,
                          m.packed.layout);
  j.normal_scales = m.normal_scales;
  return j;
}

const float* widen(const TensorView& t, Arena& arena) {
  if (t.dtype == DType::kF32 && reinterpret_cast<uintptr_t>(t.data) % alignof(float) == 0)
    return t.as<float>();
  const int64_t n = t.numel();
  float* out = arena.take<float>(n);
  if (t.dtype == DType::kBF16) {
    const bf16* src = t.as<bf16>();
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = t.get_f32(i);
  }
  return out;
}

void gated_activation(const ModelConfig& c, const float* gate, const float* up, int64_t n,
                      bool bf16_out, float* out) {
  if (c.hidden_act == Activation::kSitu)
    situ(gate, up, n, c.situ_beta, c.situ_linear_beta, bf16_out, out);
  else
    silu_mul(gate, up, n, bf16_out, out);
}

void gated_activation(const ModelConfig& c, const float* gate, const float* up, int64_t n,
                      bf16* out) {
  if (c.hidden_act == Activation::kSitu)
    situ(gate, up, n, c.situ_beta, c.situ_linear_beta, out);
  else
    silu_mul(gate, up, n, out);
}

}  // namespace attnres
