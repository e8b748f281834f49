#include "core/deepspeed_config_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_join.h"

namespace strata::dsconfig {

bool IsAuto(const Json& value) { return value.is_string() && value.get_ref<const std::string&>() == "auto"; }

std::string PrintableKey(absl::string_view key) {
  std::string k(key.substr(0, 100));
  // A key is the client's bytes: keep messages on one line.
  for (char& c : k) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  if (key.size() > 100) k += "...";
  return k;
}

std::string JoinPath(absl::string_view path, absl::string_view key) {
  std::string k = PrintableKey(key);
  return path.empty() ? k : absl::StrCat(path, ".", k);
}

absl::Status InvalidValue(absl::string_view path, const Json& value, absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": ", Describe(value), " is not valid; expected ", expected));
}

std::string IntBounds::Describe() const {
  std::string s = "a whole number";
  if (min == 1) {
    s += " > 0";
  } else if (min == 0) {
    s += " >= 0";
  } else if (min != std::numeric_limits<int64_t>::min()) {
    absl::StrAppend(&s, " >= ", min);
  }
  if (max != std::numeric_limits<int64_t>::max()) absl::StrAppend(&s, " and <= ", max);
  return s;
}

absl::StatusOr<ModelReader> ModelReader::Open(const Json& value, std::string path) {
  if (!value.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path.empty() ? "the config" : path, ": expected a JSON object, got ", Describe(value)));
  }
  return ModelReader(value, std::move(path));
}

const Json* ModelReader::Raw(absl::string_view key) const {
  if (key.empty()) return nullptr;
  auto it = object_->find(std::string(key));
  return it == object_->end() ? nullptr : &*it;
}

absl::StatusOr<const Json*> ModelReader::Field(absl::string_view name, absl::string_view alias) {
  known_.insert(std::string(name));
  if (!alias.empty()) known_.insert(std::string(alias));
  const Json* by_name = Raw(name);
  const Json* by_alias = Raw(alias);
  if (by_name != nullptr && IsAuto(*by_name)) by_name = nullptr;
  if (by_alias != nullptr && IsAuto(*by_alias)) by_alias = nullptr;
  if (by_name != nullptr && by_alias != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(PathOf(name), ": given twice, as '", alias,
                                                   "' and as '", name, "'; keep one"));
  }
  return by_alias != nullptr ? by_alias : by_name;
}

bool ModelReader::WasAuto(absl::string_view name, absl::string_view alias) const {
  const Json* a = Raw(name);
  const Json* b = Raw(alias);
  return (a != nullptr && IsAuto(*a)) || (b != nullptr && IsAuto(*b));
}

bool ModelReader::Given(absl::string_view name) const {
  const Json* v = Raw(name);
  return v != nullptr && !IsAuto(*v);
}

absl::Status ModelReader::Bool(absl::string_view name, bool* out, absl::string_view alias) {
  auto v = Field(name, alias);
  if (!v.ok()) return v.status();
  if (*v == nullptr) return absl::OkStatus();
  std::optional<bool> b = PyBool(**v);
  if (!b.has_value()) return InvalidValue(PathOf(name), **v, "true or false");
  *out = *b;
  return absl::OkStatus();
}

absl::Status ModelReader::OptBool(absl::string_view name, std::optional<bool>* out, bool* given) {
  auto v = Field(name);
  if (!v.ok()) return v.status();
  *given = *v != nullptr;
  if (*v == nullptr || (*v)->is_null()) return absl::OkStatus();
  std::optional<bool> b = PyBool(**v);
  if (!b.has_value()) return InvalidValue(PathOf(name), **v, "true, false or null");
  *out = b;
  return absl::OkStatus();
}

absl::StatusOr<std::optional<int64_t>> ModelReader::IntValue(absl::string_view name,
                                                             IntBounds bounds,
                                                             absl::string_view alias) {
  auto v = Field(name, alias);
  if (!v.ok()) return v.status();
  if (*v == nullptr) return std::optional<int64_t>();
  std::optional<int64_t> i = PyInt(**v);
  if (!i.has_value() || *i < bounds.min || *i > bounds.max) {
    return InvalidValue(PathOf(name), **v, bounds.Describe());
  }
  return i;
}

absl::Status ModelReader::Float(absl::string_view name, double* out, std::optional<double> min,
                                std::optional<double> max) {
  auto v = Field(name);
  if (!v.ok()) return v.status();
  if (*v == nullptr) return absl::OkStatus();
  std::optional<double> f = PyFloat(**v);
  std::string expected = "a number";
  if (min.has_value()) absl::StrAppend(&expected, " >= ", *min);
  if (max.has_value()) absl::StrAppend(&expected, min.has_value() ? " and" : "", " <= ", *max);
  if (!f.has_value() || (min.has_value() && !(*f >= *min)) || (max.has_value() && !(*f <= *max))) {
    return InvalidValue(PathOf(name), **v, expected);
  }
  *out = *f;
  return absl::OkStatus();
}

absl::Status ModelReader::OptString(absl::string_view name, std::string* out, bool* given) {
  auto v = Field(name);
  if (!v.ok()) return v.status();
  if (given != nullptr) *given = *v != nullptr && !(*v)->is_null();
  if (*v == nullptr || (*v)->is_null()) return absl::OkStatus();
  if (!(*v)->is_string()) return InvalidValue(PathOf(name), **v, "a string or null");
  *out = (*v)->get<std::string>();
  return absl::OkStatus();
}

absl::Status ModelReader::Enum(absl::string_view name, std::string* out,
                               const std::vector<absl::string_view>& values) {
  auto v = Field(name);
  if (!v.ok()) return v.status();
  if (*v == nullptr) return absl::OkStatus();
  if ((*v)->is_string()) {
    const std::string& s = (*v)->get_ref<const std::string&>();
    if (std::find(values.begin(), values.end(), s) != values.end()) {
      *out = s;
      return absl::OkStatus();
    }
  }
  std::vector<std::string> quoted;
  for (absl::string_view value : values) quoted.push_back(absl::StrCat("\"", value, "\""));
  return InvalidValue(PathOf(name), **v, absl::StrCat("one of ", absl::StrJoin(quoted, ", ")));
}

absl::Status ModelReader::Any(absl::string_view name) { return Field(name).status(); }

absl::Status ModelReader::OptObject(absl::string_view name) {
  auto v = Field(name);
  if (!v.ok()) return v.status();
  if (*v == nullptr || (*v)->is_null() || (*v)->is_object()) return absl::OkStatus();
  return InvalidValue(PathOf(name), **v, "a JSON object or null");
}

absl::Status ModelReader::Object(absl::string_view name) {
  auto v = Field(name);
  if (!v.ok()) return v.status();
  if (*v == nullptr || (*v)->is_object()) return absl::OkStatus();
  return InvalidValue(PathOf(name), **v, "a JSON object");
}

absl::Status ModelReader::OptArray(absl::string_view name) {
  auto v = Field(name);
  if (!v.ok()) return v.status();
  if (*v == nullptr || (*v)->is_null() || (*v)->is_array()) return absl::OkStatus();
  return InvalidValue(PathOf(name), **v, "a JSON array or null");
}

absl::Status ModelReader::Finish() const {
  for (auto it = object_->begin(); it != object_->end(); ++it) {
    if (known_.contains(it.key()) || IsAuto(it.value())) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown key '", PathOf(it.key()), "': DeepSpeed refuses keys it does not know in '",
        path_, "' (check the spelling)"));
  }
  return absl::OkStatus();
}

}  // namespace strata::dsconfig
