// kv_b_proj's absorbed-form weights (kernels/mla.h) for the kernel tests, made as the loader
// makes them (io/weights.h, absorbed_head_weights).
#pragma once

#include <cstdint>
#include <vector>

#include "io/weights.h"
#include "kernels/mla.h"
#include "util/memory.h"
#include "util/tensor.h"

namespace attnres {

class TestAbsorbedWeights {
 public:
  TestAbsorbedWeights(const TensorView& kv_b_proj, const MlaDims& d) : kv_b_proj_(kv_b_proj) {
    absorbed_head_weights(kv_b_proj, d.nope, d.v, memory_, uk_t_, uv_);
  }
  MlaAbsorbedWeights view() const { return {&kv_b_proj_, uk_t_.data(), uv_.data()}; }

 private:
  WeightMemory memory_;
  TensorView kv_b_proj_;
  std::vector<Matrix> uk_t_, uv_;
};

}  // namespace attnres
