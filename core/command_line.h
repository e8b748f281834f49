// CommandLine: the small flag parser the `strata` subcommands share.
//
// Each subcommand declares its flags with a target variable, then parses.
// Accepted forms: --name=value, --name value, and --name / --noname for bools.
// Unlike a global flag registry, two subcommands may use the same flag name
// with different meanings, and a usage error comes back as a Status whose
// message names the flag and what it accepts, so the command can print one
// line and exit 2.
#ifndef STRATA_CORE_COMMAND_LINE_H_
#define STRATA_CORE_COMMAND_LINE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace strata {

class CommandLine {
 public:
  // `command` is used in messages: "strata plan".
  explicit CommandLine(std::string command) : command_(std::move(command)) {}

  // A flag whose value is kept as text; `*seen` (optional) says whether it was given.
  void AddString(std::string name, std::string* target, std::string help, bool* seen = nullptr);
  void AddBool(std::string name, bool* target, std::string help);
  // A flag whose value is checked by `parse` as soon as it is read; `parse`
  // returns InvalidArgument saying what is accepted.
  void AddParsed(std::string name, std::function<absl::Status(absl::string_view)> parse,
                 std::string help);

  // Parses argv[1..argc); argv[0] is the subcommand's name. Positional
  // arguments are collected in positional(). "--help" sets help_requested().
  absl::Status Parse(int argc, char** argv);

  bool help_requested() const { return help_requested_; }
  const std::vector<std::string>& positional() const { return positional_; }
  std::string Usage() const;

 private:
  struct Flag {
    std::string name;
    bool is_bool = false;
    std::function<absl::Status(absl::string_view)> set;
    std::string help;
  };
  const Flag* Find(absl::string_view name) const;

  std::string command_;
  std::vector<Flag> flags_;
  std::vector<std::string> positional_;
  bool help_requested_ = false;
};

}  // namespace strata

#endif  // STRATA_CORE_COMMAND_LINE_H_
