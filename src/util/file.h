// Reading the small text files a model directory holds (config.json, the shard index, the
// tokenizer's rank file and tokenizer_config.json).
//
// Contract: read_model_file() reads a whole regular file of at most `max_bytes`. Anything else
// is a kIoError naming the file and what it is: a directory, FIFO, socket or device (opened
// without blocking, so a FIFO planted in a model directory cannot hang the loader), a file
// larger than the limit (so /dev/zero-like inputs cannot exhaust memory), or a read error.
// Symbolic links are followed. Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "util/status.h"

namespace attnres {

// Far above any published model file (Kimi-K3's tiktoken.model is 2.8 MB, its shard index
// 10 MB) and far below what could exhaust memory.
inline constexpr uint64_t kMaxModelTextFileBytes = uint64_t{1} << 30;

// `what` names the file's role in messages ("config file", "tokenizer rank file").
Result<std::string> read_model_file(const std::string& path, std::string_view what,
                                    uint64_t max_bytes = kMaxModelTextFileBytes);

// "regular file", "directory", "FIFO", "socket", "character device", "block device",
// "symbolic link" or "special file" for a st_mode.
std::string_view file_type_name(unsigned mode);

}  // namespace attnres
