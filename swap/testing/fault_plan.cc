#include "swap/testing/fault_plan.h"

#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "swap/testing/fault_injection_io_engine.h"

namespace strata {
namespace {

// The decorator that owns the engine it wraps.
class OwningFaultEngine final : public IoEngine {
 public:
  OwningFaultEngine(std::unique_ptr<IoEngine> inner, FaultSchedule* schedule, InFlightTags* tags)
      : inner_(std::move(inner)), faults_(inner_.get(), schedule) {
    faults_.set_in_flight_tags(tags);
  }
  ~OwningFaultEngine() override { faults_.Shutdown(); }
  const IoEngineInfo& info() const override { return faults_.info(); }
  absl::StatusOr<IoFileId> RegisterFile(int fd, absl::string_view path) override {
    return faults_.RegisterFile(fd, path);
  }
  absl::Status UnregisterFile(IoFileId file) override { return faults_.UnregisterFile(file); }
  absl::Status RegisterBuffers(absl::Span<const BufferRegion> regions) override {
    return faults_.RegisterBuffers(regions);
  }
  absl::StatusOr<uint32_t> RequiredAlignment(IoFileId file) const override {
    return faults_.RequiredAlignment(file);
  }
  absl::StatusOr<size_t> Submit(absl::Span<const IoRequest> requests) override { return faults_.Submit(requests); }
  absl::Status Reap(size_t min_completions, absl::Duration timeout, std::vector<IoCompletion>* out) override {
    return faults_.Reap(min_completions, timeout, out);
  }
  size_t outstanding() const override { return faults_.outstanding(); }
  void Shutdown() override { faults_.Shutdown(); }

 private:
  std::unique_ptr<IoEngine> inner_;
  FaultInjectionIoEngine faults_;
};

absl::Status Bad(absl::string_view rule, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("--fault_plan rule '", rule, "': ", why));
}

}  // namespace

absl::StatusOr<FaultPlan> ParseFaultPlan(absl::string_view text) {
  FaultPlan plan;
  for (absl::string_view rule_text : absl::StrSplit(text, ';', absl::SkipWhitespace())) {
    rule_text = absl::StripAsciiWhitespace(rule_text);
    FaultRule rule;
    rule.nth = 1;
    rule.delay = absl::Milliseconds(200);
    bool kernel = false, has_tag = false, has_kind = false;
    for (absl::string_view field : absl::StrSplit(rule_text, ',', absl::SkipWhitespace())) {
      std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(field, absl::MaxSplits('=', 1));
      const absl::string_view key = absl::StripAsciiWhitespace(kv.first);
      const absl::string_view value = absl::StripAsciiWhitespace(kv.second);
      uint64_t n = 0;
      const bool number = absl::SimpleAtoi(value, &n);
      if (key == "tag") {
        if (!number) return Bad(rule_text, "tag must be a job id (a whole number)");
        rule.only_tag = n;
        has_tag = true;
      } else if (key == "op") {
        if (value == "read") rule.only_op = IoOp::kRead;
        else if (value == "write") rule.only_op = IoOp::kWrite;
        else return Bad(rule_text, "op must be read or write");
      } else if (key == "kind") {
        has_kind = true;
        if (value == "eio") rule.kind = FaultKind::kEio;
        else if (value == "enospc") rule.kind = FaultKind::kEnospc;
        else if (value == "torn") rule.kind = FaultKind::kTornWrite;
        else if (value == "torn_silent") rule.kind = FaultKind::kTornWrite, rule.torn_silent = true;
        else if (value == "delay") rule.kind = FaultKind::kDelay;
        else if (value == "short") rule.kind = FaultKind::kShortTransfer, kernel = true;
        else return Bad(rule_text, "kind must be eio, enospc, torn, torn_silent, delay or short");
      } else if (key == "after" && number && n >= 1) {
        rule.nth = n;
      } else if (key == "run" && number && n >= 1) {
        rule.run = n;
      } else if (key == "delay_ms" && number && n <= 60000) {
        rule.delay = absl::Milliseconds(static_cast<int64_t>(n));
      } else if (key == "torn_bytes" && number) {
        rule.torn_bytes = n;
      } else {
        return Bad(rule_text, absl::StrCat("unknown field or bad value '", field,
                                           "' (tag, op, kind, after>=1, run>=1, delay_ms<=60000, torn_bytes)"));
      }
    }
    if (!has_tag) return Bad(rule_text, "tag=<job id> is required: a plan hits one job");
    if (!has_kind) return Bad(rule_text, "kind is required");
    if (rule.kind == FaultKind::kTornWrite && rule.only_op == IoOp::kRead) {
      return Bad(rule_text, "a torn write needs op=write");
    }
    if (rule.kind == FaultKind::kTornWrite) rule.only_op = IoOp::kWrite;
    (kernel ? plan.kernel_level : plan.request_level).rules.push_back(rule);
    absl::StrAppend(&plan.description, plan.description.empty() ? "" : "; ", rule_text);
  }
  if (plan.request_level.rules.empty() && plan.kernel_level.rules.empty()) {
    return absl::InvalidArgumentError("--fault_plan is empty");
  }
  return plan;
}

FaultPlanEngines::FaultPlanEngines(const FaultPlan& plan)
    : schedule_(plan.request_level), injector_(plan.kernel_level) {
  injector_.set_in_flight_tags(&tags_);
}

std::unique_ptr<IoEngine> FaultPlanEngines::Wrap(std::unique_ptr<IoEngine> inner) {
  return std::make_unique<OwningFaultEngine>(std::move(inner), &schedule_, &tags_);
}

std::string FaultPlanEngines::Summary() const {
  return absl::StrCat("faults fired: eio ", schedule_.fired(FaultKind::kEio), ", enospc ",
                      schedule_.fired(FaultKind::kEnospc), ", torn ", schedule_.fired(FaultKind::kTornWrite),
                      ", delay ", schedule_.fired(FaultKind::kDelay), ", short (applied) ", injector_.applied(),
                      "; request events ", schedule_.events());
}

}  // namespace strata
