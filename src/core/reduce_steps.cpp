#include "core/reduce_steps.hpp"

#include <algorithm>
#include <cstring>

#include "core/parallel.hpp"
#include "kernels/reduce.hpp"
#include "kernels/wide.hpp"

namespace shmring::algo {

namespace {

// The 16-bit steps count every byte they touch in for_grains (float64
// partials are 4x their elements), so a ring slice of slice_bytes / 8
// elements still splits.
// The direct path's float64 accumulator block: 16 KiB, stays in L1.
constexpr std::size_t kBlockElems = 2048;

template <class F>
void for_grains(CommState& c, std::size_t m, std::size_t elem_bytes, F f) {
  detail::for_grains(c.arena.get(), m, elem_bytes, f);
}

}  // namespace

bool partials_wide(DataType dtype, ReduceOp op, int n) {
  return n > 2 && detail::reduces_wide(dtype, op);
}

std::size_t reduction_slice_elems(std::size_t slice_bytes, DataType dtype, ReduceOp op, int n) {
  return slice_bytes / (partials_wide(dtype, op, n) ? detail::kWideBytes : datatype_size(dtype));
}

void partial_step(CommState& c, std::byte* dst, const std::byte* src, bool src_partial,
                  const std::byte* in, std::size_t m, DataType dtype, ReduceOp op) {
  if (!detail::reduces_wide(dtype, op)) {
    c.reduce(dst, src, in, m, dtype, op == ReduceOp::avg ? ReduceOp::sum : op);
    return;
  }
  const std::size_t src_es = src_partial ? detail::kWideBytes : 2;
  for_grains(c, m, src_es + 2 + detail::kWideBytes, [&](std::size_t i, std::size_t k) {
    detail::reduce_to_wide(dst + i * detail::kWideBytes, src + i * src_es, src_partial, in + i * 2,
                           k, dtype, op);
  });
}

void final_step(CommState& c, std::byte* out, const std::byte* src, bool src_partial,
                const std::byte* in, std::size_t m, DataType dtype, ReduceOp op, int n) {
  const int divisor = op == ReduceOp::avg ? n : 1;
  if (!detail::reduces_wide(dtype, op)) {
    c.reduce(out, src, in, m, dtype, op, divisor);
    return;
  }
  const std::size_t src_es = src_partial ? detail::kWideBytes : 2;
  for_grains(c, m, src_es + 2 + 2, [&](std::size_t i, std::size_t k) {
    detail::reduce_to_narrow(out + i * 2, src + i * src_es, src_partial, in + i * 2, k, dtype, op,
                             divisor);
  });
}

void reduce_in_rank_order_blocks(CommState& c, std::byte* out,
                                 const std::function<const std::byte*(int)>& src, int nsrc,
                                 std::size_t m, DataType dtype, ReduceOp op, std::byte* copy) {
  const std::size_t es = datatype_size(dtype);
  // Block by block, every rank's contribution to a block before the next
  // block: the partial (in `out`, or the float64 accumulator) stays in cache.
  auto run = [&](std::size_t begin, std::size_t count) {
    alignas(64) detail::Wide acc[kBlockElems];
    for (std::size_t i = begin; i < begin + count; i += kBlockElems) {
      const std::size_t k = std::min(kBlockElems, begin + count - i);
      const std::size_t off = i * es;
      reduce_block_in_rank_order(
          out + off, [&](int q) { return src(q) + off; }, nsrc, k, dtype, op, acc);
      if (copy != nullptr) std::memcpy(copy + off, out + off, k * es);
    }
  };
  // Every element reads nsrc sources and writes one result (two with
  // `copy`): counting only the result's bytes kept a two-shot part of 128
  // KiB (a 512 KiB piece at N=4) on one thread though it touches 640 KiB.
  for_grains(c, m, (nsrc + (copy != nullptr ? 2 : 1)) * es, run);
}

}  // namespace shmring::algo
