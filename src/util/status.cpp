#include "util/status.h"

namespace attnres {

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk:
      return "ok";
    case ErrorCode::kIoError:
      return "io_error";
    case ErrorCode::kTruncated:
      return "truncated";
    case ErrorCode::kBadHeader:
      return "bad_header";
    case ErrorCode::kBadJson:
      return "bad_json";
    case ErrorCode::kUnknownDtype:
      return "unknown_dtype";
    case ErrorCode::kSizeMismatch:
      return "size_mismatch";
    case ErrorCode::kOutOfRange:
      return "out_of_range";
    case ErrorCode::kOverlap:
      return "overlap";
    case ErrorCode::kMissingTensor:
      return "missing_tensor";
    case ErrorCode::kShapeMismatch:
      return "shape_mismatch";
    case ErrorCode::kDtypeMismatch:
      return "dtype_mismatch";
    case ErrorCode::kMissingField:
      return "missing_field";
    case ErrorCode::kWrongType:
      return "wrong_type";
    case ErrorCode::kInvalidValue:
      return "invalid_value";
    case ErrorCode::kInconsistent:
      return "inconsistent";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kInvalidArgument:
      return "invalid_argument";
    case ErrorCode::kHazard:
      return "hazard";
    case ErrorCode::kResourceExhausted:
      return "resource_exhausted";
    case ErrorCode::kUnavailable:
      return "unavailable";
    case ErrorCode::kContextLengthExceeded:
      return "context_length_exceeded";
    case ErrorCode::kCancelled:
      return "cancelled";
    case ErrorCode::kInternal:
      return "internal";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  return std::string(error_code_name(code_)) + ": " + message_;
}

}  // namespace attnres
