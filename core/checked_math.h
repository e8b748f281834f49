// Overflow-checked size arithmetic for numbers that come from outside the
// daemon (tensor element counts, sub-group sizes, region sizes). Each helper
// returns InvalidArgument naming `what` instead of wrapping around, so a
// 2^62-element tensor is refused before anything is allocated.
#ifndef STRATA_CORE_CHECKED_MATH_H_
#define STRATA_CORE_CHECKED_MATH_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace strata {

inline absl::StatusOr<uint64_t> CheckedMul(uint64_t a, uint64_t b, absl::string_view what) {
  uint64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", a, " x ", b, " overflows 64 bits"));
  }
  return out;
}

inline absl::StatusOr<uint64_t> CheckedAdd(uint64_t a, uint64_t b, absl::string_view what) {
  uint64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", a, " + ", b, " overflows 64 bits"));
  }
  return out;
}

// `v` rounded up to a multiple of `to` (> 0).
inline absl::StatusOr<uint64_t> CheckedRoundUp(uint64_t v, uint64_t to, absl::string_view what) {
  if (to == 0) return absl::InvalidArgumentError(absl::StrCat(what, ": rounding to a multiple of 0"));
  const uint64_t rem = v % to;
  if (rem == 0) return v;
  return CheckedAdd(v, to - rem, what);
}

}  // namespace strata

#endif  // STRATA_CORE_CHECKED_MATH_H_
