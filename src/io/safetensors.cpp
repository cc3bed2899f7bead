// Safetensors reading (validated header, read-only mmap, shards) and atomic writing.
// See safetensors.h for the contract.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <set>

#include <nlohmann/json.hpp>

#include "io/output.h"
#include "util/file.h"

namespace attnres {
namespace {

using json = nlohmann::json;

std::string quoted(const std::string& s) {
  return "'" + s + "'";
}

std::string errno_text() {
  return std::strerror(errno);
}

uint64_t read_le64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint64_t>(p[i]);
  return v;
}

std::string range_string(uint64_t b, uint64_t e) {
  std::string s = "[";
  s += std::to_string(b);
  s += ", ";
  s += std::to_string(e);
  s += "]";
  return s;
}

// Parses one tensor entry of the header (not `__metadata__`).
Result<SafetensorsEntry> parse_entry(const std::string& name, const json& v,
                                     const std::string& source) {
  const std::string where = source + ": tensor " + quoted(name);
  if (!v.is_object())
    return Status(ErrorCode::kBadHeader, where + " has a header entry of type " +
                                             std::string(v.type_name()) + ", expected an object");
  SafetensorsEntry e;
  e.name = name;

  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string())
    return Status(ErrorCode::kBadHeader, where + ": 'dtype' is " +
                                             (dt == v.end() ? "missing" : "not a string") +
                                             ", expected a dtype name string");
  const std::string dtype_str = dt->get<std::string>();
  auto parsed = parse_dtype(dtype_str);
  if (!parsed)
    return Status(ErrorCode::kUnknownDtype,
                  where + ": unknown dtype \"" + dtype_str +
                      "\", expected one of F64 F32 F16 BF16 F8_E4M3 F8_E5M2 I64 I32 I16 I8 U64 "
                      "U32 U16 U8 BOOL");
  e.dtype = *parsed;

  auto sh = v.find("shape");
  if (sh == v.end() || !sh->is_array())
    return Status(ErrorCode::kBadHeader, where + ": 'shape' is " +
                                             (sh == v.end() ? "missing" : "not an array") +
                                             ", expected an array of non-negative integers");
  for (const json& d : *sh) {
    // nlohmann stores non-negative integer literals as unsigned.
    if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      return Status(ErrorCode::kBadHeader, where + ": shape " + sh->dump() + " has element " +
                                               d.dump() + ", expected non-negative integers");
    e.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
  }

  auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned())
    return Status(ErrorCode::kBadHeader, where + ": 'data_offsets' is " +
                                             (off == v.end() ? "missing" : off->dump()) +
                                             ", expected [begin, end] with non-negative integers");
  e.begin = (*off)[0].get<uint64_t>();
  e.end = (*off)[1].get<uint64_t>();
  if (e.begin > e.end)
    return Status(ErrorCode::kBadHeader,
                  where + ": data_offsets " + range_string(e.begin, e.end) + " has begin > end");

  // shape x dtype size, overflow-checked.
  uint64_t bytes = dtype_size(e.dtype);
  bool overflow = false;
  for (int64_t d : e.shape)
    overflow = overflow || __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes);
  const std::string shape_str = shape_to_string(e.shape);
  if (overflow)
    return Status(ErrorCode::kSizeMismatch,
                  where + ": shape " + shape_str + " x " + std::string(dtype_name(e.dtype)) +
                      " overflows 64 bits, found data_offsets " + range_string(e.begin, e.end));
  if (bytes != e.end - e.begin)
    return Status(ErrorCode::kSizeMismatch,
                  where + ": shape " + shape_str + " x " + std::string(dtype_name(e.dtype)) + " (" +
                      std::to_string(dtype_size(e.dtype)) + " bytes) needs " +
                      std::to_string(bytes) + " bytes, found data_offsets " +
                      range_string(e.begin, e.end) + " = " + std::to_string(e.end - e.begin) +
                      " bytes");
  return e;
}

// Ranges: no two non-empty ranges overlap; a range past the end of the data section is
// kTruncated when the ranges before it are contiguous (the header is self-consistent and the
// file is short) and kOutOfRange when it lies beyond a gap (the header points nowhere).
Status check_ranges(const SafetensorsHeader& h, const std::string& source) {
  const uint64_t data_bytes = h.file_bytes - h.data_offset;
  std::vector<size_t> order(h.tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto& x = h.tensors[a];
    const auto& y = h.tensors[b];
    return x.begin != y.begin ? x.begin < y.begin : x.end < y.end;
  });
  uint64_t covered = 0;  // end of the furthest non-empty range so far
  const SafetensorsEntry* last = nullptr;
  const SafetensorsEntry* truncated = nullptr;
  for (size_t i : order) {
    const SafetensorsEntry& e = h.tensors[i];
    const std::string where = source + ": tensor " + quoted(e.name);
    if (e.begin == e.end) {
      if (e.begin > data_bytes)
        return Status(ErrorCode::kOutOfRange, where + ": empty range at offset " +
                                                  std::to_string(e.begin) +
                                                  " is outside the data section of " +
                                                  std::to_string(data_bytes) + " bytes");
      continue;
    }
    if (last != nullptr && e.begin < covered)
      return Status(ErrorCode::kOverlap, where + ": data_offsets " + range_string(e.begin, e.end) +
                                             " overlap those of tensor " + quoted(last->name) +
                                             " " + range_string(last->begin, last->end));
    if (e.end > data_bytes) {
      if (e.begin > covered)
        return Status(ErrorCode::kOutOfRange,
                      where + ": data_offsets " + range_string(e.begin, e.end) +
                          " lie outside the data section of " + std::to_string(data_bytes) +
                          " bytes (after a gap from " + std::to_string(covered) + ")");
      if (truncated == nullptr) truncated = &e;
    }
    covered = e.end;
    last = &e;
  }
  if (truncated != nullptr)
    return Status(ErrorCode::kTruncated,
                  source + ": file is truncated: tensor " + quoted(truncated->name) +
                      " needs data bytes " + range_string(truncated->begin, truncated->end) +
                      ", expected a file of at least " + std::to_string(h.data_offset + covered) +
                      " bytes, found " + std::to_string(h.file_bytes) + " bytes");
  return Status::ok();
}

}  // namespace

Result<SafetensorsHeader> parse_safetensors_header(std::span<const std::byte> file,
                                                   const std::string& source) {
  SafetensorsHeader h;
  h.file_bytes = file.size();
  if (file.size() < 8)
    return Status(ErrorCode::kTruncated,
                  source +
                      ": file is truncated: expected at least 8 bytes (header length), "
                      "found " +
                      std::to_string(file.size()));
  h.header_bytes = read_le64(file.data());
  if (h.header_bytes < 2 || h.header_bytes > kMaxSafetensorsHeaderBytes)
    return Status(ErrorCode::kBadHeader,
                  source + ": header length " + std::to_string(h.header_bytes) +
                      " is not sane, expected 2.." + std::to_string(kMaxSafetensorsHeaderBytes));
  if (h.header_bytes > file.size() - 8)
    return Status(ErrorCode::kTruncated,
                  source + ": file is truncated: header length " + std::to_string(h.header_bytes) +
                      " needs a file of at least " + std::to_string(8 + h.header_bytes) +
                      " bytes, found " + std::to_string(file.size()));
  h.data_offset = 8 + h.header_bytes;

  const char* text = reinterpret_cast<const char*>(file.data() + 8);
  json root;
  try {
    root = json::parse(text, text + h.header_bytes);
  } catch (const json::exception& e) {
    return Status(ErrorCode::kBadJson,
                  source + ": header is not well-formed JSON: " + std::string(e.what()));
  }
  if (!root.is_object())
    return Status(ErrorCode::kBadHeader, source + ": header JSON has type " +
                                             std::string(root.type_name()) +
                                             ", expected an object");

  for (const auto& [name, v] : root.items()) {
    if (name == "__metadata__") {
      if (!v.is_object())
        return Status(ErrorCode::kBadHeader, source + ": '__metadata__' has type " +
                                                 std::string(v.type_name()) +
                                                 ", expected an object of strings");
      for (const auto& [k, mv] : v.items()) {
        if (!mv.is_string())
          return Status(ErrorCode::kBadHeader, source + ": '__metadata__' entry " + quoted(k) +
                                                   " has type " + std::string(mv.type_name()) +
                                                   ", expected a string");
        h.metadata[k] = mv.get<std::string>();
      }
      continue;
    }
    ATTNRES_ASSIGN_OR_RETURN(SafetensorsEntry e, parse_entry(name, v, source));
    h.tensors.push_back(std::move(e));
  }
  ATTNRES_RETURN_IF_ERROR(check_ranges(h, source));
  return h;
}

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

Result<std::shared_ptr<const SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  // O_NONBLOCK: opening a FIFO would otherwise wait for a writer (it is refused below).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return Status(ErrorCode::kIoError, path + ": cannot open: " + errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    Status s(ErrorCode::kIoError, path + ": cannot stat: " + errno_text());
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status(ErrorCode::kIoError, path + " is a " + std::string(file_type_name(st.st_mode)) +
                                           ", expected a regular safetensors file");
  }
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->fd_ = fd;  // owned by f from here: closed by its destructor on every path
  f->map_bytes_ = static_cast<size_t>(st.st_size);
  if (f->map_bytes_ > 0) {
    void* p = ::mmap(nullptr, f->map_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      f->map_bytes_ = 0;
      return Status(ErrorCode::kIoError, path + ": cannot mmap " +
                                             std::to_string(static_cast<size_t>(st.st_size)) +
                                             " bytes: " + errno_text());
    }
    f->base_ = static_cast<const std::byte*>(p);
  }
  ATTNRES_ASSIGN_OR_RETURN(
      f->header_,
      parse_safetensors_header(std::span<const std::byte>(f->base_, f->map_bytes_), path));
  for (size_t i = 0; i < f->header_.tensors.size(); ++i)
    f->index_.emplace(f->header_.tensors[i].name, i);
  return std::shared_ptr<const SafetensorsFile>(std::move(f));
}

SafetensorsFile::~SafetensorsFile() {
  if (base_ != nullptr) ::munmap(const_cast<std::byte*>(base_), map_bytes_);
  if (fd_ >= 0) ::close(fd_);
}

Status SafetensorsFile::read_bytes(const SafetensorsEntry& e, uint64_t offset, size_t n,
                                   std::byte* dst) const {
  const uint64_t tensor_bytes = e.end - e.begin;
  if (offset > tensor_bytes || n > tensor_bytes - offset)
    return Status(ErrorCode::kInternal, path_ + ": read of bytes [" + std::to_string(offset) +
                                            ", " + std::to_string(offset + n) + ") of tensor " +
                                            quoted(e.name) + " outside its " +
                                            std::to_string(tensor_bytes) + " bytes");
  uint64_t pos = header_.data_offset + e.begin + offset;
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd_, dst + done, n - done, static_cast<off_t>(pos));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      return Status(ErrorCode::kIoError,
                    path_ + ": cannot read tensor " + quoted(e.name) + " (" + std::to_string(done) +
                        " of " + std::to_string(n) + " bytes at offset " +
                        std::to_string(pos - done) +
                        "): " + (got == 0 ? std::string("the file ended early") : errno_text()));
    done += static_cast<size_t>(got);
    pos += static_cast<uint64_t>(got);
  }
  return Status::ok();
}

const SafetensorsEntry* SafetensorsFile::entry(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

TensorView SafetensorsFile::view(const SafetensorsEntry& e) const {
  TensorView v;
  v.name = e.name;
  v.dtype = e.dtype;
  v.shape = e.shape;
  v.nbytes = static_cast<size_t>(e.end - e.begin);
  v.data = v.nbytes == 0 ? nullptr : base_ + header_.data_offset + e.begin;
  return v;
}

Result<TensorView> SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsEntry* e = entry(name);
  if (e == nullptr) return Status(ErrorCode::kMissingTensor, path_ + ": no tensor " + quoted(name));
  return view(*e);
}

// ---------------------------------------------------------------------------------------------
// SafetensorsCheckpoint

Status SafetensorsCheckpoint::add_file(std::shared_ptr<const SafetensorsFile> f) {
  const size_t fi = files_.size();
  for (const SafetensorsEntry& e : f->entries()) {
    auto [it, inserted] = tensors_.emplace(e.name, Location{fi, &e});
    if (!inserted)
      return Status(ErrorCode::kInconsistent, "tensor " + quoted(e.name) + " is in both " +
                                                  files_[it->second.file]->path() + " and " +
                                                  f->path());
  }
  files_.push_back(std::move(f));
  return Status::ok();
}

Result<SafetensorsCheckpoint> SafetensorsCheckpoint::open_files(
    const std::vector<std::string>& paths) {
  SafetensorsCheckpoint ck;
  for (const std::string& p : paths) {
    ATTNRES_ASSIGN_OR_RETURN(auto f, SafetensorsFile::open(p));
    ATTNRES_RETURN_IF_ERROR(ck.add_file(std::move(f)));
  }
  return ck;
}

Result<SafetensorsCheckpoint> SafetensorsCheckpoint::open_dir(const std::string& model_dir) {
  namespace fs = std::filesystem;
  const fs::path dir(model_dir);
  const std::string index_path = (dir / "model.safetensors.index.json").string();
  const std::string single_path = (dir / "model.safetensors").string();
  std::error_code ec;
  if (!fs::exists(index_path, ec)) {
    if (!fs::exists(single_path, ec))
      return Status(ErrorCode::kIoError, model_dir +
                                             ": no model.safetensors or "
                                             "model.safetensors.index.json in the directory");
    return open_files({single_path});
  }

  ATTNRES_ASSIGN_OR_RETURN(std::string index_text, read_model_file(index_path, "shard index"));
  json root;
  try {
    root = json::parse(index_text);
  } catch (const json::exception& e) {
    return Status(ErrorCode::kBadJson, index_path + ": not well-formed JSON: " + e.what());
  }
  if (!root.is_object())
    return Status(
        ErrorCode::kWrongType,
        index_path + ": root has type " + std::string(root.type_name()) + ", expected an object");
  auto wm = root.find("weight_map");
  if (wm == root.end())
    return Status(ErrorCode::kMissingField,
                  index_path + ": field 'weight_map' is missing (expected an object)");
  if (!wm->is_object())
    return Status(ErrorCode::kWrongType, index_path + ": field 'weight_map' has type " +
                                             std::string(wm->type_name()) + ", expected an object");
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
  std::set<std::string> shards;
  for (const auto& [name, shard] : wm->items()) {
    if (!shard.is_string())
      return Status(ErrorCode::kWrongType, index_path + ": weight_map entry " + quoted(name) +
                                               " has type " + std::string(shard.type_name()) +
                                               ", expected a shard file name");
    const std::string s = shard.get<std::string>();
    // Shards live next to the index: no directories, no escaping the model directory.
    if (s.empty() || s.find('/') != std::string::npos || s == "." || s == "..")
      return Status(ErrorCode::kInvalidValue, index_path + ": weight_map entry " + quoted(name) +
                                                  " names shard \"" + s +
                                                  "\", expected a file name in the directory");
    weight_map[name] = s;
    shards.insert(s);
  }

  SafetensorsCheckpoint ck;
  std::map<std::string, size_t> shard_index;
  for (const std::string& s : shards) {
    const std::string shard_path = (dir / s).string();
    auto f = SafetensorsFile::open(shard_path);
    if (!f)
      return Status(f.status().code(),
                    index_path + ": shard \"" + s + "\": " + f.status().message());
    shard_index[s] = ck.files_.size();
    ATTNRES_RETURN_IF_ERROR(ck.add_file(std::move(f).value()));
  }
  for (const auto& [name, s] : weight_map) {
    const SafetensorsFile& f = *ck.files_[shard_index[s]];
    if (!f.contains(name))
      return Status(
          ErrorCode::kMissingTensor,
          index_path + ": weight_map maps tensor " + quoted(name) + " to shard \"" + s +
              "\", which does not contain it" +
              (ck.contains(name) ? " (it is in " + ck.file_of(*ck.find(name)) + ")" : ""));
  }
  return ck;
}

const SafetensorsCheckpoint::Location* SafetensorsCheckpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Result<TensorView> SafetensorsCheckpoint::tensor(const std::string& name) const {
  const Location* loc = find(name);
  if (loc == nullptr)
    return Status(ErrorCode::kMissingTensor,
                  "tensor " + quoted(name) + " is not in the checkpoint");
  return files_[loc->file]->view(*loc->entry);
}

// ---------------------------------------------------------------------------------------------
// Writer

TensorToWrite tensor_to_write(const TensorView& v) {
  return TensorToWrite{v.name, v.dtype, v.shape, v.data};
}

Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  // Validate and size everything before creating any file.
  std::vector<uint64_t> bytes(tensors.size());
  std::set<std::string> names;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorToWrite& t = tensors[i];
    const std::string where = path + ": tensor " + quoted(t.name);
    if (t.name.empty() || t.name == "__metadata__")
      return Status(ErrorCode::kInvalidArgument, where + ": name is reserved or empty");
    if (!names.insert(t.name).second)
      return Status(ErrorCode::kInvalidArgument, where + ": name given twice");
    uint64_t b = dtype_size(t.dtype);
    for (int64_t d : t.shape) {
      if (d < 0 || __builtin_mul_overflow(b, static_cast<uint64_t>(d), &b))
        return Status(ErrorCode::kInvalidArgument,
                      where + ": shape " + shape_to_string(t.shape) + " is not valid");
    }
    if (b > 0 && t.data == nullptr)
      return Status(ErrorCode::kInvalidArgument,
                    where + ": data is null, expected " + std::to_string(b) + " bytes");
    bytes[i] = b;
  }
  // Largest element size first keeps every tensor aligned to its element size.
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return dtype_size(tensors[a].dtype) > dtype_size(tensors[b].dtype);
  });
  json header = json::object();
  uint64_t offset = 0;
  for (size_t i : order) {
    const TensorToWrite& t = tensors[i];
    header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes[i]}}};
    offset += bytes[i];
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(text.size() >> (8 * i));

  AtomicFileWriter out;
  ATTNRES_RETURN_IF_ERROR(out.open(path));
  ATTNRES_RETURN_IF_ERROR(out.write(len, 8));
  ATTNRES_RETURN_IF_ERROR(out.write(text.data(), text.size()));
  for (size_t i : order) ATTNRES_RETURN_IF_ERROR(out.write(tensors[i].data, bytes[i]));
  return out.commit();
}

}  // namespace attnres
