// Turns a DeepSpeed config's text into JSON without ever crashing: nesting is
// checked by a flat scan before nlohmann builds anything, and duplicate keys
// are refused (DeepSpeed loads config files with a hook that refuses them).
// Internal to core/deepspeed_config.
#ifndef STRATA_CORE_DEEPSPEED_CONFIG_JSON_H_
#define STRATA_CORE_DEEPSPEED_CONFIG_JSON_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/deepspeed_config_pyvalue.h"

namespace strata::dsconfig {

// InvalidArgument for text that is not JSON (comments allowed), nests deeper
// than `max_depth` objects/arrays, or repeats a key within one object.
absl::StatusOr<Json> ParseConfigJson(absl::string_view text, int max_depth);

}  // namespace strata::dsconfig

#endif  // STRATA_CORE_DEEPSPEED_CONFIG_JSON_H_
