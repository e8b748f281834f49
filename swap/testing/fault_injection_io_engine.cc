#include "swap/testing/fault_injection_io_engine.h"

#include <algorithm>
#include <cerrno>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/errno_status.h"
#include "core/status_macros.h"

namespace strata {

FaultInjectionIoEngine::FaultInjectionIoEngine(IoEngine* inner, FaultPolicy policy, Clock* clock)
    : FaultInjectionIoEngine(inner, static_cast<FaultSchedule*>(nullptr), clock) {
  owned_schedule_ = std::make_unique<FaultSchedule>(std::move(policy));
  schedule_ = owned_schedule_.get();
}

FaultInjectionIoEngine::FaultInjectionIoEngine(IoEngine* inner, FaultSchedule* shared, Clock* clock)
    : inner_(inner), schedule_(shared), clock_(clock) {
  if (clock_ == nullptr) {
    owned_clock_ = std::make_unique<RealClock>();
    clock_ = owned_clock_.get();
  }
}

absl::StatusOr<IoFileId> FaultInjectionIoEngine::RegisterFile(int fd, absl::string_view path) {
  STRATA_ASSIGN_OR_RETURN(IoFileId id, inner_->RegisterFile(fd, path));
  paths_[id.value] = std::string(path);
  return id;
}

absl::StatusOr<size_t> FaultInjectionIoEngine::Submit(absl::Span<const IoRequest> requests) {
  struct Pending {
    size_t index;
    IoCompletion completion;
  };
  std::vector<IoRequest> forward;
  std::vector<size_t> forward_index;  // position in `requests`
  std::vector<Forwarded> forward_meta;
  std::vector<Pending> injected;
  for (size_t i = 0; i < requests.size(); ++i) {
    const IoRequest& r = requests[i];
    auto describe = [&] {
      return absl::StrCat(r.op == IoOp::kRead ? "reading " : "writing ", paths_[r.file.value],
                          " at offset ", r.offset_bytes, ", ", r.length_bytes, " bytes (injected)");
    };
    if (crashed_ && r.op == IoOp::kWrite) {
      injected.push_back({i, IoCompletion{r.user_data,
                                          absl::UnavailableError(describe() + ": process crashed"), 0}});
      continue;
    }
    std::optional<FaultRule> rule = schedule_->Next(r.op, r.tag);
    IoRequest f = r;
    Forwarded meta{r.user_data, false, false, r, r.length_bytes};
    if (rule.has_value()) {
      switch (rule->kind) {
        case FaultKind::kEio:
          injected.push_back({i, IoCompletion{r.user_data, ErrnoToStatus(EIO, describe()), 0}});
          continue;
        case FaultKind::kEnospc:
          injected.push_back({i, IoCompletion{r.user_data, ErrnoToStatus(ENOSPC, describe()), 0}});
          continue;
        case FaultKind::kDelay:
          clock_->SleepFor(rule->delay);
          break;
        case FaultKind::kTornWrite: {
          if (r.op != IoOp::kWrite) break;
          uint64_t keep = std::min(rule->torn_bytes, r.length_bytes);
          keep -= keep % 4096;
          if (keep == 0) {
            injected.push_back({i, IoCompletion{r.user_data, ErrnoToStatus(EIO, describe() + ", torn at 0 bytes"), 0}});
            continue;
          }
          f.length_bytes = keep;
          meta.torn = true;
          meta.torn_silent = rule->torn_silent;
          meta.forwarded_length = keep;
          break;
        }
        case FaultKind::kShortTransfer:
        case FaultKind::kEagain:
        case FaultKind::kEintr:
          break;  // kernel-level faults: FaultInjector's job
      }
    }
    f.user_data = next_tag_++;
    forward.push_back(f);
    forward_index.push_back(i);
    forward_meta.push_back(meta);
  }
  STRATA_ASSIGN_OR_RETURN(size_t accepted, inner_->Submit(forward));
  // Requests up to (not including) the first one the inner engine refused
  // are accepted; injected ones beyond that point are dropped with it.
  size_t accepted_prefix = accepted < forward.size() ? forward_index[accepted] : requests.size();
  for (size_t k = 0; k < accepted; ++k) {
    forwarded_[forward[k].user_data] = forward_meta[k];
    if (tags_ != nullptr) tags_->Add(forward[k].offset_bytes, forward[k].length_bytes, forward[k].tag);
  }
  for (Pending& p : injected) {
    if (p.index < accepted_prefix) synthesized_.push_back(std::move(p.completion));
  }
  return accepted_prefix;
}

absl::Status FaultInjectionIoEngine::Reap(size_t min_completions, absl::Duration timeout,
                                          std::vector<IoCompletion>* out) {
  size_t have = 0;
  while (!synthesized_.empty()) {
    out->push_back(std::move(synthesized_.front()));
    synthesized_.pop_front();
    ++have;
  }
  size_t need = min_completions > have ? min_completions - have : 0;
  scratch_.clear();
  STRATA_RETURN_IF_ERROR(inner_->Reap(need, need == 0 ? absl::ZeroDuration() : timeout, &scratch_));
  for (IoCompletion& c : scratch_) {
    auto it = forwarded_.find(c.user_data);
    STRATA_CHECK(it != forwarded_.end());
    Forwarded meta = std::move(it->second);
    forwarded_.erase(it);
    c.user_data = meta.user_data;
    if (tags_ != nullptr) {
      tags_->Remove(meta.original.offset_bytes, meta.forwarded_length, meta.original.tag);
    }
    if (meta.torn && meta.torn_silent && c.status.ok()) {
      c.transferred_bytes = meta.original.length_bytes;  // the lie a lost tail tells
    } else if (meta.torn && c.status.ok()) {
      c.status = ErrnoToStatus(EIO, absl::StrCat("writing ", paths_[meta.original.file.value],
                                                 " at offset ", meta.original.offset_bytes, ", ",
                                                 meta.original.length_bytes, " bytes (injected): torn after ",
                                                 c.transferred_bytes, " bytes"));
    }
    out->push_back(std::move(c));
  }
  return absl::OkStatus();
}

}  // namespace strata
