// Element types of training state: fp32 masters and moments, fp16/bf16
// working params and gradients.
#ifndef STRATA_CORE_DTYPE_H_
#define STRATA_CORE_DTYPE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace strata {

enum class DType : uint8_t { kFp32 = 0, kFp16 = 1, kBf16 = 2 };

constexpr size_t DTypeSize(DType dtype) {
  return dtype == DType::kFp32 ? 4 : 2;
}

// "fp32", "fp16", "bf16".
absl::string_view DTypeName(DType dtype);

// Accepts the names above and the spellings users bring from PyTorch and
// DeepSpeed: float32/float/f32, float16/half/f16, bfloat16/bf16. Case-insensitive.
absl::StatusOr<DType> ParseDType(absl::string_view text);

}  // namespace strata

#endif  // STRATA_CORE_DTYPE_H_
