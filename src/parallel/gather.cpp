// Fused tensor-parallel all-gathers (gather.h).
#include "parallel/gather.h"

#include <cassert>
#include <chrono>
#include <cstring>

namespace attnres {

double comm_clock() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

namespace {

int64_t elem_bytes(const GatherPart& p) {
  return p.bf16 ? 2 : 4;
}

int64_t row_stride(const GatherPart& p) {
  return p.ld > 0 ? p.ld : p.width();
}

// Rank r's columns [c0, c1) of part p.
Range columns(const GatherPart& p, int r, int ranks) {
  const Range u = Shard::range_of(p.units, r, ranks);
  return {u.begin * p.unit, u.end * p.unit};
}

// Copies a [rows, cols] f32 block from src (stride ls) to the byte stream dst (as f32 or as the
// high halves of the f32 bits).
std::byte* put(const float* src, int64_t rows, int64_t cols, int64_t ls, bool bf16,
               std::byte* dst) {
  for (int64_t t = 0; t < rows; ++t) {
    const float* s = src + t * ls;
    if (!bf16) {
      std::memcpy(dst, s, sizeof(float) * static_cast<size_t>(cols));
      dst += sizeof(float) * cols;
      continue;
    }
    for (int64_t i = 0; i < cols; ++i) {
      uint32_t u;
      std::memcpy(&u, s + i, 4);
      assert((u & 0xffffu) == 0 && "a bf16 gather part holds a value that is not bf16");
      const uint16_t h = static_cast<uint16_t>(u >> 16);
      std::memcpy(dst, &h, 2);
      dst += 2;
    }
  }
  return dst;
}

const std::byte* get(const std::byte* src, int64_t rows, int64_t cols, int64_t ld, bool bf16,
                     float* dst) {
  for (int64_t t = 0; t < rows; ++t) {
    float* d = dst + t * ld;
    if (!bf16) {
      std::memcpy(d, src, sizeof(float) * static_cast<size_t>(cols));
      src += sizeof(float) * cols;
      continue;
    }
    for (int64_t i = 0; i < cols; ++i) {
      uint16_t h;
      std::memcpy(&h, src, 2);
      const uint32_t u = static_cast<uint32_t>(h) << 16;
      std::memcpy(d + i, &u, 4);
      src += 2;
    }
  }
  return src;
}

}  // namespace

TensorParallel::TensorParallel(std::shared_ptr<Communicator> comm) : comm_(std::move(comm)) {}

void TensorParallel::gather(std::span<const GatherPart> parts) {
  start(parts);
  finish();
}

void TensorParallel::pack(std::span<const GatherPart> parts) {
  const int P = comm_->size(), me = comm_->rank();
  parts_.assign(parts.begin(), parts.end());
  block_bytes_.assign(static_cast<size_t>(P), 0);
  block_offset_.assign(static_cast<size_t>(P), 0);
  int64_t total = 0;
  for (int r = 0; r < P; ++r) {
    int64_t b = 0;
    for (const GatherPart& p : parts_) b += p.rows * columns(p, r, P).size() * elem_bytes(p);
    block_offset_[static_cast<size_t>(r)] = total;
    block_bytes_[static_cast<size_t>(r)] = b;
    total += b;
  }
  stats_.gather_bytes += total;
  // One f32 row in place: the row itself is the rank-ordered concatenation of the blocks.
  direct_ =
      parts_.size() == 1 && parts_[0].rows == 1 && !parts_[0].bf16 && parts_[0].local == nullptr;
  if (direct_) return;
  if (static_cast<int64_t>(staging_.size()) < total) staging_.resize(static_cast<size_t>(total));
  std::byte* dst = staging_.data() + block_offset_[static_cast<size_t>(me)];
  for (const GatherPart& p : parts_) {
    const Range c = columns(p, me, P);
    const float* src = p.local ? p.local : p.full + c.begin;
    const int64_t ls = p.local ? (p.local_ld > 0 ? p.local_ld : c.size()) : row_stride(p);
    dst = put(src, p.rows, c.size(), ls, p.bf16, dst);
  }
}

void TensorParallel::unpack() {
  const int P = comm_->size(), me = comm_->rank();
  for (int r = 0; r < P; ++r) {
    const std::byte* src = staging_.data() + block_offset_[static_cast<size_t>(r)];
    for (const GatherPart& p : parts_) {
      const Range c = columns(p, r, P);
      if (r == me && p.local == nullptr) {  // already in place
        src += p.rows * c.size() * elem_bytes(p);
        continue;
      }
      src = get(src, p.rows, c.size(), row_stride(p), p.bf16, p.full + c.begin);
    }
  }
}

void TensorParallel::copy_local(std::span<const GatherPart> parts) {
  for (const GatherPart& p : parts) {
    if (p.local == nullptr) continue;
    const int64_t w = p.width(), ls = p.local_ld > 0 ? p.local_ld : w;
    for (int64_t t = 0; t < p.rows; ++t)
      std::memcpy(p.full + t * row_stride(p), p.local + t * ls,
                  sizeof(float) * static_cast<size_t>(w));
  }
}

void TensorParallel::start(std::span<const GatherPart> parts) {
  assert(!pending_ && "a gather is already in flight");
  if (comm_->size() == 1) return copy_local(parts);
  started_ = comm_clock();
  pack(parts);
  ++stats_.collectives;
  ++stats_.gathers;
  const int me = comm_->rank();
  if (direct_) {
    auto* row = reinterpret_cast<std::byte*>(parts_[0].full);
    pending_ =
        comm_->start_allgatherv(row + block_offset_[static_cast<size_t>(me)], row, block_bytes_);
  } else {
    pending_ = comm_->start_allgatherv(staging_.data() + block_offset_[static_cast<size_t>(me)],
                                       staging_.data(), block_bytes_);
  }
  stats_.seconds += comm_clock() - started_;
}

void TensorParallel::finish() {
  if (!pending_) return;
  const double t0 = comm_clock();
  pending_->wait();
  pending_.reset();
  stats_.seconds += comm_clock() - t0;
  if (!direct_) unpack();
}

}  // namespace attnres
