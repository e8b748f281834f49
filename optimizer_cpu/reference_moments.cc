#include "optimizer_cpu/reference_moments.h"

#include <algorithm>
#include <vector>

#include "core/status_macros.h"
#include "optimizer_cpu/half.h"
#include "optimizer_cpu/reference_optimizer.h"

namespace strata {
namespace {

// Elements [begin, end) of the step's non-moment spans.
StepSpans ChunkOf(const StepSpans& spans, size_t begin, size_t end) {
  StepSpans c;
  c.size = end - begin;
  c.params = spans.params + begin;
  c.grad = static_cast<const uint8_t*>(spans.grad) + begin * DTypeSize(spans.grad_dtype);
  c.grad_dtype = spans.grad_dtype;
  if (spans.param_out != nullptr) {
    c.param_out = static_cast<uint8_t*>(spans.param_out) + begin * DTypeSize(*spans.param_out_dtype);
    c.param_out_dtype = spans.param_out_dtype;
  }
  return c;
}

}  // namespace

absl::Status ReferenceCompressedStep(const OptimizerHyperparams& config, int64_t step,
                                     const StepSpans& spans, float grad_scale) {
  const StateLayout layout = StateLayoutFor(config);
  const bool used[3] = {layout.exp_avg, layout.exp_avg_sq, layout.max_exp_avg_sq};
  const MomentMap maps[3] = {ExpAvgMomentMap(config.kind), MomentMap::kUnsigned, MomentMap::kUnsigned};
  const Bf16Moments& b = spans.bf16_moments;
  const Blockwise8Moments& q = spans.blockwise8_moments;
  const absl::Span<uint16_t> bf16[3] = {b.exp_avg, b.exp_avg_sq, b.max_exp_avg_sq};
  const Blockwise8Moment* q8[3] = {&q.exp_avg, &q.exp_avg_sq, &q.max_exp_avg_sq};
  // Blocks of the 8-bit moments (moment_offset is on a block boundary); bf16
  // has no blocks, but stepping it in the same chunks gives the same result.
  for (size_t begin = 0; begin < spans.size; begin += kMomentBlock) {
    const size_t end = std::min(spans.size, begin + kMomentBlock);
    const size_t n = end - begin;
    const size_t at = spans.moment_offset + begin;  // element of the moment tensor
    std::vector<float> fp32[3];
    float* ptr[3] = {nullptr, nullptr, nullptr};
    for (int k = 0; k < 3; ++k) {
      if (!used[k]) continue;
      fp32[k].resize(n);
      ptr[k] = fp32[k].data();
      if (spans.moment_format == MomentFormat::kBf16) {
        for (size_t i = 0; i < n; ++i) fp32[k][i] = Bf16BitsToFp32(bf16[k][at + i]);
      } else {
        DequantizeMomentBlock8(q8[k]->codes.data() + at, n, q8[k]->absmax[at / kMomentBlock],
                               maps[k], ptr[k]);
      }
    }
    StepSpans chunk = ChunkOf(spans, begin, end);
    chunk.exp_avg = ptr[0];
    chunk.exp_avg_sq = ptr[1];
    chunk.max_exp_avg_sq = ptr[2];
    STRATA_RETURN_IF_ERROR(ReferenceStep(config, step, chunk, grad_scale));
    for (int k = 0; k < 3; ++k) {
      if (!used[k]) continue;
      if (spans.moment_format == MomentFormat::kBf16) {
        for (size_t i = 0; i < n; ++i) bf16[k][at + i] = Fp32ToBf16Bits(fp32[k][i]);
      } else {
        q8[k]->absmax[at / kMomentBlock] =
            QuantizeMomentBlock8(ptr[k], n, maps[k], q8[k]->codes.data() + at);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace strata
