#include "examples/daemon_backend.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "examples/deepspeed_configs.h"
#include "examples/partition_copy.h"

namespace strata {
namespace {

// Adds what the rank was doing to a client error.
absl::Status With(absl::string_view what, absl::Status status) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(what, ": ", status.message()));
}

template <typename T>
absl::StatusOr<T> With(absl::string_view what, absl::StatusOr<T> result) {
  if (result.ok()) return result;
  return With(what, result.status());
}

absl::Span<float> Fp32Slot(std::byte* slot, uint64_t numel) {
  // CheckLayout verified that both dtypes are fp32; the daemon places the
  // slots at aligned offsets of the shared region.
  return absl::MakeSpan(reinterpret_cast<float*>(slot), numel);
}

int ExpectedStage(TrainMode mode) { return mode == TrainMode::kInfinity ? 3 : 2; }

}  // namespace

absl::StatusOr<std::unique_ptr<DaemonBackend>> DaemonBackend::Create(const TrainOptions& options,
                                                                     const Mlp& model,
                                                                     ShmWorld* world,
                                                                     uint32_t rank) {
  if (options.mode == TrainMode::kLocal) {
    return absl::InvalidArgumentError("DaemonBackend serves the offload and infinity modes only");
  }
  ClientOptions client_options;
  client_options.socket_path = options.socket_path;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<StrataClient> client,
                          With(absl::StrCat("connecting to stratad at ", options.socket_path),
                               StrataClient::Connect(client_options)));

  // One rank creates the job; the others attach once it exists. (If rank 0
  // fails here it exits, and the launcher stops the ranks at the barrier.)
  if (rank == 0) {
    JobSpec spec;
    spec.name = options.job_name;
    spec.world_size = options.world_size;
    spec.mode = options.mode == TrainMode::kInfinity ? JobMode::kInfinity : JobMode::kOffload;
    spec.deepspeed_config_json =
        options.mode == TrainMode::kInfinity
            ? InfinityDeepSpeedConfig(options.batch_rows, options.nvme_path)
            : OffloadDeepSpeedConfig(options.batch_rows);
    // fp32 both ways: the daemon's step is then exactly local mode's.
    spec.param_dtype = DType::kFp32;
    spec.grad_dtype = DType::kFp32;
    spec.device_budget_bytes = options.device_budget_bytes;
    spec.pinned_budget_bytes = options.pinned_budget_bytes;
    STRATA_RETURN_IF_ERROR(
        With(absl::StrCat("creating job '", options.job_name, "'"), client->CreateJob(spec).status()));
  }
  world->Barrier();

  STRATA_ASSIGN_OR_RETURN(
      std::unique_ptr<RankSession> session,
      With(absl::StrCat("attaching rank ", rank, " to job '", options.job_name, "'"),
           client->Attach(options.job_name, rank)));
  std::vector<TensorDesc> descs;
  for (const ModelTensor& t : model.tensors()) descs.push_back({t.name, t.numel});
  STRATA_RETURN_IF_ERROR(With("registering the model's tensors", session->RegisterTensors(descs)));

  std::unique_ptr<DaemonBackend> backend(
      new DaemonBackend(options, model, world, rank, std::move(client), std::move(session)));
  STRATA_RETURN_IF_ERROR(backend->CheckLayout());
  return backend;
}

DaemonBackend::DaemonBackend(const TrainOptions& options, const Mlp& model, ShmWorld* world,
                             uint32_t rank, std::unique_ptr<StrataClient> client,
                             std::unique_ptr<RankSession> session)
    : options_(options),
      model_(model),
      world_(world),
      rank_(rank),
      client_(std::move(client)),
      session_(std::move(session)) {}

absl::Status DaemonBackend::CheckLayout() {
  const std::vector<ModelTensor>& tensors = model_.tensors();
  if (session_->param_dtype() != DType::kFp32 || session_->grad_dtype() != DType::kFp32) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the daemon exchanges ", DTypeName(session_->param_dtype()), " params and ",
        DTypeName(session_->grad_dtype()), " grads; the example asked for fp32 both ways"));
  }
  const int stage = static_cast<int>(session_->stage());
  if (stage != ExpectedStage(options_.mode)) {
    return absl::FailedPreconditionError(absl::StrCat("the daemon runs the ", TrainModeName(options_.mode),
                                                      " job at ZeRO stage ", stage, "; expected ",
                                                      ExpectedStage(options_.mode)));
  }
  for (const ShardView& shard : session_->shards()) {
    STRATA_RETURN_IF_ERROR(With("the daemon's shard layout",
                                ValidateShardRanges(shard.index, shard.padded_numel, shard.ranges, tensors)));
    if (shard.grad == nullptr || shard.param == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("shard ", shard.index, " has no grad or param slot mapped"));
    }
    if (stage == 3) {
      for (const OwnedRange& r : shard.ranges) {
        if (r.tensor.value() != shard.index) {
          return absl::FailedPreconditionError(absl::StrCat(
              "stage 3 shard ", shard.index, " holds elements of tensor ", r.tensor.value(),
              "; expected one shard per tensor, shard index = tensor index"));
        }
      }
    }
    for (const FlatRun& run : FlatRunsOf(shard.ranges, tensors)) owned_runs_.push_back(run);
  }
  if (stage == 3) {
    for (uint32_t t = 0; t < tensors.size(); ++t) {
      const auto& shards = session_->shards();
      if (std::none_of(shards.begin(), shards.end(),
                       [t](const ShardView& s) { return s.index == t; })) {
        return absl::FailedPreconditionError(
            absl::StrCat("stage 3: the daemon gave this rank no shard for tensor ", t, " ('",
                         tensors[t].name, "')"));
      }
    }
  }

  // The all-gathers below assume the ranks' partitions cover every element
  // exactly once. Count the owners of each element over all ranks: the
  // average is exactly 1/N where the count is 1 (the sum of ones is exact).
  std::vector<float> owners(model_.numel(), 0.0f);
  for (const FlatRun& run : owned_runs_) {
    for (uint64_t i = 0; i < run.numel; ++i) owners[run.offset + i] += 1.0f;
  }
  world_->AllReduceAverage(rank_, absl::MakeSpan(owners));
  const float once = 1.0f / static_cast<float>(world_->world_size());
  for (uint64_t i = 0; i < owners.size(); ++i) {
    if (owners[i] != once) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the daemon's partition gives flat element ", i, " ",
          owners[i] * static_cast<float>(world_->world_size()), " owners across the ranks; expected 1"));
    }
  }
  return absl::OkStatus();
}

ShardView& DaemonBackend::ShardByIndex(uint32_t index) {
  ShardView* found = nullptr;
  for (ShardView& shard : session_->shards()) {
    if (shard.index == index) found = &shard;
  }
  STRATA_CHECK(found != nullptr);  // CheckLayout saw a shard per tensor at stage 3
  return *found;
}

absl::Status DaemonBackend::Init(absl::Span<const float> params) {
  // Shard by shard, in the batches the daemon's window has room for.
  return With("InitParams", session_->InitParamsInBatches([&](ShardView& shard) {
    CopyFlatToShard(params, shard.ranges, model_.tensors(), Fp32Slot(shard.param, shard.padded_numel));
    return absl::OkStatus();
  }));
}

absl::Status DaemonBackend::FetchLayer(int layer, absl::Span<float> params) {
  if (options_.mode != TrainMode::kInfinity) return absl::OkStatus();  // params are replicated
  const std::vector<uint32_t> indices = model_.LayerTensors(layer);
  // Where each shard's params are read: the window's param slots, or (with
  // --device_tier) the places the daemon put them in its device arena.
  std::vector<const float*> sources;
  device_copies_.clear();
  if (options_.device_tier) {
    STRATA_ASSIGN_OR_RETURN(std::vector<ShardPlace> places,
                            With(absl::StrCat("acquiring the shards of layer ", layer, " into the device tier"),
                                 session_->Acquire(indices, TierKind::kDevice)));
    for (const ShardPlace& place : places) {
      const ShardView& shard = ShardByIndex(place.index);
      if (place.tier != TierKind::kDevice || place.bytes < shard.padded_numel * sizeof(float)) {
        return absl::InternalError(absl::StrCat("the daemon placed shard ", place.index, " in ",
                                                TierKindName(place.tier), " (", place.bytes, " bytes)"));
      }
      // Host bytes of the shard wherever the arena is: the emulated arena's
      // mapping, or a copy out of GPU memory.
      device_copies_.emplace_back(shard.padded_numel);
      std::vector<float>& copy = device_copies_.back();
      STRATA_RETURN_IF_ERROR(session_->ReadPlaced(
          place, absl::MakeSpan(reinterpret_cast<std::byte*>(copy.data()), copy.size() * sizeof(float))));
      sources.push_back(copy.data());
    }
  } else {
    STRATA_RETURN_IF_ERROR(With(absl::StrCat("acquiring the shards of layer ", layer),
                                session_->Acquire(indices)));
    for (uint32_t index : indices) sources.push_back(reinterpret_cast<const float*>(ShardByIndex(index).param));
  }
  std::vector<FlatRun> owned;
  std::vector<FlatRun> wanted;
  for (size_t i = 0; i < indices.size(); ++i) {
    const uint32_t index = indices[i];
    ShardView& shard = ShardByIndex(index);
    CopyShardToFlat(absl::MakeConstSpan(sources[i], shard.padded_numel), shard.ranges, model_.tensors(), params);
    for (const FlatRun& run : FlatRunsOf(shard.ranges, model_.tensors())) owned.push_back(run);
    const ModelTensor& tensor = model_.tensors()[index];
    wanted.push_back({tensor.flat_offset, tensor.numel});
  }
  world_->AllGather(rank_, owned, wanted, params);
  return absl::OkStatus();
}

absl::Status DaemonBackend::ReleaseLayer(int layer, absl::Span<float> params) {
  if (options_.mode != TrainMode::kInfinity) return absl::OkStatus();
  const std::vector<uint32_t> indices = model_.LayerTensors(layer);
  STRATA_RETURN_IF_ERROR(With(absl::StrCat("releasing the shards of layer ", layer),
                              session_->Release(indices)));
  // ZeRO-3 frees a layer's gathered params after use. Poisoning them instead
  // makes any later use without a fresh FetchLayer show up as a NaN loss.
  for (uint32_t index : indices) {
    const ModelTensor& tensor = model_.tensors()[index];
    std::fill_n(params.begin() + tensor.flat_offset, tensor.numel,
                std::numeric_limits<float>::quiet_NaN());
  }
  return absl::OkStatus();
}

absl::Status DaemonBackend::Step(uint64_t step, absl::Span<const float> grads,
                                 absl::Span<float> params) {
  for (ShardView& shard : session_->shards()) {
    CopyFlatToShard(grads, shard.ranges, model_.tensors(), Fp32Slot(shard.grad, shard.padded_numel));
    STRATA_RETURN_IF_ERROR(With(absl::StrCat("GradReady of shard ", shard.index),
                                session_->GradReady(shard.index, step)));
  }
  STRATA_ASSIGN_OR_RETURN(StepResult result, With("WaitStep", session_->WaitStep(step)));
  if (result.skipped) {
    return absl::FailedPreconditionError(
        "the daemon skipped the step (gradient overflow), but the job runs in fp32 without loss "
        "scaling and the gradients are finite");
  }
  if (options_.mode == TrainMode::kInfinity) {
    STRATA_RETURN_IF_ERROR(With("IterationBoundary", session_->IterationBoundary()));
    if (options_.park_after_step > 0 && step + 1 == options_.park_after_step) return ParkAndResume();
    return absl::OkStatus();
  }
  for (ShardView& shard : session_->shards()) {
    CopyShardToFlat(Fp32Slot(shard.param, shard.padded_numel), shard.ranges, model_.tensors(), params);
  }
  const FlatRun everything{0, params.size()};
  world_->AllGather(rank_, owned_runs_, absl::MakeConstSpan(&everything, 1), params);
  return absl::OkStatus();
}

absl::Status DaemonBackend::ParkAndResume() {
  // Every rank has released its pins (the step is done) before the park,
  // and none acquires again before the resume.
  world_->Barrier();
  absl::Status status;
  if (rank_ == 0) {
    STRATA_ASSIGN_OR_RETURN(TierKind tier, ParseTierKind(options_.park_tier));
    absl::StatusOr<ParkResult> parked = client_->ParkJob(options_.job_name, tier);
    absl::StatusOr<ParkResult> resumed =
        parked.ok() ? client_->ResumeJob(options_.job_name) : absl::StatusOr<ParkResult>(parked.status());
    if (parked.ok() && resumed.ok()) {
      for (const auto& [what, r] : {std::pair{"park", *parked}, std::pair{"resume", *resumed}}) {
        std::fprintf(stderr, "%s %s: %llu shards %llu bytes %.6f s %.3f GB/s\n", what,
                     std::string(TierKindName(r.tier)).c_str(), static_cast<unsigned long long>(r.shards),
                     static_cast<unsigned long long>(r.bytes), r.seconds, r.bytes_per_second() / 1e9);
      }
    }
    status = With("parking and resuming the job", resumed.status());
  }
  world_->Barrier();
  return status;
}

absl::Status DaemonBackend::Finish() {
  // Every rank is past its last WaitStep before anyone detaches, and every
  // rank has detached before the job goes away.
  world_->Barrier();
  session_.reset();
  world_->Barrier();
  if (rank_ != 0) return absl::OkStatus();
  if (options_.print_stats) {
    STRATA_ASSIGN_OR_RETURN(std::string stats, With("reading the daemon's stats", client_->StatsText()));
    std::fprintf(stderr, "stratad stats after the last step:\n%s", stats.c_str());
  }
  return With(absl::StrCat("deleting job '", options_.job_name, "'"),
              client_->DeleteJob(options_.job_name));
}

}  // namespace strata
