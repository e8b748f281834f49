// Opens the daemon's NVMe tier from its settings: the I/O engine (the one
// asked for, or the best the kernel offers: io_uring -> libaio -> psync), a
// few more engines of the same kind as I/O lanes, and the extent store over
// the configured paths. What it chose is appended to `choices` for the
// startup log.
#ifndef STRATA_DAEMON_NVME_TIER_SETUP_H_
#define STRATA_DAEMON_NVME_TIER_SETUP_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/daemon_config.h"
#include "swap/extent_store.h"
#include "swap/io_engine.h"

namespace strata {

class IoResultHook;

// Test seam for the test-only `stratad-faults` (tests/faults/): what wraps
// the NVMe tier's I/O engines. stratad itself never sets it.
struct IoEngineDecorator {
  IoResultHook* result_hook = nullptr;  // IoEngineOptions::result_hook of every engine
  std::function<std::unique_ptr<IoEngine>(std::unique_ptr<IoEngine>)> wrap;  // each engine, once
};

struct NvmeTierParts {
  std::unique_ptr<IoEngine> engine;
  // More I/O lanes for the extent store (engines are one-thread-at-a-time):
  // several jobs' loads and saves run at once.
  std::vector<std::unique_ptr<IoEngine>> lane_engines;
  std::unique_ptr<ExtentStore> store;  // uses the engines: destroy it first
};

// REQUIRES: !settings.nvme_paths.empty(). `io_decorator` may be null.
// InvalidArgument when a path cannot be created; the engine's and the
// store's errors otherwise, prefixed with what was being opened.
absl::StatusOr<NvmeTierParts> OpenNvmeTier(const DaemonSettings& settings, const IoEngineDecorator* io_decorator,
                                           std::vector<std::string>* choices);

}  // namespace strata

#endif  // STRATA_DAEMON_NVME_TIER_SETUP_H_
