// Google Benchmark binary for the optimizer_cpu kernels: one step of each
// algorithm and dtype combination over 16M elements (well past the caches),
// at 1 and 2 threads, reported as elements/s and bytes/s moved. `strata bench
// adam` is the end-to-end comparison with the bandwidth limit and torch.
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "benchmark/benchmark.h"
#include "core/dtype.h"
#include "optimizer_cpu/cpu_optimizer.h"
#include "optimizer_cpu/hyperparams.h"

namespace strata {
namespace {

constexpr size_t kElements = 16 << 20;

void BM_Step(benchmark::State& state, OptimizerKind kind, DType grad, std::optional<DType> out) {
  const int threads = static_cast<int>(state.range(0));
  CpuOptimizerOptions options;
  options.num_threads = threads;
  auto opt = CpuOptimizer::Create(options);
  if (!opt.ok()) {
    state.SkipWithError(opt.status().ToString().c_str());
    return;
  }
  OptimizerHyperparams h = kind == OptimizerKind::kLion ? DefaultLionHyperparams()
                                                        : OptimizerHyperparams{};
  h.kind = kind;
  h.weight_decay = 0.01;
  // std::vector value-initializes: every page is touched before timing.
  std::vector<float> params(kElements, 0.5f), exp_avg(kElements), exp_avg_sq(kElements);
  std::vector<float> grad32(kElements, 1e-3f);
  std::vector<uint16_t> grad16(kElements), out16(kElements);
  StepSpans spans;
  spans.size = kElements;
  spans.params = params.data();
  spans.exp_avg = exp_avg.data();
  spans.exp_avg_sq = StateLayoutFor(h).exp_avg_sq ? exp_avg_sq.data() : nullptr;
  spans.grad_dtype = grad;
  if (grad == DType::kFp32) {
    spans.grad = grad32.data();
  } else {
    if (!(*opt)->ConvertFromFp32(grad32.data(), grad16.data(), grad, kElements).ok()) return;
    spans.grad = grad16.data();
  }
  if (out) {
    spans.param_out = out16.data();
    spans.param_out_dtype = out;
  }
  const size_t states = StateLayoutFor(h).exp_avg_sq ? 2 : 1;
  const size_t bytes = 8 * (1 + states) + DTypeSize(grad) + (out ? DTypeSize(*out) : 0);
  int64_t step = 0;
  for (auto _ : state) {
    if (!(*opt)->Step(h, ++step, spans).ok()) state.SkipWithError("step failed");
  }
  state.SetItemsProcessed(state.iterations() * kElements);
  state.SetBytesProcessed(state.iterations() * kElements * bytes);
  state.SetLabel(CpuOptimizer::KernelTarget());
}

void BM_SquaredNormFp16(benchmark::State& state) {
  CpuOptimizerOptions options;
  options.num_threads = static_cast<int>(state.range(0));
  auto opt = CpuOptimizer::Create(options);
  std::vector<uint16_t> grad(kElements, 0x1400);
  for (auto _ : state) {
    benchmark::DoNotOptimize(*(*opt)->SquaredL2Norm({grad.data(), DType::kFp16, kElements}));
  }
  state.SetBytesProcessed(state.iterations() * kElements * 2);
}

void BM_HasInfOrNanBf16(benchmark::State& state) {
  CpuOptimizerOptions options;
  options.num_threads = static_cast<int>(state.range(0));
  auto opt = CpuOptimizer::Create(options);
  std::vector<uint16_t> grad(kElements, 0x3F80);
  for (auto _ : state) {
    benchmark::DoNotOptimize(*(*opt)->HasInfOrNan({grad.data(), DType::kBf16, kElements}));
  }
  state.SetBytesProcessed(state.iterations() * kElements * 2);
}

BENCHMARK_CAPTURE(BM_Step, adamw_fp32, OptimizerKind::kAdamW, DType::kFp32, std::nullopt)
    ->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Step, adamw_fp16_out_fp16, OptimizerKind::kAdamW, DType::kFp16, DType::kFp16)
    ->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Step, adamw_bf16_out_bf16, OptimizerKind::kAdamW, DType::kBf16, DType::kBf16)
    ->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Step, adam_fp16_out_fp16, OptimizerKind::kAdam, DType::kFp16, DType::kFp16)
    ->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Step, adagrad_fp16_out_fp16, OptimizerKind::kAdagrad, DType::kFp16, DType::kFp16)
    ->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Step, lion_fp16_out_fp16, OptimizerKind::kLion, DType::kFp16, DType::kFp16)
    ->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SquaredNormFp16)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_HasInfOrNanBf16)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace strata

BENCHMARK_MAIN();
