#include "core/command_line.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace strata {

void CommandLine::AddString(std::string name, std::string* target, std::string help, bool* seen) {
  flags_.push_back(Flag{std::move(name), false,
                        [target, seen](absl::string_view value) {
                          *target = std::string(value);
                          if (seen != nullptr) *seen = true;
                          return absl::OkStatus();
                        },
                        std::move(help)});
}

void CommandLine::AddBool(std::string name, bool* target, std::string help) {
  std::string flag_name = name;
  flags_.push_back(Flag{std::move(name), true,
                        [target, flag_name](absl::string_view value) {
                          if (value == "true" || value == "1" || value == "yes") {
                            *target = true;
                          } else if (value == "false" || value == "0" || value == "no") {
                            *target = false;
                          } else {
                            return absl::InvalidArgumentError(absl::StrCat(
                                "--", flag_name, "=", value, ": expected true or false"));
                          }
                          return absl::OkStatus();
                        },
                        std::move(help)});
}

void CommandLine::AddParsed(std::string name, std::function<absl::Status(absl::string_view)> parse,
                            std::string help) {
  flags_.push_back(Flag{std::move(name), false, std::move(parse), std::move(help)});
}

const CommandLine::Flag* CommandLine::Find(absl::string_view name) const {
  for (const Flag& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

absl::Status CommandLine::Parse(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help_requested_ = true;
      continue;
    }
    if (!absl::StartsWith(arg, "--") || arg.size() == 2) {
      positional_.emplace_back(arg);
      continue;
    }
    absl::string_view body = arg.substr(2);
    absl::string_view name = body;
    absl::string_view value;
    bool has_value = false;
    if (size_t eq = body.find('='); eq != absl::string_view::npos) {
      name = body.substr(0, eq);
      value = body.substr(eq + 1);
      has_value = true;
    }
    const Flag* flag = Find(name);
    if (flag == nullptr && !has_value && absl::StartsWith(name, "no")) {
      const Flag* negated = Find(name.substr(2));
      if (negated != nullptr && negated->is_bool) {
        absl::Status s = negated->set("false");
        if (!s.ok()) return s;
        continue;
      }
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, "; run '", command_, " --help' for the flags"));
    }
    if (!has_value) {
      if (flag->is_bool) {
        value = "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " needs a value (", flag->help, ")"));
      }
    }
    if (absl::Status s = flag->set(value); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string CommandLine::Usage() const {
  std::string out = absl::StrCat("usage: ", command_, " [flags]\n\nflags:\n");
  for (const Flag& f : flags_) {
    absl::StrAppend(&out, "  --", f.name, f.is_bool ? "" : "=VALUE", "\n      ", f.help, "\n");
  }
  return out;
}

}  // namespace strata
