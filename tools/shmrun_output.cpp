#include "shmrun_output.hpp"

#include <fmt/format.h>

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace shmring::launcher {

int write_all(int fd, const char* data, std::size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w > 0) {
      data += w;
      n -= static_cast<std::size_t>(w);
    } else if (w < 0 && errno == EINTR) {
      continue;
    } else if (w < 0 && errno == EAGAIN) {
      // Someone made our output non-blocking; wait for room rather than drop.
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 100);
    } else {
      return w < 0 ? errno : EIO;  // EPIPE, EBADF, ENOSPC, ...: nowhere to write
    }
  }
  return 0;
}

// fmt, not "[" + std::to_string(rank) + "] ": GCC 12 at -O2 reports a
// false -Wrestrict inside libstdc++ for that operator+ chain.
LineTagger::LineTagger(int rank, OutputSink& sink)
    : prefix_(fmt::format("[{}] ", rank)), sink_(&sink) {}

void LineTagger::emit(const char* begin, const char* end, std::string& out) const {
  out += prefix_;
  out.append(begin, end);
  out += '\n';
}

void LineTagger::feed(const char* data, std::size_t n) {
  std::string out;
  const char* end = data + n;
  const char* p = data;
  // A line cut at kMaxLineBytes already ended with the newline emit() adds:
  // its own newline, if it comes next, ends nothing more.
  if (cut_ && p < end) {
    if (*p == '\n') ++p;
    cut_ = false;
  }
  while (p < end) {
    const void* nl = std::memchr(p, '\n', static_cast<std::size_t>(end - p));
    if (nl == nullptr) break;
    const char* e = static_cast<const char*>(nl);
    if (!pending_.empty()) {
      pending_.append(p, e);
      emit(pending_.data(), pending_.data() + pending_.size(), out);
      pending_.clear();
    } else {
      emit(p, e, out);
    }
    p = e + 1;
  }
  pending_.append(p, end);
  if (pending_.size() >= kMaxLineBytes) {
    emit(pending_.data(), pending_.data() + pending_.size(), out);
    pending_.clear();
    cut_ = true;
  }
  write_out(out);
}

void LineTagger::finish() {
  if (pending_.empty()) return;
  std::string out;
  emit(pending_.data(), pending_.data() + pending_.size(), out);
  pending_.clear();
  write_out(out);
}

void LineTagger::write_out(const std::string& out) {
  if (out.empty()) return;
  if (sink_->error == 0) sink_->error = write_all(sink_->fd, out.data(), out.size());
  if (sink_->error != 0) sink_->lost += out.size();
}

}  // namespace shmring::launcher
