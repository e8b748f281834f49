#include "swap/testing/scratch_extent_store.h"

#include <utility>

#include "core/status_macros.h"

namespace strata {

absl::StatusOr<std::unique_ptr<ScratchExtentStore>> ScratchExtentStore::Create(const std::string& prefix,
                                                                               uint64_t capacity_bytes) {
  STRATA_ASSIGN_OR_RETURN(TestDir dir, TestDir::Create(prefix));
  std::unique_ptr<ScratchExtentStore> scratch(new ScratchExtentStore(std::move(dir)));
  STRATA_ASSIGN_OR_RETURN(scratch->engine_, NewPsyncEngine({}));
  ExtentStoreOptions options;
  options.paths = {scratch->dir_.path()};
  options.capacity_bytes_per_path = capacity_bytes;
  options.sync_policy = SyncPolicy::kNever;
  options.allow_buffered_fallback = true;
  STRATA_ASSIGN_OR_RETURN(scratch->store_, ExtentStore::Open(options, scratch->engine_.get()));
  return scratch;
}

}  // namespace strata
