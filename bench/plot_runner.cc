#include "bench/plot_runner.h"

#include <unistd.h>

#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bench/peer_process.h"
#include "core/status_macros.h"

namespace strata {

absl::StatusOr<std::optional<PlotRequest>> TakePlotFlag(std::vector<std::string>* args) {
  std::optional<PlotRequest> req;
  std::vector<std::string> rest;
  bool has_json = false;
  std::string json;
  for (size_t i = 0; i < args->size(); ++i) {
    const std::string& a = (*args)[i];
    if (a == "--plot" || absl::StartsWith(a, "--plot=")) {
      std::string value;
      if (a == "--plot") {
        if (i + 1 >= args->size()) return absl::InvalidArgumentError("--plot needs a file name, e.g. --plot out.png");
        value = (*args)[++i];
      } else {
        value = a.substr(7);
      }
      if (value.empty()) return absl::InvalidArgumentError("--plot needs a file name, e.g. --plot out.png");
      req.emplace();
      req->png = value;
      continue;
    }
    if ((a == "--json" || a == "-json") && i + 1 < args->size()) {
      has_json = true;
      json = (*args)[i + 1];
    } else if (absl::StartsWith(a, "--json=")) {
      has_json = true;
      json = a.substr(7);
    }
    rest.push_back(a);
  }
  if (!req) return req;
  if (has_json) {
    req->json = json;
  } else {
    req->json = absl::StrCat("/tmp/strata-bench-plot-", getpid(), ".json");
    req->temporary_json = true;
    rest.push_back("--json");
    rest.push_back(req->json);
  }
  *args = std::move(rest);
  return req;
}

absl::Status DrawPlot(const std::string& kind, const PlotRequest& request) {
  std::string how;
  absl::StatusOr<std::string> venv = FindVenvPython("", /*make_venv=*/false, &how);
  const std::string python = venv.ok() ? *venv : "/usr/bin/python3";
  STRATA_ASSIGN_OR_RETURN(
      PeerOutput out,
      RunPeerProcess(PeerCommand{{python, STRATA_BENCH_PLOT_SCRIPT, "--kind", kind, request.json, request.png}, {}}));
  if (request.temporary_json) unlink(request.json.c_str());
  if (out.exit_code != 0) {
    return absl::UnavailableError(absl::StrCat("bench/plot.py with ", python, " failed: ", PeerFailure(out)));
  }
  std::printf("%s", out.stdout_text.c_str());
  return absl::OkStatus();
}

}  // namespace strata
