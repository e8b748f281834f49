// A trainer rank in its own process, for tests that kill one mid-step:
//   strata-test-rank SOCKET JOB RANK
// attaches, registers the test model, initializes its params, sends the
// gradient of its first shard for step 0, prints "ready" and waits to be killed.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "client/strata_client.h"

namespace {

float InitialParam(uint32_t t, uint64_t e) { return std::sin(0.001f * (e + 1) + t); }
float Grad(uint32_t t, uint64_t e, uint64_t step) { return std::cos(0.01f * e + t + 0.5f * step) * 0.1f; }

template <typename Fn>
void Fill(const strata::ShardView& shard, std::byte* base, Fn value) {
  float* out = reinterpret_cast<float*>(base);
  for (const strata::OwnedRange& r : shard.ranges) {
    for (uint64_t e = 0; e < r.numel; ++e) out[r.shard_offset + e] = value(r.tensor.value(), r.tensor_offset + e);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: strata-test-rank SOCKET JOB RANK\n");
    return 2;
  }
  strata::ClientOptions options;
  options.socket_path = argv[1];
  auto client = strata::StrataClient::Connect(options);
  if (!client.ok()) return 3;
  auto rank = (*client)->Attach(argv[2], static_cast<uint32_t>(std::atoi(argv[3])));
  if (!rank.ok()) return 4;
  std::vector<strata::TensorDesc> model = {{"w1", 5000}, {"b1", 37}, {"w2", 12000}};
  if (!(*rank)->RegisterTensors(model).ok()) return 5;
  for (strata::ShardView& s : (*rank)->shards()) Fill(s, s.param, InitialParam);
  if (!(*rank)->InitParams().ok()) return 6;
  strata::ShardView& first = (*rank)->shards()[0];
  Fill(first, first.grad, [](uint32_t t, uint64_t e) { return Grad(t, e, 0); });
  if (!(*rank)->GradReady(first.index, 0).ok()) return 7;
  std::printf("ready\n");
  std::fflush(stdout);
  pause();
  return 0;
}
