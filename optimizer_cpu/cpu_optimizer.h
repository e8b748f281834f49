// CpuOptimizer: the optimizer step of ZeRO-Offload on the CPU, over spans of
// fp32 master params and states, with the mixed-precision helpers around it.
//
// It owns a persistent ThreadPool and splits every call into tiles of
// `tile_elements` (default 32 Ki elements: ~128 KiB per fp32 stream, so the
// streams of one tile sit in L2 while a thread works on it) that the threads
// claim in order. Each element runs the vector kernel of the best Highway
// target of this CPU (see kernels.h). It knows nothing of tiers or of the
// daemon: callers pass spans and hyperparameters.
//
// Results do not depend on the thread count or tile size: every element is
// computed independently, and the norm sums per-tile partials in tile order.
//
// Thread-safety: thread-safe. An optimizer holds no per-call state; with more
// than one thread, concurrent calls are serialized by its pool (use one
// optimizer per caller to step sub-groups in parallel).
#ifndef STRATA_OPTIMIZER_CPU_CPU_OPTIMIZER_H_
#define STRATA_OPTIMIZER_CPU_CPU_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "optimizer_cpu/hyperparams.h"
#include "optimizer_cpu/lamb.h"
#include "optimizer_cpu/step_spans.h"
#include "optimizer_cpu/thread_pool.h"

namespace strata {

struct CpuOptimizerOptions {
  int num_threads = 1;
  std::vector<int> pin_cpus;  // see ThreadPoolOptions
  size_t tile_elements = 32 * 1024;
};

class CpuOptimizer final {
 public:
  // InvalidArgument for a bad thread count/CPU list or tile_elements == 0.
  static absl::StatusOr<std::unique_ptr<CpuOptimizer>> Create(const CpuOptimizerOptions& options);

  // Applies step number `step` (1 for the first step, as torch counts) of
  // `config` to `spans`. Every gradient is multiplied by `grad_scale` first
  // (1/loss_scale times a clip coefficient). InvalidArgument (and nothing is
  // written) for a bad config, step < 1, or spans that do not fit the config.
  // LAMB: `spans` is one whole tensor (its trust ratio is computed over
  // them); for a tensor in several ranges use LambMoments / LambApply.
  absl::Status Step(const OptimizerHyperparams& config, int64_t step, const StepSpans& spans,
                    float grad_scale = 1.0f);

  // LAMB in two passes, for a tensor stepped in ranges (see lamb.h). Pass 1
  // updates exp_avg and exp_avg_sq of `spans` and returns the range's sums of
  // squares; add those of every range of the tensor, then LambTrustRatio.
  // Errors as Step (config.kind must be kLamb).
  absl::StatusOr<LambNorms> LambMoments(const OptimizerHyperparams& config, int64_t step,
                                        const StepSpans& spans, float grad_scale = 1.0f);
  // Pass 2: moves the params of `spans` by -step_size * trust_ratio * update
  // and writes param_out. The gradient span is not read (may be null).
  // InvalidArgument for a bad config or spans, step < 1, or a trust_ratio
  // that is negative or infinite (NaN, from NaN gradients, propagates).
  absl::Status LambApply(const OptimizerHyperparams& config, int64_t step, const StepSpans& spans,
                         double trust_ratio);

  // Sets the states of `spans` to what torch initializes them to: zeros, and
  // initial_accumulator_value for Adagrad's sum. Only the params and
  // state spans are used. Errors as ValidateStateSpans.
  absl::Status InitializeState(const OptimizerHyperparams& config, const StepSpans& spans);

  // True when any gradient is +-inf or NaN (the loss scale overflowed).
  // InvalidArgument for null data with size > 0.
  absl::StatusOr<bool> HasInfOrNan(const GradView& grad);
  // Sum of g^2 in double, for global-norm clipping (sum the shards, sqrt).
  absl::StatusOr<double> SquaredL2Norm(const GradView& grad);

  // Whole-buffer conversions (rounding per half.h). InvalidArgument for null
  // buffers with size > 0.
  absl::Status ConvertToFp32(const void* src, DType src_dtype, float* dst, size_t size);
  absl::Status ConvertFromFp32(const float* src, void* dst, DType dst_dtype, size_t size);

  int num_threads() const { return pool_->num_threads(); }
  size_t tile_elements() const { return tile_elements_; }
  // The Highway target the kernels run on ("AVX3", "AVX2", "SSE4", ...).
  static const char* KernelTarget();

 private:
  CpuOptimizer(std::unique_ptr<ThreadPool> pool, size_t tile_elements)
      : pool_(std::move(pool)), tile_elements_(tile_elements) {}

  // Runs fn(begin, end) over the tiles of [0, size).
  template <class Fn>
  void ForEachTile(size_t size, const Fn& fn);

  std::unique_ptr<ThreadPool> pool_;
  size_t tile_elements_;
};

}  // namespace strata

#endif  // STRATA_OPTIMIZER_CPU_CPU_OPTIMIZER_H_
