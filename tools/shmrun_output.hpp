#pragma once

// Line tagging for `shmrun --tag-output`: bytes read from a worker's pipe are
// cut into whole lines and written to the launcher's own stdout or stderr
// with a "[rank] " prefix. The launcher is the only writer of its streams in
// this mode, and each read's lines go out in one write loop, so lines of
// different ranks never interleave inside a line.

#include <cstddef>
#include <string>

namespace shmring::launcher {

/// One worker stream (rank r's stdout or stderr) feeding one output fd.
class LineTagger {
 public:
  /// Above this many bytes without a newline, the partial line is emitted
  /// anyway (with a newline added), so one runaway line cannot exhaust memory.
  static constexpr std::size_t kMaxLineBytes = 1 << 20;

  LineTagger(int rank, int out_fd);

  /// Appends `n` bytes and writes out every complete line.
  void feed(const char* data, std::size_t n);
  /// End of stream: a last line without a newline is written with one added.
  void finish();

 private:
  void emit(const char* begin, const char* end, std::string& out) const;
  void write_out(const std::string& out);

  std::string prefix_;
  std::string pending_;  // bytes after the last newline seen
  int out_fd_;
};

/// Writes all of `data` to `fd`, retrying on EINTR and short writes. A closed
/// reader (EPIPE) drops the output silently: the job must still finish and
/// clean up even if nobody reads its output any more.
void write_all(int fd, const char* data, std::size_t n);

}  // namespace shmring::launcher
