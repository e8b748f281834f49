#include "daemon/request_limits.h"

#include "absl/strings/str_cat.h"
#include "core/checked_math.h"

namespace strata {

absl::Status ValidateTensorList(const RequestLimits& limits, const std::vector<TensorSpec>& tensors) {
  if (tensors.empty()) return absl::InvalidArgumentError("tensors: the list is empty");
  if (tensors.size() > limits.max_tensors_per_job) {
    return absl::ResourceExhaustedError(absl::StrCat("tensors: ", tensors.size(),
                                                     " tensors exceed max_tensors_per_job (",
                                                     limits.max_tensors_per_job, ")"));
  }
  uint64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorSpec& t = tensors[i];
    if (t.name.size() > limits.max_name_length) {
      return absl::InvalidArgumentError(absl::StrCat("tensors[", i, "].name is ", t.name.size(),
                                                     " bytes; max_name_length is ", limits.max_name_length));
    }
    if (t.numel == 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensors[", i, "].numel ('", t.name, "') is 0"));
    }
    if (t.numel > limits.max_tensor_elements) {
      return absl::InvalidArgumentError(absl::StrCat("tensors[", i, "].numel ('", t.name, "') is ", t.numel,
                                                     "; max_tensor_elements is ", limits.max_tensor_elements));
    }
    auto sum = CheckedAdd(total, t.numel, "tensors: total elements");
    if (!sum.ok()) return sum.status();
    total = *sum;
    if (total > limits.max_job_elements) {
      return absl::ResourceExhaustedError(absl::StrCat("tensors: ", total, "+ elements exceed max_job_elements (",
                                                       limits.max_job_elements, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace strata
