// `strata checkpoint export DIR [DIR ...] --to FILE.pt`: one consolidated torch
// state dict from stratad's checkpoint files.
//
// The work is done by the Python module strata.checkpoint, which this command
// execs (`PYTHON -m strata.checkpoint export ...`). Why not C++: a .pt file is
// torch's own serialization (a zip of a pickle whose tensors are persistent
// references to storages rebuilt by torch._utils functions, versioned with
// torch); writing it here would be a second, unchecked implementation of
// torch.save, and whoever loads the file has torch anyway. Which Python:
// --python, else $STRATA_PYTHON, else the one this build was configured with
// (-DSTRATA_PYTHON), else python3. When the strata package staged by this
// build exists (build/python), it goes first on PYTHONPATH, so an uninstalled
// build works; an installed package (pip install ./python) works without it.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cli/cli_commands.h"

#ifndef STRATA_CLI_PYTHON
#define STRATA_CLI_PYTHON ""
#endif
#ifndef STRATA_CLI_PY_STAGE
#define STRATA_CLI_PY_STAGE ""
#endif

namespace strata {
namespace {

void PrintCheckpointUsage(FILE* out) {
  std::fprintf(out,
               "usage: strata checkpoint export DIR [DIR ...] --to FILE.pt [--python PYTHON]\n\n"
               "Writes a stratad checkpoint (one DIR per daemon of the job) as one torch state dict:\n"
               "fp32 params and the optimizer state in torch's format (torch.load +\n"
               "torch.optim.AdamW.load_state_dict, no strata needed). Runs `PYTHON -m strata.checkpoint`;\n"
               "PYTHON is --python, else $STRATA_PYTHON, else %s.\n",
               std::strlen(STRATA_CLI_PYTHON) > 0 ? STRATA_CLI_PYTHON : "python3");
}

bool IsDirectory(const char* path) { return path[0] != '\0' && access(path, R_OK | X_OK) == 0; }

}  // namespace

int RunCheckpointCommand(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    PrintCheckpointUsage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "export") != 0) {
    std::fprintf(stderr, "strata checkpoint: unknown subcommand '%s'; the one subcommand is 'export'\n", argv[1]);
    return 2;
  }
  // --python is this command's; everything else goes to strata.checkpoint,
  // whose argparse reports bad usage (exit 2) naming the argument.
  std::string python;
  std::vector<std::string> rest;
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--python") == 0) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "strata checkpoint export: --python needs a path\n");
        return 2;
      }
      python = argv[++i];
    } else if (std::strncmp(argv[i], "--python=", 9) == 0) {
      python = argv[i] + 9;
    } else {
      rest.emplace_back(argv[i]);
    }
  }
  if (python.empty()) {
    const char* env = std::getenv("STRATA_PYTHON");
    python = env != nullptr && *env != '\0'             ? env
             : std::strlen(STRATA_CLI_PYTHON) > 0 ? STRATA_CLI_PYTHON
                                                       : "python3";
  }
  if (IsDirectory(STRATA_CLI_PY_STAGE)) {
    const char* old = std::getenv("PYTHONPATH");
    std::string path = STRATA_CLI_PY_STAGE;
    if (old != nullptr && *old != '\0') path += std::string(":") + old;
    setenv("PYTHONPATH", path.c_str(), 1);
  }
  std::vector<char*> args;
  std::string dash_m = "-m", module = "strata.checkpoint", sub = "export";
  args.push_back(python.data());
  args.push_back(dash_m.data());
  args.push_back(module.data());
  args.push_back(sub.data());
  for (std::string& a : rest) args.push_back(a.data());
  args.push_back(nullptr);
  execvp(python.c_str(), args.data());
  std::fprintf(stderr,
               "strata checkpoint export: cannot run %s (%s); pass --python PATH or set STRATA_PYTHON to a Python "
               "with torch and the strata package (pip install ./python)\n",
               python.c_str(), std::strerror(errno));
  return 1;
}

}  // namespace strata
