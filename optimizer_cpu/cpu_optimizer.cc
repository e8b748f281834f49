#include "optimizer_cpu/cpu_optimizer.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "optimizer_cpu/kernels.h"

namespace strata {
namespace {

absl::Status CheckBuffer(const void* data, size_t size, const char* what) {
  if (data == nullptr && size > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": buffer is null but ", size, " elements were given"));
  }
  return absl::OkStatus();
}

absl::Status CheckStepNumber(int64_t step) {
  if (step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer step number is ", step, "; steps are counted from 1"));
  }
  return absl::OkStatus();
}

absl::Status CheckLamb(const OptimizerHyperparams& config) {
  if (config.kind != OptimizerKind::kLamb) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LAMB pass called with optimizer ", OptimizerKindName(config.kind), "; use Step"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuOptimizer>> CpuOptimizer::Create(
    const CpuOptimizerOptions& options) {
  if (options.tile_elements == 0) {
    return absl::InvalidArgumentError("cpu optimizer: tile_elements must be > 0");
  }
  STRATA_ASSIGN_OR_RETURN(
      std::unique_ptr<ThreadPool> pool,
      ThreadPool::Create({.num_threads = options.num_threads, .pin_cpus = options.pin_cpus}));
  return std::unique_ptr<CpuOptimizer>(new CpuOptimizer(std::move(pool), options.tile_elements));
}

const char* CpuOptimizer::KernelTarget() { return internal::ActiveTargetName(); }

template <class Fn>
void CpuOptimizer::ForEachTile(size_t size, const Fn& fn) {
  const size_t tiles = (size + tile_elements_ - 1) / tile_elements_;
  pool_->ParallelFor(tiles, [&](size_t tile) {
    const size_t begin = tile * tile_elements_;
    fn(tile, begin, std::min(size, begin + tile_elements_));
  });
}

absl::Status CpuOptimizer::Step(const OptimizerHyperparams& config, int64_t step,
                                const StepSpans& spans, float grad_scale) {
  STRATA_RETURN_IF_ERROR(ValidateOptimizerHyperparams(config));
  STRATA_RETURN_IF_ERROR(ValidateStepSpans(config, spans));
  STRATA_RETURN_IF_ERROR(CheckStepNumber(step));
  if (config.kind == OptimizerKind::kLamb) {
    STRATA_ASSIGN_OR_RETURN(const LambNorms norms, LambMoments(config, step, spans, grad_scale));
    return LambApply(config, step, spans, LambTrustRatio(config, norms));
  }
  const StepScalars s = ComputeStepScalars(config, step, grad_scale);
  auto range = &internal::AdamRange;
  switch (config.kind) {
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      range = &internal::AdamRange;
      break;
    case OptimizerKind::kAdagrad:
      range = &internal::AdagradRange;
      break;
    case OptimizerKind::kLion:
      range = &internal::LionRange;
      break;
    case OptimizerKind::kLamb:
      break;  // handled above
    case OptimizerKind::kOther:  // refused by ValidateOptimizerHyperparams
      break;
  }
  ForEachTile(spans.size, [&](size_t, size_t begin, size_t end) { range(s, spans, begin, end); });
  return absl::OkStatus();
}

absl::StatusOr<LambNorms> CpuOptimizer::LambMoments(const OptimizerHyperparams& config,
                                                    int64_t step, const StepSpans& spans,
                                                    float grad_scale) {
  STRATA_RETURN_IF_ERROR(CheckLamb(config));
  STRATA_RETURN_IF_ERROR(ValidateOptimizerHyperparams(config));
  STRATA_RETURN_IF_ERROR(ValidateStepSpans(config, spans));
  STRATA_RETURN_IF_ERROR(CheckStepNumber(step));
  const StepScalars s = ComputeStepScalars(config, step, grad_scale);
  // Fixed blocks, not tiles: the order of the sums (lamb.h) must not depend
  // on tile_elements or the thread count.
  const size_t blocks = (spans.size + kLambNormBlock - 1) / kLambNormBlock;
  std::vector<LambNorms> partial(blocks);
  pool_->ParallelFor(blocks, [&](size_t block) {
    const size_t begin = block * kLambNormBlock;
    partial[block] =
        internal::LambMomentsRange(s, spans, begin, std::min(spans.size, begin + kLambNormBlock));
  });
  LambNorms total;
  for (const LambNorms& p : partial) total += p;
  return total;
}

absl::Status CpuOptimizer::LambApply(const OptimizerHyperparams& config, int64_t step,
                                     const StepSpans& spans, double trust_ratio) {
  STRATA_RETURN_IF_ERROR(CheckLamb(config));
  STRATA_RETURN_IF_ERROR(ValidateOptimizerHyperparams(config));
  STRATA_RETURN_IF_ERROR(ValidateApplySpans(config, spans));
  STRATA_RETURN_IF_ERROR(CheckStepNumber(step));
  if (trust_ratio < 0 || std::isinf(trust_ratio)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lamb trust ratio is ", trust_ratio, "; it must be finite and >= 0"));
  }
  const StepScalars s = LambApplyScalars(config, step, trust_ratio);
  ForEachTile(spans.size, [&](size_t, size_t begin, size_t end) {
    internal::LambApplyRange(s, spans, begin, end);
  });
  return absl::OkStatus();
}

absl::Status CpuOptimizer::InitializeState(const OptimizerHyperparams& config, const StepSpans& spans) {
  STRATA_RETURN_IF_ERROR(ValidateOptimizerHyperparams(config));
  STRATA_RETURN_IF_ERROR(ValidateStateSpans(config, spans));
  const float first = config.kind == OptimizerKind::kAdagrad
                          ? static_cast<float>(config.initial_accumulator_value)
                          : 0.0f;
  // Filled by the pool so that each tile's pages are first touched by the
  // thread that will usually step them.
  ForEachTile(spans.size, [&](size_t, size_t begin, size_t end) {
    std::fill(spans.exp_avg + begin, spans.exp_avg + end, first);
    if (spans.exp_avg_sq) std::fill(spans.exp_avg_sq + begin, spans.exp_avg_sq + end, 0.0f);
    if (spans.max_exp_avg_sq) {
      std::fill(spans.max_exp_avg_sq + begin, spans.max_exp_avg_sq + end, 0.0f);
    }
  });
  return absl::OkStatus();
}

absl::StatusOr<bool> CpuOptimizer::HasInfOrNan(const GradView& grad) {
  STRATA_RETURN_IF_ERROR(CheckBuffer(grad.data, grad.size, "inf/nan check"));
  std::atomic<bool> found{false};
  ForEachTile(grad.size, [&](size_t, size_t begin, size_t end) {
    // Once one tile has found an overflow the answer is known.
    if (found.load(std::memory_order_relaxed)) return;
    if (internal::HasInfOrNanRange(grad, begin, end)) found.store(true, std::memory_order_relaxed);
  });
  return found.load(std::memory_order_relaxed);
}

absl::StatusOr<double> CpuOptimizer::SquaredL2Norm(const GradView& grad) {
  STRATA_RETURN_IF_ERROR(CheckBuffer(grad.data, grad.size, "squared L2 norm"));
  const size_t tiles = (grad.size + tile_elements_ - 1) / tile_elements_;
  std::vector<double> partial(tiles, 0.0);
  ForEachTile(grad.size, [&](size_t tile, size_t begin, size_t end) {
    partial[tile] = internal::SquaredL2NormRange(grad, begin, end);
  });
  double sum = 0.0;
  for (double p : partial) sum += p;  // tile order: same result for any thread count
  return sum;
}

absl::Status CpuOptimizer::ConvertToFp32(const void* src, DType src_dtype, float* dst,
                                         size_t size) {
  STRATA_RETURN_IF_ERROR(CheckBuffer(src, size, "convert to fp32: source"));
  STRATA_RETURN_IF_ERROR(CheckBuffer(dst, size, "convert to fp32: destination"));
  ForEachTile(size, [&](size_t, size_t begin, size_t end) {
    internal::ToFp32Range(src, src_dtype, dst, begin, end);
  });
  return absl::OkStatus();
}

absl::Status CpuOptimizer::ConvertFromFp32(const float* src, void* dst, DType dst_dtype,
                                           size_t size) {
  STRATA_RETURN_IF_ERROR(CheckBuffer(src, size, "convert from fp32: source"));
  STRATA_RETURN_IF_ERROR(CheckBuffer(dst, size, "convert from fp32: destination"));
  ForEachTile(size, [&](size_t, size_t begin, size_t end) {
    internal::FromFp32Range(src, dst, dst_dtype, begin, end);
  });
  return absl::OkStatus();
}

}  // namespace strata
