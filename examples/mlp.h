// Mlp: the small model the example trains, a multi-layer perceptron with tanh
// hidden layers and a softmax cross-entropy head, with its own forward and
// backward in plain C++ (no framework, so every floating-point operation and
// its order is fixed by this file and the three training modes can be
// compared bit for bit).
//
// Params and gradients live in two flat fp32 buffers, tensor after tensor in
// the order of tensors() (layer 0 weight, layer 0 bias, layer 1 weight, ...),
// which is also the order the ranks register with the daemon. The model reads
// params through params() and writes gradients to grads(); where the params
// come from (all local, gathered per layer from the daemon) is the caller's
// business: a layer's params only need to be valid while ForwardLayer or
// BackwardLayer of that layer runs.
//
// Thread-compatible.
#ifndef STRATA_EXAMPLES_MLP_H_
#define STRATA_EXAMPLES_MLP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"

namespace strata {

// One tensor of the model: its name and where it lies in the flat buffers.
struct ModelTensor {
  std::string name;
  uint64_t numel = 0;
  uint64_t flat_offset = 0;
};

class Mlp final {
 public:
  // `widths` = {inputs, hidden..., classes}; at least two entries.
  explicit Mlp(std::vector<int> widths);

  int num_layers() const { return static_cast<int>(widths_.size()) - 1; }
  int input_width() const { return widths_.front(); }
  int num_classes() const { return widths_.back(); }
  const std::vector<ModelTensor>& tensors() const { return tensors_; }
  // The indices in tensors() of layer `layer`'s weight and bias.
  std::vector<uint32_t> LayerTensors(int layer) const;
  uint64_t numel() const { return params_.size(); }

  absl::Span<float> params() { return absl::MakeSpan(params_); }
  absl::Span<float> grads() { return absl::MakeSpan(grads_); }

  // Sets every tensor to torch.nn.Linear's default init, U(-1/sqrt(fan_in),
  // 1/sqrt(fan_in)), drawn from a fixed seed: every rank gets the same model.
  void Initialize(uint64_t seed);

  // Starts a pass over a batch of `batch` rows of input_width() features.
  // REQUIRES: inputs.size() == batch * input_width(); labels in [0, num_classes()).
  void SetBatch(absl::Span<const float> inputs, absl::Span<const int> labels);
  // Layer `layer` of the forward pass, in order 0, 1, ...; then Loss().
  void ForwardLayer(int layer);
  // Mean cross-entropy of the batch; also seeds the backward pass.
  float Loss();
  // Layer `layer` of the backward pass, in order num_layers()-1, ..., 0:
  // writes the layer's weight and bias gradients into grads().
  void BackwardLayer(int layer);

 private:
  std::vector<int> widths_;
  std::vector<ModelTensor> tensors_;
  std::vector<float> params_;
  std::vector<float> grads_;

  int batch_ = 0;
  std::vector<int> labels_;
  // activations_[l]: the input of layer l (batch x widths_[l]); the last
  // entry holds the logits.
  std::vector<std::vector<float>> activations_;
  // The gradient of the loss with respect to the pre-activation output of
  // the layer BackwardLayer runs next (batch x widths_[layer + 1]).
  std::vector<float> delta_;
};

}  // namespace strata

#endif  // STRATA_EXAMPLES_MLP_H_
