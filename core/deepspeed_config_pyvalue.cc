#include "core/deepspeed_config_pyvalue.h"

#include <cmath>
#include <cstdlib>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace strata::dsconfig {
namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Python's str.strip() for the ASCII whitespace a JSON string can carry.
absl::string_view Strip(absl::string_view s) {
  return absl::StripAsciiWhitespace(s);
}

// Digits with single '_' between digits (Python's integer literal rule);
// appends the digits to *out. Returns false when `s` is not such a run.
bool DigitRun(absl::string_view s, std::string* out) {
  if (s.empty() || !IsDigit(s.front()) || !IsDigit(s.back())) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_') {
      if (!IsDigit(s[i - 1]) || !IsDigit(s[i + 1])) return false;
      continue;
    }
    if (!IsDigit(s[i])) return false;
    out->push_back(s[i]);
  }
  return true;
}

std::optional<int64_t> SignedDigits(bool negative, const std::string& digits) {
  // Accumulate negatively so INT64_MIN fits.
  int64_t v = 0;
  for (char c : digits) {
    const int d = c - '0';
    if (v < (std::numeric_limits<int64_t>::min() + d) / 10) return std::nullopt;
    v = v * 10 - d;
  }
  if (!negative) {
    if (v == std::numeric_limits<int64_t>::min()) return std::nullopt;
    v = -v;
  }
  return v;
}

std::optional<int64_t> IntOfString(absl::string_view text, bool allow_zero_tail) {
  absl::string_view s = Strip(text);
  bool negative = false;
  if (!s.empty() && (s.front() == '+' || s.front() == '-')) {
    negative = s.front() == '-';
    s.remove_prefix(1);
  }
  if (allow_zero_tail) {
    // pydantic strips a ".0", ".00", ... tail; "5." stays refused.
    const size_t dot = s.find('.');
    if (dot != absl::string_view::npos) {
      absl::string_view tail = s.substr(dot + 1);
      if (tail.empty() || tail.find_first_not_of('0') != absl::string_view::npos) {
        return std::nullopt;
      }
      s = s.substr(0, dot);
    }
  }
  std::string digits;
  if (!DigitRun(s, &digits)) return std::nullopt;
  return SignedDigits(negative, digits);
}

// Python's float(str): decimal literals with '_' between digits, and
// inf/infinity/nan in any case, each optionally signed.
std::optional<double> FloatOfString(absl::string_view text) {
  absl::string_view s = Strip(text);
  bool negative = false;
  if (!s.empty() && (s.front() == '+' || s.front() == '-')) {
    negative = s.front() == '-';
    s.remove_prefix(1);
  }
  const std::string lower = absl::AsciiStrToLower(s);
  if (lower == "inf" || lower == "infinity") {
    return negative ? -std::numeric_limits<double>::infinity()
                    : std::numeric_limits<double>::infinity();
  }
  if (lower == "nan") return std::numeric_limits<double>::quiet_NaN();
  // mantissa: digits [. [digits]] | . digits ; exponent: e [sign] digits
  std::string clean;
  size_t e = s.find_first_of("eE");
  absl::string_view mantissa = s.substr(0, e);
  const size_t dot = mantissa.find('.');
  absl::string_view int_part = mantissa.substr(0, dot);
  absl::string_view frac_part =
      dot == absl::string_view::npos ? absl::string_view() : mantissa.substr(dot + 1);
  if (int_part.empty() && frac_part.empty()) return std::nullopt;
  if (!int_part.empty() && !DigitRun(int_part, &clean)) return std::nullopt;
  if (dot != absl::string_view::npos) {
    clean.push_back('.');
    if (!frac_part.empty() && !DigitRun(frac_part, &clean)) return std::nullopt;
  }
  if (e != absl::string_view::npos) {
    absl::string_view exp = s.substr(e + 1);
    clean.push_back('e');
    if (!exp.empty() && (exp.front() == '+' || exp.front() == '-')) {
      clean.push_back(exp.front());
      exp.remove_prefix(1);
    }
    if (!DigitRun(exp, &clean)) return std::nullopt;
  }
  // `clean` is now a plain decimal literal, so strtod reads exactly it (no
  // hex, no locale surprises beyond '.', which the C locale uses).
  const double v = std::strtod(clean.c_str(), nullptr);
  return negative ? -v : v;
}

}  // namespace

std::optional<bool> PyBool(const Json& value) {
  if (value.is_boolean()) return value.get<bool>();
  if (value.is_number_unsigned()) {
    const uint64_t v = value.get<uint64_t>();
    if (v <= 1) return v == 1;
    return std::nullopt;
  }
  if (value.is_number_integer()) {
    const int64_t v = value.get<int64_t>();
    if (v == 0 || v == 1) return v == 1;
    return std::nullopt;
  }
  if (value.is_number_float()) {
    const double v = value.get<double>();
    if (v == 0.0 || v == 1.0) return v == 1.0;
    return std::nullopt;
  }
  if (value.is_string()) {
    const std::string s = absl::AsciiStrToLower(value.get<std::string>());
    if (s == "1" || s == "t" || s == "y" || s == "on" || s == "yes" || s == "true") return true;
    if (s == "0" || s == "f" || s == "n" || s == "no" || s == "off" || s == "false") return false;
  }
  return std::nullopt;
}

std::optional<int64_t> PyInt(const Json& value) {
  if (value.is_boolean()) return value.get<bool>() ? 1 : 0;
  if (value.is_number_unsigned()) {
    const uint64_t v = value.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(v);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_number_float()) {
    const double v = value.get<double>();
    // 2^63 is exact in a double; pydantic refuses at and beyond it.
    constexpr double kTwo63 = 9223372036854775808.0;
    if (!std::isfinite(v) || v != std::floor(v) || v >= kTwo63 || v < -kTwo63) return std::nullopt;
    return static_cast<int64_t>(v);
  }
  if (value.is_string() && !IsOverflow(value)) {
    return IntOfString(value.get<std::string>(), /*allow_zero_tail=*/true);
  }
  return std::nullopt;
}

bool IsOverflow(const Json& value) {
  return value.is_string() && absl::StartsWith(value.get_ref<const std::string&>(), kOverflowPrefix);
}

std::optional<double> PyFloat(const Json& value) {
  if (IsOverflow(value)) {
    const bool negative = value.get_ref<const std::string&>()[kOverflowPrefix.size()] == '-';
    return negative ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  }
  if (value.is_boolean()) return value.get<bool>() ? 1.0 : 0.0;
  if (value.is_number()) return value.get<double>();
  if (value.is_string()) return FloatOfString(value.get<std::string>());
  return std::nullopt;
}

std::optional<int64_t> PythonIntOfString(absl::string_view text) {
  return IntOfString(text, /*allow_zero_tail=*/false);
}

std::string Describe(const Json& value) {
  switch (value.type()) {
    case Json::value_t::object:
      return absl::StrCat("an object of ", value.size(), " keys");
    case Json::value_t::array:
      return absl::StrCat("an array of ", value.size(), " values");
    case Json::value_t::string: {
      if (IsOverflow(value)) {
        return absl::StrCat(value.get_ref<const std::string&>().substr(kOverflowPrefix.size(), 64),
                            " (beyond the range of a double)");
      }
      std::string s = value.get<std::string>();
      if (s.size() > 64) s = absl::StrCat(s.substr(0, 64), "...");
      return Json(s).dump(-1, ' ', false, Json::error_handler_t::replace);
    }
    case Json::value_t::number_float: {
      const double v = value.get<double>();
      if (std::isinf(v)) return v > 0 ? "a number too large for a double (inf)" : "-inf";
      if (std::isnan(v)) return "NaN";
      return value.dump();
    }
    default:
      return value.dump();
  }
}

}  // namespace strata::dsconfig
