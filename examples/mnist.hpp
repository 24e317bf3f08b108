// mnist.hpp: reader for the (Fashion-)MNIST IDX files, gzip-compressed or not.
//
// IDX layout (all integers big-endian):
//   magic: 0x00 0x00 <type 0x08 = unsigned byte> <number of dimensions>
//   one uint32 size per dimension
//   the elements, row-major, one byte each
// Images are IDX3 (count, rows, cols), labels IDX1 (count). The header fixes the
// exact payload size, so a short file (a truncated download) and trailing bytes
// are both errors, as are a bad magic, absurd dimensions, label values outside
// [0, classes) and image/label counts that disagree.
#pragma once

#include <zlib.h>

#include <Eigen/Core>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace shmring::examples {

/// Missing, unreadable or malformed data file; the message names the file.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Raw pixels, one image per column (column-major, so a sample is contiguous).
/// Kept as bytes: a quarter of the memory of floats, for every rank.
using ImageBytes = Eigen::Matrix<std::uint8_t, Eigen::Dynamic, Eigen::Dynamic>;

/// A labelled image set.
struct Dataset {
  ImageBytes images;  // (rows * cols) x count
  std::vector<std::uint8_t> labels;
  int rows = 0;
  int cols = 0;
  std::size_t size() const { return labels.size(); }
  int pixels() const { return rows * cols; }
};

inline constexpr int kClasses = 10;
// Bounds on what a header may claim before we allocate for it.
inline constexpr std::uint32_t kMaxSide = 4096;
inline constexpr std::uint32_t kMaxCount = 100'000'000;

namespace detail {

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<std::remove_pointer_t<gzFile>, GzCloser>;

/// Reads exactly `n` bytes or throws, naming the file and what was short.
inline void read_exact(gzFile f, const std::string& path, void* dst, std::size_t n,
                       const char* what) {
  auto* out = static_cast<unsigned char*>(dst);
  std::size_t done = 0;
  while (done < n) {
    // gzread takes an unsigned count; read in bounded pieces.
    const unsigned piece = static_cast<unsigned>(std::min<std::size_t>(n - done, 1u << 30));
    const int got = gzread(f, out + done, piece);
    if (got < 0) {
      int err = 0;
      const char* msg = gzerror(f, &err);
      throw DataError(path + ": corrupt or unreadable while reading " + what + ": " + msg);
    }
    if (got == 0) {
      int err = 0;
      const char* msg = gzerror(f, &err);
      throw DataError(path + ": file ends early while reading " + what + " (got " +
                      std::to_string(done) + " of " + std::to_string(n) + " bytes" +
                      (err != Z_OK ? std::string("; ") + msg : std::string()) + ")");
    }
    done += static_cast<std::size_t>(got);
  }
}

inline std::uint32_t big_endian_u32(const unsigned char* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}

/// Opens an IDX file, checks its magic and dimension count, and returns the
/// dimensions. The file is left positioned at the first element.
inline std::vector<std::uint32_t> open_idx(GzFile& file, const std::string& path,
                                           int expected_dims) {
  file.reset(gzopen(path.c_str(), "rb"));
  if (!file) {
    const int e = errno;
    throw DataError(path +
                    ": cannot open: " + (e != 0 ? std::strerror(e) : std::string("out of memory")));
  }
  std::array<unsigned char, 4> magic{};
  read_exact(file.get(), path, magic.data(), magic.size(), "the IDX magic");
  const std::uint32_t want = 0x0800u | static_cast<std::uint32_t>(expected_dims);
  const std::uint32_t got = big_endian_u32(magic.data());
  if (got != want) {
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  ": bad IDX magic 0x%08x, expected 0x%08x (unsigned bytes, %d dimension%s)", got,
                  want, expected_dims, expected_dims == 1 ? "" : "s");
    throw DataError(path + buf);
  }
  std::vector<std::uint32_t> dims(static_cast<std::size_t>(expected_dims));
  for (auto& d : dims) {
    std::array<unsigned char, 4> b{};
    read_exact(file.get(), path, b.data(), b.size(), "the IDX dimensions");
    d = big_endian_u32(b.data());
  }
  return dims;
}

/// After the payload, the stream must be at its end (and the gzip trailer intact).
inline void expect_end(gzFile f, const std::string& path) {
  unsigned char extra = 0;
  const int got = gzread(f, &extra, 1);
  int err = 0;
  const char* msg = gzerror(f, &err);
  if (got < 0 || (err != Z_OK && err != Z_STREAM_END))
    throw DataError(path + ": corrupt data after the last element: " + msg);
  if (got > 0) throw DataError(path + ": unexpected bytes after the last element");
}

}  // namespace detail

/// Reads an IDX3 image file: returns (rows*cols) x count bytes.
inline ImageBytes read_images(const std::string& path, int& rows, int& cols) {
  detail::GzFile file;
  const auto dims = detail::open_idx(file, path, 3);
  if (dims[0] == 0 || dims[0] > kMaxCount)
    throw DataError(path + ": image count " + std::to_string(dims[0]) + " is outside [1, " +
                    std::to_string(kMaxCount) + "]");
  if (dims[1] == 0 || dims[1] > kMaxSide || dims[2] == 0 || dims[2] > kMaxSide)
    throw DataError(path + ": image size " + std::to_string(dims[1]) + "x" +
                    std::to_string(dims[2]) + " is outside [1, " + std::to_string(kMaxSide) +
                    "] per side");
  rows = static_cast<int>(dims[1]);
  cols = static_cast<int>(dims[2]);
  // Row-major image bytes land one image per column.
  ImageBytes images(static_cast<Eigen::Index>(std::size_t{dims[1]} * dims[2]),
                    static_cast<Eigen::Index>(dims[0]));
  detail::read_exact(file.get(), path, images.data(), std::size_t(images.size()), "the pixels");
  detail::expect_end(file.get(), path);
  return images;
}

/// Reads an IDX1 label file; every label must lie in [0, classes).
inline std::vector<std::uint8_t> read_labels(const std::string& path, int classes = kClasses) {
  detail::GzFile file;
  const auto dims = detail::open_idx(file, path, 1);
  if (dims[0] == 0 || dims[0] > kMaxCount)
    throw DataError(path + ": label count " + std::to_string(dims[0]) + " is outside [1, " +
                    std::to_string(kMaxCount) + "]");
  std::vector<std::uint8_t> labels(dims[0]);
  detail::read_exact(file.get(), path, labels.data(), labels.size(), "the labels");
  detail::expect_end(file.get(), path);
  for (std::size_t i = 0; i < labels.size(); ++i)
    if (labels[i] >= classes)
      throw DataError(path + ": label " + std::to_string(labels[i]) + " at index " +
                      std::to_string(i) + " is outside [0, " + std::to_string(classes) + ")");
  return labels;
}

/// Finds `<dir>/<stem>.gz`, or the uncompressed `<dir>/<stem>`; names the .gz
/// when neither exists.
inline std::string find_file(const std::string& dir, const std::string& stem) {
  namespace fs = std::filesystem;
  const fs::path gz = fs::path(dir) / (stem + ".gz");
  const fs::path plain = fs::path(dir) / stem;
  std::error_code ec;
  if (fs::exists(gz, ec)) return gz.string();
  if (fs::exists(plain, ec)) return plain.string();
  if (!fs::is_directory(dir, ec))
    throw DataError("data directory " + dir + " does not exist (expected " + gz.string() + ")");
  throw DataError(gz.string() + ": no such file (nor " + plain.string() + ")");
}

/// Loads one split ("train" or "t10k") from `dir` with all checks.
inline Dataset load_split(const std::string& dir, const std::string& split) {
  Dataset d;
  const std::string image_path = find_file(dir, split + "-images-idx3-ubyte");
  const std::string label_path = find_file(dir, split + "-labels-idx1-ubyte");
  d.images = read_images(image_path, d.rows, d.cols);
  d.labels = read_labels(label_path);
  if (static_cast<std::size_t>(d.images.cols()) != d.labels.size())
    throw DataError(image_path + " holds " + std::to_string(d.images.cols()) + " images but " +
                    label_path + " holds " + std::to_string(d.labels.size()) + " labels");
  return d;
}

/// Copies the samples `index` of `d` into the columns of `x` (pixels scaled to
/// [0, 1]) and their labels into `y`; resizes both to the batch.
inline void gather(const Dataset& d, std::span<const std::uint32_t> index, Eigen::MatrixXf& x,
                   std::vector<std::uint8_t>& y) {
  x.resize(d.images.rows(), static_cast<Eigen::Index>(index.size()));
  y.resize(index.size());
  for (std::size_t j = 0; j < index.size(); ++j) {
    x.col(static_cast<Eigen::Index>(j)) = d.images.col(index[j]).cast<float>() * (1.0f / 255.0f);
    y[j] = d.labels[index[j]];
  }
}

}  // namespace shmring::examples
