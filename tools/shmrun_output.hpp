#pragma once

// Line tagging for `shmrun --tag-output`: bytes read from a worker's pipe are
// cut into whole lines and written to the launcher's own stdout or stderr
// with a "[rank] " prefix. The launcher is the only writer of its streams in
// this mode, and each read's lines go out in one write loop, so lines of
// different ranks never interleave inside a line.

#include <cstddef>
#include <string>

namespace shmring::launcher {

/// One of the launcher's own output descriptors (stdout or stderr), shared
/// by the taggers of every rank's stream to it. After a write to it fails,
/// nothing more is written there: the output is lost, and the launcher
/// reports it (shmrun_job.cpp) instead of exiting 0 as if it had arrived.
struct OutputSink {
  int fd = -1;
  int error = 0;         ///< errno of the first failed write; 0 while none failed
  std::size_t lost = 0;  ///< bytes dropped since (including the failed write's)
};

/// One worker stream (rank r's stdout or stderr) feeding one output fd.
class LineTagger {
 public:
  /// From this many bytes without a newline, the partial line is emitted
  /// anyway (with a newline added), so one runaway line cannot exhaust
  /// memory; the rest follows as the next line, and no byte is lost. A
  /// line of exactly this size stays one line.
  static constexpr std::size_t kMaxLineBytes = 1 << 20;

  LineTagger(int rank, OutputSink& sink);

  /// Appends `n` bytes and writes out every complete line.
  void feed(const char* data, std::size_t n);
  /// End of stream: a last line without a newline is written with one added.
  void finish();

 private:
  void emit(const char* begin, const char* end, std::string& out) const;
  void write_out(const std::string& out);

  std::string prefix_;
  std::string pending_;  // bytes after the last newline seen
  bool cut_ = false;     // the last line emitted was cut at kMaxLineBytes
  OutputSink* sink_;
};

/// Writes all of `data` to `fd`, retrying on EINTR and short writes. Returns
/// 0, or the errno of a write that failed (EPIPE: the reader is gone, EBADF,
/// ENOSPC, ...), having written only part; the caller reports the loss. The
/// launcher ignores SIGPIPE so that it can still tear the job down and clean
/// up when nobody reads its output any more.
int write_all(int fd, const char* data, std::size_t n);

}  // namespace shmring::launcher
