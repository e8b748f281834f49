#include "core/byte_size.h"

#include <cmath>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace strata {
namespace {

struct NumberAndUnit {
  long double number;
  std::string unit;
};

// Splits "1.5GiB" into 1.5 and "GiB". strtold accepts "1e9" and "1.5".
absl::StatusOr<NumberAndUnit> SplitNumber(absl::string_view text, absl::string_view what,
                                          absl::string_view accepted) {
  std::string s(absl::StripAsciiWhitespace(text));
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid ", what, " '", text, "': ", why, "; expected ", accepted));
  };
  if (s.empty()) return bad("empty");
  if (s[0] == '-') return bad("negative");
  if (!absl::ascii_isdigit(static_cast<unsigned char>(s[0])) && s[0] != '.') {
    return bad("not a number");
  }
  // strtold would read "0x10" as hex and "inf"/"nan": accept only decimal digits.
  size_t end = 0;
  while (end < s.size() && (absl::ascii_isdigit(static_cast<unsigned char>(s[end])) || s[end] == '.')) ++end;
  if (end < s.size() && (s[end] == 'e' || s[end] == 'E') && end + 1 < s.size() &&
      (absl::ascii_isdigit(static_cast<unsigned char>(s[end + 1])) || s[end + 1] == '+' ||
       s[end + 1] == '-')) {
    ++end;
    if (s[end] == '+' || s[end] == '-') ++end;
    while (end < s.size() && absl::ascii_isdigit(static_cast<unsigned char>(s[end]))) ++end;
  }
  std::string number_text = s.substr(0, end);
  char* parse_end = nullptr;
  long double number = std::strtold(number_text.c_str(), &parse_end);
  if (parse_end != number_text.c_str() + number_text.size() || number_text.empty()) {
    return bad("not a number");
  }
  if (!std::isfinite(number)) return bad("not finite");
  std::string unit(absl::StripAsciiWhitespace(absl::string_view(s).substr(end)));
  return NumberAndUnit{number, unit};
}

absl::StatusOr<uint64_t> ToWhole(long double value, absl::string_view text, absl::string_view what,
                                 absl::string_view accepted) {
  if (value > 9.2e18L) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid ", what, " '", text, "': too large; expected ", accepted));
  }
  long double rounded = std::round(value);
  if (std::fabs(rounded - value) > 1e-6L * std::max<long double>(1.0L, value)) {
    return absl::InvalidArgumentError(absl::StrCat("invalid ", what, " '", text,
                                                   "': not a whole number; expected ", accepted));
  }
  return static_cast<uint64_t>(rounded);
}

}  // namespace

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text) {
  constexpr absl::string_view kAccepted =
      "a size such as 16GiB, 16GB, 512MiB, 4096 or 1.5e9 (units B, KB/MB/GB/TB/PB = powers of "
      "1000, KiB/MiB/GiB/TiB/PiB = powers of 1024)";
  auto parts = SplitNumber(text, "size", kAccepted);
  if (!parts.ok()) return parts.status();
  std::string unit = absl::AsciiStrToLower(parts->unit);
  long double multiplier = 0;
  if (unit.empty() || unit == "b") {
    multiplier = 1;
  } else {
    const char prefix = unit[0];
    absl::string_view rest = absl::string_view(unit).substr(1);
    int power = 0;
    switch (prefix) {
      case 'k': power = 1; break;
      case 'm': power = 2; break;
      case 'g': power = 3; break;
      case 't': power = 4; break;
      case 'p': power = 5; break;
      default: power = 0;
    }
    if (power != 0 && (rest.empty() || rest == "b")) {
      multiplier = std::pow(1000.0L, power);
    } else if (power != 0 && (rest == "i" || rest == "ib")) {
      multiplier = std::pow(1024.0L, power);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("invalid size '", text, "': unknown unit '",
                                                     parts->unit, "'; expected ", kAccepted));
    }
  }
  return ToWhole(parts->number * multiplier, text, "size", kAccepted);
}

absl::StatusOr<uint64_t> ParseCount(absl::string_view text) {
  constexpr absl::string_view kAccepted =
      "a count such as 1.3B, 7e9, 350M, 125K or 1T (K=1e3, M=1e6, B or G=1e9, T=1e12)";
  auto parts = SplitNumber(text, "count", kAccepted);
  if (!parts.ok()) return parts.status();
  std::string unit = absl::AsciiStrToUpper(parts->unit);
  long double multiplier = 0;
  if (unit.empty()) multiplier = 1;
  else if (unit == "K") multiplier = 1e3L;
  else if (unit == "M") multiplier = 1e6L;
  else if (unit == "B" || unit == "G") multiplier = 1e9L;
  else if (unit == "T") multiplier = 1e12L;
  else {
    return absl::InvalidArgumentError(absl::StrCat("invalid count '", text, "': unknown suffix '",
                                                   parts->unit, "'; expected ", kAccepted));
  }
  return ToWhole(parts->number * multiplier, text, "count", kAccepted);
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

std::string FormatCount(uint64_t count) {
  double value = static_cast<double>(count);
  if (value >= 1e12) return absl::StrFormat("%.2fT", value / 1e12);
  if (value >= 1e9) return absl::StrFormat("%.2fB", value / 1e9);
  if (value >= 1e6) return absl::StrFormat("%.2fM", value / 1e6);
  if (value >= 1e3) return absl::StrFormat("%.2fK", value / 1e3);
  return absl::StrCat(count);
}

}  // namespace strata
