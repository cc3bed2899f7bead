// Output path policy and the atomic writer (output.h).
#include "io/output.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "util/file.h"

namespace attnres {
namespace {

namespace fs = std::filesystem;

std::string errno_text() {
  return std::strerror(errno);
}

std::string in_quotes(const std::string& s) {
  return "'" + s + "'";
}

// The directory a file at `path` lives in ("." for a bare name).
std::string parent_dir(const std::string& path) {
  const fs::path p(path);
  return p.has_parent_path() ? p.parent_path().string() : std::string(".");
}

}  // namespace

Result<std::string> check_output_path(const std::string& path, const OutputCheck& c) {
  const std::string what = c.flag + " " + in_quotes(path);
  auto refuse = [&](const std::string& why) -> Status {
    return Status(ErrorCode::kInvalidArgument, what + " " + why);
  };
  if (path.empty()) return Status(ErrorCode::kInvalidArgument, c.flag + ": empty path");
  std::string target = path;
  struct stat st {};
  bool exists = ::lstat(path.c_str(), &st) == 0;
  // ENOENT and ENOTDIR: not there; the directory check below says why.
  if (!exists && errno != ENOENT && errno != ENOTDIR)
    return refuse("cannot be examined: " + errno_text());
  if (exists && S_ISLNK(st.st_mode)) {
    char resolved[PATH_MAX];
    if (!c.follow_symlinks)
      return refuse(
          "is a symbolic link; it is not replaced (remove it, or give the file it points to)");
    if (::realpath(path.c_str(), resolved) == nullptr)
      return refuse("is a symbolic link to a missing file; it is not written through");
    target = resolved;
    if (::stat(target.c_str(), &st) != 0)
      return refuse("is a symbolic link to " + in_quotes(target) +
                    ", which cannot be examined: " + errno_text());
  }
  if (!exists) {
    const std::string dir = parent_dir(path);
    struct stat ds {};
    if (::stat(dir.c_str(), &ds) != 0)
      return refuse("cannot be written: its directory " + in_quotes(dir) + " does not exist");
    if (!S_ISDIR(ds.st_mode))
      return refuse("cannot be written: " + in_quotes(dir) + " is a " +
                    std::string(file_type_name(ds.st_mode)) + ", not a directory");
    return target;
  }
  const std::string shown = target == path ? std::string("it") : in_quotes(target);
  if (!S_ISREG(st.st_mode))
    return refuse("is a " + std::string(file_type_name(st.st_mode)) +
                  (target == path ? std::string() : " (" + in_quotes(target) + ")") +
                  "; only a regular file is ever replaced");
  for (const std::string& in : c.inputs) {
    struct stat is {};
    if (::stat(in.c_str(), &is) != 0) continue;
    if (is.st_dev == st.st_dev && is.st_ino == st.st_ino)
      return refuse(
          "is " +
          (in == path ? std::string("an input") : "the same file as the input " + in_quotes(in)) +
          " of this command; an output never replaces an input");
  }
  if ((st.st_mode & 0222) == 0 || ::access(target.c_str(), W_OK) != 0)
    return refuse("is read-only" +
                  (target == path ? std::string() : " (" + in_quotes(target) + ")") +
                  "; it is not replaced (make it writable first if that is what you want)");
  if (!c.overwrite)
    return refuse("already exists" +
                  (target == path ? std::string() : " (" + in_quotes(target) + ")") + "; pass " +
                  c.overwrite_flag + " to replace " + shown);
  return target;
}

AtomicFileWriter::~AtomicFileWriter() {
  discard();
}

void AtomicFileWriter::discard() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
  tmp_.clear();
}

Status AtomicFileWriter::open(const std::string& path, unsigned mode) {
  discard();
  path_ = path;
  const fs::path target(path);
  std::string name = ".";  // hidden, next to the target so rename() stays atomic
  name += target.filename().string();
  name += ".tmp.XXXXXX";
  std::string tmp = (fs::path(parent_dir(path)) / name).string();
  fd_ = ::mkstemp(tmp.data());
  if (fd_ < 0)
    return Status(ErrorCode::kIoError, path + ": cannot create a temporary file in " +
                                           parent_dir(path) + ": " + errno_text());
  tmp_ = tmp;
  // mkstemp creates the file 0600; give it the usual permissions.
  ::fchmod(fd_, static_cast<mode_t>(mode));
  return Status::ok();
}

Status AtomicFileWriter::write(const void* data, size_t n) {
  if (fd_ < 0) return Status(ErrorCode::kInternal, path_ + ": write without an open file");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      Status s(ErrorCode::kIoError, tmp_ + ": write failed: " + errno_text());
      discard();
      return s;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::ok();
}

Status AtomicFileWriter::commit() {
  if (fd_ < 0) return Status(ErrorCode::kInternal, path_ + ": commit without an open file");
  if (::fsync(fd_) != 0) {
    Status s(ErrorCode::kIoError, tmp_ + ": fsync failed: " + errno_text());
    discard();
    return s;
  }
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    Status s(ErrorCode::kIoError, tmp_ + ": close failed: " + errno_text());
    discard();
    return s;
  }
  struct stat st {};
  if (::lstat(path_.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    Status s(ErrorCode::kIoError, path_ + " is a " + std::string(file_type_name(st.st_mode)) +
                                      "; only a regular file is ever replaced");
    discard();
    return s;
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    Status s(ErrorCode::kIoError,
             path_ + ": cannot rename " + tmp_ + " into place: " + errno_text());
    discard();
    return s;
  }
  tmp_.clear();
  return Status::ok();
}

Status write_file_atomic(const std::string& path, std::string_view bytes) {
  AtomicFileWriter w;
  ATTNRES_RETURN_IF_ERROR(w.open(path));
  ATTNRES_RETURN_IF_ERROR(w.write(bytes.data(), bytes.size()));
  return w.commit();
}

}  // namespace attnres
