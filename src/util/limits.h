// Limits of the engine's fixed-size tables and of the values that size them.
//
// Contract: a kernel that holds a table of one of these sizes on the stack relies on its caller
// never exceeding the limit (it only asserts, in debug builds). The values come from a config
// file or a command-line flag, so they are checked where they enter: config validation
// (config/config.cpp) refuses a config that exceeds one, naming the field, and
// Executor::create and the CLI refuse programs and flags that would. Raising a limit only
// changes these constants (the stack tables grow with them).
#pragma once

#include <cstdint>

namespace attnres {

// Sources of one AttnRes read (bank slots + the running sum): the fused step's score and row
// tables (kernels/attnres.h) and the reference read's (model/forward.h). The published model
// reads at most 9 (8 slots + the running sum); a read of a model with L layers and block size
// B sees up to ceil(L / B) + 1.
inline constexpr int kMaxAttnResSources = 64;

// Width of the KDA short convolution (linear_attn_config.short_conv_kernel_size): the window
// tables of causal_conv1d_silu (kernels/kda.h). Published: 4.
inline constexpr int kMaxConvWidth = 16;

}  // namespace attnres
