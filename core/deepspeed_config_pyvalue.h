// How DeepSpeed's config models turn a JSON value into a bool, an int or a
// float: pydantic v2 in "lax" mode, which DeepSpeedConfigModel uses. strata
// reads the same inputs the same way so that a config DeepSpeed accepts is
// accepted here and one it refuses is refused (tests/deepspeed_conformance
// checks this against DeepSpeed itself). Internal to core/deepspeed_config.
//
// The rules, measured against pydantic 2.14 (the version DeepSpeed 0.19.8
// runs with in the project venv):
// - bool: true/false; the numbers 0 and 1 (also 0.0 and 1.0); the strings
//   0 1 f t n y no on off yes true false in any case, not padded.
// - int: a JSON integer; true (1) and false (0); a float with no fractional
//   part below 2^63; a string of an optionally signed decimal integer,
//   surrounded by whitespace if so, with single '_' between digits and an
//   optional ".000" tail ("5e8" and "5." are refused).
// - float: any JSON number; true and false; a string Python's float() reads
//   ("1e-3", " .5 ", "1_0", "inf", "nan").
// Python ints are unbounded; strata holds int64, so an int beyond it is
// refused here (a difference listed in docs/DEEPSPEED_CONFIG.md).
#ifndef STRATA_CORE_DEEPSPEED_CONFIG_PYVALUE_H_
#define STRATA_CORE_DEEPSPEED_CONFIG_PYVALUE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace strata::dsconfig {

using Json = nlohmann::json;

// A number literal beyond a double (1e400) cannot live in nlohmann's JSON;
// ParseConfigJson writes it as a string with this prefix and the literal,
// and the readers here take it as the +-inf Python's json makes of it.
inline constexpr absl::string_view kOverflowPrefix = "\x01strata-overflow:";
bool IsOverflow(const Json& value);

// Each returns nullopt when pydantic would refuse the value.
std::optional<bool> PyBool(const Json& value);
std::optional<int64_t> PyInt(const Json& value);
std::optional<double> PyFloat(const Json& value);

// Python's int(str) (no ".0" tail, unlike pydantic's int): used where
// DeepSpeed calls int() itself before pydantic sees the value.
std::optional<int64_t> PythonIntOfString(absl::string_view text);

// A short description of a value for an error message: scalars as JSON,
// containers by kind and size. Never recursive, so a hostile, deeply nested
// value costs nothing here.
std::string Describe(const Json& value);

}  // namespace strata::dsconfig

#endif  // STRATA_CORE_DEEPSPEED_CONFIG_PYVALUE_H_
