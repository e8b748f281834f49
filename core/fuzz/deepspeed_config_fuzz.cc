// libFuzzer target: ParseDeepSpeedConfig must return (ok or an error) for
// every byte string, never crash, hang or trip a sanitizer. Build with
// -DSTRATA_FUZZ=ON and clang; run with the committed seed corpus:
//   build-fuzz/core/fuzz/deepspeed_config_fuzz core/fuzz/corpus/deepspeed_config
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "core/deepspeed_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = strata::ParseDeepSpeedConfig(text);
  if (!config.ok()) {
    // Every refusal is InvalidArgument with a message.
    if (config.status().code() != absl::StatusCode::kInvalidArgument ||
        config.status().message().empty()) {
      std::abort();
    }
  }
  return 0;
}
