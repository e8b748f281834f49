// The memory one optimizer step reads and writes: fp32 master params and
// states updated in place, a gradient in fp32/fp16/bf16, and an optional
// 16-bit copy of the updated params written in the same pass. The moments
// are fp32 (`exp_avg`, ...), or compressed (moment_format.h): bf16 or 8-bit
// blockwise, given as typed spans over the whole moment tensor with the
// step's range in it (`moment_offset`), so that validation can check their
// sizes and that the range starts on a block.
//
// The spans are borrowed: the caller owns the memory and keeps it valid for
// the duration of the call. Any alignment is accepted; the spans of one step
// must not overlap, with one exception: param_out may be the gradient itself
// (the same address, elements of the same size) -- each element's gradient
// is read before its param is written, so the new params replace the
// gradient in place (the daemon's early ZeRO-Infinity steps rely on it;
// kernels_test checks every target).
#ifndef STRATA_OPTIMIZER_CPU_STEP_SPANS_H_
#define STRATA_OPTIMIZER_CPU_STEP_SPANS_H_

#include <cstddef>
#include <optional>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/dtype.h"
#include "optimizer_cpu/hyperparams.h"
#include "optimizer_cpu/moment_format.h"

namespace strata {

// One moment in 8-bit blockwise form: a code per element of the moment
// tensor and an absmax per block of kMomentBlock elements from its start.
struct Blockwise8Moment {
  absl::Span<uint8_t> codes;
  absl::Span<float> absmax;  // MomentBlocks(codes.size()) entries
  bool empty() const { return codes.empty() && absmax.empty(); }
};

// The compressed moments, by role (as the fp32 fields of StepSpans). Each
// span covers the whole moment tensor (a shard's state, say); the step
// covers elements [moment_offset, moment_offset + size) of it.
struct Bf16Moments {
  absl::Span<uint16_t> exp_avg;
  absl::Span<uint16_t> exp_avg_sq;
  absl::Span<uint16_t> max_exp_avg_sq;
};
struct Blockwise8Moments {
  Blockwise8Moment exp_avg;         // kSigned map; Adagrad's sum: kUnsigned
  Blockwise8Moment exp_avg_sq;      // kUnsigned
  Blockwise8Moment max_exp_avg_sq;  // kUnsigned
};

struct StepSpans {
  size_t size = 0;  // elements in every span
  float* params = nullptr;
  // Adam/AdamW: first moment. Adagrad: sum of squared gradients. Lion: momentum.
  float* exp_avg = nullptr;
  // Adam/AdamW: second moment; null for Adagrad and Lion.
  float* exp_avg_sq = nullptr;
  // Adam/AdamW with amsgrad: running max of exp_avg_sq; null otherwise.
  float* max_exp_avg_sq = nullptr;
  const void* grad = nullptr;
  DType grad_dtype = DType::kFp32;
  // Optional copy of the updated params, fp16 or bf16 (round to nearest even).
  void* param_out = nullptr;
  std::optional<DType> param_out_dtype;

  // How the moments are stored. kFp32: the float* fields above, which
  // point at this step's first element. kBf16 / kBlockwise8: those are null
  // and the moments are in bf16_moments / blockwise8_moments, whose spans
  // hold the whole moment tensor; element j of this step (params[j],
  // grad[j], ...) is element moment_offset + j of the moments.
  // Blockwise8: moment_offset is a multiple of kMomentBlock, and the range
  // ends at the tensor's end or on a block boundary (a block is
  // requantized whole, with one new absmax).
  MomentFormat moment_format = MomentFormat::kFp32;
  size_t moment_offset = 0;
  Bf16Moments bf16_moments;
  Blockwise8Moments blockwise8_moments;
};

// The 8-bit map of the exp_avg role: kSigned (Adam's first moment, Lion's
// momentum), kUnsigned for Adagrad's sum of squares. The second moments are
// always kUnsigned.
MomentMap ExpAvgMomentMap(OptimizerKind kind);

// A read-only gradient buffer, for the helpers (inf/nan check, norm).
struct GradView {
  const void* data = nullptr;
  DType dtype = DType::kFp32;
  size_t size = 0;
};

// InvalidArgument when a span the algorithm needs is null (with size > 0), a
// span it does not use is set (exp_avg_sq for Lion: a caller bug that would
// otherwise go unnoticed), param_out and its dtype disagree, or param_out's
// dtype is fp32 (the fp32 params are already the output). Compressed
// moments, naming the field: a moment given in another format's field, a
// span shorter than moment_offset + size, moments of different lengths, an
// absmax span whose length is not MomentBlocks(codes), a moment_offset that
// is not a multiple of kMomentBlock, a range that ends inside a block short
// of the tensor's end, or moment_offset with fp32 moments. Unimplemented for
// LAMB with compressed moments.
absl::Status ValidateStepSpans(const OptimizerHyperparams& config, const StepSpans& spans);
// The params and state checks of ValidateStepSpans only (grad and param_out
// are not looked at), for state initialization.
absl::Status ValidateStateSpans(const OptimizerHyperparams& config, const StepSpans& spans);
// ValidateStepSpans without the gradient (LAMB's second pass reads none).
absl::Status ValidateApplySpans(const OptimizerHyperparams& config, const StepSpans& spans);

}  // namespace strata

#endif  // STRATA_OPTIMIZER_CPU_STEP_SPANS_H_
