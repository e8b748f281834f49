#include "examples/train_rank.h"

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "examples/deepspeed_configs.h"
#include "examples/local_backend.h"
#include "examples/rank_launcher.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

// Runs local mode and returns rank 0's output.
std::string TrainLocal(const TrainOptions& options) {
  Mlp probe(options.widths);
  auto world = ShmWorld::Create(options.world_size, probe.numel());
  EXPECT_TRUE(world.ok()) << world.status();
  std::FILE* out = std::tmpfile();
  absl::Status status = RunRanks(options.world_size, [&](uint32_t rank) -> absl::Status {
    Mlp model(options.widths);
    auto backend = LocalBackend::Create(model.tensors(), world->get(), rank,
                                        OffloadDeepSpeedConfig(options.batch_rows));
    if (!backend.ok()) return backend.status();
    return TrainRank(options, world->get(), rank, &model, backend->get(), out);
  });
  EXPECT_TRUE(status.ok()) << status;
  std::rewind(out);
  std::string text;
  char buffer[256];
  while (std::fgets(buffer, sizeof(buffer), out) != nullptr) text += buffer;
  std::fclose(out);
  return text;
}

std::vector<float> Losses(const std::string& text, uint64_t steps) {
  std::vector<float> losses;
  const char* p = text.c_str();
  for (uint64_t step = 0; step < steps; ++step) {
    unsigned long long n = 0;
    float loss = 0;
    int consumed = 0;
    EXPECT_EQ(std::sscanf(p, "step %llu loss %g\n%n", &n, &loss, &consumed), 2) << text;
    EXPECT_EQ(n, step);
    losses.push_back(loss);
    p += consumed;
  }
  EXPECT_EQ(*p, '\0') << "extra output: " << p;
  return losses;
}

TEST(TrainRankTest, LocalModeLossFallsAndRunsAreBitIdentical) {
  TrainOptions options;
  options.world_size = 2;
  options.steps = 8;
  const std::string first = TrainLocal(options);
  std::printf("%s", first.c_str());  // the losses, for the test log
  const std::vector<float> losses = Losses(first, options.steps);
  ASSERT_EQ(losses.size(), options.steps);
  EXPECT_LT(losses.back(), losses.front() * 0.9f) << first;
  EXPECT_EQ(TrainLocal(options), first);
}

TEST(TrainRankTest, EachRanksBatchMatters) {
  // The same job with 1 and 2 ranks sees different data, so different losses
  // from step 0: the printed loss really is averaged over the ranks.
  TrainOptions one;
  one.world_size = 1;
  one.steps = 2;
  TrainOptions two = one;
  two.world_size = 2;
  EXPECT_NE(TrainLocal(one), TrainLocal(two));
}

}  // namespace
}  // namespace strata
