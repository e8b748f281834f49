#include "core/deepspeed_config_json.h"

#include "core/deepspeed_config_model.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace strata::dsconfig {
namespace {

bool NumberStart(char c) { return c == '-' || (c >= '0' && c <= '9'); }
bool NumberChar(char c) {
  return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
}

// One flat pass over the text (strings and comments skipped): refuses
// nesting deeper than `max_depth` (the offset of the first byte past it in
// *where), and rewrites number literals beyond a double (which nlohmann
// refuses without naming the key) as kOverflowPrefix strings in *rewritten.
bool Scan(absl::string_view text, int max_depth, size_t* where, std::string* rewritten) {
  int depth = 0;
  size_t copied = 0;  // text[0, copied) is already in *rewritten
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '"') {
      for (++i; i < text.size() && text[i] != '"'; ++i) {
        if (text[i] == '\\') ++i;
      }
    } else if (c == '/' && i + 1 < text.size() && text[i + 1] == '/') {
      while (i < text.size() && text[i] != '\n') ++i;
    } else if (c == '/' && i + 1 < text.size() && text[i + 1] == '*') {
      const size_t end = text.find("*/", i + 2);
      i = end == absl::string_view::npos ? text.size() : end + 1;
    } else if (c == '{' || c == '[') {
      if (++depth > max_depth) {
        *where = i;
        return false;
      }
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
    } else if (NumberStart(c)) {
      size_t end = i;
      while (end < text.size() && NumberChar(text[end])) ++end;
      const std::string literal(text.substr(i, std::min<size_t>(end - i, 4096)));
      if (end - i <= 4096 && std::isinf(std::strtod(literal.c_str(), nullptr))) {
        absl::StrAppend(rewritten, text.substr(copied, i - copied), "\"\\u0001",
                        kOverflowPrefix.substr(1), literal, "\"");
        copied = end;
      }
      i = end - 1;
    }
  }
  if (copied > 0) absl::StrAppend(rewritten, text.substr(copied));
  return true;
}

}  // namespace

absl::StatusOr<Json> ParseConfigJson(absl::string_view text, int max_depth) {
  size_t where = 0;
  std::string rewritten;
  if (!Scan(text, max_depth, &where, &rewritten)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DeepSpeed config nests objects/arrays deeper than ", max_depth, " levels (at byte ",
        where, "); DeepSpeed configs are a few levels deep"));
  }
  // One set of keys per open object; the first repeated key is remembered
  // and reported after the parse (the callback cannot return an error).
  std::vector<absl::flat_hash_set<std::string>> keys;
  std::string duplicate;
  auto callback = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        keys.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!keys.empty() && !keys.back().insert(parsed.get<std::string>()).second &&
            duplicate.empty()) {
          duplicate = PrintableKey(parsed.get<std::string>());
        }
        break;
      default:
        break;
    }
    return true;
  };
  if (!rewritten.empty()) text = rewritten;
  Json root;
  // nlohmann reports errors only by exception; none crosses this function.
  try {
    root = Json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true,
                       /*ignore_comments=*/true);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("DeepSpeed config is not valid JSON: ", e.what()));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("DeepSpeed config cannot be read: ", e.what()));
  }
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DeepSpeed config has the key '", duplicate,
        "' twice in one object; DeepSpeed refuses duplicate keys"));
  }
  return root;
}

}  // namespace strata::dsconfig
