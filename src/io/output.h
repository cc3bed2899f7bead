// Output files: the one policy every command that writes a file goes through, and the atomic
// writer that puts a file in place only when it is complete.
//
// Contract of check_output_path(path, check): whether `path` may be written by a command that
// reads `check.inputs`. Refused, with a kInvalidArgument that names the flag, the path and what
// it is:
//   - an empty path, or one whose directory does not exist (or is not a directory);
//   - a symbolic link when !follow_symlinks; with follow_symlinks the link's target is what
//     would be replaced (so every check below applies to the target) and a dangling link is
//     refused;
//   - an existing file that is not a regular file (directory, device, FIFO, socket): never
//     replaced, whatever the flags;
//   - the same file (device + inode, so hard links and links to it included) as one of the
//     inputs: never replaced, whatever the flags;
//   - an existing read-only file (no write permission for this process, or no write bit at all
//     when running as root): never replaced;
//   - any other existing file unless `overwrite` (the message names the flag that allows it).
// On success returns the path to write: `path` itself, or a followed link's target.
// Inputs that do not exist are ignored. The check and the write are separate system calls, so
// a concurrent change to the directory between them is not detected (except that the writer
// still refuses to rename over a non-regular file).
//
// write_file_atomic() and AtomicFileWriter write to a temporary file in the target's
// directory (mkstemp: a fresh name, never an existing file), fsync it and rename it over the
// target only when everything was written; on any failure the target is left as it was and the
// temporary file is removed. The final rename is refused when the target exists and is not a
// regular file (a symbolic link included: rename would replace the link itself).
// Thread-safety: the functions are reentrant; one AtomicFileWriter per thread.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace attnres {

struct OutputCheck {
  std::string flag;  // how the user named the output: "--dump-logits", "--out"
  std::string overwrite_flag = "--overwrite";  // the flag that allows replacing a file
  bool overwrite = false;                      // the user gave overwrite_flag
  bool follow_symlinks = true;                 // false: a symbolic link at `path` is refused
  std::vector<std::string> inputs;             // every file the command reads
};

Result<std::string> check_output_path(const std::string& path, const OutputCheck& check);

// Writes a file atomically (see above). `mode` is the permission of the new file.
class AtomicFileWriter {
 public:
  AtomicFileWriter() = default;
  ~AtomicFileWriter();  // removes the temporary file unless commit() succeeded
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  Status open(const std::string& path, unsigned mode = 0644);
  Status write(const void* data, size_t n);
  // fsync, close and rename over the target.
  Status commit();

 private:
  void discard();
  std::string path_, tmp_;
  int fd_ = -1;
};

Status write_file_atomic(const std::string& path, std::string_view bytes);

}  // namespace attnres
