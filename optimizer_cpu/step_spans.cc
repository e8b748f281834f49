#include "optimizer_cpu/step_spans.h"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"

namespace strata {
namespace {

absl::Status CheckSpan(const OptimizerHyperparams& config, const char* name,
                       const void* ptr, bool needed, size_t size) {
  if (needed && ptr == nullptr && size > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        OptimizerKindName(config.kind), " step: span '", name, "' is null but ",
        size, " elements were given"));
  }
  if (!needed && ptr != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        OptimizerKindName(config.kind), " step: span '", name,
        "' is set but this optimizer", config.amsgrad ? "" : " (without amsgrad)",
        " does not use it; pass null"));
  }
  return absl::OkStatus();
}

absl::Status CheckParamOut(const StepSpans& spans) {
  if ((spans.param_out != nullptr) != spans.param_out_dtype.has_value()) {
    return absl::InvalidArgumentError(
        "step: param_out and param_out_dtype must be given together");
  }
  if (spans.param_out_dtype.has_value() && *spans.param_out_dtype == DType::kFp32) {
    return absl::InvalidArgumentError(
        "step: param_out_dtype must be fp16 or bf16; the fp32 params are updated in place");
  }
  return absl::OkStatus();
}

// A set fp32 moment under a compressed format: say where it belongs.
absl::Status InFormat(const StepSpans& spans, const absl::Status& s) {
  if (spans.moment_format == MomentFormat::kFp32) return s;
  return absl::InvalidArgumentError(absl::StrCat(
      s.message(), " (moment_format is ", MomentFormatName(spans.moment_format),
      ": the moments go in ",
      spans.moment_format == MomentFormat::kBf16 ? "bf16_moments" : "blockwise8_moments", ")"));
}

absl::Status Invalid(const OptimizerHyperparams& config, absl::string_view field,
                     absl::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat(OptimizerKindName(config.kind), " step: ", field, ": ", problem));
}

struct MomentRole {
  const char* name;
  bool needed;
  size_t bf16_size;
  const Blockwise8Moment* q8;
};

absl::Status CheckCompressedMoments(const OptimizerHyperparams& config, const StateLayout& layout,
                                    const StepSpans& spans) {
  const MomentFormat format = spans.moment_format;
  const Bf16Moments& b = spans.bf16_moments;
  const Blockwise8Moments& q = spans.blockwise8_moments;
  const MomentRole roles[] = {
      {"exp_avg", layout.exp_avg, b.exp_avg.size(), &q.exp_avg},
      {"exp_avg_sq", layout.exp_avg_sq, b.exp_avg_sq.size(), &q.exp_avg_sq},
      {"max_exp_avg_sq", layout.max_exp_avg_sq, b.max_exp_avg_sq.size(), &q.max_exp_avg_sq},
  };
  if (format != MomentFormat::kFp32 && config.kind == OptimizerKind::kLamb) {
    return absl::UnimplementedError(absl::StrCat(
        "lamb step: moment_format ", MomentFormatName(format),
        " is not implemented for LAMB (its two passes read fp32 moments); use fp32"));
  }
  // Fields of the formats not in use must be empty.
  for (const MomentRole& r : roles) {
    if (format != MomentFormat::kBf16 && r.bf16_size != 0) {
      return Invalid(config, absl::StrCat("bf16_moments.", r.name),
                     absl::StrCat("is set but moment_format is ", MomentFormatName(format)));
    }
    if (format != MomentFormat::kBlockwise8 && !r.q8->empty()) {
      return Invalid(config, absl::StrCat("blockwise8_moments.", r.name),
                     absl::StrCat("is set but moment_format is ", MomentFormatName(format)));
    }
  }
  if (format == MomentFormat::kFp32) {
    if (spans.moment_offset != 0) {
      return Invalid(config, "moment_offset",
                     "is for compressed moments; fp32 moment pointers start at the step's first "
                     "element, so pass 0");
    }
    return absl::OkStatus();
  }
  const size_t end = spans.moment_offset + spans.size;
  const char* prefix = format == MomentFormat::kBf16 ? "bf16_moments." : "blockwise8_moments.";
  std::optional<size_t> tensor;  // elements of the moment tensor, from the first moment
  const char* first = nullptr;
  for (const MomentRole& r : roles) {
    const size_t n = format == MomentFormat::kBf16 ? r.bf16_size : r.q8->codes.size();
    const std::string field = absl::StrCat(prefix, r.name);
    if (!r.needed) {
      const bool set = format == MomentFormat::kBf16 ? n != 0 : !r.q8->empty();
      if (set) {
        return Invalid(config, field,
                       absl::StrCat("is set but this optimizer",
                                    config.amsgrad ? "" : " (without amsgrad)",
                                    " does not use it; leave it empty"));
      }
      continue;
    }
    if (n < end) {
      return Invalid(config, field,
                     absl::StrCat("has ", n, " elements but the step covers [",
                                  spans.moment_offset, ", ", end, ") of it"));
    }
    if (tensor && *tensor != n) {
      return Invalid(config, field,
                     absl::StrCat("has ", n, " elements but ", prefix, first, " has ", *tensor,
                                  "; the moments of one tensor have one length"));
    }
    tensor = n;
    first = r.name;
    if (format == MomentFormat::kBlockwise8 && r.q8->absmax.size() != MomentBlocks(n)) {
      return Invalid(config, absl::StrCat(field, ".absmax"),
                     absl::StrCat("has ", r.q8->absmax.size(), " blocks but its ", n,
                                  " codes need ", MomentBlocks(n), " (one per ", kMomentBlock,
                                  " elements)"));
    }
  }
  if (format == MomentFormat::kBlockwise8 && tensor) {
    if (spans.moment_offset % kMomentBlock != 0) {
      return Invalid(config, "moment_offset",
                     absl::StrCat(spans.moment_offset, " is not the start of a ", kMomentBlock,
                                  "-element block of the 8-bit moments"));
    }
    if (end != *tensor && spans.size % kMomentBlock != 0) {
      return Invalid(config, "size",
                     absl::StrCat(spans.size, " elements end inside a block of the 8-bit moments (",
                                  end, " of ", *tensor, "); a range short of the tensor's end "
                                  "must be a multiple of ", kMomentBlock));
    }
  }
  return absl::OkStatus();
}

}  // namespace

MomentMap ExpAvgMomentMap(OptimizerKind kind) {
  return kind == OptimizerKind::kAdagrad ? MomentMap::kUnsigned : MomentMap::kSigned;
}

absl::Status ValidateStepSpans(const OptimizerHyperparams& config, const StepSpans& spans) {
  if (auto s = ValidateStateSpans(config, spans); !s.ok()) return s;
  if (auto s = CheckSpan(config, "grad", spans.grad, true, spans.size); !s.ok()) return s;
  return CheckParamOut(spans);
}

absl::Status ValidateApplySpans(const OptimizerHyperparams& config, const StepSpans& spans) {
  if (auto s = ValidateStateSpans(config, spans); !s.ok()) return s;
  return CheckParamOut(spans);
}

absl::Status ValidateStateSpans(const OptimizerHyperparams& config, const StepSpans& spans) {
  const StateLayout layout = StateLayoutFor(config);
  if (auto s = CheckSpan(config, "params", spans.params, true, spans.size); !s.ok()) return s;
  const bool fp32 = spans.moment_format == MomentFormat::kFp32;
  if (auto s = CheckSpan(config, "exp_avg", spans.exp_avg, fp32 && layout.exp_avg, spans.size);
      !s.ok()) {
    return InFormat(spans, s);
  }
  if (auto s = CheckSpan(config, "exp_avg_sq", spans.exp_avg_sq, fp32 && layout.exp_avg_sq,
                         spans.size);
      !s.ok()) {
    return InFormat(spans, s);
  }
  if (auto s = CheckSpan(config, "max_exp_avg_sq", spans.max_exp_avg_sq,
                         fp32 && layout.max_exp_avg_sq, spans.size);
      !s.ok()) {
    return InFormat(spans, s);
  }
  return CheckCompressedMoments(config, layout, spans);
}

}  // namespace strata
