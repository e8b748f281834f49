#include "bench/io_ds_io.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"

namespace strata {

absl::StatusOr<std::unique_ptr<DsIoPeer>> DsIoPeer::Start(const std::string& python, const std::string& file,
                                                          uint64_t io_size) {
  PeerCommand cmd;
  cmd.argv = {python, STRATA_BENCH_DS_IO_PEER_SCRIPT, "--file", file, "--io-size", absl::StrCat(io_size)};
  // A first-time build of the op on a 2-core machine shared with others:
  // one compiler at a time keeps it from starving everything else.
  cmd.env = {"DS_ACCELERATOR=cpu", "MAX_JOBS=1"};
  std::unique_ptr<DsIoPeer> peer(new DsIoPeer());
  STRATA_ASSIGN_OR_RETURN(peer->proc_, PeerCoprocess::Start(cmd));
  STRATA_ASSIGN_OR_RETURN(nlohmann::json ready, peer->proc_->Next());
  if (!ready.value("ready", false)) {
    return absl::UnavailableError(ready.value("error", std::string("ds_io peer did not start")));
  }
  peer->version_ = absl::StrCat("deepspeed ", ready.value("deepspeed", std::string("?")), " aio_handle (torch ",
                                ready.value("torch", std::string("?")), ")");
  return peer;
}

absl::StatusOr<double> DsIoPeer::Measure(IoOp op, uint64_t block_size, uint32_t queue_depth,
                                         absl::Duration runtime) {
  STRATA_ASSIGN_OR_RETURN(
      nlohmann::json r,
      proc_->Request(absl::StrFormat("%s %d %d %.3f", op == IoOp::kRead ? "read" : "write", block_size,
                                     queue_depth, absl::ToDoubleSeconds(runtime))));
  if (!r.contains("mbps") || !r["mbps"].is_number()) {
    return absl::UnavailableError(
        absl::StrCat("ds_io peer: ", r.value("error", std::string("no result")), "; ", proc_->StderrTail()));
  }
  return r["mbps"].get<double>();
}

}  // namespace strata
