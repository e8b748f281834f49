#include "core/dtype.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace strata {

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFp32: return "fp32";
    case DType::kFp16: return "fp16";
    case DType::kBf16: return "bf16";
  }
  return "unknown";
}

absl::StatusOr<DType> ParseDType(absl::string_view text) {
  std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (lower == "fp32" || lower == "float32" || lower == "float" || lower == "f32" ||
      lower == "torch.float32") {
    return DType::kFp32;
  }
  if (lower == "fp16" || lower == "float16" || lower == "half" || lower == "f16" ||
      lower == "torch.float16") {
    return DType::kFp16;
  }
  if (lower == "bf16" || lower == "bfloat16" || lower == "torch.bfloat16") {
    return DType::kBf16;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown dtype '", text, "': expected one of fp32, fp16, bf16"));
}

}  // namespace strata
