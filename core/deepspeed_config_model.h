// ModelReader: reads one JSON object the way a DeepSpeed pydantic config model
// (DeepSpeedConfigModel: extra="forbid", populate_by_name, lax coercion,
// "auto" dropped) reads its keyword arguments. Internal to core/deepspeed_config.
#ifndef STRATA_CORE_DEEPSPEED_CONFIG_MODEL_H_
#define STRATA_CORE_DEEPSPEED_CONFIG_MODEL_H_

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>
#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/deepspeed_config_pyvalue.h"

namespace strata::dsconfig {

bool IsAuto(const Json& value);

// "zero_optimization" + "stage" -> "zero_optimization.stage"; keys are cut
// to 100 characters so a hostile key cannot blow up a message.
std::string JoinPath(absl::string_view path, absl::string_view key);
// The key itself, cut the same way, control characters replaced by '?'.
std::string PrintableKey(absl::string_view key);

// "<path>: <value> is not valid; expected <what>".
absl::Status InvalidValue(absl::string_view path, const Json& value, absl::string_view expected);

// Bounds of a whole-number field (pydantic's ge/gt) and the range of the C++
// field that holds it.
struct IntBounds {
  int64_t min = std::numeric_limits<int64_t>::min();
  int64_t max = std::numeric_limits<int64_t>::max();
  std::string Describe() const;
};

class ModelReader {
 public:
  // `value` must be a JSON object (pydantic: "a valid dictionary").
  static absl::StatusOr<ModelReader> Open(const Json& value, std::string path);

  const std::string& path() const { return path_; }
  std::string PathOf(absl::string_view key) const { return JoinPath(path_, key); }

  // Declares a field, under its name and, when given, its alias; returns its
  // value, or nullptr when absent or "auto" (DeepSpeed drops "auto" before
  // validation). Both spellings at once is an error, as in pydantic.
  absl::StatusOr<const Json*> Field(absl::string_view name, absl::string_view alias = {});
  // True when the key (or alias) was written as "auto".
  bool WasAuto(absl::string_view name, absl::string_view alias = {}) const;

  // Typed fields. A null is refused unless the field is Optional (Opt*).
  absl::Status Bool(absl::string_view name, bool* out, absl::string_view alias = {});
  absl::Status OptBool(absl::string_view name, std::optional<bool>* out, bool* given);
  // A whole number within `bounds` and within what T holds; nullopt when
  // absent or "auto".
  absl::StatusOr<std::optional<int64_t>> IntValue(absl::string_view name, IntBounds bounds,
                                                  absl::string_view alias = {});
  template <typename T>
  absl::Status Int(absl::string_view name, T* out, IntBounds bounds, absl::string_view alias = {}) {
    constexpr uint64_t kTypeMax = static_cast<uint64_t>(std::numeric_limits<T>::max());
    if (kTypeMax < static_cast<uint64_t>(bounds.max)) bounds.max = static_cast<int64_t>(kTypeMax);
    if constexpr (std::is_unsigned_v<T>) bounds.min = std::max<int64_t>(bounds.min, 0);
    if constexpr (std::is_signed_v<T>) {
      bounds.min = std::max<int64_t>(bounds.min, std::numeric_limits<T>::min());
    }
    auto v = IntValue(name, bounds, alias);
    if (!v.ok()) return v.status();
    if (v->has_value()) *out = static_cast<T>(**v);
    return absl::OkStatus();
  }
  // A float in [min, max] (pydantic ge/le); NaN fails any bound.
  absl::Status Float(absl::string_view name, double* out, std::optional<double> min,
                     std::optional<double> max);
  // Optional[str] / Optional[Path]: a string or null.
  absl::Status OptString(absl::string_view name, std::string* out, bool* given = nullptr);
  // A str enum: one of `values`, exactly.
  absl::Status Enum(absl::string_view name, std::string* out,
                    const std::vector<absl::string_view>& values);
  // A field of any value, or of the given JSON kind ("object", "array").
  absl::Status Any(absl::string_view name);
  absl::Status OptObject(absl::string_view name);
  absl::Status OptArray(absl::string_view name);
  absl::Status Object(absl::string_view name);

  // Was the key (or alias) written, null included, "auto" excluded?
  bool Given(absl::string_view name) const;

  // Refuses every key no field declared (extra="forbid").
  absl::Status Finish() const;

 private:
  ModelReader(const Json& object, std::string path) : object_(&object), path_(std::move(path)) {}
  const Json* Raw(absl::string_view key) const;

  const Json* object_;
  std::string path_;
  absl::flat_hash_set<std::string> known_;
};

}  // namespace strata::dsconfig

#endif  // STRATA_CORE_DEEPSPEED_CONFIG_MODEL_H_
