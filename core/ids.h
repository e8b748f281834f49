// Strong identifier types, so a rank can never be passed where a job is meant.
#ifndef STRATA_CORE_IDS_H_
#define STRATA_CORE_IDS_H_

#include <compare>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace strata {

// A value of type T that only compares with values of the same Tag.
template <typename Tag, typename T>
class StrongId {
 public:
  using ValueType = T;
  constexpr StrongId() = default;
  constexpr explicit StrongId(T value) : value_(value) {}
  constexpr T value() const { return value_; }
  friend constexpr auto operator<=>(StrongId, StrongId) = default;
  template <typename H>
  friend H AbslHashValue(H h, StrongId id) {
    return H::combine(std::move(h), id.value_);
  }

 private:
  T value_{};
};

struct JobIdTag {};
struct RankTag {};
struct TensorIdTag {};

using JobId = StrongId<JobIdTag, uint64_t>;
using Rank = StrongId<RankTag, uint32_t>;
using TensorId = StrongId<TensorIdTag, uint32_t>;

}  // namespace strata

#endif  // STRATA_CORE_IDS_H_
