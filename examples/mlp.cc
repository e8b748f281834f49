#include "examples/mlp.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/status_macros.h"
#include "examples/split_mix64.h"

namespace strata {

Mlp::Mlp(std::vector<int> widths) : widths_(std::move(widths)) {
  STRATA_CHECK(widths_.size() >= 2);
  uint64_t offset = 0;
  for (int l = 0; l + 1 < static_cast<int>(widths_.size()); ++l) {
    const uint64_t in = static_cast<uint64_t>(widths_[l]);
    const uint64_t out = static_cast<uint64_t>(widths_[l + 1]);
    std::string prefix = "layers." + std::to_string(l);
    tensors_.push_back({prefix + ".weight", out * in, offset});
    offset += out * in;
    tensors_.push_back({prefix + ".bias", out, offset});
    offset += out;
  }
  params_.assign(offset, 0.0f);
  grads_.assign(offset, 0.0f);
  activations_.resize(widths_.size());
}

std::vector<uint32_t> Mlp::LayerTensors(int layer) const {
  return {static_cast<uint32_t>(2 * layer), static_cast<uint32_t>(2 * layer + 1)};
}

void Mlp::Initialize(uint64_t seed) {
  SplitMix64 rng(seed);
  for (int l = 0; l < num_layers(); ++l) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(widths_[l]));
    for (uint32_t t : LayerTensors(l)) {
      const ModelTensor& tensor = tensors_[t];
      for (uint64_t i = 0; i < tensor.numel; ++i) {
        params_[tensor.flat_offset + i] = rng.NextUniform(-bound, bound);
      }
    }
  }
}

void Mlp::SetBatch(absl::Span<const float> inputs, absl::Span<const int> labels) {
  batch_ = static_cast<int>(labels.size());
  STRATA_CHECK(inputs.size() == labels.size() * static_cast<size_t>(input_width()));
  labels_.assign(labels.begin(), labels.end());
  activations_[0].assign(inputs.begin(), inputs.end());
}

void Mlp::ForwardLayer(int layer) {
  const int in = widths_[layer];
  const int out = widths_[layer + 1];
  const float* w = &params_[tensors_[2 * layer].flat_offset];
  const float* b = &params_[tensors_[2 * layer + 1].flat_offset];
  const std::vector<float>& x = activations_[layer];
  std::vector<float>& y = activations_[layer + 1];
  y.assign(static_cast<size_t>(batch_) * out, 0.0f);
  const bool hidden = layer + 1 < num_layers();
  for (int n = 0; n < batch_; ++n) {
    const float* xn = &x[static_cast<size_t>(n) * in];
    for (int o = 0; o < out; ++o) {
      const float* wo = w + static_cast<size_t>(o) * in;
      float sum = b[o];
      for (int i = 0; i < in; ++i) sum += wo[i] * xn[i];
      y[static_cast<size_t>(n) * out + o] = hidden ? std::tanh(sum) : sum;
    }
  }
}

float Mlp::Loss() {
  const int classes = num_classes();
  const std::vector<float>& logits = activations_.back();
  delta_.assign(logits.size(), 0.0f);
  const float inv_batch = 1.0f / static_cast<float>(batch_);
  // Summed in double so the printed mean does not depend on float
  // cancellation across rows; the gradients below stay fp32.
  double total = 0.0;
  for (int n = 0; n < batch_; ++n) {
    const float* z = &logits[static_cast<size_t>(n) * classes];
    float max_logit = z[0];
    for (int c = 1; c < classes; ++c) max_logit = std::max(max_logit, z[c]);
    float denom = 0.0f;
    for (int c = 0; c < classes; ++c) denom += std::exp(z[c] - max_logit);
    const float log_denom = std::log(denom);
    total += static_cast<double>(log_denom - (z[labels_[n]] - max_logit));
    float* d = &delta_[static_cast<size_t>(n) * classes];
    for (int c = 0; c < classes; ++c) {
      const float p = std::exp(z[c] - max_logit) / denom;
      d[c] = (p - (c == labels_[n] ? 1.0f : 0.0f)) * inv_batch;
    }
  }
  return static_cast<float>(total / batch_);
}

void Mlp::BackwardLayer(int layer) {
  const int in = widths_[layer];
  const int out = widths_[layer + 1];
  const float* w = &params_[tensors_[2 * layer].flat_offset];
  float* dw = &grads_[tensors_[2 * layer].flat_offset];
  float* db = &grads_[tensors_[2 * layer + 1].flat_offset];
  const std::vector<float>& x = activations_[layer];

  for (int o = 0; o < out; ++o) {
    float* dwo = dw + static_cast<size_t>(o) * in;
    for (int i = 0; i < in; ++i) dwo[i] = 0.0f;
    db[o] = 0.0f;
  }
  for (int n = 0; n < batch_; ++n) {
    const float* xn = &x[static_cast<size_t>(n) * in];
    const float* dn = &delta_[static_cast<size_t>(n) * out];
    for (int o = 0; o < out; ++o) {
      float* dwo = dw + static_cast<size_t>(o) * in;
      for (int i = 0; i < in; ++i) dwo[i] += dn[o] * xn[i];
      db[o] += dn[o];
    }
  }
  if (layer == 0) return;  // the inputs need no gradient

  // delta of the previous layer: (delta W) * tanh'(z) = (delta W) * (1 - x^2),
  // x being the tanh output that fed this layer.
  std::vector<float> previous(static_cast<size_t>(batch_) * in, 0.0f);
  for (int n = 0; n < batch_; ++n) {
    const float* dn = &delta_[static_cast<size_t>(n) * out];
    float* pn = &previous[static_cast<size_t>(n) * in];
    for (int o = 0; o < out; ++o) {
      const float* wo = w + static_cast<size_t>(o) * in;
      for (int i = 0; i < in; ++i) pn[i] += dn[o] * wo[i];
    }
    const float* xn = &x[static_cast<size_t>(n) * in];
    for (int i = 0; i < in; ++i) pn[i] *= 1.0f - xn[i] * xn[i];
  }
  delta_ = std::move(previous);
}

}  // namespace strata
