// Compute-peak probe: the arithmetic limit prefill is measured against (`attnres bench`), like
// the STREAM probe is for decode. It times independent chains of the instruction the prefill
// projections run on: vdpbf16ps (bf16 pairs into f32, 2 multiply-adds per pair) where the CPU has
// AVX512_BF16 and the bf16 flow uses it, else the f32 fused multiply-add of the widest Highway
// target; on every thread of the pool, best of `reps` passes.
#pragma once

#include <string>

namespace attnres {

struct ComputeProbeResult {
  double gflop_s = 0;       // 1 multiply-add = 2 FLOPs
  std::string instruction;  // "vdpbf16ps" or "fma f32 (AVX3)" etc.
  int threads = 0;
};

// `bf16_dot`: probe the bf16 dot product when the CPU has it (the bf16 flow's kernel).
ComputeProbeResult compute_probe(bool bf16_dot, int reps = 5);

}  // namespace attnres
