// Weight binding: maps the published checkpoint names (k3-model.md §6) onto ModelWeights,
// checking every tensor's dtype and shape against the config. See weights.h for the contract.
//
// Names are matched on their canonical form: a leading `language_model.` and then a leading
// `model.` are stripped, so `language_model.model.layers.0.input_layernorm.weight`,
// `model.layers.0.input_layernorm.weight` and `layers.0.input_layernorm.weight` all bind, and
// `language_model.lm_head.weight` and `lm_head.weight` both bind the output head. The prefix
// is detected per tensor; two file names with the same canonical form are kInconsistent.
#include "io/weights.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <new>
#include <set>

#include "io/safetensors.h"
#include "util/lanes.h"
#include "util/memory.h"
#include "util/mxfp4_lanes.h"

namespace attnres {
namespace {

constexpr size_t kMaxListedProblems = 12;
constexpr size_t kMaxExtraExamples = 5;

std::string canonical_name(const std::string& name) {
  std::string_view n = name;
  if (n.starts_with("language_model.")) n.remove_prefix(15);
  if (n.starts_with("model.")) n.remove_prefix(6);
  return std::string(n);
}

enum class Kind {
  kFloat,  // BF16 or F32: an engine widens either
  kU8,     // MXFP4 packed codes or E8M0 scales
};

std::string kind_string(Kind k) {
  return k == Kind::kFloat ? "BF16 or F32" : "U8";
}

bool kind_ok(Kind k, DType d) {
  return k == Kind::kFloat ? (d == DType::kBF16 || d == DType::kF32) : d == DType::kU8;
}

using Shape = std::vector<int64_t>;

// Which part of an MXFP4 matrix a tensor is, if any (Binder::bind_split).
enum class Mxfp4Part : uint8_t { kNone, kCodes, kScales };

// Binds tensors by canonical name, collecting every problem so one load reports them all.
class Binder {
 public:
  // `owned` receives the private copies (see WeightResidence).
  Binder(const SafetensorsCheckpoint& ck, BindReport& report, WeightMemory& owned,
         WeightResidence residence)
      : ck_(&ck), report_(&report), owned_(&owned), residence_(residence) {}
  // Enumeration mode: nothing is looked up; every tensor the model needs is recorded in `specs`
  // with its canonical shape (model_tensor_specs()).
  explicit Binder(std::vector<TensorSpec>& specs) : specs_(&specs) {}
  bool enumerating() const { return specs_ != nullptr; }

  Status index_names() {
    for (const auto& [name, loc] : ck_->tensors()) {
      const std::string canon = canonical_name(name);
      if (canon == "embed_tokens.weight")  // the file's spelling, for naming missing tensors
        model_prefix_ = name.substr(0, name.size() - canon.size());
      auto [it, inserted] = canon_.emplace(canon, name);
      if (!inserted)
        return Status(ErrorCode::kInconsistent,
                      "tensors '" + it->second + "' and '" + name +
                          "' name the same weight (they differ only in the "
                          "'language_model.'/'model.' prefix)");
    }
    return Status::ok();
  }

  // How the forward reads a tensor: streamed whole every step (projections, norms), or only
  // looked up (an untied embedding's rows of the step's tokens; factors folded at load).
  enum class Use { kStreamed, kLookedUp };

  // The tensor with canonical name `canon`, checked for dtype kind and exact shape, replicated
  // on every rank. On a problem it is recorded and an empty view returned (binding continues,
  // so all problems are listed).
  TensorView bind(const std::string& canon, Kind kind, const Shape& shape,
                  const std::string& formula, Use use = Use::kStreamed) {
    TensorView v = bind_whole(canon, kind, shape, formula);
    replicated(v);
    if (use == Use::kStreamed && residence_ == WeightResidence::kPrivate && v.nbytes > 0)
      return private_copy(canon, v, v);
    return v;
  }

  // The same tensor split by its first dimension over the ranks: `units` units of `unit_rows`
  // rows (shape[0] == units * unit_rows); the view holds this rank's rows only. With P > 1 the
  // rows are read into private memory instead of viewed in the mapping: a rank's rows of a
  // small tensor (an expert's scales, a few KB) share pages with the other ranks' rows, and page
  // faults on a mapping bring in whole pages and their neighbours, so a view would leave most
  // of the tensor resident on every rank. `mxfp4`: the tensor is an MXFP4 matrix's packed
  // codes [rows, cols/2] or its scales [rows, cols/32], which a private copy stores in 16-row
  // lane groups where the rows fit them (util/mxfp4_lanes.h; the codes and the scales of a
  // matrix have the same rows, so both or neither are packed); in the mapping (--mmap) they
  // stay row-major. The kernels compute the same bits from either.
  TensorView bind_split(const std::string& canon, Kind kind, const Shape& shape,
                        const std::string& formula, int64_t units, int64_t unit_rows,
                        Mxfp4Part mxfp4 = Mxfp4Part::kNone) {
    if (specs_ != nullptr) {
      specs_->push_back({canon, kind == Kind::kU8, shape, units, unit_rows});
      return TensorView{};
    }
    TensorView v = bind_whole(canon, kind, shape, formula);
    if (v.name.empty()) return v;
    const Range r = shard_.range(units);
    TensorView s = slice_rows(v, r.begin * unit_rows, r.size() * unit_rows);
    report_->rank_bytes += static_cast<int64_t>(s.nbytes);
    if ((shard_.sharded() || residence_ == WeightResidence::kPrivate) && s.nbytes > 0) {
      const int64_t k_per_byte = mxfp4 == Mxfp4Part::kCodes ? 2 : kMxfp4BlockSize;
      const bool lanes =
          mxfp4 != Mxfp4Part::kNone && mxfp4_lanes_fit(s.shape[0], s.shape[1] * k_per_byte);
      return private_copy(canon, v, s, lanes ? mxfp4 : Mxfp4Part::kNone);
    }
    return s;
  }

  // A projection's weights, read only through projection jobs (kernels/matmul.h): bound like
  // bind() (units == 0) or bind_split(), and then, when BF16 with an even K, stored lane-packed
  // (util/lanes.h) in private memory whatever the residence, so the same bits come out of every
  // load (see the file comment in weights.h).
  TensorView bind_projection(const std::string& canon, const Shape& shape,
                             const std::string& formula, int64_t units = 0, int64_t unit_rows = 1) {
    if (specs_ != nullptr) {
      specs_->push_back({canon, false, shape, units, units > 0 ? unit_rows : 0});
      return TensorView{};
    }
    TensorView v = bind_whole(canon, Kind::kFloat, shape, formula);
    if (v.name.empty() || v.dtype != DType::kBF16 || v.shape[1] % 2 != 0)
      return units > 0 ? bind_split(canon, Kind::kFloat, shape, formula, units, unit_rows)
                       : bind(canon, Kind::kFloat, shape, formula);
    TensorView s = v;
    if (units > 0) {
      const Range r = shard_.range(units);
      s = slice_rows(v, r.begin * unit_rows, r.size() * unit_rows);
      report_->rank_bytes += static_cast<int64_t>(s.nbytes);
    } else {
      replicated(v);
    }
    return s.nbytes > 0 ? lanes_copy(canon, v, s) : s;
  }

  // `rows` (a slice of the mapped BF16 [N, K] `whole`) read from the file group by group into
  // private memory in the lane-packed layout; an empty view, with the problem recorded, when
  // the read fails.
  TensorView lanes_copy(const std::string& canon, const TensorView& whole, const TensorView& rows) {
    if (!ok()) return rows;  // the load fails: read nothing more
    const int64_t N = rows.shape[0], K = rows.shape[1];
    const size_t bytes = static_cast<size_t>(lanes_size(N, K)) * sizeof(bf16);
    std::byte* buf = nullptr;
    std::vector<bf16> group;
    try {
      buf = owned_->allocate(bytes);
      group.resize(static_cast<size_t>(kLaneGroupRows * K));
    } catch (const std::bad_alloc&) {
      problem(ErrorCode::kResourceExhausted, "cannot allocate " + std::to_string(bytes) +
                                                 " bytes to read tensor '" + whole.name +
                                                 "' into memory");
      return TensorView{};
    }
    const SafetensorsCheckpoint::Location* loc = ck_->find(canon_.at(canon));
    const auto offset = static_cast<uint64_t>(rows.data - whole.data);
    const size_t row_bytes = static_cast<size_t>(K) * sizeof(bf16);
    for (int64_t g = 0; g * kLaneGroupRows < N; ++g) {
      const int64_t n = std::min(kLaneGroupRows, N - g * kLaneGroupRows);
      Status st = ck_->files()[loc->file]->read_bytes(
          *loc->entry, offset + static_cast<uint64_t>(g * kLaneGroupRows) * row_bytes,
          static_cast<size_t>(n) * row_bytes, reinterpret_cast<std::byte*>(group.data()));
      if (!st.is_ok()) {
        problem(st.code(), st.message());
        return TensorView{};
      }
      pack_bf16_lanes_group(group.data(), g, N, K, reinterpret_cast<bf16*>(buf));
    }
    TensorView s = rows;  // nbytes: the values' bytes, as for every view (util/tensor.h)
    s.data = buf;
    s.layout = Layout::kBf16Lanes;
    report_->bytes_private += static_cast<int64_t>(bytes);
    return s;
  }

  // `rows` (a slice of the mapped `whole`) read from the file into private memory, row-major as
  // read, or, for `lanes` the part of an MXFP4 matrix whose rows fit the lane layout, packed into
  // it in place; an empty view, with the problem recorded, when the read fails.
  TensorView private_copy(const std::string& canon, const TensorView& whole, const TensorView& rows,
                          Mxfp4Part lanes = Mxfp4Part::kNone) {
    if (!ok()) return rows;  // the load fails: read nothing more
    std::byte* buf = nullptr;
    try {
      buf = owned_->allocate(rows.nbytes);
    } catch (const std::bad_alloc&) {
      problem(
          ErrorCode::kResourceExhausted,
          "cannot allocate " + std::to_string(rows.nbytes) + " bytes to read tensor '" +
              whole.name + "' into memory" +
              (shard_.sharded() ? std::string(" (this rank's rows)")
                                : std::string(" (--mmap views it in the file mapping instead)")));
      return TensorView{};
    }
    const SafetensorsCheckpoint::Location* loc = ck_->find(canon_.at(canon));
    const auto offset = static_cast<uint64_t>(rows.data - whole.data);
    Status st = ck_->files()[loc->file]->read_bytes(*loc->entry, offset, rows.nbytes, buf);
    if (!st.is_ok()) {
      problem(st.code(), st.message());
      return TensorView{};
    }
    auto* bytes = reinterpret_cast<uint8_t*>(buf);
    if (lanes == Mxfp4Part::kCodes)
      pack_mxfp4_lane_codes_in_place(bytes, rows.shape[0], rows.shape[1] * 2);
    if (lanes == Mxfp4Part::kScales)
      pack_mxfp4_lane_scales_in_place(bytes, rows.shape[0], rows.shape[1] * kMxfp4BlockSize);
    TensorView s = rows;
    s.data = buf;
    s.layout = lanes == Mxfp4Part::kNone ? Layout::kRowMajor : Layout::kMxfp4Lanes;
    report_->bytes_private += static_cast<int64_t>(rows.nbytes);
    return s;
  }

  // kv_b_proj's per-head absorbed projections (absorbed_head_weights) in private memory; none
  // while enumerating or once the load has failed.
  void absorbed_heads(const TensorView& kv_b_proj, int64_t nope, int64_t v,
                      std::vector<Matrix>& uk_t, std::vector<Matrix>& uv) {
    if (specs_ != nullptr || !ok() || kv_b_proj.data == nullptr) return;
    const size_t before = owned_->bytes_used();
    try {
      absorbed_head_weights(kv_b_proj, nope, v, *owned_, uk_t, uv);
    } catch (const std::bad_alloc&) {
      problem(ErrorCode::kResourceExhausted, "cannot allocate the per-head copies of tensor '" +
                                                 kv_b_proj.name + "' for the absorbed attention");
      return;
    }
    report_->bytes_private += static_cast<int64_t>(owned_->bytes_used() - before);
    report_->rank_copy_bytes += absorbed_head_bytes(
        kv_b_proj.dtype, static_cast<int64_t>(uk_t.size()), nope, v, kv_b_proj.shape[1]);
  }

  // Counts a replicated view (bound whole on every rank) in this rank's bytes.
  void replicated(const TensorView& v) {
    if (specs_ != nullptr || v.name.empty() || !rank_counted_.insert(v.name).second) return;
    report_->rank_bytes += static_cast<int64_t>(v.nbytes);
    report_->rank_replicated_bytes += static_cast<int64_t>(v.nbytes);
  }

  void set_shard(const Shard& s) { shard_ = s; }
  const Shard& shard() const { return shard_; }

  TensorView bind_whole(const std::string& canon, Kind kind, const Shape& shape,
                        const std::string& formula) {
    TensorView v = lookup(canon, kind, shape);
    if (v.name.empty()) return TensorView{};
    if (v.shape != shape) {
      problem(ErrorCode::kShapeMismatch, "tensor '" + v.name + "' has shape " + v.shape_string() +
                                             ", expected " + shape_to_string(shape) + " (" +
                                             formula + ")");
      return TensorView{};
    }
    return v;
  }

  // The tensor with its dtype checked but not its shape (the caller checks it; `canonical` is
  // the shape recorded in enumeration mode).
  TensorView lookup(const std::string& canon, Kind kind, const Shape& canonical) {
    if (specs_ != nullptr) {
      specs_->push_back({canon, kind == Kind::kU8, canonical});
      return TensorView{};
    }
    auto it = canon_.find(canon);
    if (it == canon_.end()) {
      problem(ErrorCode::kMissingTensor, "missing tensor '" + display(canon) +
                                             "' (looked for it with and without the " +
                                             "'language_model.' and 'model.' prefixes)");
      return TensorView{};
    }
    auto t = ck_->tensor(it->second);
    if (!t) {  // cannot happen: names come from the checkpoint
      problem(t.status().code(), t.status().message());
      return TensorView{};
    }
    TensorView v = std::move(t).value();
    if (!kind_ok(kind, v.dtype)) {
      problem(ErrorCode::kDtypeMismatch, "tensor '" + v.name + "' has dtype " +
                                             std::string(dtype_name(v.dtype)) + ", expected " +
                                             kind_string(kind));
      return TensorView{};
    }
    const size_t align = dtype_size(v.dtype);
    if (v.data != nullptr && reinterpret_cast<uintptr_t>(v.data) % align != 0) {
      problem(ErrorCode::kUnsupported,
              "tensor '" + v.name + "' is not aligned to its element size " +
                  std::to_string(align) + " in " + ck_->file_of(*ck_->find(it->second)) +
                  " (rewrite the file with aligned offsets)");
      return TensorView{};
    }
    if (bound_.insert(v.name).second) {
      const std::string dn(dtype_name(v.dtype));
      report_->params_by_dtype[dn] += v.numel();
      report_->bytes_by_dtype[dn] += static_cast<int64_t>(v.nbytes);
    }
    return v;
  }

  void problem(ErrorCode code, std::string what) {
    if (problems_.empty()) first_code_ = code;
    problems_.push_back(std::move(what));
  }
  bool ok() const { return problems_.empty(); }

  Status finish(const std::string& model_dir) {
    report_->tensors_in_files = static_cast<int64_t>(ck_->tensors().size());
    report_->tensors_bound = static_cast<int64_t>(bound_.size());
    report_->extra_tensors = 0;
    for (const auto& [name, loc] : ck_->tensors()) {
      if (bound_.count(name)) continue;
      if (report_->extra_examples.size() < kMaxExtraExamples)
        report_->extra_examples.push_back(name);
      ++report_->extra_tensors;
    }
    report_->bytes_mapped = 0;
    for (const auto& f : ck_->files())
      report_->bytes_mapped += static_cast<int64_t>(f->file_bytes());
    if (problems_.empty()) return Status::ok();
    std::string msg = model_dir + ": " + std::to_string(problems_.size()) + " weight problem" +
                      (problems_.size() > 1 ? "s" : "") + ":";
    for (size_t i = 0; i < problems_.size() && i < kMaxListedProblems; ++i)
      msg += "\n  " + problems_[i];
    if (problems_.size() > kMaxListedProblems)
      msg += "\n  ... and " + std::to_string(problems_.size() - kMaxListedProblems) + " more";
    return Status(first_code_, msg);
  }

  // A canonical name as the file would most likely spell it (same prefix as the embedding; the
  // head sits outside `model.`).
  std::string display(const std::string& canon) const {
    if (canon != "lm_head.weight") return model_prefix_ + canon;
    const bool lm = model_prefix_.starts_with("language_model.");
    return (lm ? "language_model." : "") + canon;
  }

 private:
  const SafetensorsCheckpoint* ck_ = nullptr;
  BindReport* report_ = nullptr;
  WeightMemory* owned_ = nullptr;
  std::vector<TensorSpec>* specs_ = nullptr;
  std::map<std::string, std::string> canon_;  // canonical -> name in the file
  std::string model_prefix_ = "language_model.model.";
  std::set<std::string> bound_;
  std::set<std::string> rank_counted_;
  Shard shard_;
  WeightResidence residence_ = WeightResidence::kMapped;
  std::vector<std::string> problems_;
  ErrorCode first_code_ = ErrorCode::kOk;
};

}  // namespace

TensorView slice_rows(const TensorView& v, int64_t row0, int64_t rows) {
  assert(v.layout == Layout::kRowMajor);
  TensorView s = v;
  if (v.shape.empty() || v.shape[0] == 0) return s;
  const size_t row_bytes = v.nbytes / static_cast<size_t>(v.shape[0]);
  s.shape[0] = rows;
  s.nbytes = row_bytes * static_cast<size_t>(rows);
  s.data = s.nbytes == 0 ? nullptr : v.data + row_bytes * static_cast<size_t>(row0);
  return s;
}

namespace {

std::string dims(std::initializer_list<std::pair<const char*, int64_t>> terms) {
  std::string s;
  for (const auto& [name, v] : terms) {
    if (!s.empty()) s += ", ";
    s += std::string(name) + " = " + std::to_string(v);
  }
  return s;
}

// q = res_norm.weight * res_proj.weight, elementwise in fp32. Empty on a problem. The stored
// factors are returned in `norm` and `proj`.
std::vector<float> fold_query(Binder& b, const std::string& prefix, int64_t d, TensorView& norm,
                              TensorView& proj) {
  norm = b.bind(prefix + "_norm.weight", Kind::kFloat, {d}, dims({{"hidden_size", d}}),
                Binder::Use::kLookedUp);
  proj = b.lookup(prefix + "_proj.weight", Kind::kFloat, Shape{1, d});
  b.replicated(proj);
  if (proj.name.empty() || norm.name.empty()) return {};
  // Published as nn.Linear(d, 1): [1, d]; a flat [d] has the same bytes.
  if (proj.shape != Shape{1, d} && proj.shape != Shape{d}) {
    b.problem(ErrorCode::kShapeMismatch, "tensor '" + proj.name + "' has shape " +
                                             proj.shape_string() + ", expected " +
                                             shape_to_string(Shape{1, d}) + " ([1, hidden_size])");
    proj = TensorView{};
    return {};
  }
  std::vector<float> q(static_cast<size_t>(d));  // [d]
  for (int64_t j = 0; j < d; ++j) q[static_cast<size_t>(j)] = norm.get_f32(j) * proj.get_f32(j);
  return q;
}

// A_log: [H], zero-padded [N > H] (first H used) or legacy [1, 1, H, 1].
std::vector<float> bind_a_log(Binder& b, const std::string& name, int64_t H, TensorView& t) {
  t = b.lookup(name, Kind::kFloat, Shape{H});
  if (t.name.empty()) return {};
  const bool flat = t.rank() == 1 && t.shape[0] >= H;
  const bool legacy = t.shape == Shape{1, 1, H, 1};
  if (!flat && !legacy) {
    b.problem(ErrorCode::kShapeMismatch,
              "tensor '" + t.name + "' has shape " + t.shape_string() + ", expected [" +
                  std::to_string(H) + "], [N >= " + std::to_string(H) + "] or [1, 1, " +
                  std::to_string(H) + ", 1] (linear_attn_config.num_heads = " + std::to_string(H) +
                  ")");
    t = TensorView{};
    return {};
  }
  b.replicated(t);
  // This rank's heads (all of them at P = 1).
  const Range heads = b.shard().range(H);
  std::vector<float> a(static_cast<size_t>(heads.size()));  // [local heads]
  for (int64_t h = heads.begin; h < heads.end; ++h)
    a[static_cast<size_t>(h - heads.begin)] = t.get_f32(h);
  return a;
}

// Tensor parallelism (parallel.md's table): heads for q/k/v/g/beta and everything per head
// (conv channels, f_b rows, dt_bias, A_log), output rows for o_proj; f_a_proj, g_a_proj and
// o_norm are replicated.
KdaWeights bind_kda(Binder& b, const ModelConfig& c, const std::string& p) {
  const int64_t d = c.hidden_size, H = c.linear.num_heads, dk = c.linear.head_dim;
  const int64_t dv = dk, P = H * dk, W = c.linear.short_conv_kernel_size;
  const std::string proj = dims({{"H*head_dim", P}, {"hidden_size", d}});
  KdaWeights w;
  w.q_proj = b.bind_projection(p + "q_proj.weight", {P, d}, proj, H, dk);
  w.k_proj = b.bind_projection(p + "k_proj.weight", {P, d}, proj, H, dk);
  w.v_proj = b.bind_projection(p + "v_proj.weight", {P, d}, proj, H, dv);
  const std::string conv = dims({{"H*head_dim", P}, {"short_conv_kernel_size", W}});
  w.q_conv = b.bind_split(p + "q_conv1d.weight", Kind::kFloat, {P, 1, W}, conv, H, dk);
  w.k_conv = b.bind_split(p + "k_conv1d.weight", Kind::kFloat, {P, 1, W}, conv, H, dk);
  w.v_conv = b.bind_split(p + "v_conv1d.weight", Kind::kFloat, {P, 1, W}, conv, H, dv);
  w.f_a_proj = b.bind_projection(p + "f_a_proj.weight", {dk, d},
                                 dims({{"head_dim", dk}, {"hidden_size", d}}));
  w.f_b_proj = b.bind_projection(p + "f_b_proj.weight", {P, dk},
                                 dims({{"H*head_dim", P}, {"head_dim", dk}}), H, dk);
  w.b_proj = b.bind_projection(p + "b_proj.weight", {H, d},
                               dims({{"num_heads", H}, {"hidden_size", d}}), H, 1);
  if (c.linear.use_full_rank_gate) {
    w.g_proj = b.bind_projection(p + "g_proj.weight", {H * dv, d},
                                 dims({{"H*head_dim", H * dv}, {"hidden_size", d}}), H, dv);
  } else {
    w.g_a_proj = b.bind_projection(p + "g_a_proj.weight", {dv, d},
                                   dims({{"head_dim", dv}, {"hidden_size", d}}));
    w.g_b_proj = b.bind_projection(p + "g_b_proj.weight", {H * dv, dv},
                                   dims({{"H*head_dim", H * dv}, {"head_dim", dv}}), H, dv);
  }
  w.a_log = bind_a_log(b, p + "A_log", H, w.a_log_stored);
  w.a_log_group = dk;
  w.dt_bias = b.bind_split(p + "dt_bias", Kind::kFloat, {P}, dims({{"H*head_dim", P}}), H, dk);
  w.o_norm = b.bind(p + "o_norm.weight", Kind::kFloat, {dv}, dims({{"head_dim", dv}}));
  w.o_proj = b.bind_projection(p + "o_proj.weight", {d, H * dv},
                               dims({{"hidden_size", d}, {"H*head_dim", H * dv}}), d, 1);
  return w;
}

// An absorbed [n, k] matrix is lane-packed when BF16 with k even, else row-major as stored.
bool absorbed_packed(DType dtype, int64_t k) {
  return dtype == DType::kBF16 && k % 2 == 0;
}

int64_t absorbed_matrix_bytes(DType dtype, int64_t n, int64_t k) {
  return absorbed_packed(dtype, k) ? lanes_size(n, k) * static_cast<int64_t>(sizeof(bf16))
                                   : n * k * static_cast<int64_t>(dtype_size(dtype));
}

// The [n, k] matrix whose element (i, j) is kv_b_proj's element at(i, j) (a row-major index) as
// a projection weight in `memory`: BF16 lane-packed when the stored dtype is BF16 and k even,
// else row-major in the stored dtype.
template <typename At>
TensorView absorbed_matrix(const TensorView& kv_b_proj, int64_t n, int64_t k, WeightMemory& memory,
                           const At& at) {
  const size_t es = dtype_size(kv_b_proj.dtype);
  std::vector<std::byte> rows(static_cast<size_t>(n * k) * es);  // row-major
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j)
      std::memcpy(rows.data() + static_cast<size_t>(i * k + j) * es,
                  kv_b_proj.data + static_cast<size_t>(at(i, j)) * es, es);
  TensorView t;
  t.name = kv_b_proj.name;
  t.dtype = kv_b_proj.dtype;
  t.shape = {n, k};
  t.nbytes = rows.size();
  std::byte* buf = memory.allocate(static_cast<size_t>(absorbed_matrix_bytes(t.dtype, n, k)));
  t.data = buf;
  if (absorbed_packed(t.dtype, k)) {
    pack_bf16_lanes(reinterpret_cast<const bf16*>(rows.data()), n, k, reinterpret_cast<bf16*>(buf));
    t.layout = Layout::kBf16Lanes;
  } else {
    std::memcpy(buf, rows.data(), rows.size());
  }
  return t;
}

}  // namespace

int64_t absorbed_head_bytes(DType dtype, int64_t heads, int64_t nope, int64_t v, int64_t r) {
  return heads * (absorbed_matrix_bytes(dtype, r, nope) + absorbed_matrix_bytes(dtype, v, r));
}

void absorbed_head_weights(const TensorView& kv_b_proj, int64_t nope, int64_t v,
                           WeightMemory& memory, std::vector<Matrix>& uk_t,
                           std::vector<Matrix>& uv) {
  const int64_t kvw = nope + v, r = kv_b_proj.shape[1], H = kv_b_proj.shape[0] / kvw;
  uk_t.clear();
  uv.clear();
  for (int64_t h = 0; h < H; ++h) {
    // W_UK[h]^T: element (c, i) is W_UK[h]'s (i, c), kv_b_proj row h*kvw + i.
    uk_t.push_back(absorbed_matrix(kv_b_proj, r, nope, memory,
                                   [&](int64_t c, int64_t i) { return (h * kvw + i) * r + c; }));
    // W_UV[h]: kv_b_proj rows h*kvw + nope + e as stored.
    uv.push_back(absorbed_matrix(kv_b_proj, v, r, memory, [&](int64_t e, int64_t c) {
      return (h * kvw + nope + e) * r + c;
    }));
  }
}

namespace {

// Tensor parallelism: q_a and kv_a by output rows (gathered: their norms need whole vectors),
// q_b (or q), kv_b and g by heads, o_proj by output rows; the latent norms replicated.
MlaWeights bind_mla(Binder& b, const ModelConfig& c, const std::string& p) {
  const int64_t d = c.hidden_size, H = c.num_attention_heads;
  const int64_t nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim, v = c.v_head_dim;
  const int64_t rq = c.q_lora_rank, rkv = c.kv_lora_rank;
  MlaWeights w;
  if (rq > 0) {
    w.q_a_proj = b.bind_projection(p + "q_a_proj.weight", {rq, d},
                                   dims({{"q_lora_rank", rq}, {"hidden_size", d}}), rq, 1);
    w.q_a_norm =
        b.bind(p + "q_a_layernorm.weight", Kind::kFloat, {rq}, dims({{"q_lora_rank", rq}}));
    w.q_b_proj = b.bind_projection(
        p + "q_b_proj.weight", {H * (nope + rope), rq},
        dims({{"H*(qk_nope+qk_rope)", H * (nope + rope)}, {"q_lora_rank", rq}}), H, nope + rope);
  } else {
    w.q_proj = b.bind_projection(
        p + "q_proj.weight", {H * (nope + rope), d},
        dims({{"H*(qk_nope+qk_rope)", H * (nope + rope)}, {"hidden_size", d}}), H, nope + rope);
  }
  w.kv_a_proj = b.bind_projection(p + "kv_a_proj_with_mqa.weight", {rkv + rope, d},
                                  dims({{"kv_lora_rank+qk_rope", rkv + rope}, {"hidden_size", d}}),
                                  rkv + rope, 1);
  w.kv_a_norm =
      b.bind(p + "kv_a_layernorm.weight", Kind::kFloat, {rkv}, dims({{"kv_lora_rank", rkv}}));
  w.kv_b_proj = b.bind_split(
      p + "kv_b_proj.weight", Kind::kFloat, {H * (nope + v), rkv},
      dims({{"H*(qk_nope+v_head_dim)", H * (nope + v)}, {"kv_lora_rank", rkv}}), H, nope + v);
  b.absorbed_heads(w.kv_b_proj, nope, v, w.w_uk_t, w.w_uv);
  if (c.mla_use_output_gate)
    w.g_proj = b.bind_projection(p + "g_proj.weight", {H * v, d},
                                 dims({{"H*v_head_dim", H * v}, {"hidden_size", d}}), H, v);
  w.o_proj = b.bind_projection(p + "o_proj.weight", {d, H * v},
                               dims({{"hidden_size", d}, {"H*v_head_dim", H * v}}), d, 1);
  return w;
}

// An expert matrix split by its rows (every rank holds its rows of every expert).
ExpertMatrix bind_expert_matrix(Binder& b, const ModelConfig& c, const std::string& p, int64_t rows,
                                int64_t cols, const char* rows_name, const char* cols_name) {
  ExpertMatrix m;
  m.rows = b.shard().range(rows).size();
  m.cols = cols;
  m.mxfp4 = c.expert_format == ExpertFormat::kMxfp4;
  if (m.mxfp4) {
    m.packed =
        b.bind_split(p + ".weight_packed", Kind::kU8, {rows, cols / 2},
                     dims({{rows_name, rows}, {cols_name, cols}}) + ", two E2M1 codes per byte",
                     rows, 1, Mxfp4Part::kCodes);
    m.scale = b.bind_split(p + ".weight_scale", Kind::kU8, {rows, cols / kMxfp4BlockSize},
                           dims({{rows_name, rows}, {cols_name, cols}}) + ", one E8M0 scale per 32",
                           rows, 1, Mxfp4Part::kScales);
    m.normal_scales =
        m.scale.layout == Layout::kMxfp4Lanes &&
        mxfp4_scales_normal(m.scale.as<uint8_t>(), static_cast<int64_t>(m.scale.nbytes));
  } else {
    m.dense = b.bind_projection(p + ".weight", {rows, cols},
                                dims({{rows_name, rows}, {cols_name, cols}}), rows, 1);
  }
  return m;
}

// Tensor parallelism: router rows (expert scores, gathered; the selection bias replicated),
// every expert's w1/w3 by rows (the intermediate dimension) and w2 by rows (the latent or
// model dimension), the shared experts' gate/up by rows and down by output rows, the latent
// down and up projections by output rows; the latent norm replicated.
MoeWeights bind_moe(Binder& b, const ModelConfig& c, const std::string& p) {
  const int64_t d = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size;
  const int64_t K = c.routed_expert_hidden_size.value_or(d);
  const char* k_name = c.routed_expert_hidden_size ? "routed_expert_hidden_size" : "hidden_size";
  MoeWeights w;
  w.gate = b.bind_projection(p + "gate.weight", {E, d},
                             dims({{"num_experts", E}, {"hidden_size", d}}), E, 1);
  w.gate_bias =
      b.bind(p + "gate.e_score_correction_bias", Kind::kFloat, {E}, dims({{"num_experts", E}}));
  // E is only trusted once the router [E, d] exists in the file (it bounds the allocation).
  if (w.gate.name.empty() && !b.enumerating()) return w;
  w.experts.resize(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    const std::string ep = p + "experts." + std::to_string(e) + ".";
    ExpertWeights& x = w.experts[static_cast<size_t>(e)];
    x.w1 = bind_expert_matrix(b, c, ep + "w1", I, K, "moe_intermediate_size", k_name);
    x.w2 = bind_expert_matrix(b, c, ep + "w2", K, I, k_name, "moe_intermediate_size");
    x.w3 = bind_expert_matrix(b, c, ep + "w3", I, K, "moe_intermediate_size", k_name);
  }
  if (c.num_shared_experts > 0) {
    int64_t SI = 0;
    if (__builtin_mul_overflow(int64_t{c.num_shared_experts}, I, &SI)) {
      b.problem(ErrorCode::kInvalidValue,
                c.source + ": num_shared_experts * moe_intermediate_size overflows");
      return w;
    }
    const std::string f = dims({{"num_shared_experts*moe_intermediate_size", SI}});
    w.shared_gate = b.bind_projection(p + "shared_experts.gate_proj.weight", {SI, d},
                                      f + ", hidden_size = " + std::to_string(d), SI, 1);
    w.shared_up = b.bind_projection(p + "shared_experts.up_proj.weight", {SI, d},
                                    f + ", hidden_size = " + std::to_string(d), SI, 1);
    w.shared_down = b.bind_projection(p + "shared_experts.down_proj.weight", {d, SI},
                                      "hidden_size = " + std::to_string(d) + ", " + f, d, 1);
  }
  if (c.routed_expert_hidden_size) {
    const int64_t r = *c.routed_expert_hidden_size;
    w.latent_down =
        b.bind_projection(p + "routed_expert_down_proj.weight", {r, d},
                          dims({{"routed_expert_hidden_size", r}, {"hidden_size", d}}), r, 1);
    if (c.latent_moe_use_norm)
      w.latent_norm = b.bind(p + "routed_expert_norm.weight", Kind::kFloat, {r},
                             dims({{"routed_expert_hidden_size", r}}));
    w.latent_up =
        b.bind_projection(p + "routed_expert_up_proj.weight", {d, r},
                          dims({{"hidden_size", d}, {"routed_expert_hidden_size", r}}), d, 1);
  }
  return w;
}

// Tensor parallelism: gate/up by rows (the intermediate dimension), down by output rows.
DenseMlpWeights bind_dense(Binder& b, const ModelConfig& c, const std::string& p) {
  const int64_t d = c.hidden_size, I = c.intermediate_size;
  const std::string f = dims({{"intermediate_size", I}, {"hidden_size", d}});
  DenseMlpWeights w;
  w.gate = b.bind_projection(p + "gate_proj.weight", {I, d}, f, I, 1);
  w.up = b.bind_projection(p + "up_proj.weight", {I, d}, f, I, 1);
  w.down = b.bind_projection(p + "down_proj.weight", {d, I},
                             dims({{"hidden_size", d}, {"intermediate_size", I}}), d, 1);
  return w;
}

LayerWeights bind_layer(Binder& b, const ModelConfig& c, const LayerInfo& info) {
  const int64_t d = c.hidden_size;
  const std::string p = "layers." + std::to_string(info.index) + ".";
  LayerWeights w;
  w.input_norm =
      b.bind(p + "input_layernorm.weight", Kind::kFloat, {d}, dims({{"hidden_size", d}}));
  w.post_attn_norm =
      b.bind(p + "post_attention_layernorm.weight", Kind::kFloat, {d}, dims({{"hidden_size", d}}));
  if (c.schedule.has_attnres()) {
    // Layer 0 skips its pre-attention read, but its query exists and is bound (and folded)
    // like every other so the checkpoint is checked in full.
    w.attn_res_query = fold_query(b, p + "self_attention_res", d, w.attn_res_norm, w.attn_res_proj);
    w.mlp_res_query = fold_query(b, p + "mlp_res", d, w.mlp_res_norm, w.mlp_res_proj);
  }
  if (info.attention == AttnKind::kKda)
    w.kda = bind_kda(b, c, p + "self_attn.");
  else
    w.mla = bind_mla(b, c, p + "self_attn.");
  if (info.ffn == FfnKind::kMoe)
    w.moe = bind_moe(b, c, p + "block_sparse_moe.");
  else
    w.dense = bind_dense(b, c, p + "mlp.");
  return w;
}

}  // namespace

namespace {

// Binds (or, in enumeration mode, lists) every tensor of the model into `mw`.
void bind_model(Binder& b, const ModelConfig& c, ModelWeights& mw) {
  const int64_t d = c.hidden_size, V = c.vocab_size;
  const std::string vd = dims({{"vocab_size", V}, {"hidden_size", d}});
  // The embedding is replicated (a rank reads the rows of its tokens; streamed whole only as
  // a tied head); lm_head is split by vocabulary rows (the logits are gathered).
  mw.embed = b.bind("embed_tokens.weight", Kind::kFloat, {V, d}, vd,
                    c.tie_word_embeddings ? Binder::Use::kStreamed : Binder::Use::kLookedUp);
  mw.final_norm = b.bind("norm.weight", Kind::kFloat, {d}, dims({{"hidden_size", d}}));
  // Tied: the head is the embedding (this rank's rows of it); a stored lm_head is then left
  // unbound (counted as extra).
  if (c.tie_word_embeddings) {
    const Range r = b.shard().range(V);
    mw.lm_head = slice_rows(mw.embed, r.begin, r.size());
  } else {
    mw.lm_head = b.bind_projection("lm_head.weight", {V, d}, vd, V, 1);
  }
  if (c.schedule.has_attnres())
    mw.out_res_query = fold_query(b, "output_attn_res", d, mw.out_res_norm, mw.out_res_proj);
  mw.layers.reserve(c.schedule.layers.size());
  for (const LayerInfo& info : c.schedule.layers) mw.layers.push_back(bind_layer(b, c, info));
}

}  // namespace

std::vector<TensorSpec> model_tensor_specs(const ModelConfig& config) {
  std::vector<TensorSpec> specs;
  Binder b(specs);
  ModelWeights unused;
  bind_model(b, config, unused);
  return specs;
}

DType release_dtype(const std::string& canon) {
  if (canon.ends_with("weight_packed") || canon.ends_with("weight_scale")) return DType::kU8;
  if (canon.ends_with("conv1d.weight") || canon.ends_with("A_log") || canon.ends_with("dt_bias") ||
      canon.ends_with("o_norm.weight") || canon.ends_with("e_score_correction_bias"))
    return DType::kF32;
  return DType::kBF16;
}

int64_t shard_tensor_bytes(const TensorSpec& spec, DType dtype, const Shard& shard) {
  int64_t inner = 1;
  for (size_t i = 1; i < spec.shape.size(); ++i) inner *= spec.shape[i];
  const int64_t rows = spec.split_units > 0 ? shard.range(spec.split_units).size() * spec.unit_rows
                                            : (spec.shape.empty() ? 1 : spec.shape[0]);
  return rows * inner * static_cast<int64_t>(dtype_size(dtype));
}

Result<ModelWeights> load_model(const std::string& model_dir, const Shard& shard,
                                WeightResidence residence) {
  ModelWeights mw;
  mw.shard = shard;
  ATTNRES_ASSIGN_OR_RETURN(mw.config, load_model_config(model_dir + "/config.json"));
  ATTNRES_ASSIGN_OR_RETURN(SafetensorsCheckpoint ck, SafetensorsCheckpoint::open_dir(model_dir));
  mw.private_memory = std::make_shared<WeightMemory>();
  Binder b(ck, mw.report, *mw.private_memory, residence);
  b.set_shard(shard);
  ATTNRES_RETURN_IF_ERROR(b.index_names());
  bind_model(b, mw.config, mw);
  ATTNRES_RETURN_IF_ERROR(b.finish(model_dir));
  mw.files = ck.files();
  return mw;
}

std::vector<std::string> model_input_files(const ModelWeights& weights,
                                           const std::string& model_dir) {
  std::vector<std::string> files = {model_dir + "/config.json",
                                    model_dir + "/model.safetensors.index.json"};
  if (!weights.config.source.empty()) files.push_back(weights.config.source);
  for (const auto& f : weights.files) files.push_back(f->path());
  return files;
}

}  // namespace attnres
