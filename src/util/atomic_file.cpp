#include "util/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

namespace fs {
namespace {

// Closes the descriptor and, unless released, removes the temporary file.
class TempFile {
 public:
  TempFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  int fd() const { return fd_; }
  Status close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc == 0 ? Status{} : io_error("close " + path_ + ": " + std::strerror(errno));
  }
  void release() { path_.clear(); }

 private:
  int fd_;
  std::string path_;
};

Status write_all(int fd, std::span<const std::uint8_t> bytes, const std::string& path) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return io_error("write " + path + ": " + std::strerror(errno));
    }
    done += static_cast<std::size_t>(n);
  }
  return {};
}

}  // namespace

Status write_file_atomically(const std::string& path,
                             std::span<const std::span<const std::uint8_t>> parts) {
  const std::filesystem::path target(path);
  const auto dir = target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
  std::random_device rd;
  const std::string tmp =
      path + "." + std::to_string(::getpid()) + "-" + std::to_string(rd()) + kTempSuffix;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return io_error("create " + tmp + ": " + std::strerror(errno));
  TempFile file(fd, tmp);
  for (const auto& part : parts) {
    if (auto s = write_all(file.fd(), part, tmp); !s.ok()) return s;
  }
  if (::fsync(file.fd()) != 0) return io_error("fsync " + tmp + ": " + std::strerror(errno));
  if (auto s = file.close(); !s.ok()) return s;
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    return io_error("rename to " + path + ": " + std::strerror(errno));
  file.release();
  // The rename itself must reach the disk: fsync the folder.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return io_error("open folder " + dir.string() + ": " + std::strerror(errno));
  const int rc = ::fsync(dfd);
  ::close(dfd);
  if (rc != 0) return io_error("fsync folder " + dir.string() + ": " + std::strerror(errno));
  return {};
}

}  // namespace fs
