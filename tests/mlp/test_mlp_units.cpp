// Unit tests of the train_mlp building blocks: the IDX reader's checks and
// the MLP's analytic gradients against finite differences.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "mlp.hpp"
#include "mnist.hpp"

namespace fs = std::filesystem;
using namespace shmring::examples;

namespace {

// A fresh directory per test case, removed at the end.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("shmring_mlp_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

std::vector<unsigned char> idx_header(unsigned dims_code, std::vector<std::uint32_t> dims) {
  std::vector<unsigned char> b = {0, 0, 8, static_cast<unsigned char>(dims_code)};
  for (auto d : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<unsigned char>(d >> s));
  return b;
}

void write_gz(const std::string& path, const std::vector<unsigned char>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) ==
          static_cast<int>(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

std::vector<unsigned char> concat(std::vector<unsigned char> a,
                                  const std::vector<unsigned char>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// 3 images of 2x2 with distinct pixels, and 3 labels.
void write_tiny_split(const TempDir& dir, const std::string& split) {
  std::vector<unsigned char> pixels;
  for (int i = 0; i < 12; ++i) pixels.push_back(static_cast<unsigned char>(i * 20));
  write_gz(dir.file(split + "-images-idx3-ubyte.gz"), concat(idx_header(3, {3, 2, 2}), pixels));
  write_gz(dir.file(split + "-labels-idx1-ubyte.gz"), concat(idx_header(1, {3}), {7, 0, 9}));
}

std::string load_error(const std::string& dir, const std::string& split) {
  try {
    load_split(dir, split);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a well-formed IDX pair loads with one image per column and pixels in order") {
  TempDir dir;
  write_tiny_split(dir, "train");
  const Dataset d = load_split(dir.path.string(), "train");
  REQUIRE(d.size() == 3);
  CHECK(d.rows == 2);
  CHECK(d.cols == 2);
  CHECK(d.images.rows() == 4);
  CHECK(d.images(0, 1) == 80);  // image 1 starts at byte 4
  CHECK(d.images(3, 2) == 220);
  CHECK(d.labels == std::vector<std::uint8_t>{7, 0, 9});
  Eigen::MatrixXf x;
  std::vector<std::uint8_t> y;
  const std::uint32_t idx[] = {2, 0};
  gather(d, idx, x, y);
  CHECK(x.cols() == 2);
  CHECK(x(3, 0) == doctest::Approx(220.0f / 255.0f));
  CHECK(y == std::vector<std::uint8_t>{9, 7});
}

TEST_CASE("uncompressed IDX files are accepted too") {
  TempDir dir;
  write_tiny_split(dir, "t10k");
  // gzread passes plain files through; store one split uncompressed.
  for (const char* stem : {"t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
    gzFile in = gzopen(dir.file(std::string(stem) + ".gz").c_str(), "rb");
    std::vector<unsigned char> buf(1024);
    const int n = gzread(in, buf.data(), 1024);
    gzclose(in);
    fs::remove(dir.file(std::string(stem) + ".gz"));
    std::ofstream(dir.file(stem), std::ios::binary).write(reinterpret_cast<char*>(buf.data()), n);
  }
  CHECK(load_split(dir.path.string(), "t10k").size() == 3);
}

TEST_CASE("missing directory and missing file are named") {
  TempDir dir;
  CHECK(load_error(dir.file("absent"), "train").find("does not exist") != std::string::npos);
  write_tiny_split(dir, "train");
  fs::remove(dir.file("train-labels-idx1-ubyte.gz"));
  const std::string e = load_error(dir.path.string(), "train");
  CHECK(e.find("train-labels-idx1-ubyte.gz: no such file") != std::string::npos);
}

TEST_CASE("bad magic, short payload, trailing bytes and truncated gzip are errors") {
  TempDir dir;
  const std::string dirname = dir.path.string();
  write_tiny_split(dir, "train");
  const std::string images = dir.file("train-images-idx3-ubyte.gz");
  std::vector<unsigned char> twelve(12, 1);

  write_gz(images, concat(idx_header(2, {3, 2}), twelve));  // IDX2 where IDX3 belongs
  CHECK(load_error(dirname, "train").find("bad IDX magic 0x00000802, expected 0x00000803") !=
        std::string::npos);

  write_gz(images, concat(idx_header(3, {3, 2, 2}), std::vector<unsigned char>(11, 1)));
  CHECK(load_error(dirname, "train").find("file ends early while reading the pixels") !=
        std::string::npos);

  write_gz(images, concat(idx_header(3, {3, 2, 2}), std::vector<unsigned char>(13, 1)));
  CHECK(load_error(dirname, "train").find("unexpected bytes after the last element") !=
        std::string::npos);

  write_gz(images, concat(idx_header(3, {3, 0, 2}), {}));
  CHECK(load_error(dirname, "train").find("image size 0x2") != std::string::npos);

  // A gzip stream cut short: the deflate data stops mid-way.
  std::vector<unsigned char> big = idx_header(3, {3000, 20, 20});
  for (std::size_t i = 0; i < 3000u * 400u; ++i) big.push_back(static_cast<unsigned char>(i * 7));
  write_gz(images, big);
  fs::resize_file(images, fs::file_size(images) / 2);
  const std::string e = load_error(dirname, "train");
  CHECK(e.find("train-images-idx3-ubyte.gz") != std::string::npos);
  CHECK((e.find("ends early") != std::string::npos || e.find("corrupt") != std::string::npos));
}

TEST_CASE("labels out of range and count mismatches are errors") {
  TempDir dir;
  const std::string dirname = dir.path.string();
  write_tiny_split(dir, "train");
  const std::string labels = dir.file("train-labels-idx1-ubyte.gz");
  write_gz(labels, concat(idx_header(1, {3}), {1, 10, 2}));
  CHECK(load_error(dirname, "train").find("label 10 at index 1 is outside [0, 10)") !=
        std::string::npos);
  write_gz(labels, concat(idx_header(1, {2}), {1, 2}));
  CHECK(load_error(dirname, "train").find("holds 3 images but") != std::string::npos);
}

TEST_CASE("analytic gradients match central finite differences") {
  Mlp model(6, 5, 4);
  model.init(3);
  auto p = model.params();
  // Biases start at zero; make them non-zero so their gradients are tested too.
  for (float& v : p) v += 0.05f;
  Eigen::MatrixXf x = (Eigen::MatrixXf::Random(6, 3).array() + 1.0f) * 0.5f;
  const std::vector<std::uint8_t> y = {1, 3, 0};
  std::vector<float> grad(model.param_count(), 0.0f);
  model.forward_backward(x, y, grad);
  // Accumulation: a second call adds, it does not overwrite.
  std::vector<float> twice = grad;
  model.forward_backward(x, y, twice);
  for (std::size_t i = 0; i < grad.size(); ++i) CHECK(twice[i] == doctest::Approx(2 * grad[i]));

  const float eps = 1e-2f;
  for (std::size_t i = 0; i < model.param_count(); ++i) {
    const float saved = p[i];
    p[i] = saved + eps;
    const double up = model.forward(x, y).loss_sum;
    p[i] = saved - eps;
    const double down = model.forward(x, y).loss_sum;
    p[i] = saved;
    const double numeric = (up - down) / (2.0 * eps);
    INFO("parameter " << i);
    CHECK(grad[i] == doctest::Approx(numeric).epsilon(2e-2).scale(1.0));
  }
}

TEST_CASE("forward counts correct predictions and rejects bad shapes") {
  Mlp model(2, 3, 2);
  auto v = model.views(model.params());
  v.w1.setIdentity();  // h = relu(x) (first two units)
  v.w2.setZero();
  v.w2(0, 0) = 1.0f;  // class 0 score = x0
  v.w2(1, 1) = 1.0f;  // class 1 score = x1
  Eigen::MatrixXf x(2, 3);
  x << 1, 0, 2,  //
      0, 1, 3;
  const std::vector<std::uint8_t> y = {0, 1, 0};
  const BatchStats st = model.forward(x, y);
  CHECK(st.correct == 2);
  CHECK(st.loss_sum > 0);
  CHECK_THROWS_AS(model.forward(x, std::vector<std::uint8_t>{0, 1}), std::invalid_argument);
  CHECK_THROWS_AS(model.forward(x, std::vector<std::uint8_t>{0, 1, 2}), std::invalid_argument);
}

TEST_CASE("the parameter hash is FNV-1a over the bytes") {
  // FNV-1a 64 of the empty input is the offset basis.
  CHECK(fnv1a({}) == 0xcbf29ce484222325ull);
  std::vector<float> a = {1.0f, 2.0f}, b = {1.0f, 2.0000002f};
  CHECK(fnv1a(a) != fnv1a(b));
  CHECK(fnv1a(a) == fnv1a(std::vector<float>{1.0f, 2.0f}));
}
