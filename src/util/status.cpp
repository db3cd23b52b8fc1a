#include "util/status.h"

namespace fs {

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk:
      return "ok";
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kNotFound:
      return "not found";
    case ErrorCode::kCorrupt:
      return "corrupt";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kIo:
      return "i/o error";
    case ErrorCode::kFailedPrecondition:
      return "failed precondition";
    case ErrorCode::kOutOfRange:
      return "out of range";
    case ErrorCode::kCancelled:
      return "cancelled";
    case ErrorCode::kInternal:
      return "internal error";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  std::string out(error_code_name(code_));
  out += ": ";
  out += message_;
  return out;
}

Status Status::with_context(std::string_view context) const {
  if (ok()) return *this;
  std::string m(context);
  m += ": ";
  m += message_;
  return {code_, std::move(m)};
}

}  // namespace fs
