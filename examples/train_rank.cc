#include "examples/train_rank.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "examples/synthetic_batch.h"

namespace strata {
namespace {

absl::Status AtStep(uint64_t step, absl::string_view what, absl::Status status) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat("step ", step, ", ", what, ": ", status.message()));
}

}  // namespace

absl::Status TrainRank(const TrainOptions& options, ShmWorld* world, uint32_t rank, Mlp* model,
                       ZeroBackend* backend, std::FILE* out) {
  model->Initialize(options.seed);
  STRATA_RETURN_IF_ERROR(backend->Init(model->params()));
  const SyntheticTask task(options.seed, model->input_width(), model->num_classes());

  for (uint64_t step = 0; step < options.steps; ++step) {
    const Batch batch = task.MakeBatch(rank, step, options.batch_rows);
    model->SetBatch(batch.inputs, batch.labels);
    for (int layer = 0; layer < model->num_layers(); ++layer) {
      STRATA_RETURN_IF_ERROR(AtStep(step, absl::StrCat("fetching layer ", layer, " (forward)"),
                                    backend->FetchLayer(layer, model->params())));
      model->ForwardLayer(layer);
      STRATA_RETURN_IF_ERROR(AtStep(step, absl::StrCat("releasing layer ", layer, " (forward)"),
                                    backend->ReleaseLayer(layer, model->params())));
    }
    float loss = model->Loss();
    for (int layer = model->num_layers() - 1; layer >= 0; --layer) {
      STRATA_RETURN_IF_ERROR(AtStep(step, absl::StrCat("fetching layer ", layer, " (backward)"),
                                    backend->FetchLayer(layer, model->params())));
      model->BackwardLayer(layer);
      STRATA_RETURN_IF_ERROR(AtStep(step, absl::StrCat("releasing layer ", layer, " (backward)"),
                                    backend->ReleaseLayer(layer, model->params())));
    }

    // What NCCL's all-reduce does in data-parallel training, here in rank
    // order so every mode sees the same bits.
    world->AllReduceAverage(rank, model->grads());
    world->AllReduceAverage(rank, absl::MakeSpan(&loss, 1));
    if (rank == 0) {
      // %.9g prints every float exactly, so equal lines mean equal losses.
      std::fprintf(out, "step %llu loss %.9g\n", static_cast<unsigned long long>(step), loss);
      std::fflush(out);
    }
    STRATA_RETURN_IF_ERROR(
        AtStep(step, "optimizer step", backend->Step(step, model->grads(), model->params())));
  }
  return backend->Finish();
}

}  // namespace strata
