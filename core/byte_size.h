// Parsing and printing of the sizes users type: byte sizes ("16GiB", "16GB",
// "512MiB", "1.5e9") and counts such as parameter counts ("1.3B", "7e9", "1T").
#ifndef STRATA_CORE_BYTE_SIZE_H_
#define STRATA_CORE_BYTE_SIZE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace strata {

// A number (integer, decimal or exponent form) followed by an optional unit:
//   B; K/KB/M/MB/G/GB/T/TB/P/PB (powers of 1000); KiB/MiB/GiB/TiB/PiB (powers
//   of 1024). Units are case-insensitive except that "b" alone means bytes.
// Fractions are allowed where the result is a whole number of bytes
// ("1.5GiB"); negative values, NaN and values over 2^63 are InvalidArgument.
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text);

// A count with an optional SI suffix: K (1e3), M (1e6), B or G (1e9),
// T (1e12); or exponent form ("7e9"). Used for parameter counts.
absl::StatusOr<uint64_t> ParseCount(absl::string_view text);

// "15.0 GiB", "512.0 MiB", "100 B": binary units with one decimal.
std::string FormatBytes(uint64_t bytes);
// "1.30B", "7.00B", "350.00M": decimal units for counts.
std::string FormatCount(uint64_t count);

}  // namespace strata

#endif  // STRATA_CORE_BYTE_SIZE_H_
