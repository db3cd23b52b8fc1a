// Errors are values at boundaries (DESIGN principle 7): a Status names what went wrong in words a
// user can act on; Expected<T> is a value or the Status that explains why there is none.
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace fs {

enum class ErrorCode {
  kOk = 0,
  kInvalidArgument,     // the caller's input is malformed or out of range
  kNotFound,            // a file, tensor or key that should exist does not
  kCorrupt,             // a file exists but its contents are inconsistent
  kUnsupported,         // valid input that this build does not handle
  kIo,                  // the operating system refused an operation
  kFailedPrecondition,  // the operation is not valid in the current state
  kOutOfRange,          // a length or index exceeds a limit (context, budget)
  kCancelled,
  kInternal,
};

std::string_view error_code_name(ErrorCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return {}; }
  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "corrupt: header length 1234 exceeds file size 99"
  std::string to_string() const;

  // Prefixes context ("loading shard model-00002: ...") while keeping the code.
  Status with_context(std::string_view context) const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) {
  return {ErrorCode::kInvalidArgument, std::move(m)};
}
inline Status not_found(std::string m) {
  return {ErrorCode::kNotFound, std::move(m)};
}
inline Status corrupt(std::string m) {
  return {ErrorCode::kCorrupt, std::move(m)};
}
inline Status unsupported(std::string m) {
  return {ErrorCode::kUnsupported, std::move(m)};
}
inline Status io_error(std::string m) {
  return {ErrorCode::kIo, std::move(m)};
}
inline Status failed_precondition(std::string m) {
  return {ErrorCode::kFailedPrecondition, std::move(m)};
}
inline Status out_of_range(std::string m) {
  return {ErrorCode::kOutOfRange, std::move(m)};
}
inline Status internal_error(std::string m) {
  return {ErrorCode::kInternal, std::move(m)};
}

template <typename T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Expected(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!std::get<Status>(v_).ok() &&
           "an Expected holds an error or a value, never an ok status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }

  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace fs
