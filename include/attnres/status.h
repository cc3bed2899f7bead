// Status and Result<T>: the error channel of every library boundary (config, io, plan,
// tokenizer, runtime). No exception crosses a library boundary; a failed operation returns a
// Status whose message names the file, field or tensor, what was expected and what was found.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace attnres {

// Error classes. Tests assert the class, so each malformed-input kind maps to exactly one code.
enum class ErrorCode {
  kOk = 0,
  kIoError,                // open/stat/mmap/read failed
  kTruncated,              // file shorter than its header says
  kBadHeader,              // safetensors header length or framing is not sane
  kBadJson,                // JSON not well-formed
  kUnknownDtype,           // dtype string not known
  kSizeMismatch,           // shape x dtype size != byte range
  kOutOfRange,             // byte range outside the file's data section
  kOverlap,                // two tensors' byte ranges overlap
  kMissingTensor,          // a tensor the model needs is absent
  kShapeMismatch,          // a tensor's shape disagrees with the config
  kDtypeMismatch,          // a tensor's dtype disagrees with what the model needs
  kMissingField,           // a config field is missing
  kWrongType,              // a config field has the wrong JSON type
  kInvalidValue,           // a value is out of its legal range
  kInconsistent,           // values disagree with each other (e.g. layer lists)
  kUnsupported,            // well-formed but not supported by this engine
  kInvalidArgument,        // bad command-line or API argument
  kHazard,                 // a storage plan would overwrite a live value
  kResourceExhausted,      // a memory budget or pool has no room for the request
  kUnavailable,            // busy: the request may succeed later (a full queue)
  kContextLengthExceeded,  // the prompt (and what it asks to generate) exceeds the context
  kCancelled,              // the caller cancelled the operation
  kInternal,
};

std::string_view error_code_name(ErrorCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok() { return Status(); }

  bool is_ok() const { return code_ == ErrorCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "<code name>: <message>"
  std::string to_string() const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {
    if (std::get<Status>(v_).is_ok()) std::abort();  // a Result error must carry an error
  }
  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOkStatus;
    return is_ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() { return value(); }
  const T& operator*() const { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace attnres

#define ATTNRES_CONCAT_INNER(a, b) a##b
#define ATTNRES_CONCAT(a, b) ATTNRES_CONCAT_INNER(a, b)

// Propagate a non-ok Status.
#define ATTNRES_RETURN_IF_ERROR(expr) \
  do {                                \
    ::attnres::Status _st = (expr);   \
    if (!_st.is_ok()) return _st;     \
  } while (0)

// lhs = value of a Result, or return its Status.
#define ATTNRES_ASSIGN_OR_RETURN(lhs, expr) \
  ATTNRES_ASSIGN_OR_RETURN_IMPL(ATTNRES_CONCAT(_res_, __LINE__), lhs, expr)
#define ATTNRES_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.is_ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
