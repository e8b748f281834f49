// ScratchExtentStore: a real ExtentStore over the psync engine in a scratch
// directory, for tests of the layers above swap/ (tiers, the daemon's param
// store and pipelines) that need NVMe semantics but no daemon. Never syncs
// (SyncPolicy::kNever) and falls back to buffered I/O where the file system
// refuses O_DIRECT. Everything, the directory included, goes with the object.
#ifndef STRATA_SWAP_TESTING_SCRATCH_EXTENT_STORE_H_
#define STRATA_SWAP_TESTING_SCRATCH_EXTENT_STORE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "swap/extent_store.h"
#include "swap/io_engine.h"
#include "swap/testing/test_dir.h"

namespace strata {

class ScratchExtentStore {
 public:
  // `prefix` names the scratch directory (TestDir::Create).
  static absl::StatusOr<std::unique_ptr<ScratchExtentStore>> Create(const std::string& prefix,
                                                                    uint64_t capacity_bytes);

  ExtentStore* store() const { return store_.get(); }
  const std::string& path() const { return dir_.path(); }

 private:
  explicit ScratchExtentStore(TestDir dir) : dir_(std::move(dir)) {}

  TestDir dir_;  // destroyed last
  std::unique_ptr<IoEngine> engine_;
  std::unique_ptr<ExtentStore> store_;  // uses engine_
};

}  // namespace strata

#endif  // STRATA_SWAP_TESTING_SCRATCH_EXTENT_STORE_H_
