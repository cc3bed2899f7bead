// Helpers for the io tests: temporary directories, raw file bytes, and rewriting the header of
// a golden safetensors file (each negative fixture changes exactly one thing).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace attnres::testing {

namespace fs = std::filesystem;

inline std::string golden_dir(const std::string& name) {
  return std::string(ATTNRES_FIXTURES_DIR) + "/golden/" + name;
}

// A fresh directory under the system temp dir, removed with its contents on destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "attnres-io-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed";
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline uint64_t le64(const std::string& b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[static_cast<size_t>(i)]);
  return v;
}

inline std::string le64_bytes(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>(v >> (8 * i));
  return s;
}

// A safetensors file split into its header JSON and its data section.
struct RawSafetensors {
  nlohmann::json header;
  std::string data;

  static RawSafetensors load(const std::string& path) {
    const std::string b = read_bytes(path);
    const uint64_t n = le64(b);
    RawSafetensors r;
    r.header = nlohmann::json::parse(b.substr(8, n));
    r.data = b.substr(8 + n);
    return r;
  }
  // Header padded with spaces to an 8-byte boundary, as writers do.
  std::string bytes() const {
    std::string h = header.dump();
    h.append((8 - (8 + h.size()) % 8) % 8, ' ');
    return le64_bytes(h.size()) + h + data;
  }
  void save(const std::string& path) const { write_bytes(path, bytes()); }
};

// Copies config.json of a golden model into `dir` and writes its model.safetensors with the
// header passed through `edit` (the data section unchanged).
inline void golden_with_header_edit(const std::string& golden, const std::string& dir,
                                    const std::function<void(nlohmann::json&)>& edit) {
  fs::copy_file(golden_dir(golden) + "/config.json", dir + "/config.json",
                fs::copy_options::overwrite_existing);
  RawSafetensors r = RawSafetensors::load(golden_dir(golden) + "/model.safetensors");
  edit(r.header);
  r.save(dir + "/model.safetensors");
}

// Symlinks the golden model.safetensors into `dir` and writes config.json passed through `edit`.
inline void golden_with_config_edit(const std::string& golden, const std::string& dir,
                                    const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json cfg = nlohmann::json::parse(read_bytes(golden_dir(golden) + "/config.json"));
  edit(cfg);
  write_bytes(dir + "/config.json", cfg.dump(2));
  fs::create_symlink(golden_dir(golden) + "/model.safetensors", dir + "/model.safetensors");
}

inline constexpr const char* kLm = "language_model.model.";

}  // namespace attnres::testing
