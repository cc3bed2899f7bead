// Executor (executor.h): runs the forward program under a verified plan.
//
// Invariants:
//  - Every [T, d] value lives in the arena storage the plan assigns it; the executor never
//    copies a value except where the program says so (the commit, and only when the plan put
//    the committed slot in other storage than the running sum).
//  - Every read step is one attnres_step call (fused or reference, per ExecutorOptions), so all
//    policies run the same arithmetic and differ only in where values live.
//  - The inverse RMS of committed slot k lives in inv_rms[k] ([max_tokens] fp32), written by the
//    commit and read by every later read of slot k.
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "kernels/attnres.h"
#include "plan/executor.h"

namespace attnres {

std::string_view act_dtype_name(ActDType t) {
  return t == ActDType::kBF16 ? "bf16" : "f32";
}
size_t act_dtype_size(ActDType t) {
  return t == ActDType::kBF16 ? 2 : 4;
}

struct Executor::Arena {
  std::byte* base = nullptr;
  size_t storage_bytes = 0;    // bytes of one [max_tokens, d] storage, rounded up to 64
  std::vector<float> inv_rms;  // [bank_slots, max_tokens]
  std::byte* raw = nullptr;    // [max_tokens, d] raw mixture (capture_raw_mixture) or null
  ~Arena() { std::free(base); }
};

Executor::Executor(Program program, Plan plan, const ExecutorOptions& options)
    : program_(std::move(program)), plan_(std::move(plan)), options_(options) {}

Executor::~Executor() = default;

Result<std::unique_ptr<Executor>> Executor::create(Program program, Plan plan,
                                                   const ExecutorOptions& options) {
  if (options.max_tokens <= 0 || options.dim <= 0) {
    return Status(ErrorCode::kInvalidArgument,
                  "executor: max_tokens and dim must be positive, got " +
                      std::to_string(options.max_tokens) + " and " + std::to_string(options.dim));
  }
  // The fused step and the reference hold their sources in fixed tables (util/limits.h).
  for (const Step& s : program.steps) {
    if (s.is_read() && static_cast<int64_t>(s.slot_sources.size()) + 1 > kMaxAttnResSources) {
      return Status(ErrorCode::kUnsupported,
                    "executor: read " + s.name + " has " +
                        std::to_string(s.slot_sources.size() + 1) + " sources (" +
                        std::to_string(program.num_layers) + " layers, AttnRes block " +
                        std::to_string(program.block_size) + "), at most " +
                        std::to_string(kMaxAttnResSources) + " are supported");
    }
  }
  auto hazards = verify_plan(program, plan);
  if (!hazards.is_ok()) return hazards.status();
  if (!hazards->empty() && !options.allow_hazards) {
    return Status(ErrorCode::kHazard, "plan '" + std::string(policy_name(plan.policy)) + "' has " +
                                          std::to_string(hazards->size()) +
                                          " hazard(s); first: " + format_hazard(hazards->front()));
  }
  std::unique_ptr<Executor> ex(new Executor(std::move(program), std::move(plan), options));
  auto arena = std::make_unique<Arena>();
  const size_t buffers =
      static_cast<size_t>(ex->plan_.num_storages()) + (options.capture_raw_mixture ? 1 : 0);
  // Sizes come from flags and configs: every product is checked (SIZE_MAX / 2 leaves room for
  // the rounding to 64 bytes).
  size_t raw = 0, total = 0, inv = 0;
  if (__builtin_mul_overflow(static_cast<size_t>(options.max_tokens),
                             static_cast<size_t>(options.dim), &raw) ||
      __builtin_mul_overflow(raw, act_dtype_size(options.dtype), &raw) || raw > SIZE_MAX / 2 ||
      __builtin_mul_overflow((raw + 63) / 64 * 64, buffers, &total) ||
      __builtin_mul_overflow(static_cast<size_t>(ex->program_.bank_slots),
                             static_cast<size_t>(options.max_tokens), &inv) ||
      inv > SIZE_MAX / sizeof(float)) {
    return Status(ErrorCode::kInvalidArgument,
                  "executor: " + std::to_string(buffers) + " activation buffers of [" +
                      std::to_string(options.max_tokens) + ", " + std::to_string(options.dim) +
                      "] " + std::string(act_dtype_name(options.dtype)) +
                      " do not fit in the address space");
  }
  arena->storage_bytes = (raw + 63) / 64 * 64;
  arena->base = static_cast<std::byte*>(std::aligned_alloc(64, total > 0 ? total : 64));
  if (arena->base == nullptr) {
    return Status(ErrorCode::kInternal, "executor: cannot allocate the activation arena of " +
                                            std::to_string(total) + " bytes (" +
                                            std::to_string(ex->plan_.num_storages()) + " x [" +
                                            std::to_string(options.max_tokens) + ", " +
                                            std::to_string(options.dim) + "])");
  }
  // Zeroed once so that a run is a pure function of its inputs even for plans the verifier
  // rejected (the harness runs those on purpose).
  std::memset(arena->base, 0, total);
  try {
    arena->inv_rms.assign(inv, 0.0f);
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kInternal, "executor: cannot allocate the inverse RMS of " +
                                            std::to_string(ex->program_.bank_slots) +
                                            " bank slots x " + std::to_string(options.max_tokens) +
                                            " tokens");
  }
  if (options.capture_raw_mixture) {
    arena->raw = arena->base + arena->storage_bytes * static_cast<size_t>(ex->plan_.num_storages());
  }
  ex->arena_ = std::move(arena);
  return ex;
}

size_t Executor::arena_bytes() const {
  return arena_->storage_bytes *
             (static_cast<size_t>(plan_.num_storages()) + (arena_->raw != nullptr ? 1 : 0)) +
         arena_->inv_rms.size() * sizeof(float);
}

ActView Executor::raw_mixture_view() const {
  ActView v;
  v.data = arena_->raw;
  v.dtype = options_.dtype;
  v.tokens = last_tokens_;
  v.dim = options_.dim;
  return v;
}

ActView Executor::storage_view(int storage) const {
  ActView v;
  v.data = arena_->base + arena_->storage_bytes * static_cast<size_t>(storage);
  v.dtype = options_.dtype;
  v.tokens = last_tokens_;
  v.dim = options_.dim;
  return v;
}

ActView Executor::value_view(int value) const {
  return storage_view(plan_.storage_of[static_cast<size_t>(value)]);
}

ActView Executor::final_hidden() const {
  return value_view(program_.final_value);
}

Status Executor::check_params(const ForwardParams& p) const {
  const size_t d = static_cast<size_t>(options_.dim);
  std::string bad;
  auto need = [&](std::span<const float> s, const std::string& what, bool required) {
    if (s.size() == d || (!required && s.empty())) return;
    bad += "\n  " + what + ": expected " + std::to_string(d) + " values, got " +
           std::to_string(s.size());
  };
  if (p.layers.size() != static_cast<size_t>(program_.num_layers)) {
    return Status(ErrorCode::kInvalidArgument,
                  "forward params: expected " + std::to_string(program_.num_layers) +
                      " layers, got " + std::to_string(p.layers.size()));
  }
  const bool ar = program_.has_attnres();
  for (size_t i = 0; i < p.layers.size(); ++i) {
    const LayerResParams& l = p.layers[i];
    const std::string L = "layer " + std::to_string(i);
    need(l.input_layernorm, L + " input_layernorm", true);
    need(l.post_attention_layernorm, L + " post_attention_layernorm", true);
    need(l.attn_query, L + " attention-residual query", ar && i > 0);
    need(l.mlp_query, L + " mlp-residual query", ar);
  }
  need(p.output_query, "output residual query", ar);
  need(p.final_norm, "final norm", true);
  if (!bad.empty()) return Status(ErrorCode::kInvalidArgument, "forward params:" + bad);
  return Status::ok();
}

namespace {

template <typename T>
void run_step(const AttnResStepArgs<T>& a, ReadKernel k) {
  if (k == ReadKernel::kFused) {
    attnres_step(a);
  } else {
    attnres_step_ref(a);
  }
}

template <typename T>
T* ptr(const ActView& v) {
  return static_cast<T*>(v.data);
}

// One read step on the storages the plan names: T rows of the arena's [max_tokens, d] buffers.
template <typename T>
void read_with(const Executor& ex, const Step& s, int64_t tokens, const float* query,
               const float* gain, const ForwardParams& p, float* inv_rms, int64_t max_tokens,
               ReadKernel k, void* raw) {
  const Program& prog = ex.program();
  AttnResStepArgs<T> a;
  a.tokens = tokens;
  a.dim = ex.options().dim;
  a.res_eps = p.res_eps;
  a.norm_eps = p.norm_eps;
  const T* slots[kMaxAttnResSources];
  const float* slot_inv[kMaxAttnResSources];
  a.num_slots = static_cast<int>(s.slot_sources.size());
  for (int j = 0; j < a.num_slots; ++j) {
    const int v = s.slot_sources[static_cast<size_t>(j)];
    slots[j] = ptr<T>(ex.value_view(v));
    slot_inv[j] =
        inv_rms + static_cast<int64_t>(prog.values[static_cast<size_t>(v)].slot) * max_tokens;
  }
  a.slots = slots;
  a.slot_inv_rms = slot_inv;
  if (s.rs_in >= 0) a.rs_in = ptr<T>(ex.value_view(s.rs_in));
  if (s.pending >= 0) a.pending = ptr<T>(ex.value_view(s.pending));
  if (s.rs_out >= 0) a.rs_out = ptr<T>(ex.value_view(s.rs_out));
  if (s.commit >= 0) {
    a.commit = ptr<T>(ex.value_view(s.commit));
    a.commit_inv_rms = inv_rms + static_cast<int64_t>(s.commit_slot) * max_tokens;
  }
  a.query = query;
  a.norm_weight = gain;
  a.out = ptr<T>(ex.value_view(s.out));
  a.raw_mixture = static_cast<T*>(raw);
  run_step(a, k);
}

}  // namespace

Status Executor::run_read(const Step& s, const ForwardParams& p, int64_t T) {
  std::span<const float> q, gain;
  if (s.kind == StepKind::kFinalRead) {
    q = p.output_query;
    gain = p.final_norm;
  } else {
    const LayerResParams& l = p.layers[static_cast<size_t>(s.layer)];
    q = s.kind == StepKind::kPreAttnRead ? l.attn_query : l.mlp_query;
    gain = s.kind == StepKind::kPreAttnRead ? l.input_layernorm : l.post_attention_layernorm;
  }
  if (!s.slot_sources.empty() && q.size() != static_cast<size_t>(options_.dim)) {
    return Status(ErrorCode::kInvalidArgument, "forward params: " + s.name + " needs a query");
  }
  const float* qp = q.empty() ? nullptr : q.data();
  float* inv = arena_->inv_rms.data();
  if (options_.dtype == ActDType::kBF16) {
    read_with<bf16>(*this, s, T, qp, gain.data(), p, inv, options_.max_tokens, options_.kernel,
                    arena_->raw);
  } else {
    read_with<float>(*this, s, T, qp, gain.data(), p, inv, options_.max_tokens, options_.kernel,
                     arena_->raw);
  }
  return Status::ok();
}

Status Executor::run(SublayerRunner& runner, const ForwardParams& params,
                     std::span<const int32_t> tokens, const StepObserver& observer) {
  const int64_t T = static_cast<int64_t>(tokens.size());
  if (T <= 0 || T > options_.max_tokens) {
    return Status(ErrorCode::kInvalidArgument, "executor: " + std::to_string(T) +
                                                   " tokens, expected 1.." +
                                                   std::to_string(options_.max_tokens));
  }
  ATTNRES_RETURN_IF_ERROR(check_params(params));
  last_tokens_ = T;
  for (const Step& s : program_.steps) {
    switch (s.kind) {
      case StepKind::kEmbed:
        ATTNRES_RETURN_IF_ERROR(runner.embed(tokens, value_view(s.out)));
        break;
      case StepKind::kAttention:
        ATTNRES_RETURN_IF_ERROR(runner.attention(s.layer, value_view(s.in), value_view(s.out)));
        break;
      case StepKind::kMlp:
        ATTNRES_RETURN_IF_ERROR(runner.mlp(s.layer, value_view(s.in), value_view(s.out)));
        break;
      case StepKind::kPreAttnRead:
      case StepKind::kPreMlpRead:
      case StepKind::kFinalRead: {
        const auto t0 = std::chrono::steady_clock::now();
        ATTNRES_RETURN_IF_ERROR(run_read(s, params, T));
        read_seconds_ +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        break;
      }
    }
    if (observer) {
      for (int v : s.writes()) observer(s, v, value_view(v));
      if (s.is_read() && arena_->raw != nullptr) observer(s, -1, raw_mixture_view());
    }
  }
  return Status::ok();
}

}  // namespace attnres
