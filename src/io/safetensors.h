// Safetensors: bounds-checked header parsing, read-only memory-mapped files, sharded
// checkpoints (`model.safetensors.index.json`) and an atomic writer.
//
// File layout: 8-byte little-endian header length N, N bytes of JSON (an object mapping each
// tensor name to {dtype, shape, data_offsets: [begin, end]}, plus an optional `__metadata__`
// string map), then the data section; offsets are relative to the start of the data section.
//
// Contract: parse_safetensors_header() validates everything before any tensor byte is touched:
// header length sane (>= 2, <= kMaxHeaderBytes, inside the file), JSON well-formed and an
// object, every dtype known, every shape a list of non-negative integers, shape x dtype size ==
// end - begin (no overflow), every range inside the data section, no two non-empty ranges
// overlapping. Failures are Status values naming the file and the tensor with what was expected
// and what was found; a truncated or corrupt file is an error, never a SIGBUS or a segfault.
// (A file truncated by another process *after* it was mapped can still fault: mappings cannot
// guard against that.)
// Thread-safety: SafetensorsFile and SafetensorsCheckpoint are immutable after open; share freely.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "util/status.h"
#include "util/tensor.h"

namespace attnres {

// Largest header accepted (the reference implementation uses the same limit).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range relative to the data section, begin <= end
};

struct SafetensorsHeader {
  uint64_t header_bytes = 0;  // N
  uint64_t data_offset = 0;   // 8 + N: first byte of the data section in the file
  uint64_t file_bytes = 0;
  std::vector<SafetensorsEntry> tensors;  // sorted by name
  std::map<std::string, std::string> metadata;
};

// Validates the header of a whole safetensors file held in `file` (memory or a mapping).
// `source` names the file in error messages. Touches no tensor data.
Result<SafetensorsHeader> parse_safetensors_header(std::span<const std::byte> file,
                                                   const std::string& source);

// One read-only memory-mapped safetensors file. The descriptor stays open so that ranges can
// also be read into private memory (read_bytes) without touching the mapping.
class SafetensorsFile {
 public:
  static Result<std::shared_ptr<const SafetensorsFile>> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  const std::vector<SafetensorsEntry>& entries() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  uint64_t file_bytes() const { return header_.file_bytes; }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  // Null when absent.
  const SafetensorsEntry* entry(const std::string& name) const;
  // The tensor as a view into the mapping; kMissingTensor naming it and the file when absent.
  Result<TensorView> tensor(const std::string& name) const;
  TensorView view(const SafetensorsEntry& e) const;
  // Copies `n` bytes of the data section starting `offset` bytes into tensor `e` to `dst` with
  // pread (the page cache, not this mapping); kIoError naming the file and the tensor on a
  // short read. The range must lie inside the tensor.
  Status read_bytes(const SafetensorsEntry& e, uint64_t offset, size_t n, std::byte* dst) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  int fd_ = -1;
  const std::byte* base_ = nullptr;  // mapping of the whole file (null for an empty mapping)
  size_t map_bytes_ = 0;
  SafetensorsHeader header_;
  std::unordered_map<std::string, size_t> index_;  // name -> position in header_.tensors
};

// A checkpoint directory: `model.safetensors` or the shards listed in
// `model.safetensors.index.json` (weight_map: tensor name -> shard file name). Every name in the
// weight map must be present in its shard (else kMissingTensor naming both); a name present in
// two shards is kInconsistent.
class SafetensorsCheckpoint {
 public:
  struct Location {
    size_t file = 0;  // index into files()
    const SafetensorsEntry* entry = nullptr;
  };

  static Result<SafetensorsCheckpoint> open_dir(const std::string& model_dir);
  // From an explicit list of files (no index); duplicate names are kInconsistent.
  static Result<SafetensorsCheckpoint> open_files(const std::vector<std::string>& paths);

  const std::vector<std::shared_ptr<const SafetensorsFile>>& files() const { return files_; }
  const std::map<std::string, Location>& tensors() const { return tensors_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // Null when absent.
  const Location* find(const std::string& name) const;
  Result<TensorView> tensor(const std::string& name) const;
  // Where a tensor lives, for error messages ("<file>").
  const std::string& file_of(const Location& loc) const { return files_[loc.file]->path(); }

 private:
  Status add_file(std::shared_ptr<const SafetensorsFile> f);
  std::vector<std::shared_ptr<const SafetensorsFile>> files_;
  std::map<std::string, Location> tensors_;
};

// A tensor to write: `data` points to numel(shape) * dtype_size(dtype) bytes in the layout the
// file will hold (row-major, little-endian).
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};
TensorToWrite tensor_to_write(const TensorView& v);

// Writes a safetensors file: header padded with spaces so the data section starts on an 8-byte
// boundary; tensors laid out contiguously, largest element size first, so every tensor is
// aligned to its element size. Written to a temporary file in the same directory and renamed
// over `path` only when complete: on failure `path` is left as it was (AtomicFileWriter,
// io/output.h; a non-regular file at `path` is never replaced). Whether `path` may be written
// at all (an input of the run, an existing file) is the caller's check_output_path().
Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace attnres
