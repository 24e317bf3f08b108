// mlp.hpp: a two-layer perceptron (in -> hidden, ReLU -> out, softmax
// cross-entropy) on Eigen, with every parameter in one flat float buffer.
//
// Flat layout, shared by parameters, gradients and the momentum buffer, so the
// gradients of a whole step are already "packed" for one allreduce:
//   W1 (hidden x in, column-major) | b1 (hidden) | W2 (out x hidden) | b2 (out)
//
// Gradients are *sums* over the samples of a batch (not means): sums add up
// across micro-batches and ranks, and the trainer divides once by the global
// batch, so the result is the global mean whatever the split.
#pragma once

#include <Eigen/Core>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace shmring::examples {

/// Loss summed over a batch and number of correct argmax predictions.
struct BatchStats {
  double loss_sum = 0;
  std::size_t correct = 0;
};

class Mlp {
 public:
  using Matrix = Eigen::MatrixXf;
  using Vector = Eigen::VectorXf;
  using MatrixMap = Eigen::Map<Matrix>;
  using VectorMap = Eigen::Map<Vector>;

  /// Typed views into one flat buffer of param_count() floats.
  struct Views {
    MatrixMap w1, w2;
    VectorMap b1, b2;
  };

  Mlp(int in, int hidden, int out) : in_(in), hidden_(hidden), out_(out) {
    if (in < 1 || hidden < 1 || out < 2)
      throw std::invalid_argument("Mlp: sizes must be in >= 1, hidden >= 1, out >= 2; got " +
                                  std::to_string(in) + ", " + std::to_string(hidden) + ", " +
                                  std::to_string(out));
    params_.assign(param_count(), 0.0f);
  }

  int in() const { return in_; }
  int hidden() const { return hidden_; }
  int out() const { return out_; }
  std::size_t param_count() const {
    return std::size_t(hidden_) * in_ + hidden_ + std::size_t(out_) * hidden_ + out_;
  }
  std::span<float> params() { return params_; }
  std::span<const float> params() const { return params_; }

  Views views(std::span<float> flat) const {
    if (flat.size() < param_count())
      throw std::invalid_argument("Mlp::views: buffer of " + std::to_string(flat.size()) +
                                  " floats, need " + std::to_string(param_count()));
    float* p = flat.data();
    float* b1 = p + std::size_t(hidden_) * in_;
    float* w2 = b1 + hidden_;
    float* b2 = w2 + std::size_t(out_) * hidden_;
    return Views{MatrixMap(p, hidden_, in_), MatrixMap(w2, out_, hidden_), VectorMap(b1, hidden_),
                 VectorMap(b2, out_)};
  }

  /// He-normal first layer, Glorot-normal second, zero biases; a pure function
  /// of the seed, so every rank starts from the same bits.
  void init(std::uint64_t seed) {
    std::mt19937_64 gen(seed);
    auto v = views(params_);
    std::normal_distribution<float> n1(0.0f, std::sqrt(2.0f / float(in_)));
    for (Eigen::Index i = 0; i < v.w1.size(); ++i) v.w1.data()[i] = n1(gen);
    std::normal_distribution<float> n2(0.0f, std::sqrt(2.0f / float(hidden_ + out_)));
    for (Eigen::Index i = 0; i < v.w2.size(); ++i) v.w2.data()[i] = n2(gen);
    v.b1.setZero();
    v.b2.setZero();
  }

  /// Forward and backward on the columns of `x` (in x b) with labels `y`;
  /// adds the summed gradients into `grad` (param_count() floats).
  BatchStats forward_backward(const Eigen::Ref<const Matrix>& x, std::span<const std::uint8_t> y,
                              std::span<float> grad) {
    BatchStats stats = forward(x, y);
    auto p = views(params_);
    auto g = views(grad);
    // dL/dz = softmax - onehot, per sample (summed loss, so no 1/b).
    for (Eigen::Index j = 0; j < z_.cols(); ++j) z_(y[std::size_t(j)], j) -= 1.0f;
    g.w2.noalias() += z_ * h_.transpose();
    g.b2 += z_.rowwise().sum();
    dh_.noalias() = p.w2.transpose() * z_;
    dh_ = (h_.array() > 0.0f).select(dh_, 0.0f);
    g.w1.noalias() += dh_ * x.transpose();
    g.b1 += dh_.rowwise().sum();
    return stats;
  }

  /// Forward only; leaves the softmax probabilities of the batch in z_.
  BatchStats forward(const Eigen::Ref<const Matrix>& x, std::span<const std::uint8_t> y) {
    if (x.rows() != in_ || std::size_t(x.cols()) != y.size())
      throw std::invalid_argument("Mlp: batch is " + std::to_string(x.rows()) + " x " +
                                  std::to_string(x.cols()) + " with " + std::to_string(y.size()) +
                                  " labels; expected " + std::to_string(in_) + " rows");
    auto p = views(params_);
    h_.noalias() = p.w1 * x;
    h_.colwise() += p.b1;
    h_ = h_.cwiseMax(0.0f);
    z_.noalias() = p.w2 * h_;
    z_.colwise() += p.b2;
    BatchStats stats;
    for (Eigen::Index j = 0; j < z_.cols(); ++j) {
      auto col = z_.col(j);
      Eigen::Index arg = 0;
      const float mx = col.maxCoeff(&arg);
      const int label = y[std::size_t(j)];
      if (label >= out_)
        throw std::invalid_argument("Mlp: label " + std::to_string(label) + " is outside [0, " +
                                    std::to_string(out_) + ")");
      // -log softmax of the true class from the shifted logits, so that an
      // underflowing probability never turns into log(0).
      const float true_logit = col(label) - mx;
      col.array() = (col.array() - mx).exp();
      const float sum = col.sum();
      stats.loss_sum += double(std::log(sum)) - double(true_logit);
      col /= sum;
      if (arg == label) ++stats.correct;
    }
    return stats;
  }

 private:
  int in_, hidden_, out_;
  std::vector<float> params_;
  Matrix h_, z_, dh_;  // activations and scratch, reused across batches
};

/// FNV-1a (64-bit) over the raw bytes of a float buffer.
inline std::uint64_t fnv1a(std::span<const float> data) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(data.data());
  for (std::size_t i = 0; i < data.size_bytes(); ++i) {
    h ^= bytes[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace shmring::examples
