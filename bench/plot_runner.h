// `--plot FILE.png` for `strata bench adam|io|prefetch|rpc`: the bench runs
// as usual with --json (a temporary file when the user gave none), then
// bench/plot.py draws its JSON. Handled in strata-bench's main so that every
// bench gets the same flag without knowing about it.
#ifndef STRATA_BENCH_PLOT_RUNNER_H_
#define STRATA_BENCH_PLOT_RUNNER_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata {

struct PlotRequest {
  std::string png;
  std::string json;
  bool temporary_json = false;  // removed after plotting
};

// Takes "--plot FILE" / "--plot=FILE" out of `args` (the bench's arguments,
// args[0] its name) and makes sure they hold "--json PATH". nullopt when
// there is no --plot; InvalidArgument when it has no value.
absl::StatusOr<std::optional<PlotRequest>> TakePlotFlag(std::vector<std::string>* args);

// Runs bench/plot.py for `kind` on the request's JSON with the venv's Python
// (FindVenvPython) or /usr/bin/python3; says where the PNG went.
absl::Status DrawPlot(const std::string& kind, const PlotRequest& request);

}  // namespace strata

#endif  // STRATA_BENCH_PLOT_RUNNER_H_
