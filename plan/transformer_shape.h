// TransformerShape: parameter and activation counts of a GPT-style decoder,
// for `strata plan --layers --hidden ...`.
#ifndef STRATA_PLAN_TRANSFORMER_SHAPE_H_
#define STRATA_PLAN_TRANSFORMER_SHAPE_H_

#include <cstdint>

#include "absl/status/status.h"

namespace strata {

struct TransformerShape {
  uint64_t layers = 0;
  uint64_t hidden = 0;
  uint64_t heads = 0;
  uint64_t vocab = 0;
  uint64_t seq = 0;
  uint64_t micro_batch = 1;
};

// InvalidArgument naming the flag (--layers, --hidden, ...) when a dimension
// is zero or hidden is not divisible by heads.
absl::Status ValidateTransformerShape(const TransformerShape& shape);

// 12*L*h^2 + 13*L*h (attention and MLP weights and biases, two layer norms)
// + V*h (tied token embedding) + s*h (learned positions) + 2*h (final norm).
uint64_t TransformerParams(const TransformerShape& shape);

// The largest single module, as DeepSpeed's estimator counts "largest layer"
// (parameters of one module, not recursive): the token embedding or the MLP's
// up-projection (4*h*h + 4*h), whichever is larger.
uint64_t TransformerLargestLayerParams(const TransformerShape& shape);

// Parameters DeepSpeed's ZeRO-3 keeps whole on every GPU instead of
// partitioning: every tensor of at most `threshold` elements
// (stage3_param_persistence_threshold; DeepSpeed tests numel <= threshold in
// partition_parameters.py). Counted per tensor: per layer the qkv (3h), proj
// (h), fc1 (4h) and fc2 (h) biases and two layer norms (2h each), the
// weights (h*h and larger), the embeddings and the final norm (2 tensors of h).
uint64_t TransformerPersistentParams(const TransformerShape& shape, uint64_t threshold);

// Activation bytes one GPU holds at the peak of backward, fp16, following
// Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
// Transformer Models"), tensor parallel without sequence parallelism:
//   per layer: s*b*h*(10 + 24/t + 5*a*s/(h*t))
// Without checkpointing a GPU holds all L layers' worth (with pipeline
// parallelism the first stage holds pp micro-batches of L/pp layers: the same
// total). With full activation checkpointing it holds each layer's input,
// 2*s*b*h per layer, plus one layer recomputed in full.
uint64_t ActivationBytes(const TransformerShape& shape, uint64_t tensor_parallel,
                         bool checkpointing);

}  // namespace strata

#endif  // STRATA_PLAN_TRANSFORMER_SHAPE_H_
