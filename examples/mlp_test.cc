#include "examples/mlp.h"

#include <cmath>
#include <vector>

#include "examples/synthetic_batch.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

float LossAt(Mlp& model) {
  for (int l = 0; l < model.num_layers(); ++l) model.ForwardLayer(l);
  return model.Loss();
}

TEST(MlpTest, TensorsAreLaidOutLayerByLayerWeightThenBias) {
  Mlp model({64, 128, 128, 10});
  ASSERT_EQ(model.tensors().size(), 6u);
  EXPECT_EQ(model.tensors()[0].name, "layers.0.weight");
  EXPECT_EQ(model.tensors()[0].numel, 128u * 64u);
  EXPECT_EQ(model.tensors()[1].name, "layers.0.bias");
  EXPECT_EQ(model.tensors()[1].flat_offset, 128u * 64u);
  EXPECT_EQ(model.tensors()[5].flat_offset + model.tensors()[5].numel, model.numel());
  EXPECT_EQ(model.numel(), 64u * 128 + 128 + 128u * 128 + 128 + 128u * 10 + 10);
  EXPECT_EQ(model.LayerTensors(2), (std::vector<uint32_t>{4, 5}));
}

TEST(MlpTest, InitialLossIsNearLogOfClassCount) {
  Mlp model({16, 32, 10});
  model.Initialize(7);
  SyntheticTask task(7, 16, 10);
  Batch batch = task.MakeBatch(0, 0, 128);
  model.SetBatch(batch.inputs, batch.labels);
  EXPECT_NEAR(LossAt(model), std::log(10.0f), 0.3f);
}

// Backward against central finite differences of the loss, for every
// element of every tensor of a tiny model.
TEST(MlpTest, GradientsMatchFiniteDifferences) {
  Mlp model({5, 6, 4, 3});
  model.Initialize(11);
  SyntheticTask task(11, 5, 3);
  Batch batch = task.MakeBatch(1, 2, 7);
  model.SetBatch(batch.inputs, batch.labels);
  LossAt(model);
  for (int l = model.num_layers() - 1; l >= 0; --l) model.BackwardLayer(l);
  const std::vector<float> grads(model.grads().begin(), model.grads().end());

  const float h = 1e-2f;
  for (size_t i = 0; i < model.numel(); ++i) {
    const float saved = model.params()[i];
    model.params()[i] = saved + h;
    const double up = LossAt(model);
    model.params()[i] = saved - h;
    const double down = LossAt(model);
    model.params()[i] = saved;
    const double numeric = (up - down) / (2.0 * h);
    EXPECT_NEAR(grads[i], numeric, 2e-3 + 2e-2 * std::fabs(numeric)) << "element " << i;
  }
}

TEST(MlpTest, SameSeedSameBitsAndBatchesDifferPerRankAndStep) {
  Mlp a({8, 4, 2});
  Mlp b({8, 4, 2});
  a.Initialize(3);
  b.Initialize(3);
  for (size_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.params()[i], b.params()[i]);

  SyntheticTask task(3, 8, 2);
  EXPECT_EQ(task.MakeBatch(0, 0, 4).inputs, task.MakeBatch(0, 0, 4).inputs);
  EXPECT_NE(task.MakeBatch(0, 0, 4).inputs, task.MakeBatch(1, 0, 4).inputs);
  EXPECT_NE(task.MakeBatch(0, 0, 4).inputs, task.MakeBatch(0, 1, 4).inputs);
}

}  // namespace
}  // namespace strata
