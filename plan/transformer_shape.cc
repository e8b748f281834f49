#include "plan/transformer_shape.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace strata {

absl::Status ValidateTransformerShape(const TransformerShape& s) {
  struct Dim {
    const char* flag;
    uint64_t value;
  };
  for (Dim d : {Dim{"--layers", s.layers}, Dim{"--hidden", s.hidden}, Dim{"--heads", s.heads},
                Dim{"--vocab", s.vocab}, Dim{"--seq", s.seq}, Dim{"--micro-batch", s.micro_batch}}) {
    if (d.value == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(d.flag, " must be a positive whole number for a transformer shape"));
    }
  }
  if (s.hidden % s.heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--heads ", s.heads, " does not divide --hidden ",
                                                   s.hidden, "; expected a divisor of the hidden size"));
  }
  return absl::OkStatus();
}

uint64_t TransformerParams(const TransformerShape& s) {
  const uint64_t h = s.hidden;
  return s.layers * (12 * h * h + 13 * h) + s.vocab * h + s.seq * h + 2 * h;
}

uint64_t TransformerLargestLayerParams(const TransformerShape& s) {
  const uint64_t h = s.hidden;
  return std::max<uint64_t>(s.vocab * h, 4 * h * h + 4 * h);
}

uint64_t TransformerPersistentParams(const TransformerShape& s, uint64_t threshold) {
  const uint64_t h = s.hidden;
  auto small = [threshold](uint64_t numel) { return numel <= threshold ? numel : 0; };
  const uint64_t per_layer = small(3 * h * h) + small(3 * h) + small(h * h) + small(h) +
                             small(4 * h * h) + small(4 * h) + small(4 * h * h) + small(h) +
                             4 * small(h);
  return s.layers * per_layer + small(s.vocab * h) + small(s.seq * h) + 2 * small(h);
}

uint64_t ActivationBytes(const TransformerShape& s, uint64_t tensor_parallel, bool checkpointing) {
  const double t = static_cast<double>(std::max<uint64_t>(tensor_parallel, 1));
  const double sbh = static_cast<double>(s.seq) * s.micro_batch * s.hidden;
  const double per_layer =
      sbh * (10.0 + 24.0 / t + 5.0 * s.heads * s.seq / (static_cast<double>(s.hidden) * t));
  if (!checkpointing) return static_cast<uint64_t>(per_layer * s.layers);
  return static_cast<uint64_t>(2.0 * sbh * s.layers + per_layer);
}

}  // namespace strata
